"""Recursive doubling and Rabenseifner's all-reduce, for any group size: their records (bytes
counted from their schedules, written once in :mod:`commbench.collectives.schedules`); the
send/recv code, :mod:`commbench.collectives.doubling_comms`, runs the same schedules.

Non-powers of two (Thakur, Rabenseifner and Gropp 2005, as MPICH does it): with p the largest power
of two <= P and r = P - p, the first 2r members pair up; each even one sends its whole vector to
its odd neighbour and sits out, leaving p active members numbered ``new = i // 2`` (i < 2r) or
``i - r``; at the end each odd one sends the result back to its even neighbour.

* recursive doubling: log2(p) steps; at distance d the active members ``new`` and ``new ^ d``
  exchange their whole vectors and both combine. Every member moves log2(p) * S each way (plus S
  for the fold): fewest steps, most bytes; the small-message algorithm.
* Rabenseifner: recursive halving reduce-scatter (at distance d = p/2, p/4, ..., 1, keep the half of
  the current block range on this side of ``new``'s bit, send the other half), then recursive
  doubling all-gather back up. Each active member moves about 2(p-1)/p * S: the large-message one.

Blocks are the p chunks of :func:`commbench.ops.split_sizes`, so any count works.
Shapes: x [*] -> out [*], the same on every member.
"""

from __future__ import annotations

from commbench.collectives.algorithm import Algorithm, traffic
from commbench.collectives.schedules import doubling_steps, rabenseifner_steps

__all__ = ["RECORDS"]


def _rd_elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
    return traffic(doubling_steps(n, i, count))


def _rab_elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
    return traffic(rabenseifner_steps(n, i, count))


def _rd_terms(n: int, S: float) -> tuple[float, float, float]:
    p = 1 << (n.bit_length() - 1)
    extra, lp = int(n > p), p.bit_length() - 1
    return lp + 2 * extra, S * (lp + 2 * extra), S * (lp + extra)


def _rab_terms(n: int, S: float) -> tuple[float, float, float]:
    p = 1 << (n.bit_length() - 1)
    extra, lp = int(n > p), p.bit_length() - 1
    return 2 * lp + 2 * extra, 2 * (p - 1) / p * S + 2 * extra * S, (p - 1) / p * S + extra * S


RECORDS = (
    Algorithm("all_reduce", "recursive_doubling", "doubling_comms:recursive_doubling_all_reduce",
              _rd_elements, _rd_terms, steps=doubling_steps),
    Algorithm("all_reduce", "rabenseifner", "doubling_comms:rabenseifner_all_reduce",
              _rab_elements, _rab_terms, steps=rabenseifner_steps),
)
