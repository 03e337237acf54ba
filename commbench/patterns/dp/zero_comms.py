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

Where a rank's chunk starts, how stage 2 keeps its gradient chunk and how stage 3 takes the
prefetched parameters are parts (:class:`ZeroParts`), so broken ones can stand in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from commbench.patterns.dp.configs import ZeroConfig, flat_size
from commbench.patterns.dp.zero_model import Adam
from commbench.runtime.group import Group
from commbench.wire.comm import Comm
from commbench.wire.dtypes import DTYPES

__all__ = ["ZeroParts", "chunk_start_off_by_one", "forward_zero3", "gather_params",
           "gather_params_twice", "gathered", "local_grad_slice", "stale_prefetch", "train"]


def reduce_scattered(grad: torch.Tensor, comm: Comm, group: Group, c: int) -> torch.Tensor:
    """The whole parameter's gradient [numel] -> this rank's chunk, summed over the group."""
    padded = grad.new_zeros(group.size * -(-grad.numel() // group.size))
    padded[: grad.numel()] = grad
    return comm.reduce_scatter(padded, group)


class _Gathered(torch.autograd.Function):
    @staticmethod
    def forward(ctx, chunk, numel, comm, group, back):
        ctx.comm, ctx.group, ctx.c, ctx.back = comm, group, chunk.numel(), back
        return comm.all_gather(chunk, group)[:numel]

    @staticmethod
    def backward(ctx, grad):
        return ctx.back(grad, ctx.comm, ctx.group, ctx.c), None, None, None, None


def gathered(chunk: torch.Tensor, numel: int, comm: Comm, group: Group,
             back=reduce_scattered) -> torch.Tensor:
    """ZeRO-3 for any layer: this rank's chunk [c] -> the whole flat parameter [numel], all-gathered
    just before use; backward reduce-scatters its gradient back to [c]. A layer that views the
    result as its weights (``w = gathered(...)[: h*h].view(h, h)``) is ZeRO-3 sharded; the
    Ulysses + ZeRO-3 combination gathers its projections this way. ``back(grad, comm, group,
    c)``: the chunk's gradient from the whole one (a broken variant's differs)."""
    return _Gathered.apply(chunk, numel, comm, group, back)


def chunk_start(r: int, c: int, P: int) -> int:
    """Where member ``r``'s chunk of ``c`` elements starts in a padded flat vector."""
    return r * c


def reduce_scatter_grad(grad: torch.Tensor, comm: Comm, group: Group) -> torch.Tensor:
    """Stage 2's hook: this rank's chunk of the gradient summed over the group."""
    return comm.reduce_scatter(grad, group)


def gather_params(comm: Comm, shard: torch.Tensor, group: Group) -> torch.Tensor:
    """Stages 1 and 2 after the step: every rank's updated shard, all-gathered."""
    return comm.all_gather(shard, group)


def take_prefetched(pending, k: int, cache: list) -> torch.Tensor | None:
    """Stage 3: the parameters of layer ``k`` from the gather posted one layer earlier."""
    return pending.wait() if pending is not None else None


@dataclass(frozen=True)
class ZeroParts:
    """The swappable steps of ZeRO."""

    chunk_start: Callable = chunk_start
    grad_shard: Callable = reduce_scatter_grad
    take_prefetched: Callable = take_prefetched
    gather_params: Callable = gather_params


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
        grad = full.new_zeros(full.shape, dtype=ctx.acc.dtype)
        grad[: h * h] = dw.reshape(-1)
        grad[h * h: h * h + h] = db
        ctx.acc.add_(comm.reduce_scatter(grad, group))
        return dx, None, None, None, None, None, None


def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def train(ctx, cfg: ZeroConfig, stage: int, data: dict, group: Group, parts: ZeroParts) -> dict:
    """``cfg.steps`` Adam steps from ``data`` (the layers' flat initial vectors, padded, and the
    batches); this rank's master weights (its chunk, or all of them for DDP) and the bytes it
    held in parameters, gradients and optimizer states."""
    comm, g = ctx.comm(), group
    P, r = g.size, g.index
    cdt = DTYPES[cfg.dtype]
    mdt = torch.float32 if cfg.mixed else cdt
    _, padded = flat_size(cfg, P)
    c = padded // P
    off = parts.chunk_start(r, c, P)
    full0 = data["layers"]
    if stage == 0:
        master = [f.to(mdt) for f in full0]
    else:
        master = [torch.roll(f, -off)[:c].to(mdt).clone() for f in full0]
    opt = Adam(master, cfg.lr)
    params = [f.to(cdt, copy=True) for f in full0] if stage < 3 else \
        [m.to(cdt, copy=True) for m in master]
    bl = cfg.batch // P
    cache: list = []
    memory: dict = {}
    for step in range(cfg.steps):
        acc = [f.new_zeros(padded if stage < 2 else c, dtype=mdt) for f in master]
        for mb in range(cfg.micro):
            x, t = (v[r * bl:(r + 1) * bl].to(cdt) for v in data["batches"][step][mb])
            if stage < 3:
                y = _forward_full(params, acc, x, cfg, stage, comm, g, parts)
            else:
                y = forward_zero3(params, acc, x, cfg, comm, g, parts, cache)
            (0.5 * ((y - t) ** 2).sum()).backward()
        # master weights count as optimizer state only under mixed precision; otherwise they
        # are the parameters themselves (or, sharded, the chunk a rank updates of them)
        memory = {"params": _nbytes(params), "grads": _nbytes(acc),
                  "optimizer": opt.nbytes() + (_nbytes(master) if cfg.mixed else 0)}
        _update(stage, comm, g, opt, acc, master, params, cdt, parts)
    return {**{f"w{k}": m for k, m in enumerate(master)}, "stats": {"memory": memory}}


def _forward_full(params, acc, x, cfg: ZeroConfig, stage: int, comm: Comm, g: Group, parts):
    """Stages 0-2: the whole parameters are here; stage 2 reduce-scatters in backward hooks."""
    h = cfg.hidden
    leaves = [p.detach().requires_grad_() for p in params]
    for k, leaf in enumerate(leaves):
        if stage == 2:
            def hook(p, k=k):
                grad = p.grad.to(acc[k].dtype)  # reduced in fp32 under mixed precision
                acc[k].add_(parts.grad_shard(grad, comm, g).to(acc[k].dtype))
                p.grad = None  # only the chunk is kept
            leaf.register_post_accumulate_grad_hook(hook)
        else:
            def keep(p, k=k):
                acc[k].add_(p.grad.to(acc[k].dtype))
            leaf.register_post_accumulate_grad_hook(keep)
    for f in leaves:
        x = torch.tanh(x @ f[: h * h].view(h, h).T + f[h * h: h * h + h])
    return x


def forward_zero3(chunks, acc, x, cfg: ZeroConfig, comm: Comm, g: Group, parts, cache: list):
    """Stage 3's forward over this rank's chunks [c] of every layer on ``g`` (each gathered
    before use, the next one prefetched); backward adds each layer's reduce-scattered gradient
    chunk to ``acc``."""
    h = cfg.hidden
    x = x.requires_grad_()  # so that backward reaches every layer's function
    pending = comm.all_gather_async(chunks[0], g) if cfg.prefetch else None
    for k, chunk in enumerate(chunks):
        full = parts.take_prefetched(pending, k, cache)
        pending = comm.all_gather_async(chunks[k + 1], g) \
            if cfg.prefetch and k + 1 < len(chunks) else None
        x = _Zero3Layer.apply(x, chunk, full, acc[k], comm, g, h)
    return x


def _update(stage: int, comm: Comm, g: Group, opt: Adam, acc, master, params, cdt, parts):
    if stage == 0:
        opt.step([comm.all_reduce(a, g) for a in acc])
        for p, m in zip(params, master):
            p.copy_(m.to(cdt))
    elif stage == 1:
        opt.step([comm.reduce_scatter(a, g) for a in acc])
        for p, m in zip(params, master):
            p.copy_(parts.gather_params(comm, m.to(cdt), g))
    elif stage == 2:
        opt.step(acc)
        for p, m in zip(params, master):
            p.copy_(parts.gather_params(comm, m.to(cdt), g))
    else:
        opt.step(acc)
        for p, m in zip(params, master):
            p.copy_(m.to(cdt))


# -- broken parts: each a bug class the contract must catch ----------------------------------
def gather_params_twice(comm: Comm, shard: torch.Tensor, group: Group) -> torch.Tensor:
    """The updated parameters all-gathered, then gathered again (a refresh left in after a
    refactor): the same values, one all-gather per layer more than the stage moves."""
    comm.all_gather(shard, group)
    return comm.all_gather(shard, group)


def chunk_start_off_by_one(r: int, c: int, P: int) -> int:
    """ZeRO's chunk of a rank one element too far: each rank updates its neighbour's first
    element as its own last."""
    return r * c + (1 if P > 1 else 0)


def local_grad_slice(grad, comm, group):
    """Stage 2 keeping its slice of its own gradient, never reduce-scattered over the group."""
    return grad.view(group.size, -1)[group.index].clone()


def stale_prefetch(pending, k: int, cache: list):
    """Stage 3 that keeps the first gather it ever made of each layer: the parameters of later
    steps are the initial ones."""
    full = pending.wait() if pending is not None else None
    if len(cache) <= k:
        cache.append(full)
    return cache[k]
