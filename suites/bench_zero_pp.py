"""ZeRO and pipeline suites, declared as data, timed on the ranks, recorded by pytest-benchmark.

ZeRO: one sample per optimizer step (the slowest rank's), every stage against DDP, with the bytes
checked against the prediction. Pipeline: one sample per whole schedule, synthetic equal stages,
with the measured bubble and the formula in extra_info.
"""

from __future__ import annotations

import pytest

from commbench.patterns.pp import PPConfig, run_pipeline
from commbench.patterns.pp_schedule import bubble_fraction
from commbench.patterns.zero import predicted_calls, train
from commbench.patterns.zero_model import ZeroConfig
from commbench.timing.clock import CLOCK, feed
from commbench.wire.volume import booked

STAGES = [0, 1, 2, 3]
SCHEDULES = [("gpipe", 8, 1), ("1f1b", 8, 1), ("interleaved", 8, 2)]


@pytest.mark.bench
@pytest.mark.zero
@pytest.mark.world(sizes=[2, 4])
@pytest.mark.benchmark(timer=CLOCK, group="zero")
@pytest.mark.parametrize("micro", [1, 4])
@pytest.mark.parametrize("stage", STAGES, ids=["ddp", "zero1", "zero2", "zero3"])
def test_zero_step(world, benchmark, stage, micro):
    P = world.size
    cfg = ZeroConfig(stage=stage, layers=4, hidden=64, batch=4 * P, micro=micro, steps=8,
                     dtype="float32")
    outs = world.run(train, cfg, 0)
    samples = [max(ts) for ts in zip(*(o["step_times"] for o in outs))]
    sent = max(sum(e[2] for e in o["ledger"]) for o in outs)
    pred = max(sum(booked(op, P, i, c, 4)[0] for op, c in predicted_calls(cfg, P)) for i in range(P))
    feed(benchmark, samples, stage=stage, micro=micro, ranks=P, sent_per_step=sent // cfg.steps,
         memory=outs[0]["memory"])
    assert sent == pred


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
