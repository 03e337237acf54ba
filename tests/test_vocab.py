"""The vocab-parallel head beyond the contract (tests/test_patterns.py): the cross-entropy's
volume is free of the vocabulary."""

from __future__ import annotations

import pytest

from commbench.patterns.run import run_pattern
from commbench.patterns.tp.vocab import VocabConfig

pytestmark = [pytest.mark.tp]


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("vocab_per_rank", [3, 50])
def test_cross_entropy_moves_b_s_floats_whatever_the_vocabulary(world, vocab_per_rank):
    """3 all-reduces (fused: 2) of b*s float32 in forward, none in backward; V changes nothing."""
    P = world.size
    cfg = VocabConfig(batch=2, seq=6, hidden=8, vocab=P * vocab_per_rank, tp=P, dtype="float32")
    bs = cfg.batch * cfg.seq
    for variant, counts in (("megatron", [bs] * 3), ("fused", [bs, 2 * bs])):
        for out in world.run(run_pattern, "vocab", cfg, variant, 1):
            ce = out["outputs"]["stats"]["cross_entropy"]
            assert [(op, n) for op, n, _ in ce] == [("all_reduce", n) for n in counts]
