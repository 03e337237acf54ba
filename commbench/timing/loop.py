"""The one timing loop, for a collective's call and a pattern's step alike.

Cadence ("isolated", nccl-tests' ``-z 3`` spirit): before every sample the ranks meet in the
transport's own barrier (after a device synchronisation on a GPU), outside the timed region; the
timer then brackets ``batch`` calls: host ``perf_counter`` on CPU, CUDA events around the calls
on a GPU. Each rank returns its per-sample times; the driver takes the maximum over ranks per
sample (:func:`slowest`, nccl-tests' ``-I`` aggregation): an iteration ends with its last rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

__all__ = ["BROKEN_RULES", "slowest", "timed"]


def timed(call: Callable[[], object], barrier: Callable[[], object], iters: int, warmup: int,
          cuda: bool = False, *, reset: Callable[[], object] | None = None,
          batch: int = 1, progress: Callable[[int, int], object] | None = None) -> list[float]:
    """Seconds per call of ``iters`` samples after ``warmup`` more.

    ``reset`` runs before each sample, untimed (an in-place input restored). Kept flat (nothing
    between the barrier and the timer) so that the timed region holds the calls and nothing
    else. With ``batch`` > 1 the calls of a sample run back to back (nccl-tests' cadence: no
    barrier and no reset between them) and the sample is their mean; the last call then runs
    once more on a restored input, so that a result checked afterwards is one call's.
    ``progress(sample, total)`` runs before each sample's barrier, untimed: it publishes how far
    this rank got, so that a rank stuck inside the loop is named.
    """
    times = []
    perf = time.perf_counter
    calls = range(batch)
    total = warmup + iters
    for i in range(total):
        if progress is not None:
            progress(i + 1, total)
        if reset is not None:
            reset()
        if cuda:
            torch.cuda.synchronize()
            barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in calls:
                call()
            end.record()
            end.synchronize()
            t = start.elapsed_time(end) / 1e3
        else:
            barrier()
            t0 = perf()
            for _ in calls:
                call()
            t = perf() - t0
        if i >= warmup:
            times.append(t / batch)
    if batch > 1 and (iters or warmup):
        if reset is not None:
            reset()
        call()
    return times


def slowest(per_rank: list[list[float]]) -> list[float]:
    """Per sample, the slowest rank's time: ``per_rank[r][k]`` -> ``max_r per_rank[r][k]``."""
    return [max(ts) for ts in zip(*per_rank, strict=True)]


# Deliberately wrong ways to make a row of the ranks' samples, declared as the patterns declare
# their broken variants: the harness's contract (tests/test_harness_contract.py) tells each
# from :func:`slowest` on the same samples.
BROKEN_RULES: dict[str, Callable[[list[list[float]]], list[float]]] = {
    "rank_zero": lambda per_rank: list(per_rank[0]),  # the driver's own rank only
    "slowest_series": lambda per_rank: list(max(per_rank, key=sum)),  # one rank's whole series
    "mean_over_ranks": lambda per_rank: [sum(ts) / len(ts) for ts in zip(*per_rank, strict=True)],
}
