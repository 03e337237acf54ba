"""The MoE suite: dispatch/combine in the capacity, variable and naive layouts.

pytest-benchmark gets the per-iteration maximum over ranks; every case checks that the bytes the
ledger counted equal the prediction. ``commbench run moe`` prints and
write the committed tables.
"""

from __future__ import annotations

import pytest

from commbench.patterns.moe_gating import MoEConfig
from commbench.patterns.moe_run import predicted, run_moe
from commbench.studies.pattern_bench import per_iteration
from commbench.studies.pattern_bench_a2a import MOE_MODELS
from commbench.timing.clock import CLOCK, feed

pytestmark = [pytest.mark.bench]


@pytest.mark.moe
@pytest.mark.ep
@pytest.mark.world(sizes=[2, 4])
@pytest.mark.benchmark(timer=CLOCK, group="moe")
@pytest.mark.parametrize("cf", [0.5, 2.0])
@pytest.mark.parametrize("variant", ["capacity", "variable", "naive"])
def test_moe_layer(world, benchmark, variant, cf):
    T, M, F, per = MOE_MODELS[0]
    P = world.size
    cfg = MoEConfig(tokens=(T,) * P, model=M, ffn=F, experts=per * P, capacity_factor=cf, ep=P,
                    dtype="float32")
    outs = world.run(run_moe, cfg, 0, variant, 10, 3)
    sent = max(sum(e[4] for e in o["ledger"]) for o in outs)
    feed(benchmark, per_iteration(outs), variant=variant, capacity_factor=cf, ranks=P, sent=sent)
    kept = [o["kept"] for o in outs]
    assert sent == max(sum(x[2] for x in predicted(cfg, variant, r, kept)) for r in range(P))
