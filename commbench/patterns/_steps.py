"""What every pattern's SPMD entry point shares: the ledger as plain tuples, and the timed loop."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["ledger_rows", "timed"]


def ledger_rows(entries) -> list[tuple]:
    """(op, group, count, dtype, sent, recv) per call: picklable, for the driver to judge."""
    return [(e.op, e.group, e.count, e.dtype, e.sent, e.recv) for e in entries]


def timed(ctx, step: Callable[[], object], iters: int, warmup: int) -> list[float]:
    """Seconds of each of ``iters`` calls of ``step`` after ``warmup`` more, a world barrier of
    the transport before each, outside the timer."""
    times = []
    for i in range(warmup + iters):
        ctx.comm().backend.barrier(ctx.world)
        t0 = time.perf_counter()
        step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times
