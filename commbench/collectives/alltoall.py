"""All-to-all from send/recv: pairwise exchange (any splits) and Bruck (equal blocks): their
records; the send/recv code is :mod:`commbench.collectives.alltoall_comms`.

* pairwise: in step k = 1..P-1 member i sends its block for i+k and receives the block from i-k.
  Each member moves exactly its off-diagonal data, sum_j!=i of its splits: the least possible bytes,
  in P-1 steps. Uneven splits (all-to-allv) and empty blocks work; when only ``in_splits`` is
  given, the counts are exchanged first the same way (P-1 messages of one int64).
* Bruck (1997): rotate the blocks so that block j is the one for member i+j, then in step k send
  every block whose index has bit k set to member i + 2^k; after ceil(log2 P) steps block j holds
  what member i-j sent, and a last rotation puts it in place. About (P/2) log2 P blocks each way:
  more bytes, far fewer messages; the small-message algorithm.

Shapes: x [sum(in_splits), *] -> out [sum(out_splits), *]; Bruck needs x [P*b, *].
"""

from __future__ import annotations

from commbench.collectives.algorithm import Algorithm
from commbench.ops import lg

__all__ = ["RECORDS", "bruck_blocks_per_step", "pairwise_elements"]


def bruck_blocks_per_step(n: int) -> list[int]:
    """Blocks each member sends in each Bruck step: indices 0..n-1 with bit k set."""
    out, k = [], 0
    while (1 << k) < n:
        out.append(sum(1 for j in range(n) if j >> k & 1))
        k += 1
    return out


def pairwise_elements(n: int, i: int, count: int, in_splits=None, out_splits=None, row: int = 1,
                       **kw) -> tuple[int, int]:
    if in_splits is None or out_splits is None:
        raise ValueError("pairwise all_to_all needs in_splits and out_splits")
    return (sum(in_splits) - in_splits[i]) * row, (sum(out_splits) - out_splits[i]) * row


def _bruck_elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
    moved = sum(bruck_blocks_per_step(n)) * (count // n)
    return moved, moved


RECORDS = (
    Algorithm("all_to_all", "pairwise", "alltoall_comms:pairwise_all_to_all", pairwise_elements,
              lambda n, S: (n - 1, (n - 1) / n * S, 0.0),
              call=lambda fn, comm, x, group, root, redop, splits: fn(comm, x, group, splits, splits)),
    Algorithm("all_to_all", "bruck", "alltoall_comms:bruck_all_to_all", _bruck_elements,
              lambda n, S: (lg(n), S / n * sum(bruck_blocks_per_step(n)), 0.0)),
)
