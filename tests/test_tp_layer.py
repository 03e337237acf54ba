"""Megatron TP and TP+SP beyond the contract (tests/test_patterns.py): replicated outputs
bitwise equal, and configs refused before any collective."""

from __future__ import annotations

import pytest
import torch

from commbench.patterns.run import run_pattern
from commbench.patterns.tp.configs import TPConfig
from commbench.runtime.errors import SPMDError

pytestmark = [pytest.mark.tp]


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("variant", ["tp", "naive"])
def test_replicated_outputs_are_bitwise_equal_on_a_tp_group(world, variant):
    """y is replicated over TP (no sequence parallelism): every rank of a TP group holds the
    same bits, not merely close values."""
    tp = 2
    cfg = TPConfig(batch=world.size // tp * 2, seq=4, hidden=8, ffn=8, heads=2, vocab=2, tp=tp,
                   dp=world.size // tp, dtype="float32")
    outs = world.run(run_pattern, "tp_layer", cfg, variant, 3)
    for r, out in enumerate(outs):
        assert torch.equal(out["outputs"]["y"], outs[r - r % tp]["outputs"]["y"])


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize(("bad", "variant"), [
    (dict(heads=3), "tp"), (dict(vocab=7), "tp"), (dict(seq=3), "sp"), (dict(dropout=1.0), "tp"),
    (dict(batch=1, dp=2), "tp"), (dict(bucket_bytes=0), "tp"), (dict(dtype="int8"), "tp")])
def test_configs_that_cannot_work_are_refused_before_any_collective(world, bad, variant):
    base = dict(batch=4, seq=8, hidden=12, ffn=8, heads=4, vocab=8, tp=world.size)
    if "dp" in bad:
        base["tp"] = world.size // 2
    cfg = TPConfig(**{**base, **bad})
    with pytest.raises(ValueError) as direct:
        cfg.validate(world.size, variant)
    with pytest.raises(SPMDError, match=str(direct.value).split(":")[0]):
        world.run(run_pattern, "tp_layer", cfg, variant, 0)
