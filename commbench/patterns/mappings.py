"""Megatron's tensor- and sequence-parallel operators as autograd functions over the comm layer.

Shoeybi et al. 2019 (Megatron-LM, arXiv:1909.08053) §3 names the pair:

* ``f`` (:func:`copy_to_tp`): identity forward, all-reduce of the gradient backward; it stands
  before a column-parallel linear, whose input every rank holds whole.
* ``g`` (:func:`reduce_from_tp`): all-reduce forward, identity backward; it stands after a
  row-parallel linear, whose outputs are partial sums.

Korthikanti et al. 2022 (arXiv:2205.05198) §4.2.2 replace them under sequence parallelism:

* :func:`gather_from_sp` (``g`` bar in the paper): all-gather along the sequence forward,
  reduce-scatter of the gradient backward;
* :func:`reduce_scatter_to_sp` (``g``): reduce-scatter along the sequence forward, all-gather of the
  gradient backward.

And the last-dimension pair used around column/row outputs: :func:`scatter_to_tp` (keep this rank's
slice forward, all-gather backward) and :func:`gather_from_tp` (all-gather forward, keep the slice
backward). Shapes use P for the TP group size: x [b, s, h] whole, [b, s/P, h] sequence-sharded,
[b, s, h/P] last-dim-sharded. Every op with P = 1 passes its input through untouched.
"""

from __future__ import annotations

import torch

from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["copy_to_tp", "gather_from_sp", "gather_from_tp", "reduce_from_tp",
           "reduce_scatter_to_sp", "scatter_to_tp"]


def _ag(comm: Comm, x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
    """All-gather along ``dim``: [.., d, ..] -> [.., P*d, ..]."""
    front = x.movedim(dim, 0).contiguous()
    return comm.all_gather(front, group).movedim(0, dim)


def _rs(comm: Comm, x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
    """Sum over ``group``, keep this rank's block of ``dim``: [.., P*d, ..] -> [.., d, ..]."""
    if x.shape[dim] % group.size:
        raise ValueError(f"reduce-scatter along dim {dim}: size {x.shape[dim]} is not a multiple "
                         f"of the group size {group.size}")
    front = x.movedim(dim, 0).contiguous()
    return comm.reduce_scatter(front, group).movedim(0, dim)


def _slice(x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
    if x.shape[dim] % group.size:
        raise ValueError(f"split along dim {dim}: size {x.shape[dim]} is not a multiple of the "
                         f"group size {group.size}")
    return x.chunk(group.size, dim)[group.index].contiguous()


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, group):
        ctx.comm, ctx.group = comm, group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return ctx.comm.all_reduce(dy.contiguous(), ctx.group), None, None


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, group):
        return comm.all_reduce(x.contiguous(), group)

    @staticmethod
    def backward(ctx, dy):
        return dy, None, None


class _GatherSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, group, dim):
        ctx.comm, ctx.group, ctx.dim = comm, group, dim
        return _ag(comm, x, group, dim)

    @staticmethod
    def backward(ctx, dy):
        return _rs(ctx.comm, dy, ctx.group, ctx.dim), None, None, None


class _ReduceScatterSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, group, dim):
        ctx.comm, ctx.group, ctx.dim = comm, group, dim
        return _rs(comm, x, group, dim)

    @staticmethod
    def backward(ctx, dy):
        return _ag(ctx.comm, dy, ctx.group, ctx.dim), None, None, None


class _ScatterTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, group, dim):
        ctx.comm, ctx.group, ctx.dim = comm, group, dim
        return _slice(x, group, dim)

    @staticmethod
    def backward(ctx, dy):
        return _ag(ctx.comm, dy, ctx.group, ctx.dim), None, None, None


class _GatherTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, group, dim):
        ctx.group, ctx.dim = group, dim
        return _ag(comm, x, group, dim)

    @staticmethod
    def backward(ctx, dy):
        return _slice(dy, ctx.group, ctx.dim), None, None, None


def copy_to_tp(x: torch.Tensor, comm: Comm, group: Group) -> torch.Tensor:
    """Megatron's f: x [*] -> x; backward all-reduces the gradient over ``group``."""
    return x if group.size == 1 else _Copy.apply(x, comm, group)


def reduce_from_tp(x: torch.Tensor, comm: Comm, group: Group) -> torch.Tensor:
    """Megatron's g: partial sums [*] -> their all-reduce; backward passes the gradient on."""
    return x if group.size == 1 else _Reduce.apply(x, comm, group)


def gather_from_sp(x: torch.Tensor, comm: Comm, group: Group, dim: int = 1) -> torch.Tensor:
    """SP all-gather: x [b, s/P, h] -> [b, s, h]; backward reduce-scatters the gradient."""
    return x if group.size == 1 else _GatherSP.apply(x, comm, group, dim)


def reduce_scatter_to_sp(x: torch.Tensor, comm: Comm, group: Group, dim: int = 1) -> torch.Tensor:
    """SP reduce-scatter: partial x [b, s, h] -> summed [b, s/P, h]; backward all-gathers."""
    return x if group.size == 1 else _ReduceScatterSP.apply(x, comm, group, dim)


def scatter_to_tp(x: torch.Tensor, comm: Comm, group: Group, dim: int = -1) -> torch.Tensor:
    """Keep this rank's slice of ``dim`` (default the last): [.., h] -> [.., h/P]; backward
    all-gathers (DeepSpeed's ``drop_tokens`` along the capacity dim)."""
    return x if group.size == 1 else _ScatterTP.apply(x, comm, group, dim)


def gather_from_tp(x: torch.Tensor, comm: Comm, group: Group, dim: int = -1) -> torch.Tensor:
    """All-gather ``dim`` (default the last): [.., h/P] -> [.., h]; backward keeps this rank's
    slice (DeepSpeed's ``gather_tokens``)."""
    return x if group.size == 1 else _GatherTP.apply(x, comm, group, dim)
