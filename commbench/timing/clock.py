"""Feed pytest-benchmark with the ranks' own timings.

pytest-benchmark times a function in the process that runs the test, which for a local world is
the driver: its numbers would include sending the task to the ranks. Instead, a suite runs the
timing loop on the ranks (:func:`commbench.collectives.measure.measure`), takes the per-iteration maximum over
ranks, and hands those samples to :func:`feed`. ``feed`` runs ``benchmark.pedantic`` with one round
per sample on a clock that advances by exactly that sample, so pytest-benchmark's statistics,
storage (``--benchmark-autosave``) and comparison (``--benchmark-compare``) are those of the
in-rank times. Suites name the clock in their marker: ``@pytest.mark.benchmark(timer=CLOCK)``.
"""

from __future__ import annotations

__all__ = ["CLOCK", "SampleClock", "feed"]


class SampleClock:
    """A clock that stands still until :meth:`step` moves it by the next sample."""

    def __init__(self) -> None:
        self.now = 0.0
        self._pending: list[float] = []

    def __call__(self) -> float:
        return self.now

    def load(self, samples: list[float]) -> None:
        if not samples or min(samples) < 0:
            raise ValueError(f"samples {samples[:4]}...: need at least one, none negative")
        self._pending = list(samples)

    def step(self) -> None:
        self.now += self._pending.pop(0)

    def __repr__(self) -> str:  # pytest-benchmark prints the timer's name
        return "commbench.timing.clock.CLOCK"


CLOCK = SampleClock()


def feed(benchmark, samples: list[float], **extra) -> None:
    """Record ``samples`` (seconds) as ``benchmark``'s rounds; ``extra`` goes to extra_info."""
    benchmark.extra_info.update(extra)
    CLOCK.load(samples)
    benchmark.pedantic(CLOCK.step, rounds=len(samples), iterations=1, warmup_rounds=0)
