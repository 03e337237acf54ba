"""Binomial trees (broadcast, reduce) and the naive all-reduce, from send/recv: their records
(bytes counted from their schedules, written once in :mod:`commbench.collectives.schedules`);
the send/recv code, :mod:`commbench.collectives.tree_comms`, runs the same schedules.

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

from commbench.collectives.algorithm import Algorithm, traffic
from commbench.collectives.schedules import broadcast_steps, naive_steps, reduce_steps
from commbench.ops import lg

__all__ = ["RECORDS"]


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
