"""Ring algorithms from send/recv: reduce-scatter, all-gather, and all-reduce as the two in turn.
Their records (bytes counted from their schedules, terms, broken variants); the schedules are
written once in :mod:`commbench.collectives.schedules`, and the send/recv code,
:mod:`commbench.collectives.ring_comms`, runs them.

The ring of the notes ("Ring All-reduce = Reduce-scatter + All-gather", Patarasuk and Yuan 2009):
the buffer is cut in P chunks (:func:`commbench.ops.split_sizes`; the first ``count % P`` one
element longer, so any count works). Member i sends to i+1 and receives from i-1.

* reduce-scatter, step k = 0..P-2: send the running sum of chunk i-k-1, receive chunk i-k-2 and add
  this rank's part of it. After P-1 steps member i holds the full reduction of chunk i.
* all-gather, step k = 0..P-2: send chunk i-k, receive chunk i-k-1.

Shapes (P = group size, c_j = chunk j's length, S = c_0 + ... + c_{P-1}):
    x      [S]      this rank's input, flattened
    rs     [c_i]    ring_reduce_scatter's result on member i
    ag     [S]      ring_all_gather's result, chunks in member order

Per member i: reduce-scatter sends S - c_i and receives S - c_{i-1} elements; all-gather sends
S - c_{i+1} and receives S - c_i; all-reduce sends 2S - c_i - c_{i+1}: 2(P-1)/P * S when P divides S.
"""

from __future__ import annotations

from commbench.collectives.algorithm import Algorithm, BrokenAlgorithm, Step, traffic
from commbench.collectives.schedules import ag_schedule, ring_steps, rs_schedule
from commbench.ops import split_sizes

__all__ = ["RECORDS", "off_by_one_chunks", "skip_last_rs_step"]


def off_by_one_chunks(count: int, n: int) -> list[int]:
    """Broken: chunk boundaries shifted by one element (the first chunk one longer, the last one
    shorter); every member cuts the same wrong chunks."""
    c = split_sizes(count, n)
    if n > 1 and c[-1] > 0:
        c[0] += 1
        c[-1] -= 1
    return c


def skip_last_rs_step(n: int, i: int, counts: list[int]) -> list[Step]:
    """Broken: the reduce-scatter stops one step early; one contribution per chunk is missing."""
    return rs_schedule(n, i, counts)[:-1]


def rs_elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
    return traffic(rs_schedule(n, i, split_sizes(count, n)))


def _ag_elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
    return traffic(ag_schedule(n, i, [count] * n))


def ar_elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
    return traffic(ring_steps(n, i, count))


BROKEN = (BrokenAlgorithm("skip_step", {"rs_steps": skip_last_rs_step},
                          "the reduce-scatter stops a step early: a contribution is missing"),
          BrokenAlgorithm("off_by_one_chunk", {"split": off_by_one_chunks},
                          "the chunks cut one element off: the bytes differ from the formula"))
RECORDS = (
    Algorithm("all_reduce", "ring", "ring_comms:ring_all_reduce", ar_elements,
              lambda n, S: (2 * (n - 1), 2 * (n - 1) / n * S, (n - 1) / n * S), steps=ring_steps,
              parts="ring_comms:RING", broken=BROKEN),
    Algorithm("reduce_scatter", "ring", "ring_comms:ring_reduce_scatter", rs_elements,
              lambda n, S: (n - 1, (n - 1) / n * S, (n - 1) / n * S), parts="ring_comms:RING",
              broken=BROKEN),
    Algorithm("all_gather", "ring", "ring_comms:ring_all_gather", _ag_elements,
              lambda n, S: (n - 1, (n - 1) / n * S, 0.0)),
)
