"""Binomial broadcast and reduce, and the naive all-reduce, from send/recv (records and the
tree: :mod:`commbench.collectives.tree`). Shapes: x [*] -> out [*]."""

from __future__ import annotations

import torch

from commbench.collectives._p2p import combine, exchange, finish_avg, flat
from commbench.collectives.blocks import tree_children
from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["binomial_broadcast", "binomial_reduce", "naive_all_reduce"]


def binomial_broadcast(comm: Comm, x: torch.Tensor, group: Group, *, root: int = 0) -> torch.Tensor:
    """Every member gets the root's ``x``; the others pass a tensor of the same shape. x [*]."""
    n, buf = group.size, flat(x)
    v = (group.index - root) % n
    parent, children = tree_children(n, v)
    with comm.ledger.scope("binomial_broadcast"):
        if parent is not None:
            buf = exchange(comm, None, None, buf, (parent + root) % n, group)
        for c in reversed(children):  # farthest subtree first: it has the most rounds left
            exchange(comm, buf, (c + root) % n, None, None, group)
    return buf.reshape(x.shape)


def binomial_reduce(comm: Comm, x: torch.Tensor, group: Group, *, root: int = 0,
                    op: str = "sum") -> torch.Tensor | None:
    """The root gets the reduction of every member's ``x``; the others get None."""
    n, buf = group.size, flat(x)
    v = (group.index - root) % n
    parent, children = tree_children(n, v)
    with comm.ledger.scope("binomial_reduce"):
        for c in children:
            got = exchange(comm, None, None, buf, (c + root) % n, group)
            buf = combine(got, buf, op)
        if parent is not None:
            exchange(comm, buf, (parent + root) % n, None, None, group)
            return None
    return finish_avg(buf, op, n).reshape(x.shape)


def naive_all_reduce(comm: Comm, x: torch.Tensor, group: Group, *, op: str = "sum") -> torch.Tensor:
    """Reduce to member 0 in member order, then send the result to every member."""
    n, buf = group.size, flat(x)
    with comm.ledger.scope("naive_all_reduce"):
        if group.index == 0:
            parts = [buf] + [exchange(comm, None, None, buf, j, group) for j in range(1, n)]
            acc = parts[0]
            for part in parts[1:]:
                acc = combine(acc, part, op)
            finish_avg(acc, op, n)
            for j in range(1, n):
                exchange(comm, acc, j, None, None, group)
            buf = acc
        else:
            exchange(comm, buf, 0, None, None, group)
            buf = exchange(comm, None, None, buf, 0, group)
    return buf.reshape(x.shape)
