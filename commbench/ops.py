"""The native collectives, one :class:`Op` record each, as nccl-tests keeps one file per
collective (its byte count, its data, its bandwidth): what a requested size means, the bytes a
rank moves, nccl-tests' bus factor, the alpha-beta terms of the transport's own schedule, the
exact result a rank must hold, NCCL's ring steps for its tuning model, and its names in the other
tools (:class:`Names`: torch's profiler and execution traces, NCCL's kernels, nccl-tests, OSU).
Every other module asks the record; none spells the list of collectives again. Pure: no torch
here, so that prediction imports none.

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

__all__ = ["OPS", "Names", "Op", "benchmarked", "booked", "counts_for", "lg", "offsets",
           "split_sizes", "vsplits"]

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
class Names:
    """What other tools call a collective.

    torch: the ``Collective name`` values torch's ``record_param_comms`` writes for it (torch
    2.0 to 2.13), the first the one torch 2.13 writes; c10d: its dispatcher ops in an execution
    trace (``c10d::allreduce_``), each with the index of the input whose elements are booked and
    of the peer (None: none); dispatch: the dispatcher ops that issue it, as the audit's watcher
    sees them (``c10d.allreduce_``, ``_c10d_functional.all_reduce``: torch 2.13); profiler: the
    CPU op the process group records around it in a profiler trace (``nccl:all_reduce``,
    ``gloo:all_reduce``), which before torch 2.1 alone carries its sizes; kernel: the
    word of NCCL's kernel name (``ncclDevKernel_AllReduce_...``; ``SendRecv`` for what NCCL runs
    as grouped point-to-point: all-to-all, gather, scatter, send, recv); osu: OSU's benchmark
    names that do not follow from the collective's (``osu_bcast``). The flat spellings
    (``allreduce``, ``all_reduce_perf``, ``osu_allreduce``) follow from the name itself
    (:data:`commbench.names.ALIASES`).
    """

    torch: tuple[str, ...] = ()
    c10d: tuple[tuple[str, int | None, int | None], ...] = ()
    dispatch: tuple[str, ...] = ()
    kernel: str = ""
    osu: tuple[str, ...] = ()
    profiler: tuple[str, ...] = ()
    work: tuple[str, ...] = ()


@dataclass(frozen=True)
class Op:
    """One native collective.

    size: what nccl-tests' size column holds for it; input: how a requested size becomes each
    rank's input, ``whole`` (the buffer), ``block`` (one rank's block: all-gather, gather),
    ``blocks`` (one block per member: reduce-scatter, all-to-all, scatter) or ``none`` (no
    buffer: barrier);
    elements(n, i, count, root, in_splits, out_splits, row): elements member i sends and
    receives in one call; bus(n): nccl-tests' busbw factor; terms(n, S): steps, bytes sent and
    bytes reduced on the critical path of the transport's own schedule (MPICH's and gloo's:
    bandwidth-optimal at log latency); expected(rank, n, count, root): segments (above);
    one_way: a sample is a round trip, reported halved (OSU's latency); ranks: the fewest it
    runs on; reduces: it takes a reduction (``-o``); split: its buffers go out in one split per
    member (all-to-all); rooted: it takes a root (``-r``); agreed: every member of the group
    calls it alike, so debug mode checks that they agree before it starts and a replay re-issues
    it as one collective; bench: ``commbench run`` times it (``-b``..``-e``; the others are
    booked when the comm layer issues them); suite: in the default suite (``commbench run``,
    ``make bench``: the collectives of the committed tables; the others are run by name); perf:
    nccl-tests has a binary for it (``all_reduce_perf``); nccl:
    NCCL's ring for its tuning model, (the
    ring's steps over n ranks, the steps per node boundary that cross the network; 0: a chain,
    priced per step), None where the tuning model has none; names: :class:`Names`.
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
    rooted: bool = False
    agreed: bool = False
    bench: bool = False
    suite: bool = False
    perf: bool = False
    nccl: tuple[Callable[[int], int], int] | None = None
    names: Names = Names()

    def needs(self, n: int) -> str:
        """Why a group of ``n`` cannot run it ('' when it can)."""
        return "" if n >= self.ranks else f"needs {self.ranks} ranks"

    def counts(self, nbytes: int, n: int, itemsize: int) -> tuple[int, int]:
        """(elements of each rank's input, bytes in nccl-tests' size column) for a requested
        size; split collectives round each rank's block down to a multiple of 16 bytes, as
        nccl-tests does."""
        elems = nbytes // itemsize
        if self.input == "none":
            return 0, 0
        if self.input == "whole":
            return elems, elems * itemsize
        align = max(16 // itemsize, 1)
        block = (elems // n) // align * align
        return (block if self.input == "block" else block * n), block * n * itemsize

    def size_elems(self, in_elems: int, out_elems: int) -> int:
        """nccl-tests' size column in elements, from a call's input and output elements: the
        whole output where the input is one rank's block, else the input."""
        return out_elems if self.input == "block" else in_elems

    def call_elems(self, count: int, n: int) -> tuple[int, int]:
        """(input, output) elements of one equal-split call whose input has ``count``."""
        if self.input == "block":
            return count, count * n
        if self.input == "blocks" and not self.split:
            return count, count // n
        return count, count


def split_size(count: int, n: int, k: int) -> int:
    """Part ``k`` of :func:`split_sizes` (``count`` over ``n``), without the list: a call's
    booking at 512 ranks spent 45 us making it."""
    base, extra = divmod(count, n)
    return base + (1 if k < extra else 0)


def _all_reduce(n, i, count, **kw):
    if n == 1:
        return 0, 0
    mine, after, before = (split_size(count, n, k % n) for k in (i, i + 1, i - 1))
    return 2 * count - mine - after, 2 * count - before - mine


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


VSEED = 0x5EED
WEIGHTS = 8


def _weight(seed: int, n: int, i: int, j: int) -> int:
    """A weight in 1..WEIGHTS from (seed, n, i, j): splitmix64's finaliser over their mix."""
    z = (seed * 0x9E3779B97F4A7C15 + n * 0xBF58476D1CE4E5B9 + i * 0x94D049BB133111EB + j + 1) \
        & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) % WEIGHTS + 1


def vsplits(n: int, count: int, seed: int = VSEED) -> list[list[int]]:
    """The benchmarked all-to-allv's uneven counts: ``m[i][j]`` elements member i sends member
    j. Each member's send of ``count`` elements is cut over the n members in proportion to
    weights drawn uniformly from 1..WEIGHTS (at most 8 times as much to one peer as to another,
    as a skewed MoE router's tokens per expert), each rank's draws seeded by (seed, n, i, j):
    every rank computes the whole matrix alone. The cut is floor(count * w / sum(w)), the
    remainder one element each to the first members. Every member sends ``count``; what each
    receives differs."""
    out = []
    for i in range(n):
        w = [_weight(seed, n, i, j) for j in range(n)]
        cut = [count * wj // sum(w) for wj in w]
        for j in range(count - sum(cut)):
            cut[j] += 1
        out.append(cut)
    return out


def _vsplit_elements(n, i, count, *, in_splits=None, out_splits=None, row=1, **kw):
    """all_to_allv: the given splits (a trace's, the comm layer's), else :func:`vsplits`."""
    if in_splits is None and out_splits is None:
        m = vsplits(n, count)
        in_splits, out_splits = m[i], [m[j][i] for j in range(n)]
    return _all_to_all(n, i, count, in_splits=in_splits, out_splits=out_splits, row=row)


def _vsplit_expected(rank: int, n: int, count: int, root: int) -> list[Segment]:
    """What member ``rank`` holds after the benchmarked all-to-allv: member j's block for it."""
    m = vsplits(n, count)
    return [("input", j, offsets(m[j])[rank], offsets(m[j])[rank + 1]) for j in range(n)]


_HALF = lambda n: (n - 1) / n  # noqa: E731
_ONE = lambda n: 1.0  # noqa: E731
_N = lambda n: n  # noqa: E731
_RECORDS = [
    Op("all_reduce", "one rank's buffer", "whole", _all_reduce, lambda n: 2 * (n - 1) / n,
       lambda n, S: (2 * lg(n), 2 * (n - 1) / n * S, (n - 1) / n * S),
       lambda rank, n, count, root: [("reduced", None, 0, count)], reduces=True, agreed=True,
       bench=True, suite=True, perf=True, nccl=(lambda n: 2 * (n - 1), 2),
       names=Names(("allreduce", "allreduce_coalesced", "all_reduce"),
                   (("c10d::allreduce_", 0, None), ("c10d::allreduce_coalesced_", 0, None)),
                   ("c10d.allreduce_", "c10d.allreduce_coalesced_", "_c10d_functional.all_reduce",
                    "_c10d_functional.all_reduce_", "_c10d_functional.all_reduce_coalesced",
                    "_c10d_functional.all_reduce_coalesced_"), "AllReduce",
                   profiler=("nccl:all_reduce", "gloo:all_reduce", "nccl:all_reduce_coalesced",
                             "gloo:all_reduce_coalesced"),
                   work=("ALLREDUCE", "ALLREDUCE_COALESCED"))),
    Op("all_gather", "the whole output", "block", _ring, _HALF,
       lambda n, S: (lg(n), (n - 1) / n * S, 0.0), _inputs, agreed=True, bench=True, suite=True, perf=True,
       nccl=(lambda n: n - 1, 1),
       names=Names(("_allgather_base", "allgather", "all_gather",
                    "allgather_into_tensor_coalesced", "all_gather_into_tensor",
                    "allgather_coalesced"),
                   (("c10d::_allgather_base_", 1, None), ("c10d::allgather_", 1, None),
                    ("c10d::allgather_into_tensor_coalesced_", 1, None)),
                   ("c10d._allgather_base_", "c10d.allgather_", "c10d.allgather_coalesced_",
                    "c10d.allgather_into_tensor_coalesced_",
                    "_c10d_functional.all_gather_into_tensor",
                    "_c10d_functional.all_gather_into_tensor_out",
                    "_c10d_functional.all_gather_into_tensor_coalesced"), "AllGather",
                   profiler=("nccl:_all_gather_base", "nccl:all_gather", "gloo:all_gather",
                             "gloo:_all_gather_base", "nccl:all_gather_into_tensor_coalesced"),
                   work=("ALLGATHER", "_ALLGATHER_BASE", "ALLGATHER_COALESCED"))),
    Op("reduce_scatter", "the whole input", "blocks", _reduce_scatter, _HALF,
       lambda n, S: (lg(n), (n - 1) / n * S, (n - 1) / n * S),
       lambda rank, n, count, root: [("reduced", None, *_block(rank, n, count))],
       reduces=True, agreed=True, bench=True, suite=True, perf=True, nccl=(lambda n: n - 1, 1),
       names=Names(("_reduce_scatter_base", "reduce_scatter", "reduce_scatter_tensor_coalesced",
                    "reduce_scatter_tensor"),
                   (("c10d::reduce_scatter_", 1, None), ("c10d::_reduce_scatter_base_", 1, None),
                    ("c10d::reduce_scatter_tensor_coalesced_", 1, None)),
                   ("c10d._reduce_scatter_base_", "c10d.reduce_scatter_",
                    "c10d.reduce_scatter_tensor_coalesced_",
                    "_c10d_functional.reduce_scatter_tensor",
                    "_c10d_functional.reduce_scatter_tensor_out",
                    "_c10d_functional.reduce_scatter_tensor_coalesced"), "ReduceScatter",
                   profiler=("nccl:_reduce_scatter_base", "nccl:reduce_scatter",
                             "gloo:reduce_scatter", "nccl:reduce_scatter_tensor_coalesced"),
                   work=("REDUCE_SCATTER", "_REDUCE_SCATTER_BASE",
                         "REDUCE_SCATTER_TENSOR_COALESCED"))),
    Op("all_to_all", "one rank's whole send", "blocks", _all_to_all, _HALF,
       lambda n, S: (n - 1, (n - 1) / n * S, 0.0),
       lambda rank, n, count, root: _inputs(rank, n, count, root, *_block(rank, n, count)),
       split=True, agreed=True, bench=True, suite=True, perf=True,
       names=Names(("all_to_allv", "all_to_all", "alltoall", "alltoall_base"),
                   (("c10d::alltoall_base_", 1, None),),
                   ("c10d.alltoall_base_", "c10d.alltoall_", "_c10d_functional.all_to_all_single",
                    "_dtensor.shard_dim_alltoall"), "SendRecv",
                   profiler=("nccl:all_to_all", "gloo:all_to_all", "nccl:all_to_allv"),
                   work=("ALLTOALL", "ALLTOALL_BASE"))),
    Op("broadcast", "one rank's buffer", "whole", _broadcast, _ONE,
       lambda n, S: (lg(n), lg(n) * S, 0.0),
       lambda rank, n, count, root: [("input", root, 0, count)], rooted=True, agreed=True,
       bench=True, suite=True, perf=True, nccl=(_N, 0),
       names=Names(("broadcast",), (("c10d::broadcast_", 0, None),),
                   ("c10d.broadcast_", "_c10d_functional.broadcast",
                    "_c10d_functional.broadcast_"), "Broadcast", ("osu_bcast",),
                   ("nccl:broadcast", "gloo:broadcast"), ("BROADCAST",))),
    Op("reduce", "one rank's buffer", "whole", _reduce, _ONE,
       lambda n, S: (lg(n), lg(n) * S, lg(n) * S),
       lambda rank, n, count, root: [("reduced", None, 0, count)] if rank == root else None,
       reduces=True, rooted=True, agreed=True, bench=True, suite=True, perf=True, nccl=(_N, 0),
       names=Names(("reduce",), (("c10d::reduce_", 0, None),), ("c10d.reduce_",), "Reduce",
                   profiler=("nccl:reduce", "gloo:reduce"), work=("REDUCE",))),
    Op("gather", "the whole output", "block", _gather, _HALF,
       lambda n, S: (lg(n), (n - 1) / n * S, 0.0),
       lambda rank, n, count, root: _inputs(rank, n, count, root) if rank == root else None,
       rooted=True, agreed=True, bench=True, suite=True, perf=True,
       names=Names(("gather",), dispatch=("c10d.gather_",), kernel="SendRecv",
                   profiler=("nccl:gather", "gloo:gather"), work=("GATHER",))),
    Op("scatter", "the root's whole send", "blocks", _scatter, _HALF,
       lambda n, S: (lg(n), (n - 1) / n * S, 0.0),
       lambda rank, n, count, root: [("input", root, *_block(rank, n, count))], rooted=True,
       agreed=True, bench=True, suite=True, perf=True,
       names=Names(("scatter",), dispatch=("c10d.scatter_",), kernel="SendRecv",
                   profiler=("nccl:scatter", "gloo:scatter"), work=("SCATTER",))),
    Op("sendrecv", "one rank's buffer", "whole", _sendrecv, _ONE, lambda n, S: (1, S, 0.0),
       lambda rank, n, count, root: [("input", (rank - 1) % n, 0, count)], bench=True, suite=True, perf=True),
    Op("pingpong", "one rank's buffer", "whole", _pingpong, _ONE, lambda n, S: (1, S, 0.0),
       one_way=True, ranks=2, bench=True, suite=True, names=Names(osu=("osu_latency",))),
    Op("all_to_allv", "one rank's whole send", "blocks", _vsplit_elements, _HALF,
       expected=_vsplit_expected, split=True, bench=True),
    Op("barrier", "nothing: no buffer", "none", lambda n, i, count, **kw: (0, 0), _ONE,
       agreed=True, bench=True,
       names=Names(("barrier",), (("c10d::barrier", None, None),), ("c10d.barrier",),
                   profiler=("gloo:barrier",), work=("BARRIER",))),
    # the comm layer's other calls: booked, never benchmarked on their own
    Op("send", "", "whole", lambda n, i, count, **kw: (count, 0),
       names=Names(("send",), (("c10d::send", 0, 2),), ("c10d.send", "_c10d_functional.isend"),
                   "SendRecv", profiler=("nccl:send", "gloo:send"), work=("SEND",))),
    # isend/irecv: torch records them as send/recv (a trace's "send" reads back as send)
    Op("isend", "", "whole", lambda n, i, count, **kw: (count, 0), names=Names(("send",))),
    Op("recv", "", "whole", lambda n, i, count, **kw: (0, count),
       names=Names(("recv",), (("c10d::recv_", 0, 2),),
                   ("c10d.recv_", "c10d.recv_any_source_", "_c10d_functional.irecv"), "SendRecv",
                   profiler=("nccl:recv", "gloo:recv"), work=("RECV", "RECVANYSOURCE"))),
    Op("irecv", "", "whole", lambda n, i, count, **kw: (0, count), names=Names(("recv",))),
]
OPS: dict[str, Op] = {o.name: o for o in _RECORDS}


def benchmarked() -> tuple[str, ...]:
    """The collectives ``commbench run`` times, in the records' order."""
    return tuple(o.name for o in _RECORDS if o.bench)


def bufferless(op: str) -> bool:
    """Whether ``op`` moves no buffer (a barrier): no dtype and no count are booked for it."""
    return op in OPS and OPS[op].input == "none"


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
