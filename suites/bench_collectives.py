"""The collectives suite, declared as data, timed on the ranks, recorded by pytest-benchmark.

    make suites          # runs every suite; records under results/pytest-benchmark/
    pytest suites -m bench --benchmark-enable --benchmark-compare --benchmark-compare-fail=median:10%

Each series is one collective with one algorithm on one transport, at each size, on worlds of 2
and 4 ranks. The ranks time themselves (commbench.collectives.measure); pytest-benchmark gets the
per-iteration maximum over ranks (commbench.timing.clock). Every sample set is checked: #wrong
must be 0 and the bytes counted must equal the bytes predicted.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from commbench.collectives.measure import Case, measure
from commbench.results.busbw import busbw
from commbench.timing.clock import CLOCK, feed

pytestmark = [pytest.mark.bench, pytest.mark.collectives]


@dataclass(frozen=True)
class Series:
    op: str
    algo: str = "native"


MATRIX = [Series("all_reduce"), Series("all_reduce", "ring"), Series("all_reduce", "rabenseifner"),
          Series("all_reduce", "recursive_doubling"), Series("all_gather"),
          Series("all_gather", "ring"), Series("reduce_scatter"), Series("reduce_scatter", "ring"),
          Series("all_to_all"), Series("all_to_all", "pairwise"), Series("broadcast"),
          Series("broadcast", "binomial")]
SIZES = [1 << 10, 1 << 16, 1 << 20]
ITERS, WARMUP = 20, 5


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.benchmark(timer=CLOCK, group="collectives")
@pytest.mark.parametrize("series", MATRIX, ids=[f"{s.op}-{s.algo}" for s in MATRIX])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("transport", ["gloo", "mpi"])
def test_collective(world, benchmark, series, size, transport):
    if transport not in world.transports:
        pytest.skip(f"{transport} is not in this world ({', '.join(world.transports)})")
    case = Case(series.op, transport, series.algo, iters=ITERS, warmup=WARMUP)
    outs = world.run(measure, case, size)
    samples = [max(ts) for ts in zip(*(o["times"] for o in outs))]
    median = sorted(samples)[len(samples) // 2]
    feed(benchmark, samples, size=outs[0]["size"], ranks=world.size,
         busbw_GBps=busbw(series.op, world.size, outs[0]["size"], median),
         sent=max(o["sent"] for o in outs), predicted=max(o["pred_sent"] for o in outs))
    assert sum(o["wrong"] for o in outs) == 0
    assert [o["sent"] for o in outs] == [o["pred_sent"] for o in outs]
