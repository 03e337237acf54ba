"""DDP beyond the contract (tests/test_patterns.py): buckets overlapped with backward under
TP x DP, the naive DDP's one all-reduce per parameter, and a TP degree refused."""

from __future__ import annotations

import pytest
import torch

from commbench.patterns.buckets import naive_sync
from commbench.patterns.dp.ddp import DDPConfig
from commbench.patterns.run import run_pattern
from commbench.patterns.tp.configs import TPConfig

pytestmark = [pytest.mark.ddp]


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


@pytest.mark.world(sizes=[2, 3, 4])
def test_naive_ddp_is_one_all_reduce_per_parameter(world):
    n = world.size
    for grads, calls in world.run(_naive_ddp, 4):
        assert calls == [("all_reduce", k + 1) for k in range(4)]
        assert grads == [[float(n * (k + 1))] * (k + 1) for k in range(4)]


def test_the_ddp_pattern_refuses_a_tp_degree():
    from commbench.patterns.registry import get

    with pytest.raises(ValueError, match="tp=2: the ddp pattern replicates the layer"):
        get("ddp").check(DDPConfig(tp=2, heads=2), 2, "ddp")
    with pytest.raises(ValueError, match="config TPConfig: the ddp pattern takes a DDPConfig"):
        get("ddp").check(TPConfig(tp=1, heads=2), 2, "ddp")
