"""Megatron TP, TP+SP, the vocab-parallel head and DDP beyond the contract
(tests/test_patterns.py): replicated outputs bitwise equal, the cross-entropy's volume free of
the vocabulary, DDP's overlap with backward, the naive DDP, and configs refused before any
collective."""

from __future__ import annotations

import pytest
import torch

from commbench.patterns.dp.ddp import naive_sync
from commbench.patterns.run import run_pattern
from commbench.patterns.tp.head import VocabConfig
from commbench.patterns.tp.model import TPConfig
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


@pytest.mark.ddp
@pytest.mark.world(sizes=[2, 4])
def test_ddp_buckets_overlap_backward_and_tp_continues(world):
    """TP x DP: the DP all-reduce of the MLP's gradients starts before the TP group's backward
    all-reduce of the attention input: the DP reduction of one layer runs while TP goes on."""
    tp = 2 if world.size % 2 == 0 and world.size > 2 else 1
    dp = world.size // tp
    cfg = TPConfig(batch=2 * dp, seq=4, hidden=8, ffn=16, heads=2, vocab=8, tp=tp, dp=dp,
                   bucket_bytes=256)
    for out in world.run(run_pattern, "tp_layer", cfg, "tp", 7):
        ledger, issued = out["ledger"], out["outputs"]["stats"]["ddp_issued"]
        assert len(issued) > 1  # several buckets
        if tp > 1:
            last_tp = max(k for k, c in enumerate(ledger) if c[1] == "tp")
            assert issued[0] <= last_tp, "the first DP bucket started only after TP finished"


def _naive_ddp(ctx, n_params: int):
    params = [torch.full((k + 1,), float(ctx.rank)).requires_grad_() for k in range(n_params)]
    sum(p.sum() * (k + 1) for k, p in enumerate(params)).backward()
    with ctx.ledger.capture() as cap:
        naive_sync(params, ctx.comm(), ctx.world)
    return [p.grad.tolist() for p in params], [(e.op, e.count) for e in cap.entries]


@pytest.mark.ddp
@pytest.mark.world(sizes=[2, 3])
def test_naive_ddp_is_one_all_reduce_per_parameter(world):
    n = world.size
    for grads, calls in world.run(_naive_ddp, 4):
        assert calls == [("all_reduce", k + 1) for k in range(4)]
        assert grads == [[float(n * (k + 1))] * (k + 1) for k in range(4)]


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


def test_the_ddp_pattern_refuses_a_tp_degree():
    from commbench.patterns.registry import get

    with pytest.raises(ValueError, match="tp=2: the ddp pattern replicates the layer"):
        get("ddp").check(TPConfig(tp=2, heads=2), 2, "ddp")
