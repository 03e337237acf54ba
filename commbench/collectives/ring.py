"""Ring algorithms from send/recv: reduce-scatter, all-gather, and all-reduce as the two in turn.
Their records (bytes, terms, broken variants) and the all-reduce's step list; the send/recv code
is :mod:`commbench.collectives.ring_comms`.

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

from commbench.collectives.algorithm import Algorithm, BrokenAlgorithm, Step
from commbench.ops import offsets, split_sizes

__all__ = ["RECORDS", "off_by_one_chunks", "ring_steps"]


def off_by_one_chunks(count: int, n: int) -> list[int]:
    """Broken: chunk boundaries shifted by one element (the first chunk one longer, the last one
    shorter); every member cuts the same wrong chunks."""
    c = split_sizes(count, n)
    if n > 1 and c[-1] > 0:
        c[0] += 1
        c[-1] -= 1
    return c


def ring_steps(n: int, i: int, count: int, split=split_sizes) -> list[Step]:
    """The ring all-reduce as member i's steps: reduce-scatter, its chunk averaged, all-gather
    (the blocks, peers and order of :func:`~.ring_comms.ring_all_reduce`)."""
    b = offsets(split(count, n))
    nxt, prv, out = (i + 1) % n, (i - 1) % n, []
    for k in range(n - 1):
        s, r = (i - k - 1) % n, (i - k - 2) % n
        out.append(Step((b[s], b[s + 1]), nxt, (b[r], b[r + 1]), prv, reduce=True))
    out.append(Step(avg=(b[i], b[i + 1])))
    for k in range(n - 1):
        s, r = (i - k) % n, (i - k - 1) % n
        out.append(Step((b[s], b[s + 1]), nxt, (b[r], b[r + 1]), prv))
    return out


def rs_elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
    c = split_sizes(count, n)
    return (count - c[i], count - c[(i - 1) % n]) if n > 1 else (0, 0)


def _ag_elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
    return (n - 1) * count, (n - 1) * count


def ar_elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
    rs, ag = rs_elements(n, i, count), split_sizes(count, n)
    # all-gather: every chunk but chunk i+1 goes out, every chunk but chunk i comes in
    return (rs[0] + count - ag[(i + 1) % n], rs[1] + count - ag[i]) if n > 1 else (0, 0)


BROKEN = (BrokenAlgorithm("skip_step", {"rs_steps": "ring_comms:skip_last_rs_step"},
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
