"""Binomial trees (broadcast, reduce) and the naive all-reduce, from send/recv.

Binomial tree over members relative to the root, v = (i - root) mod P: in broadcast, v receives
from v - lowbit(v) and then sends to v + m for each power of two m below lowbit(v) (the root to
every power of two), so the data reaches all members in ceil(log2 P) rounds; reduce runs the same
tree backwards, each member combining its children's partial results before sending to its parent.
Every non-root member receives (broadcast) or sends (reduce) S once; a member with c children moves
c * S the other way.

The naive all-reduce is what a newcomer writes: every member sends its vector to member 0, which
reduces them in member order and sends the result back to each: (P-1) * S in and out of member 0.
"""

from __future__ import annotations

import torch

from commbench.collectives._p2p import combine, exchange, finish_avg, flat
from commbench.collectives.algorithm import Algorithm
from commbench.runtime.group import Group
from commbench.wire.comm import Comm
from commbench.wire.ops import lg

__all__ = ["RECORDS", "binomial_broadcast", "binomial_reduce", "naive_all_reduce", "tree_children"]


def tree_children(n: int, v: int) -> tuple[int | None, list[int]]:
    """(parent, children) of relative member v in the binomial tree of n members."""
    low = v & -v if v else 1 << n.bit_length()
    parent = v - low if v else None
    children, m = [], 1
    while m < low and v + m < n:
        children.append(v + m)
        m <<= 1
    return parent, children


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


def _naive_elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
    moved = (n - 1) * count if i == 0 else (count if n > 1 else 0)
    return moved, moved


def _tree_elements(op: str):
    def elements(n: int, i: int, count: int, root: int = 0, **kw) -> tuple[int, int]:
        parent, children = tree_children(n, (i - root) % n)
        down, up = len(children) * count, (count if parent is not None else 0)
        return (down, up) if op == "broadcast" else (up, down)
    return elements


RECORDS = (
    Algorithm("all_reduce", "naive", naive_all_reduce, _naive_elements,
              lambda n, S: (2 * (n - 1), 2 * (n - 1) * S, (n - 1) * S)),
    Algorithm("broadcast", "binomial", binomial_broadcast, _tree_elements("broadcast"),
              lambda n, S: (lg(n), lg(n) * S, 0.0)),
    Algorithm("reduce", "binomial", binomial_reduce, _tree_elements("reduce"),
              lambda n, S: (lg(n), lg(n) * S, lg(n) * S)),
)
