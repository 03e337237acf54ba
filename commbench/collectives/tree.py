"""Binomial trees (broadcast, reduce) and the naive all-reduce, from send/recv: their schedules,
written once as step lists, and their records (bytes counted from the schedules); the send/recv
code, :mod:`commbench.collectives.tree_comms`, runs the same schedules.

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

from commbench.collectives.algorithm import Algorithm, Step, traffic
from commbench.collectives.blocks import tree_children
from commbench.ops import lg, split_sizes

__all__ = ["RECORDS", "broadcast_steps", "naive_steps", "reduce_steps"]


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


def broadcast_steps(n: int, i: int, count: int, root: int = 0) -> list[Step]:
    """The binomial broadcast as member i's steps: receive from the parent, then send to each
    child, the farthest subtree first (it has the most rounds left)."""
    parent, children = tree_children(n, (i - root) % n)
    whole = (0, count)
    out = [] if parent is None else [Step(recv=whole, src=(parent + root) % n)]
    return out + [Step(send=whole, dst=(c + root) % n) for c in reversed(children)]


def reduce_steps(n: int, i: int, count: int, root: int = 0) -> list[Step]:
    """The binomial reduce as member i's steps: combine each child's partial result, then send
    to the parent; the root divides at the end (op avg)."""
    parent, children = tree_children(n, (i - root) % n)
    whole = (0, count)
    out = [Step(recv=whole, src=(c + root) % n, reduce=True) for c in children]
    return out + [Step(avg=whole) if parent is None else Step(send=whole, dst=(parent + root) % n)]


def _naive_elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
    return traffic(naive_steps(n, i, count))


def _tree_elements(steps):
    def elements(n: int, i: int, count: int, root: int = 0, **kw) -> tuple[int, int]:
        return traffic(steps(n, i, count, root))
    return elements


RECORDS = (
    Algorithm("all_reduce", "naive", "tree_comms:naive_all_reduce", _naive_elements,
              lambda n, S: (2 * (n - 1), 2 * (n - 1) * S, (n - 1) * S), steps=naive_steps),
    Algorithm("broadcast", "binomial", "tree_comms:binomial_broadcast", _tree_elements(broadcast_steps),
              lambda n, S: (lg(n), lg(n) * S, 0.0)),
    Algorithm("reduce", "binomial", "tree_comms:binomial_reduce", _tree_elements(reduce_steps),
              lambda n, S: (lg(n), lg(n) * S, lg(n) * S)),
)
