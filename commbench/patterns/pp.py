"""Pipeline parallelism: stages on ranks, activations and gradients sent point to point.

Each rank runs its schedule (:mod:`commbench.patterns.pp_schedule`). A forward of chunk c on
micro-batch j receives the activation [b/m, h] from chunk c-1's rank (or takes the input), runs
the chunk's layers and sends the result on (isend: sends never block the schedule); the last chunk
computes the loss 1/2 * ||y - t||^2. A backward receives dy from chunk c+1's rank (or takes
y - t), runs backward and sends dx back. Gradients of a chunk's layers add up over micro-batches.

With ``checkpoint`` a forward keeps only its input and runs without autograd; the backward runs
the forward again with autograd first (re-materialisation, GPipe §2). ``compute_s`` adds a fixed
sleep per layer (forward) and twice that (backward), so that stages of equal compute show the
schedule's bubble whatever the machine. The naive pipeline is m = 1: no micro-batching.

Bytes per rank: b/m * h elements per chunk boundary it owns, per micro-batch, each direction.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from commbench.patterns.pp_schedule import SCHEDULES, schedule

__all__ = ["PPConfig", "oracle_pp", "run_pipeline"]

TAG = 9000


@dataclass(frozen=True, slots=True)
class PPConfig:
    stages: int = 2
    layers: int = 4
    hidden: int = 4
    batch: int = 4
    micro: int = 2
    virtual: int = 1
    schedule: str = "1f1b"
    checkpoint: bool = False
    compute_s: float = 0.0  # synthetic compute per layer forward (backward: twice)

    def validate(self, world_size: int | None = None) -> PPConfig:
        for name in ("stages", "layers", "hidden", "batch", "micro", "virtual"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        rules = [
            (self.schedule not in SCHEDULES,
             f"schedule={self.schedule!r}: must be one of {', '.join(SCHEDULES)}"),
            (self.layers % (self.stages * self.virtual),
             f"layers={self.layers}: must be a multiple of stages x virtual = "
             f"{self.stages * self.virtual}"),
            (self.batch % self.micro, f"batch={self.batch}: must be a multiple of micro={self.micro}"),
            (self.schedule != "interleaved" and self.virtual != 1,
             f"virtual={self.virtual}: only the interleaved schedule has virtual stages"),
            (self.schedule == "interleaved" and self.micro % self.stages,
             f"micro={self.micro}: the interleaved schedule needs a multiple of stages="
             f"{self.stages}"),
            (self.compute_s < 0, f"compute_s={self.compute_s}: must be >= 0"),
            (world_size is not None and self.stages != world_size,
             f"stages={self.stages}: must equal the world size {world_size}"),
        ]
        for bad, message in rules:
            if bad:
                raise ValueError(message)
        return self

    def as_dict(self) -> dict:
        return asdict(self)


def _weights(cfg: PPConfig, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h = cfg.hidden
    return [torch.randn(h, h, generator=g, dtype=torch.float64) * h ** -0.5
            for _ in range(cfg.layers)]


def _data(cfg: PPConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    return (torch.randn(cfg.batch, cfg.hidden, generator=g, dtype=torch.float64),
            torch.randn(cfg.batch, cfg.hidden, generator=g, dtype=torch.float64))


def _chunk_forward(x: torch.Tensor, ws: list[torch.Tensor], sleep: float) -> torch.Tensor:
    for w in ws:
        if sleep:
            time.sleep(sleep)
        x = torch.tanh(x @ w.T)
    return x


def oracle_pp(cfg: PPConfig, seed: int) -> dict:
    ws = [w.requires_grad_() for w in _weights(cfg, seed)]
    x, t = _data(cfg, seed)
    loss = 0.5 * ((_chunk_forward(x, ws, 0) - t) ** 2).sum()
    loss.backward()
    return {"loss": loss.item(), "grads": [w.grad for w in ws]}


class _ActivationMeter:
    """Bytes of tensors autograd keeps for backward, now and at the peak."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    def pack(self, t: torch.Tensor):
        n = t.numel() * t.element_size()
        self.now += n
        self.peak = max(self.peak, self.now)
        return (t, n)

    def unpack(self, packed):
        return packed[0]

    def free(self, n: int) -> None:
        self.now -= n


