"""Binomial trees (broadcast, reduce) and the naive all-reduce, from send/recv: their records,
the tree both directions share and the naive all-reduce's step list; the send/recv code is
:mod:`commbench.collectives.tree_comms`.

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

from commbench.collectives.algorithm import Algorithm, Step
from commbench.collectives.blocks import tree_children
from commbench.ops import lg, split_sizes

__all__ = ["RECORDS", "naive_steps"]


def naive_steps(n: int, i: int, count: int, split=split_sizes) -> list[Step]:
    """The naive all-reduce as member i's steps: member 0 combines every vector in member order,
    then sends the result to every member (:func:`~.tree_comms.naive_all_reduce`). Its receives
    are posted together, one scratch block each, and so are its sends: gloo sends only once the
    receiver has posted (a rendezvous), so receives posted one after another cost a round trip
    each (docs/decisions.md)."""
    whole = (0, count)
    if n == 1:
        return [Step(avg=whole)]
    if i:
        return [Step(send=whole, dst=0), Step(recv=whole, src=0)]
    return ([Step(recv=whole, src=j, reduce=True, slot=j - 1, joint=j < n - 1)
             for j in range(1, n)] + [Step(avg=whole)]
            + [Step(send=whole, dst=j, joint=j < n - 1) for j in range(1, n)])


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
    Algorithm("all_reduce", "naive", "tree_comms:naive_all_reduce", _naive_elements,
              lambda n, S: (2 * (n - 1), 2 * (n - 1) * S, (n - 1) * S), steps=naive_steps),
    Algorithm("broadcast", "binomial", "tree_comms:binomial_broadcast", _tree_elements("broadcast"),
              lambda n, S: (lg(n), lg(n) * S, 0.0)),
    Algorithm("reduce", "binomial", "tree_comms:binomial_reduce", _tree_elements("reduce"),
              lambda n, S: (lg(n), lg(n) * S, lg(n) * S)),
)
