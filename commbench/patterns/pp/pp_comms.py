"""Pipeline parallelism's operators: stages on ranks, activations and gradients sent point to
point (the pattern: pp/pp.py; the config: pp/configs.py).

Each rank runs its schedule (:mod:`commbench.patterns.pp.schedule`). A forward of chunk c on
micro-batch j receives the activation [b/m, h] from chunk c-1's rank (or takes the input), runs
the chunk's layers and sends the result on (sends never block the schedule; when each goes, and
with which receive, is :mod:`commbench.patterns.pp.stage_link`); the last chunk
computes the loss 1/2 * ||y - t||^2. A backward receives dy from chunk c+1's rank (or takes
y - t), runs backward and sends dx back. Gradients of a chunk's layers add up over micro-batches.

With ``checkpoint`` a forward keeps only its input and runs without autograd; the backward runs
the forward again with autograd first (re-materialisation, GPipe §2). ``compute_s`` adds a
synthetic compute time per layer for the whole batch (a micro-batch of b/m rows computes
compute_s/m forward, twice that backward), so that stages of equal compute show the schedule's
bubble whatever the machine, and every schedule does the same total work. On a CPU the host
sleeps; on a GPU the stage's stream runs a kernel of that duration (``torch.cuda._sleep``, its
cycles per second measured once with CUDA events), so that the compute sits on the device
between the stage's sends and receives as a layer's kernels would, and the CUDA events that time
the step and the stage's busy time see it. The naive pipeline is
GPipe with one micro-batch.

Which weights a chunk takes and what happens to its gradients before each backward are parts
(:class:`PPParts`), so broken ones can stand in.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from commbench.patterns.pp.configs import PPConfig
from commbench.patterns.pp.schedule import interleaved_warmup, schedule
from commbench.patterns.pp.stage_link import StageLink, units
from commbench.runtime.group import Group

__all__ = ["PPParts", "chunk_layers", "compute", "last_rank_shifted_layers",
           "no_grad_accumulation", "oracle_pp", "pipeline", "weights_and_data"]

TAG = 9000


def weights_and_data(cfg: PPConfig, seed: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Every layer's weight [h, h], the inputs and the targets [b, h]: float64, on the CPU."""
    g = torch.Generator().manual_seed(seed)
    h = cfg.hidden
    ws = [torch.randn(h, h, generator=g, dtype=torch.float64) * h ** -0.5 for _ in range(cfg.layers)]
    g = torch.Generator().manual_seed(seed + 1)
    x, t = (torch.randn(cfg.batch, h, generator=g, dtype=torch.float64) for _ in range(2))
    return ws, x, t


@functools.cache
def _cycles_per_second(index: int) -> float:
    """GPU ``index``'s clock as ``torch.cuda._sleep`` counts it, timed once with CUDA events."""
    with torch.cuda.device(index):
        torch.cuda._sleep(1000)  # load the kernel
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / (start.elapsed_time(end) / 1e3)


def compute(seconds: float, device: torch.device) -> None:
    """``seconds`` of synthetic compute: the host sleeps on a CPU; on a GPU a kernel of that
    duration runs on the current stream (module docstring)."""
    if seconds <= 0:
        return
    if device.type != "cuda":
        time.sleep(seconds)
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda._sleep(max(1, int(seconds * _cycles_per_second(index))))


def _chunk_forward(x: torch.Tensor, ws: list[torch.Tensor], sleep: float) -> torch.Tensor:
    for w in ws:
        compute(sleep, x.device)
        x = torch.tanh(x @ w.T)
    return x


def oracle_pp(cfg: PPConfig, seed: int) -> dict:
    ws, x, t = weights_and_data(cfg, seed)
    ws = [w.requires_grad_() for w in ws]
    loss = 0.5 * ((_chunk_forward(x, ws, 0) - t) ** 2).sum()
    loss.backward()
    return {"loss": loss.detach(), **{f"dw{k}": w.grad for k, w in enumerate(ws)}}


def chunk_layers(all_w: list[torch.Tensor], c: int, per: int, rank: int, ranks: int) -> list:
    """The weights of chunk ``c``: layers [c per, (c+1) per)."""
    return all_w[c * per:(c + 1) * per]


def keep_accumulating(ws: list[torch.Tensor]) -> None:
    """Before each backward: nothing; a chunk's gradients add up over its micro-batches."""


@dataclass(frozen=True)
class PPParts:
    """The swappable steps of the pipeline."""

    chunk_layers: Callable = chunk_layers
    before_backward: Callable = keep_accumulating


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