def run_pipeline(ctx, cfg: PPConfig, seed: int, mutant: str | None = None) -> dict:
    """Run this rank's schedule; its loss share, chunk gradients, ledger, timing and memory."""
    cfg.validate(ctx.size)
    comm, g, r, p = ctx.comm(), ctx.world, ctx.rank, ctx.size
    n_chunks = p * cfg.virtual
    per = cfg.layers // n_chunks
    all_w = _weights(cfg, seed)
    shift = 1 if mutant == "wrong_chunk_weights" and r == p - 1 else 0
    mine = {c: [w.clone().requires_grad_()
                for w in (all_w[c * per + shift:(c + 1) * per + shift] + all_w)[:per]]
            for c in range(r, n_chunks, p)}
    x_all, t_all = _data(cfg, seed)
    bm = cfg.batch // cfg.micro
    meter = _ActivationMeter()
    saved: dict = {}
    sends: list = []
    loss_total = 0.0
    busy = 0.0
    sleep = cfg.compute_s
    probe = torch.empty(bm, cfg.hidden, dtype=torch.float64)
    actions = schedule(cfg.schedule, p, r, cfg.micro, cfg.virtual)
    local: dict[int, torch.Tensor] = {}  # chunk boundaries inside this rank (p = 1) need no wire

    def _send(t: torch.Tensor, dst: int, tag: int) -> None:
        if dst == r:
            local[tag] = t.detach().clone()
        else:
            sends.append(comm.isend(t, g, dst, tag=tag))

    def _recv(src: int, tag: int) -> torch.Tensor:
        return local.pop(tag) if src == r else comm.recv(probe, g, src, tag=tag)

    with ctx.ledger.capture() as cap:
        comm.backend.barrier(g)
        t0 = time.perf_counter()
        for kind, c, j in actions:
            def tag(boundary: int, backward: bool = False, j: int = j) -> int:  # chunks b, b+1
                return TAG + 2 * (boundary * cfg.micro + j) + int(backward)
            if kind == "F":
                x = x_all[j * bm:(j + 1) * bm] if c == 0 else _recv((c - 1) % p, tag(c - 1))
                x = x.requires_grad_() if c > 0 else x
                s = time.perf_counter()
                if cfg.checkpoint:  # keep only the input
                    with torch.no_grad():
                        y = _chunk_forward(x, mine[c], sleep)
                    meter.pack(x)
                    saved[c, j] = (x, None, x.numel() * x.element_size())
                else:
                    before = meter.now
                    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
                        y = _chunk_forward(x, mine[c], sleep)
                    saved[c, j] = (x, y, meter.now - before)
                busy += time.perf_counter() - s
                if c < n_chunks - 1:
                    _send(y.detach(), (c + 1) % p, tag(c))
                else:
                    loss_total += 0.5 * ((y.detach() - t_all[j * bm:(j + 1) * bm]) ** 2).sum().item()
            else:
                x, y, nbytes = saved.pop((c, j))
                if c == n_chunks - 1:
                    target = t_all[j * bm:(j + 1) * bm]
                else:
                    grad_in = _recv((c + 1) % p, tag(c, True))
                s = time.perf_counter()
                if cfg.checkpoint:  # re-materialise the chunk's activations, then backward
                    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
                        before = meter.now
                        y = _chunk_forward(x, mine[c], sleep)
                        nbytes += meter.now - before
                if sleep:
                    time.sleep(2 * sleep * per)
                dy = (y.detach() - target) if c == n_chunks - 1 else grad_in
                if mutant == "no_grad_accumulation":  # keeps only the last micro-batch's gradient
                    for w in mine[c]:
                        w.grad = None
                y.backward(dy)
                meter.free(nbytes)
                busy += time.perf_counter() - s
                if c > 0:
                    _send(x.grad, (c - 1) % p, tag(c - 1, True))
        for w in sends:
            w.wait()
        total = time.perf_counter() - t0
    return {"loss": loss_total, "grads": {c: [w.grad for w in ws] for c, ws in mine.items()},
            "ledger": [(e.op, e.count, e.sent, e.recv) for e in cap.entries],
            "total_s": total, "busy_s": busy, "peak_activation_bytes": meter.peak}
