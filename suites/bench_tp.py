"""The tensor-parallel suite: one transformer layer, declared as data, timed on the ranks.

Each case is a model size and a variant (TP, naive TP, TP+SP, TP+SP with Megatron's re-gather,
DDP and naive DDP); pytest-benchmark gets the per-iteration maximum over ranks, and every case
checks that the bytes the ledger counted equal the prediction.
"""

from __future__ import annotations

import pytest

from commbench.patterns.tp_model import TPConfig
from commbench.patterns.tp_run import run_layer
from commbench.studies.pattern_bench import MODELS, VARIANTS, _predicted_sent, per_iteration
from commbench.timing.clock import CLOCK, feed

pytestmark = [pytest.mark.bench, pytest.mark.tp]
CASES = [(m, v) for m in MODELS[:2] for v in VARIANTS]


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.benchmark(timer=CLOCK, group="tp")
@pytest.mark.parametrize(("model", "variant"), CASES,
                         ids=[f"{v.replace(' ', '_')}-h{m[2]}" for m, v in CASES])
def test_layer(world, benchmark, model, variant):
    b, s, h, f = model
    sp, regather, naive, dp, naive_ddp = VARIANTS[variant]
    tp, dp = (world.size, 1) if dp == 1 else (1, world.size)
    if sp and tp == 1:
        pytest.skip("sequence parallelism needs TP > 1")
    cfg = TPConfig(batch=b * dp, seq=s, hidden=h, ffn=f, heads=h // 16, vocab=tp, tp=tp, dp=dp,
                   sequence_parallel=sp, regather=regather, dtype="float32")
    outs = world.run(run_layer, cfg, 0, naive, 25 << 20, True, 10, 3, naive_ddp)
    samples = per_iteration(outs)
    sent = max(sum(e[4] for e in o["ledger"]) for o in outs)
    feed(benchmark, samples, variant=variant, model=list(model), ranks=world.size, sent=sent)
    if dp == 1:
        assert sent == _predicted_sent(cfg, naive)
