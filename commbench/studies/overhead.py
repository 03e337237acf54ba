"""Side-by-side studies behind the committed performance figures.

* :func:`overhead`: commbench's reported time for MPI's own all-reduce against a minimal raw mpi4py
  loop of the same call, same cadence (reset outside the timer, barrier, timed ``Allreduce``),
  interleaved round by round in one run so that both see the same machine.
* :func:`memcpy_bandwidth`: this machine's memory-copy bandwidth, measured in the same run, to
  express large-message results as a fraction of it.

Both report medians of the per-iteration maximum over ranks, and the spread (min and p99).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from commbench.collectives.measure import MEASUREMENT, Case, measure
from commbench.results import records as res
from commbench.results.records import overhead_markdown
from commbench.studies.settings import StudySettings, write_study

__all__ = ["memcpy_bandwidth", "overhead", "raw_mpi_all_reduce", "run_overhead"]


def raw_mpi_all_reduce(ctx, nbytes: int, iters: int, warmup: int) -> list[float]:
    """The reference loop: NumPy buffers and mpi4py only, nothing of commbench in the loop."""
    # lazy: imports mpi4py
    from mpi4py import MPI

    comm = ctx.mpi
    src = np.arange(nbytes // 4, dtype=np.float32) % 7
    buf = src.copy()
    times = []
    for i in range(warmup + iters):
        buf[:] = src
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, buf, MPI.SUM)
        t = time.perf_counter() - t0
        if i >= warmup:
            times.append(t)
    return times


def overhead(world, sizes: list[int], iters: int = 50, warmup: int = 10, rounds: int = 3,
             emit=print) -> list[dict]:
    """Per size: commbench's MPI all-reduce time over the raw loop's, rounds interleaved."""
    if "mpi" not in world.transports:
        raise ValueError(f"the overhead study needs the MPI transport; this world has "
                         f"{list(world.transports)}")
    rows = []
    case = Case("all_reduce", "mpi", iters=iters, warmup=warmup, check=True)
    emit(f"#{'size':>11} {'raw(us)':>10} {'commbench(us)':>14} {'ratio':>7} "
         f"{'raw p99':>9} {'cb p99':>9}")
    for nbytes in sizes:
        raw: list[float] = []
        ours: list[float] = []
        for k in range(rounds):  # ABBA order, so that drift during the run hits both alike
            for which in (("raw", "ours") if k % 2 == 0 else ("ours", "raw")):
                if which == "raw":
                    per_rank = world.run(raw_mpi_all_reduce, nbytes, iters, warmup)
                    raw += [max(ts) for ts in zip(*per_rank)]
                    continue
                outs = world.run(measure, case, nbytes)
                if any(o["wrong"] for o in outs):
                    raise RuntimeError(f"all_reduce of {nbytes} B gave wrong elements")
                ours += [max(ts) for ts in zip(*(o["times"] for o in outs))]
        row = {"size": nbytes, "raw_us": statistics.median(raw) * 1e6,
               "commbench_us": statistics.median(ours) * 1e6,
               "raw_p99_us": res.percentile(raw, 99) * 1e6,
               "commbench_p99_us": res.percentile(ours, 99) * 1e6, "samples": len(raw)}
        row["ratio"] = row["commbench_us"] / row["raw_us"]
        emit(f" {nbytes:>11} {row['raw_us']:>10.2f} {row['commbench_us']:>14.2f} "
             f"{row['ratio']:>7.3f} {row['raw_p99_us']:>9.1f} {row['commbench_p99_us']:>9.1f}")
        rows.append(row)
    return rows


def memcpy_bandwidth(ctx, nbytes: int = 64 << 20, iters: int = 10) -> float:
    """Bytes per second of ``dst.copy_(src)`` for ``nbytes``, median of ``iters`` (this rank)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device="cpu")
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times)


def run_overhead(s: StudySettings, world, transports, sizes, launch, prints, emit) -> int:
    """``commbench run overhead``: commbench's MPI all-reduce against a bare mpi4py loop."""

    measurement = dict(MEASUREMENT, iters=s.iters, warmup=s.warmup, rounds=s.rounds,
                       order="ABBA: raw then commbench, then commbench then raw, ...")
    emit(f"# commbench run overhead: MPI all-reduce, {world.size} ranks ({launch}); commbench's "
         "reported time against a bare mpi4py loop of the same call, interleaved")
    rows = overhead(world, sizes, s.iters, s.warmup, s.rounds, emit)
    worst = max(r["ratio"] for r in rows)
    emit(f"# worst ratio {worst:.3f} (target <= 1.10)")
    write_study(s, prints, world, launch, "overhead", measurement, rows,
                 overhead_markdown, emit, transport="mpi")
    return 0
