"""A collective's measurement on every rank: buffers prepared, the one timing loop
(:mod:`commbench.timing.loop`), the result checked and the bytes booked.

The driver takes the maximum over ranks per iteration and reports min, median, max and p99 of
those. Nothing of the driver's dispatch is inside a timed region.

Binding (BINDING): in a local world, MPI series run with rank r bound to core r mod C (MPI
busy-polls; a moving rank shifts timings; with more ranks than cores they share, as ``mpirun
--bind-to core`` places them), gloo series with the ranks free: gloo's I/O threads must run
beside the rank's main thread, and bound to one core its wake-ups wait for a scheduler tick
(docs/decisions.md).

Native collectives are timed as the transport's bare call on buffers prepared before the loop; the
comm layer's checks ran once in the first warm-up call, and each timed call is booked in the
ledger after its timer stops. Inputs are :mod:`commbench.timing.verify` patterns, so the last iteration's
result is checked element by element (``#wrong``). In-place ops (all-reduce, broadcast, reduce)
get their input restored before each iteration, outside the timer.

The witness (``Case.witness``): after the loop of a row of :data:`WITNESS_FROM` bytes or more,
the transport's own all-reduce of :data:`WITNESS_BYTES` timed the same way, its samples returned
beside the row's. It is the same call at every row of every run, so its time moves only with the
state of the machine (and of the transport): this machine runs it at 135 us in one state and
370 us in another, for seconds to minutes at a time, and a row measured in either state carries
the state with it. Beside it the arithmetic witness: :data:`ADD_TIMES` in-place adds of
:data:`ADD_ELEMENTS` float32 on the row's device, the arithmetic commbench's own algorithms do
between their messages, timed the same way. A milder state slows them and not the transport's
own call (docs/decisions.md). ``commbench compare`` judges no row whose witness, either one,
moved between the two runs. Not booked in the ledger: they are the machine's figures, not the
row's traffic.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from functools import partial

import torch

from commbench.collectives import ALGORITHMS
from commbench.collectives.compiled.schedule import Compiled
from commbench.collectives.compiled.steps import step_list
from commbench.names import COLLECTIVES
from commbench.ops import OPS
from commbench.timing import verify
from commbench.timing.loop import timed
from commbench.timing.native import Prepared, prepare_native, restore
from commbench.wire.buffers import like
from commbench.wire.dtypes import DTYPES
from commbench.wire.ledger import Entry

__all__ = ["COLLECTIVES", "MEASUREMENT", "WITNESS", "WITNESS_ADD", "Case", "cadence", "measure"]

MEASUREMENT = {"cadence": "isolated (transport barrier before each iteration, untimed)",
               "rank_aggregation": "per-iteration max over ranks", "statistic": "median"}


WITNESS_BYTES = 1 << 20  # the size this machine's states move most (2.8x; 2x at 256 KiB)
WITNESS_SAMPLES, WITNESS_WARMUP = 8, 2
WITNESS_FROM = 64 << 10  # rows of fewer bytes get none: the gate does not judge them by default
WITNESS = (f"the transport's own all_reduce of {WITNESS_BYTES} B (float32, sum), "
           f"{WITNESS_SAMPLES} samples after {WITNESS_WARMUP} warm-up, timed as the rows, right "
           f"after the loop of each row of >= {WITNESS_FROM} B: witness_us, its median (the "
           "machine's state beside the row)")
ADD_ELEMENTS, ADD_TIMES = 1 << 16, 4  # 256 KiB an add: a step of those algorithms
WITNESS_ADD = (f"{ADD_TIMES} in-place adds of {ADD_ELEMENTS} float32 on the row's device, "
               f"{WITNESS_SAMPLES} samples after {WITNESS_WARMUP} warm-up, timed as the rows, "
               "right after the witness: witness_add_us, its median (the device's arithmetic "
               "beside the row)")


def cadence(batch: int) -> dict:
    """The measurement fields for samples of ``batch`` calls (see commbench.timing.loop.timed)."""
    if batch == 1:
        return dict(MEASUREMENT)
    return dict(MEASUREMENT, cadence=f"batched ({batch} calls back to back per sample after an "
                "untimed transport barrier; the sample is their mean)",
                rank_aggregation="per-sample max over ranks", batch=batch)


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
    batch: int = 1  # calls timed back to back per sample (1: a barrier before every call)
    trace: bool = False  # one more call after the check, its messages kept for a timeline
    witness: bool = False  # the witness after the loop (module docstring)

    def as_dict(self) -> dict:
        return asdict(self)


def _core(ctx) -> int | None:
    return getattr(ctx.affinity, "core", None)


def placement(world) -> str:
    """Where MPI series ran on ``world``'s ranks (a record's ``binding``; see BINDING)."""
    cores = world.run(_core)
    if None in cores:
        return "not bound by commbench (a launcher's placement, or COMMBENCH_BIND=0)"
    return f"MPI series: rank r on core {cores}[r]; gloo series free"


def measure(ctx, case: Case, nbytes: int) -> dict:
    """Time ``case`` at ``nbytes`` on this rank; return its samples, #wrong and bytes per call."""
    if case.batch < 1:
        raise ValueError(f"batch={case.batch}: must be >= 1")
    if ctx.affinity is not None:  # a local world: see BINDING
        ctx.affinity(case.transport == "mpi")
    comm = ctx.comm(case.transport)
    g, n, r = ctx.world, ctx.size, ctx.rank
    dtype = DTYPES[case.dtype]
    itemsize = dtype.itemsize
    count, size = OPS[case.op].counts(nbytes, n, itemsize)
    dev = ctx.device if case.transport != "mpi" else torch.device("cpu")
    src = verify.seeded(case.seed, r, count, dtype, case.redop, dev)
    if dev.type == "cpu":  # the input too lives in NumPy-allocated memory (see wire.buffers.like)
        src = like(src, count).copy_(src)
    root = case.root % n
    if case.algo == "native":
        prep = prepare_native(comm, g, case.op, case.redop, root, src, count)
    else:
        prep = _prepare_algorithm(ctx, comm, case, src, count, root)
    be = comm.backend
    barrier = be.barrier_call(g)
    with ctx.ledger.capture() as one_call:
        prep.first()
    # published before the loop, so a hang inside it is still named
    loop = f"timed {case.op}/{case.algo} loop ({case.batch} call(s) per sample, a barrier before each)"
    ctx.tracker.enter(loop, g.ranks)
    times = timed(prep.call, barrier, case.iters, case.warmup, dev.type == "cuda",
                  reset=prep.reset, batch=case.batch,
                  progress=lambda k, total: ctx.tracker.progress(loop, k, total))
    ctx.tracker.leave(case.op)
    seen = _witness(ctx, comm, barrier, dev) if case.witness and nbytes >= WITNESS_FROM else None
    per_call = [t for t in times for _ in range(case.batch)]  # one ledger entry per timed call
    if prep.after is not None:
        prep.after(per_call)
    if OPS[case.op].one_way:
        times = [t / 2 for t in times]  # one way, as OSU reports it
    record = ALGORITHMS[(case.op, case.algo)]
    pred_sent, pred_recv = record.bytes(n, g.index, count, itemsize,
                                        **{"root": root, **prep.vol, **record.node_kw(ctx)})
    if case.algo == "native":  # the transport's own call: booked at its formula volume
        sent, recv = pred_sent, pred_recv
        for t in per_call:
            ctx.ledger.record(case.op, g.ranks, comm.transport, case.dtype, count, sent, recv, t,
                              axis=g.name)
    else:  # built from send/recv: what the ledger counted, message by message, in one call
        sent, recv = one_call.sent, one_call.recv
    wrong = 0
    if case.check and OPS[case.op].expected is not None:
        want = verify.expected(case.op, case.seed, r, n, count, dtype, case.redop, root, dev)
        wrong = verify.wrong(prep.result(), want)
    out = {"times": times, "wrong": wrong, "count": count, "size": size, "sent": sent,
           "recv": recv, "pred_sent": pred_sent, "pred_recv": pred_recv}
    if seen is not None:
        out["witness"], out["witness_add"] = seen
    if case.trace:  # a warm call, the ranks started together, for a Chrome trace
        prep.reset()
        barrier()
        with ctx.ledger.capture() as traced:
            t0 = time.perf_counter()
            prep.call()
            span = (t0, time.perf_counter())
        entries = [tuple(e) for e in traced.entries] or [tuple(Entry(  # the transport's own call
            case.op, g.ranks, comm.transport, case.dtype, count, sent, recv, span[1] - span[0],
            axis=g.name, start=t0))]
        out.update(timeline=entries, span=span)
    return out


