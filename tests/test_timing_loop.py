"""The timing loop at its boundaries, on a fake clock (no wall-clock figure in any assertion):
what is timed, how many calls, barriers and resets each cadence makes, and the per-sample
maximum over ranks."""

from __future__ import annotations

import pytest

from commbench.results.busbw import algbw, busbw, factor
from commbench.timing import loop
from commbench.timing.loop import slowest, timed

pytestmark = pytest.mark.foundation


class _Clock:
    """A fake ``perf_counter``: a call costs 1 s, a reset 100 s, a barrier 10 s; every event
    is logged."""

    def __init__(self) -> None:
        self.now, self.log = 0.0, []

    def __call__(self) -> float:
        return self.now

    def event(self, name: str, cost: float):
        def f():
            self.log.append(name)
            self.now += cost
        return f


def _run(monkeypatch, **kw):
    clock = _Clock()
    monkeypatch.setattr(loop.time, "perf_counter", clock)
    times = timed(clock.event("call", 1.0), clock.event("barrier", 10.0),
                  reset=clock.event("reset", 100.0), **kw)
    return times, clock.log


def test_samples_come_after_the_warm_up_and_time_the_calls_alone(monkeypatch):
    times, log = _run(monkeypatch, iters=3, warmup=2)
    assert times == [1.0, 1.0, 1.0]  # neither the reset nor the barrier is inside the timer
    assert log == ["reset", "barrier", "call"] * 5


def test_a_batch_is_its_mean_and_its_last_call_runs_again_on_a_restored_input(monkeypatch):
    times, log = _run(monkeypatch, iters=2, warmup=1, batch=4)
    assert times == [1.0, 1.0]  # 4 calls of 1 s each per sample, reported per call
    assert log == (["reset", "barrier"] + ["call"] * 4) * 3 + ["reset", "call"]


@pytest.mark.parametrize("iters, warmup, calls", [(0, 0, 0), (0, 2, 2), (1, 0, 1)])
@pytest.mark.parametrize("batch", [2, 3])
def test_empty_and_single_sample_loops(monkeypatch, iters, warmup, calls, batch):
    times, log = _run(monkeypatch, iters=iters, warmup=warmup, batch=1)
    assert len(times) == iters and log.count("call") == calls
    times, log = _run(monkeypatch, iters=iters, warmup=warmup, batch=batch)
    assert len(times) == iters
    assert log.count("call") == batch * (iters + warmup) + (1 if iters or warmup else 0)


def test_progress_names_each_sample_before_its_barrier(monkeypatch):
    seen = []
    clock = _Clock()
    monkeypatch.setattr(loop.time, "perf_counter", clock)
    timed(clock.event("call", 1.0), lambda: seen.append("barrier"), 2, 1,
          progress=lambda k, total: seen.append((k, total)))
    assert seen == [(1, 3), "barrier", (2, 3), "barrier", (3, 3), "barrier"]


def test_slowest_is_the_maximum_per_sample_for_one_rank_and_for_none():
    assert slowest([[3.0, 1.0, 2.0]]) == [3.0, 1.0, 2.0]
    assert slowest([[1.0, 5.0], [2.0, 4.0], [0.5, 6.0]]) == [2.0, 6.0]
    assert slowest([[], []]) == []


def test_bandwidth_at_its_edges():
    """A sample of no time has no bandwidth (not infinity); one rank moves nothing on the bus;
    algbw is bytes per second in GB/s (1e9, as nccl-tests)."""
    assert algbw(10**9, 0.0) == 0.0 and algbw(10**9, 1.0) == 1.0
    assert factor("all_reduce", 1) == 0.0 and factor("all_gather", 1) == 0.0
    assert factor("broadcast", 1) == 1.0
    assert busbw("all_reduce", 4, 10**9, 0.5) == pytest.approx(2.0 * 2 * 3 / 4)
    with pytest.raises(ValueError, match="n=0: must be >= 1"):
        factor("all_reduce", 0)
    with pytest.raises(ValueError, match="op 'send': no busbw factor"):
        factor("send", 2)
