"""The timing loop, run on every rank: warm-up, barriers, device sync, per-iteration samples.

Cadence ("isolated", nccl-tests' ``-z 3`` spirit): before every iteration the ranks meet in the
transport's own barrier (after a device synchronisation on a GPU), outside the timed region; the
timer then brackets one call: host ``perf_counter`` on CPU, CUDA events around the call on a GPU.
Each rank returns its per-iteration times; the driver takes the maximum over ranks per iteration
(nccl-tests' ``-I`` aggregation) and reports min, median, max and p99 of those. Nothing of the
driver's dispatch is inside a timed region.

Native collectives are timed as the transport's bare call on buffers prepared before the loop; the
comm layer's checks ran once in the first warm-up call, and each timed call is booked in the
ledger after its timer stops. Inputs are :mod:`commbench.verify` patterns, so the last iteration's
result is checked element by element (``#wrong``). In-place ops (all-reduce, broadcast, reduce)
get their input restored before each iteration, outside the timer.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from commbench import verify
from commbench.volume import booked

__all__ = ["COLLECTIVES", "Case", "counts_for", "measure"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
               "gather", "scatter", "sendrecv")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int8": torch.int8, "uint8": torch.uint8,
          "int32": torch.int32, "int64": torch.int64}


@dataclass(frozen=True, slots=True)
class Case:
    """One benchmark series: a collective on a transport, swept over sizes."""

    op: str
    transport: str = "gloo"
    algo: str = "native"
    dtype: str = "float32"
    redop: str = "sum"
    root: int = 0
    iters: int = 20
    warmup: int = 5
    check: bool = True
    seed: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def counts_for(op: str, nbytes: int, n: int, itemsize: int) -> tuple[int, int]:
    """(elements of each rank's input, bytes in nccl-tests' size column) for a requested size.

    Split collectives round each rank's block down to a multiple of 16 bytes, as nccl-tests does.
    """
    elems = nbytes // itemsize
    if op in ("all_reduce", "broadcast", "reduce", "sendrecv"):
        return elems, elems * itemsize
    align = max(16 // itemsize, 1)
    block = (elems // n) // align * align
    if op in ("all_gather", "gather"):
        return block, block * n * itemsize
    # reduce_scatter, all_to_all, scatter: the input holds one block per member
    return block * n, block * n * itemsize


def _timed(call, barrier, cuda: bool) -> float:
    """One iteration: barrier (untimed), then the call; CUDA events bracket it on a GPU."""
    barrier()
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def measure(ctx, case: Case, nbytes: int) -> dict:
    """Time ``case`` at ``nbytes`` on this rank; return its samples, #wrong and booked bytes."""
    comm = ctx.comm(case.transport)
    g, n, r = ctx.world, ctx.size, ctx.rank
    dtype = DTYPES[case.dtype]
    itemsize = torch.empty((), dtype=dtype).element_size()
    count, size = counts_for(case.op, nbytes, n, itemsize)
    dev = ctx.device if case.transport != "mpi" else torch.device("cpu")
    src = verify.pattern(case.seed, r, count, dtype, case.redop, dev)
    be = comm.backend
    out: torch.Tensor | None
    root = case.root % n
    vol: dict = {}
    if case.op in ("all_reduce", "broadcast", "reduce"):
        out = src.clone()
        call = {"all_reduce": lambda: be.all_reduce(out, g, case.redop),
                "broadcast": lambda: be.broadcast(out, g, root),
                "reduce": lambda: be.reduce(out, g, root, case.redop)}[case.op]
        reset = lambda: out.copy_(src)  # noqa: E731
        first = {"all_reduce": lambda: comm.all_reduce(src, g, op=case.redop),
                 "broadcast": lambda: comm.broadcast(src, g, root=root),
                 "reduce": lambda: comm.reduce(src, g, root=root, op=case.redop)}[case.op]
        vol = {"root": root} if case.op != "all_reduce" else {}
    else:
        reset = lambda: None  # noqa: E731
        if case.op == "all_gather":
            out = src.new_empty(count * n)
            call, first = (lambda: be.all_gather(out, src, g)), (lambda: comm.all_gather(src, g))
        elif case.op == "gather":
            out = src.new_empty(count * n) if g.index == root else None
            call = lambda: be.gather(out, src, g, root)  # noqa: E731
            first = lambda: comm.gather(src, g, root=root)  # noqa: E731
            vol = {"root": root}
        elif case.op == "reduce_scatter":
            out = src.new_empty(count // n)
            call = lambda: be.reduce_scatter(out, src, g, case.redop)  # noqa: E731
            first = lambda: comm.reduce_scatter(src, g, op=case.redop)  # noqa: E731
        elif case.op == "all_to_all":
            out, splits = src.new_empty(count), [count // n] * n
            call = lambda: be.all_to_all(out, src, g, splits, splits)  # noqa: E731
            first = lambda: comm.all_to_all(src, g)  # noqa: E731
            vol = {"in_splits": splits, "out_splits": splits}
        elif case.op == "scatter":
            out = src.new_empty(count // n)
            s = src if g.index == root else None
            call = lambda: be.scatter(out, s, g, root)  # noqa: E731
            first = lambda: comm.scatter(src if g.index == root else out, g, root=root)  # noqa: E731
            vol = {"root": root}
        elif case.op == "sendrecv":
            out = src.new_empty(count)
            call = lambda: _sendrecv(be, src, out, g)  # noqa: E731
            first = lambda: _sendrecv(be, src, out, g)  # noqa: E731
        else:
            raise ValueError(f"op {case.op!r}: not a collective commbench times; "
                             f"known: {', '.join(COLLECTIVES)}")
    cuda = dev.type == "cuda"
    barrier = (lambda: (torch.cuda.synchronize(), be.barrier(g))) if cuda else \
        (lambda: be.barrier(g))
    first()
    times = []
    tracker = ctx.tracker  # published outside the timer, so a hang in the loop is still named
    for i in range(case.warmup + case.iters):
        reset()
        tracker.enter(f"timed {case.op} (iteration {i}, barrier first)", g.ranks)
        t = _timed(call, barrier, cuda)
        tracker.leave(case.op)
        if i >= case.warmup:
            times.append(t)
    if case.op == "sendrecv":  # one send to the next member and one receive from the previous
        sent = recv = count * itemsize if n > 1 else 0
    else:
        sent, recv = booked(case.op, n, g.index, count, itemsize, **vol)
    for t in times:
        ctx.ledger.record(case.op, g.ranks, comm.transport, case.dtype, count, sent, recv, t)
    wrong = 0
    if case.check:
        want = verify.expected(case.op, case.seed, r, n, count, dtype, case.redop, root)
        got = out if case.op not in ("reduce",) or g.index == root else None
        wrong = verify.wrong(got, want)
    return {"times": times, "wrong": wrong, "count": count, "size": size, "sent": sent,
            "recv": recv}


def _sendrecv(be, src, out, g) -> None:
    """Ring exchange: send to the next member, receive from the previous one."""
    n = g.size
    if n == 1:
        out.copy_(src)
        return
    i = g.index
    req = be.irecv(out, g, (i - 1) % n, 7)
    be.send(src, g, (i + 1) % n, 7)
    req.wait()