def _witness(ctx, comm, barrier, dev) -> tuple[list[float], list[float]]:
    """The witnesses' samples on this rank (module docstring): the bare transport call on
    buffers of its own, then the adds; none of it booked."""
    count = WITNESS_BYTES // 4
    src = torch.ones(count, dtype=torch.float32, device=dev)
    if dev.type == "cpu":
        src = like(src, count).copy_(src)
    prep = prepare_native(comm, ctx.world, "all_reduce", "sum", 0, src, count)
    what = "the witness's all_reduce loop (after the row's)"
    ctx.tracker.enter(what, ctx.world.ranks)
    times = timed(prep.call, barrier, WITNESS_SAMPLES, WITNESS_WARMUP, dev.type == "cuda",
                  reset=prep.reset)
    ctx.tracker.leave("all_reduce")
    acc = torch.zeros(ADD_ELEMENTS, dtype=torch.float32, device=dev)
    one = torch.ones(ADD_ELEMENTS, dtype=torch.float32, device=dev)

    def adds() -> None:
        for _ in range(ADD_TIMES):
            acc.add_(one)

    what = "the arithmetic witness's adds (after the row's)"
    ctx.tracker.enter(what, ctx.world.ranks)
    added = timed(adds, barrier, WITNESS_SAMPLES, WITNESS_WARMUP, dev.type == "cuda")
    ctx.tracker.leave("the arithmetic witness")
    return times, added


