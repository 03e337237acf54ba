"""Binomial broadcast and reduce, and the naive all-reduce, from send/recv: the schedules of
:mod:`commbench.collectives.schedules` run through the comm layer. Shapes: x [*] -> out [*]."""

from __future__ import annotations

import torch

from commbench.collectives._p2p import flat, run_steps
from commbench.collectives.schedules import broadcast_steps, naive_steps, reduce_steps
from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["binomial_broadcast", "binomial_reduce", "naive_all_reduce"]


def binomial_broadcast(comm: Comm, x: torch.Tensor, group: Group, *, root: int = 0) -> torch.Tensor:
    """Every member gets the root's ``x``; the others pass a tensor of the same shape. x [*]."""
    buf = flat(x)
    with comm.ledger.scope("binomial_broadcast"):
        run_steps(comm, buf, group, broadcast_steps(group.size, group.index, buf.numel(), root))
    return buf.reshape(x.shape)


def binomial_reduce(comm: Comm, x: torch.Tensor, group: Group, *, root: int = 0,
                    op: str = "sum") -> torch.Tensor | None:
    """The root gets the reduction of every member's ``x``; the others get None."""
    buf = flat(x)
    with comm.ledger.scope("binomial_reduce"):
        run_steps(comm, buf, group, reduce_steps(group.size, group.index, buf.numel(), root), op)
    return buf.reshape(x.shape) if group.index == root else None


def naive_all_reduce(comm: Comm, x: torch.Tensor, group: Group, *, op: str = "sum") -> torch.Tensor:
    """Reduce to member 0 in member order, then send the result to every member."""
    buf = flat(x)
    with comm.ledger.scope("naive_all_reduce"):
        run_steps(comm, buf, group, naive_steps(group.size, group.index, buf.numel()), op)
    return buf.reshape(x.shape)