class _Busy:
    """The compute time of a rank's steps: the host clock on a CPU, with each computation's
    (start, end) on it (the clock a trace's calls are timed on); on a GPU CUDA events on the
    current stream (the host only queues the kernels, so its clock would time the enqueue)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.seconds, self.events, self.spans = 0.0, [], []

    def start(self):
        if not self.cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def stop(self, mark) -> None:
        if not self.cuda:
            end = time.perf_counter()
            self.seconds += end - mark
            self.spans.append((mark, end))
            return
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self.events.append((mark, ev))

    def total(self) -> float:
        if self.events:
            self.events[-1][1].synchronize()
            self.seconds += sum(a.elapsed_time(b) for a, b in self.events) / 1e3
            self.events = []
        return self.seconds


def pipeline(ctx, cfg: PPConfig, variant: str, data: dict, g: Group, parts: PPParts) -> dict:
    """Run this rank's schedule; its loss share, its layers' gradients, its compute time and
    activation peak."""
    comm, r, p = ctx.comm(), g.index, g.size
    name, m = ("gpipe", 1) if variant == "naive" else (variant, cfg.micro)
    v = cfg.chunks(variant)
    n_chunks = p * v
    per = cfg.layers // n_chunks
    mine = {c: [w.clone().requires_grad_() for w in parts.chunk_layers(data["w"], c, per, r, p)]
            for c in range(r, n_chunks, p)}
    x_all, t_all = data["x"], data["t"]
    bm = cfg.batch // m
    meter, saved, local = _ActivationMeter(), {}, {}
    loss_total = x_all.new_zeros(())
    clock, sleep = _Busy(x_all.device), cfg.compute_s / m
    probe = x_all.new_empty((bm, cfg.hidden))
    forwards = 0  # layer forwards run, re-materialisations included

    def _forward(x: torch.Tensor, c: int) -> torch.Tensor:
        nonlocal forwards
        forwards += len(mine[c])
        return _chunk_forward(x, mine[c], sleep)

    def _send(t: torch.Tensor, dst: int, tag: int) -> None:
        if dst == r:  # chunk boundaries inside this rank (p = 1) need no wire
            local[tag] = t.detach().clone()
        else:
            link.send(t, dst)

    def _recv(k: int, src: int, tag: int) -> torch.Tensor:
        return local.pop(tag) if src == r else link.recv(k)

    steps = schedule(name, p, r, m, v)
    sources = [(c - 1) % p if kind == "F" and c > 0 else
               (c + 1) % p if kind == "B" and c < n_chunks - 1 else r for kind, c, _ in steps]
    grouped = units([kind for kind, _, _ in steps], interleaved_warmup(p, r, m, v)) \
        if name == "interleaved" else None
    link = StageLink(comm, g, probe, TAG, sources, grouped)  # when each message goes: comms.py
    for k, (kind, c, j) in enumerate(steps):
        def tag(boundary: int, backward: bool = False, j: int = j) -> int:  # chunks b, b+1
            return TAG + 2 * (boundary * m + j) + int(backward)
        link.before(k)
        if kind == "F":
            x = x_all[j * bm:(j + 1) * bm] if c == 0 else _recv(k, (c - 1) % p, tag(c - 1))
            x = x.requires_grad_() if c > 0 else x
            s = clock.start()
            if cfg.checkpoint:  # keep only the input
                with torch.no_grad():
                    y = _forward(x, c)
                meter.pack(x)
                saved[c, j] = (x, None, x.numel() * x.element_size())
            else:
                before = meter.now
                with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
                    y = _forward(x, c)
                saved[c, j] = (x, y, meter.now - before)
            clock.stop(s)
            if c < n_chunks - 1:
                _send(y.detach(), (c + 1) % p, tag(c))
            else:
                loss_total = loss_total + 0.5 * ((y.detach() - t_all[j * bm:(j + 1) * bm]) ** 2).sum()
        else:
            x, y, nbytes = saved.pop((c, j))
            grad_in = None if c == n_chunks - 1 else _recv(k, (c + 1) % p, tag(c, True))
            s = clock.start()
            if cfg.checkpoint:  # re-materialise the chunk's activations, then backward
                with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
                    before = meter.now
                    y = _forward(x, c)
                    nbytes += meter.now - before
            compute(2 * sleep * per, x.device)
            dy = (y.detach() - t_all[j * bm:(j + 1) * bm]) if grad_in is None else grad_in
            parts.before_backward(mine[c])
            y.backward(dy)
            meter.free(nbytes)
            clock.stop(s)
            if c > 0:
                _send(x.grad, (c - 1) % p, tag(c - 1, True))
        link.after(k)
    link.finish()
    return {"loss": loss_total,
            **{f"dw{c * per + k}": w.grad for c, ws in mine.items() for k, w in enumerate(ws)},
            "stats": {"busy_s": clock.total(), "compute_spans": clock.spans or None,
                      "peak_activation_bytes": meter.peak,
                      "layer_forwards": forwards}}


# -- broken parts: each a bug class the contract must catch ----------------------------------
def last_rank_shifted_layers(all_w, c: int, per: int, rank: int, ranks: int) -> list:
    """The last rank takes its chunk's weights one layer too late (a wrong split of the model)."""
    shift = 1 if rank == ranks - 1 else 0
    return (all_w[c * per + shift:(c + 1) * per + shift] + all_w)[:per]


def no_grad_accumulation(ws) -> None:
    """Each backward starts from zero gradients: only the last micro-batch's gradient is kept."""
    for w in ws:
        w.grad = None