def _prepare_algorithm(ctx, comm, case: Case, src, count: int, root: int) -> Prepared:
    record = ALGORITHMS.get((case.op, case.algo))
    if record is None or record.fn is None:
        known = sorted(f"{o}/{a}" for o, a in ALGORITHMS)
        raise ValueError(f"no algorithm {case.algo!r} for {case.op!r}; known: {', '.join(known)}")
    if record.compiled:
        return _prepare_compiled(comm, case, src, record, ctx.world)
    splits = [count // ctx.size] * ctx.size if OPS[case.op].split else None
    vol = {"in_splits": splits, "out_splits": splits} if splits else {}
    run = record.bind(ctx, comm, src, root=root, redop=case.redop, splits=splits)
    holder: dict = {}

    def call() -> None:
        holder["out"] = run()

    return Prepared(call, lambda: None, call, lambda: holder.get("out"), vol)


def _prepare_compiled(comm, case: Case, src, record, g) -> Prepared:
    """A compiled schedule bound once to a NumPy-backed buffer; the timer brackets its replay.

    Like the native path: restored before each iteration by the same NumPy copy, outside the
    timer (a torch ``copy_`` there, untimed, still slowed the timed call after the barrier: see
    docs/decisions.md), and booked after the loop, message by message, each timed call at its
    own time.
    """
    buf = like(src, src.numel())
    steps = step_list(record.compiled, g.size, g.index, buf.numel())
    sched = Compiled(comm, buf, g, steps, case.redop, case.algo)

    def after(times: list[float]) -> None:
        for t in times:
            sched.book(t)
        sched.close()

    once = partial(record.function, comm, src, g, op=case.redop, algo=record.compiled)
    return Prepared(sched.run, restore(buf, src), once, lambda: buf, after=after)
