"""The pipeline suite, declared as data, timed on the ranks, recorded by pytest-benchmark: one
sample per whole schedule, synthetic equal stages, with the measured bubble and the formula in
extra_info.
"""

from __future__ import annotations

import pytest

from commbench.patterns.pp import PPConfig, run_pipeline
from commbench.patterns.pp_schedule import bubble_fraction
from commbench.timing.clock import CLOCK, feed

SCHEDULES = [("gpipe", 8, 1), ("1f1b", 8, 1), ("interleaved", 8, 2)]


@pytest.mark.bench
@pytest.mark.pp
@pytest.mark.world(sizes=[2, 4])
@pytest.mark.benchmark(timer=CLOCK, group="pp")
@pytest.mark.parametrize(("name", "m", "v"), SCHEDULES, ids=[s[0] for s in SCHEDULES])
def test_pipeline(world, benchmark, name, m, v):
    p = world.size
    cfg = PPConfig(stages=p, layers=4 * p, hidden=32, batch=4 * m, micro=m, virtual=v,
                   schedule=name, compute_s=0.002)
    world.run(run_pipeline, cfg, 0)  # opens the point-to-point connections
    runs = [world.run(run_pipeline, cfg, 0) for _ in range(3)]
    samples = [max(o["total_s"] for o in outs) for outs in runs]
    last = runs[-1]
    wall = max(o["total_s"] for o in last)
    feed(benchmark, samples, bubble=sum(1 - o["busy_s"] / wall for o in last) / p,
         predicted_bubble=bubble_fraction(name, p, m, v))
