"""ZeRO-1/2/3 (Rajbhandari et al. 2020, arXiv:1910.02054 §5, §7) against DDP, on P data ranks.

Per layer flat vector (``zero_model``), padded to a multiple of P; rank r owns chunk r.

* stage 0, DDP: all-reduce each layer's gradient once per step; every rank keeps everything.
* stage 1 (P_os): Adam moments and master weights of chunk r only. Per step: reduce-scatter each
  layer's accumulated gradient, update the chunk, all-gather the updated parameters.
* stage 2 (P_os+g): as stage 1, but each layer's gradient is reduce-scattered as soon as backward
  produces it (a post-accumulate hook), in every micro-batch; a rank keeps only its gradient chunk.
* stage 3 (P_os+g+p): parameters sharded too. Each layer all-gathers its parameters just before
  its forward (the next layer's gather is started first: prefetch), drops them after use,
  gathers them again in backward and reduce-scatters its gradient there, every micro-batch.

Bytes per rank per step, Psi = padded elements of all layers, m micro-batches, P ranks:
DDP 2(P-1)/P*Psi; ZeRO-1 the same (RS + AG); ZeRO-2 (m+1)(P-1)/P*Psi; ZeRO-3 3m(P-1)/P*Psi.
"""

from __future__ import annotations

import time

import torch

from commbench.patterns.zero_model import DTYPES, Adam, ZeroConfig, batch, flat_size, init_layers
from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["gathered", "predicted_calls", "train"]


