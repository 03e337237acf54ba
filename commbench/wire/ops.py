"""The native collectives, one :class:`Op` record each, as nccl-tests keeps one file per
collective (its byte count, its data, its bandwidth): what a requested size means, the bytes a
rank moves, nccl-tests' bus factor, the alpha-beta terms of the transport's own schedule, and the
exact result a rank must hold. Pure: no torch here, so that prediction imports none.

Bytes booked for a transport's own call are those of the bandwidth-optimal schedule NCCL runs for
large messages, per rank and exactly, also when the count does not divide by the group size:

* all-reduce: ring reduce-scatter then ring all-gather over the chunks of :func:`split_sizes`;
  rank i sends every chunk but its own in the first pass and every chunk but chunk i+1 in the
  second, so ``sent = 2*count - c[i] - c[i+1]`` and ``recv = 2*count - c[i-1] - c[i]`` elements
  (2(n-1)/n * S when n divides the count);
* all-gather, reduce-scatter: ring, (n-1) * c each way, c the per-rank block;
* broadcast, reduce: NCCL's ring chain (root first for broadcast, root last for reduce): every rank
  on the chain forwards the whole buffer once;
* gather, scatter, all-to-all(v), send/recv: direct, what leaves and enters this rank.

These are the bytes a rank must move at the least (nccl-tests' busbw bound), not what the
transport's own algorithm happens to send; commbench's own algorithms, built from send/recv, are
booked call by call from the buffers they really pass.

Expected data is a list of segments, each ``("input", r, lo, hi)`` (rank r's input elements
lo..hi-1) or ``("reduced", None, lo, hi)`` (every rank's elements lo..hi-1 reduced), concatenated;
None: this rank receives nothing (:mod:`commbench.timing.verify` makes the tensors).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from commbench.names import ROOTED

__all__ = ["OPS", "Op", "booked", "counts_for", "lg", "offsets", "split_sizes"]

Segment = tuple[str, "int | None", int, int]


def split_sizes(count: int, n: int) -> list[int]:
    """Split ``count`` items into ``n`` parts, the first ``count % n`` one larger: 7 over 4 is
    [2, 2, 2, 1]. The ring's chunks, and Ulysses' heads per rank (DeepSpeed's
    ``get_shard_size_list``), are this split."""
    if n < 1:
        raise ValueError(f"n={n}: must be >= 1")
    if count < 0:
        raise ValueError(f"count={count}: must be >= 0")
    base, extra = divmod(count, n)
    return [base + (1 if k < extra else 0) for k in range(n)]


def offsets(counts: list[int]) -> list[int]:
    """Start of each block and the end: [0, c0, c0+c1, ..., sum(counts)]."""
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def lg(n: int) -> int:
    """ceil(log2 n): rounds of a binary tree or of recursive doubling over n members."""
    return math.ceil(math.log2(n)) if n > 1 else 0


@dataclass(frozen=True)
class Op:
    """One native collective.

    size: what nccl-tests' size column holds for it; input: how a requested size becomes each
    rank's input, ``whole`` (the buffer), ``block`` (one rank's block: all-gather, gather) or
    ``blocks`` (one block per member: reduce-scatter, all-to-all, scatter);
    elements(n, i, count, root, in_splits, out_splits, row): elements member i sends and
    receives in one call; bus(n): nccl-tests' busbw factor; terms(n, S): steps, bytes sent and
    bytes reduced on the critical path of the transport's own schedule (MPICH's and gloo's:
    bandwidth-optimal at log latency); expected(rank, n, count, root): segments (above);
    one_way: a sample is a round trip, reported halved (OSU's latency); ranks: the fewest it
    runs on; reduces: it takes a reduction (``-o``); split: its buffers go out in one split per
    member (all-to-all); rooted: it takes a root (``-r``; :data:`commbench.names.ROOTED`).
    """

    name: str
    size: str
    input: str
    elements: Callable[..., tuple[int, int]]
    bus: Callable[[int], float] | None = None
    terms: Callable[[int, float], tuple[float, float, float]] | None = None
    expected: Callable[[int, int, int, int], list[Segment] | None] | None = None
    one_way: bool = False
    ranks: int = 1
    reduces: bool = False
    split: bool = False

    @property
    def rooted(self) -> bool:
        return self.name in ROOTED

    def needs(self, n: int) -> str:
        """Why a group of ``n`` cannot run it ('' when it can)."""
        return "" if n >= self.ranks else f"needs {self.ranks} ranks"

    def counts(self, nbytes: int, n: int, itemsize: int) -> tuple[int, int]:
        """(elements of each rank's input, bytes in nccl-tests' size column) for a requested
        size; split collectives round each rank's block down to a multiple of 16 bytes, as
        nccl-tests does."""
        elems = nbytes // itemsize
        if self.input == "whole":
            return elems, elems * itemsize
        align = max(16 // itemsize, 1)
        block = (elems // n) // align * align
        return (block if self.input == "block" else block * n), block * n * itemsize


def _all_reduce(n, i, count, **kw):
    c = split_sizes(count, n)
    if n == 1:
        return 0, 0
    return 2 * count - c[i] - c[(i + 1) % n], 2 * count - c[(i - 1) % n] - c[i]


def _ring(n, i, count, **kw):  # all-gather: count is this rank's block
    return (n - 1) * count, (n - 1) * count


def _reduce_scatter(n, i, count, **kw):
    if count % n:
        raise ValueError(f"reduce_scatter count {count}: not a multiple of group size {n}")
    return (n - 1) * (count // n), (n - 1) * (count // n)


def _all_to_all(n, i, count, *, in_splits=None, out_splits=None, row=1, **kw):
    if in_splits is None or out_splits is None:
        raise ValueError("all_to_all needs in_splits and out_splits")
    return (sum(in_splits) - in_splits[i]) * row, (sum(out_splits) - out_splits[i]) * row


def _chain(n: int, position: int, count: int) -> tuple[int, int]:
    """A rank at ``position`` of an n-rank chain: sends unless last, receives unless first."""
    return count * (position < n - 1), count * (position > 0)


def _broadcast(n, i, count, *, root=0, **kw):
    return _chain(n, (i - root) % n, count)


def _reduce(n, i, count, *, root=0, **kw):
    return _chain(n, (i - root - 1) % n, count)


def _gather(n, i, count, *, root=0, **kw):
    return (0, (n - 1) * count) if i == root else (count, 0)


def _scatter(n, i, count, *, root=0, **kw):  # count: the root's whole buffer
    return ((n - 1) * (count // n), 0) if i == root else (0, count // n)


def _sendrecv(n, i, count, **kw):  # a ring exchange: one each way
    return (count, count) if n > 1 else (0, 0)


def _pingpong(n, i, count, **kw):  # members 0 and 1 bounce
    return (count, count) if i in (0, 1) else (0, 0)


def _inputs(rank, n, count, root, lo=0, hi=None) -> list[Segment]:
    return [("input", r, lo, count if hi is None else hi) for r in range(n)]


def _block(rank: int, n: int, count: int) -> tuple[int, int]:
    return rank * (count // n), (rank + 1) * (count // n)


_HALF = lambda n: (n - 1) / n  # noqa: E731
_ONE = lambda n: 1.0  # noqa: E731
_RECORDS = [
    Op("all_reduce", "one rank's buffer", "whole", _all_reduce, lambda n: 2 * (n - 1) / n,
       lambda n, S: (2 * lg(n), 2 * (n - 1) / n * S, (n - 1) / n * S),
       lambda rank, n, count, root: [("reduced", None, 0, count)], reduces=True),
    Op("all_gather", "the whole output", "block", _ring, _HALF,
       lambda n, S: (lg(n), (n - 1) / n * S, 0.0), _inputs),
    Op("reduce_scatter", "the whole input", "blocks", _reduce_scatter, _HALF,
       lambda n, S: (lg(n), (n - 1) / n * S, (n - 1) / n * S),
       lambda rank, n, count, root: [("reduced", None, *_block(rank, n, count))],
       reduces=True),
    Op("all_to_all", "one rank's whole send", "blocks", _all_to_all, _HALF,
       lambda n, S: (n - 1, (n - 1) / n * S, 0.0),
       lambda rank, n, count, root: _inputs(rank, n, count, root, *_block(rank, n, count)),
       split=True),
    Op("broadcast", "one rank's buffer", "whole", _broadcast, _ONE,
       lambda n, S: (lg(n), lg(n) * S, 0.0),
       lambda rank, n, count, root: [("input", root, 0, count)]),
    Op("reduce", "one rank's buffer", "whole", _reduce, _ONE,
       lambda n, S: (lg(n), lg(n) * S, lg(n) * S),
       lambda rank, n, count, root: [("reduced", None, 0, count)] if rank == root else None,
       reduces=True),
    Op("gather", "the whole output", "block", _gather, _HALF,
       lambda n, S: (lg(n), (n - 1) / n * S, 0.0),
       lambda rank, n, count, root: _inputs(rank, n, count, root) if rank == root else None),
    Op("scatter", "the root's whole send", "blocks", _scatter, _HALF,
       lambda n, S: (lg(n), (n - 1) / n * S, 0.0),
       lambda rank, n, count, root: [("input", root, *_block(rank, n, count))]),
    Op("sendrecv", "one rank's buffer", "whole", _sendrecv, _ONE, lambda n, S: (1, S, 0.0),
       lambda rank, n, count, root: [("input", (rank - 1) % n, 0, count)]),
    Op("pingpong", "one rank's buffer", "whole", _pingpong, _ONE, lambda n, S: (1, S, 0.0),
       one_way=True, ranks=2),
    # the comm layer's other calls: booked, never benchmarked on their own
    Op("all_to_allv", "one rank's whole send", "blocks", _all_to_all, _HALF, split=True),
    Op("send", "", "whole", lambda n, i, count, **kw: (count, 0)),
    Op("isend", "", "whole", lambda n, i, count, **kw: (count, 0)),
    Op("recv", "", "whole", lambda n, i, count, **kw: (0, count)),
    Op("irecv", "", "whole", lambda n, i, count, **kw: (0, count)),
    Op("barrier", "", "whole", lambda n, i, count, **kw: (0, 0)),
]
OPS: dict[str, Op] = {o.name: o for o in _RECORDS}


def op_record(op: str) -> Op:
    if op not in OPS:
        raise ValueError(f"op {op!r}: no record; known: {', '.join(OPS)}")
    return OPS[op]


def booked(op: str, n: int, i: int, count: int, itemsize: int, *, root: int = 0,
           in_splits: list[int] | None = None, out_splits: list[int] | None = None,
           row: int = 1) -> tuple[int, int]:
    """(bytes sent, bytes received) by group member ``i`` of ``n`` for one call of ``op``.

    count: elements of this rank's input buffer (for ``scatter``, of the root's whole buffer; for
    ``all_gather`` and ``gather``, of this rank's contribution).
    in_splits/out_splits: rows sent to / received from each member, for ``all_to_all``; a row has
    ``row`` elements.
    """
    if not 0 <= i < n:
        raise ValueError(f"member index {i}: must be in 0..{n - 1}")
    s, r = op_record(op).elements(n, i, count, root=root, in_splits=in_splits,
                                  out_splits=out_splits, row=row)
    return s * itemsize, r * itemsize


def counts_for(op: str, nbytes: int, n: int, itemsize: int) -> tuple[int, int]:
    """(elements of each rank's input, bytes in nccl-tests' size column): :meth:`Op.counts`."""
    return op_record(op).counts(nbytes, n, itemsize)