class _Gathered(torch.autograd.Function):
    @staticmethod
    def forward(ctx, chunk, numel, comm, group):
        ctx.comm, ctx.group = comm, group
        return comm.all_gather(chunk, group)[:numel]

    @staticmethod
    def backward(ctx, grad):
        comm, group = ctx.comm, ctx.group
        padded = grad.new_zeros(group.size * -(-grad.numel() // group.size))
        padded[: grad.numel()] = grad
        return comm.reduce_scatter(padded, group), None, None, None


def gathered(chunk: torch.Tensor, numel: int, comm: Comm, group: Group) -> torch.Tensor:
    """ZeRO-3 for any layer: this rank's chunk [c] -> the whole flat parameter [numel], all-gathered
    just before use; backward reduce-scatters its gradient back to [c]. A layer that views the
    result as its weights (``w = gathered(...)[: h*h].view(h, h)``) is ZeRO-3 sharded; the
    Ulysses + ZeRO-3 combination gathers its projections this way."""
    return _Gathered.apply(chunk, numel, comm, group)


def predicted_calls(cfg: ZeroConfig, P: int) -> list[tuple[str, int]]:
    """(op, elements per call) on the DP group for the whole run, as a multiset."""
    _, padded = flat_size(cfg, P)
    c, L, m = padded // P, cfg.layers, cfg.micro
    per_step = {0: [("all_reduce", padded)] * L,
                1: [("reduce_scatter", padded)] * L + [("all_gather", c)] * L,
                2: [("reduce_scatter", padded)] * (m * L) + [("all_gather", c)] * L,
                3: [("all_gather", c)] * (2 * m * L) + [("reduce_scatter", padded)] * (m * L)}
    return per_step[cfg.stage] * cfg.steps


class _Zero3Layer(torch.autograd.Function):
    """y = tanh(x W^T + b) with W, b gathered from this rank's chunk; x [b, h] -> y [b, h].

    Backward adds the reduce-scattered gradient chunk, reduced in the accumulator's dtype (fp32
    under mixed precision), to ``acc``, and returns none for the chunk itself."""

    @staticmethod
    def forward(ctx, x, chunk, gathered, acc, comm, group, h):
        full = gathered if gathered is not None else comm.all_gather(chunk, group)
        y = torch.tanh(x @ full[: h * h].view(h, h).T + full[h * h: h * h + h])
        ctx.save_for_backward(x, y, chunk)
        ctx.acc, ctx.comm, ctx.group, ctx.h = acc, comm, group, h
        return y  # ``full`` is dropped here: only the chunk stays

    @staticmethod
    def backward(ctx, dy):
        x, _, chunk = ctx.saved_tensors
        h, comm, group = ctx.h, ctx.comm, ctx.group
        full = comm.all_gather(chunk, group)  # gathered again: it was released after forward
        with torch.enable_grad():  # the layer again, by autograd: the same roundings as unsharded
            xd, w, b = (t.detach().requires_grad_() for t in
                        (x, full[: h * h].view(h, h), full[h * h: h * h + h]))
            dx, dw, db = torch.autograd.grad(torch.tanh(xd @ w.T + b), (xd, w, b), dy)
        grad = torch.zeros(full.shape, dtype=ctx.acc.dtype)
        grad[: h * h] = dw.reshape(-1)
        grad[h * h: h * h + h] = db
        ctx.acc.add_(comm.reduce_scatter(grad, group))
        return dx, None, None, None, None, None, None


def _pad(f: torch.Tensor, padded: int) -> torch.Tensor:
    return torch.cat([f, f.new_zeros(padded - f.numel())])


def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def train(ctx, cfg: ZeroConfig, seed: int, prefetch: bool = True, mutant: str | None = None):
    """Train ``cfg.steps`` steps; every rank returns the full final master weights (float64), the
    ledger of the steps, and the bytes it held in parameters, gradients and optimizer states."""
    cfg.validate(ctx.size)
    comm, g = ctx.comm(), ctx.world
    P, r = g.size, g.index
    cdt = DTYPES[cfg.dtype]
    mdt = torch.float32 if cfg.mixed else cdt
    n, padded = flat_size(cfg, P)
    c = padded // P
    off = r * c + (1 if mutant == "shard_off_by_one" and P > 1 else 0)
    full0 = [_pad(f, padded) for f in init_layers(cfg, seed)]
    if cfg.stage == 0:
        master = [f.to(mdt) for f in full0]
    else:
        master = [torch.roll(f, -off)[:c].to(mdt).clone() for f in full0]
    opt = Adam(master, cfg.lr)
    params = [f.to(cdt, copy=True) for f in full0] if cfg.stage < 3 else \
        [m.to(cdt, copy=True) for m in master]
    bl = cfg.batch // P
    stale: list = []
    memory = {"params": 0, "grads": 0, "optimizer": 0}
    comm.backend.barrier(g)
    t0 = time.perf_counter()
    step_times: list[float] = []
    with ctx.ledger.capture() as cap:
        for step in range(cfg.steps):
            ts = time.perf_counter()
            acc = [torch.zeros(padded if cfg.stage < 2 else c, dtype=mdt) for _ in master]
            for mb in range(cfg.micro):
                x, t = (v[r * bl:(r + 1) * bl].to(cdt) for v in batch(cfg, seed, step, mb))
                if cfg.stage < 3:
                    y = _forward_full(params, acc, x, cfg, comm, g, mutant)
                else:
                    y = _forward_zero3(params, acc, x, cfg, comm, g, prefetch, stale, mutant)
                (0.5 * ((y - t) ** 2).sum()).backward()
            # master weights count as optimizer state only under mixed precision; otherwise they
            # are the parameters themselves (or, sharded, the chunk a rank updates of them)
            memory = {"params": _nbytes(params), "grads": _nbytes(acc),
                      "optimizer": opt.nbytes() + (_nbytes(master) if cfg.mixed else 0)}
            _update(cfg, comm, g, opt, acc, master, params, cdt, mutant)
            step_times.append(time.perf_counter() - ts)
    seconds = time.perf_counter() - t0
    final = [m.double() for m in master] if cfg.stage == 0 else \
        [comm.all_gather(m, g).double() for m in master]  # harness: outside the ledger capture
    return {"params": [f[:n] for f in final], "ledger": [(e.op, e.count, e.sent, e.recv)
                                                         for e in cap.entries],
            "memory": memory, "padded": padded, "step_s": seconds / cfg.steps,
            "step_times": step_times}


def _forward_full(params, acc, x, cfg: ZeroConfig, comm: Comm, g: Group, mutant):
    """Stages 0-2: the whole parameters are here; stage 2 reduce-scatters in backward hooks."""
    h = cfg.hidden
    leaves = [p.detach().requires_grad_() for p in params]
    for k, leaf in enumerate(leaves):
        if cfg.stage == 2:
            def hook(p, k=k):
                grad = p.grad.to(acc[k].dtype)  # reduced in fp32 under mixed precision
                shard = grad if mutant == "no_reduce_scatter" else comm.reduce_scatter(grad, g)
                if mutant == "no_reduce_scatter":
                    shard = shard.view(g.size, -1)[g.index]
                acc[k].add_(shard.to(acc[k].dtype))
                p.grad = None  # only the chunk is kept
            leaf.register_post_accumulate_grad_hook(hook)
        else:
            def keep(p, k=k):
                acc[k].add_(p.grad.to(acc[k].dtype))
            leaf.register_post_accumulate_grad_hook(keep)
    for f in leaves:
        x = torch.tanh(x @ f[: h * h].view(h, h).T + f[h * h: h * h + h])
    return x


def _forward_zero3(chunks, acc, x, cfg: ZeroConfig, comm: Comm, g: Group, prefetch: bool,
                   stale: list, mutant):
    h = cfg.hidden
    x = x.requires_grad_()  # so that backward reaches every layer's function
    pending = comm.all_gather_async(chunks[0], g) if prefetch else None
    for k, chunk in enumerate(chunks):
        gathered = pending.wait() if pending is not None else None
        if mutant == "stale_prefetch":  # keeps the first gather it ever made
            if len(stale) <= k:
                stale.append(gathered)
            gathered = stale[k]
        pending = comm.all_gather_async(chunks[k + 1], g) \
            if prefetch and k + 1 < len(chunks) else None
        x = _Zero3Layer.apply(x, chunk, gathered, acc[k], comm, g, h)
    return x


def _update(cfg: ZeroConfig, comm: Comm, g: Group, opt: Adam, acc, master, params, cdt, mutant):
    if cfg.stage == 0:
        opt.step([comm.all_reduce(a, g) for a in acc])
        for p, m in zip(params, master):
            p.copy_(m.to(cdt))
    elif cfg.stage == 1:
        opt.step([comm.reduce_scatter(a, g) for a in acc])
        for p, m in zip(params, master):
            p.copy_(comm.all_gather(m.to(cdt), g))
    elif cfg.stage == 2:
        opt.step(acc)
        for p, m in zip(params, master):
            p.copy_(comm.all_gather(m.to(cdt), g))
    else:
        opt.step(acc)
        for p, m in zip(params, master):
            p.copy_(m.to(cdt))
