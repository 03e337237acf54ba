"""ZeRO-1/2/3 and DDP beyond the contract (tests/test_patterns.py): bytes per step against the
textbook ratios, memory per rank as the notes count it, configs refused before any collective,
and ZeRO-3's gather for any layer."""

from __future__ import annotations

import pytest
import torch

from commbench.patterns.dp.configs import STAGES, ZeroConfig, flat_size
from commbench.patterns.dp.zero_comms import gathered
from commbench.patterns.run import run_pattern
from commbench.runtime.errors import SPMDError

pytestmark = pytest.mark.zero


def _sent(out: dict) -> int:
    return sum(c[3] for c in out["ledger"])


@pytest.mark.world(sizes=[2, 4])
def test_bytes_per_step_against_ddp(world):
    """Per rank per step: DDP 2(P-1)/P*Psi = ZeRO-1 = ZeRO-2 (one micro-batch); ZeRO-3 3(P-1)/P*Psi,
    1.5x DDP; with m micro-batches ZeRO-2 moves (m+1)/2x and ZeRO-3 3m/2x what DDP moves."""
    P = world.size
    sent = {}
    for stage, variant in enumerate(STAGES):
        for micro in (1, 4):
            cfg = ZeroConfig(layers=2, hidden=8, batch=P, micro=micro, steps=1, dp=P)
            sent[stage, micro] = _sent(world.run(run_pattern, "zero", cfg, variant, 0)[0])
    _, padded = flat_size(ZeroConfig(layers=2, hidden=8), P)
    ddp = 2 * (P - 1) * padded * 2 * 8 // P  # 2 layers, float64
    assert sent[0, 1] == sent[1, 1] == sent[2, 1] == ddp == sent[0, 4] == sent[1, 4]
    assert sent[3, 1] * 2 == ddp * 3 and sent[3, 4] * 2 == ddp * 3 * 4
    assert sent[2, 4] * 2 == ddp * 5


@pytest.mark.world(sizes=[2, 4])
def test_memory_per_rank_shards_as_the_notes_say(world):
    """Per element: params 4 B, grads 4 B, Adam moments 8 B in float32 (the notes' 12 B per
    parameter count weights and moments); each stage divides one more of them by P."""
    P = world.size
    _, padded = flat_size(ZeroConfig(layers=2, hidden=8), P)
    psi = 2 * padded
    full = {"params": 4 * psi, "grads": 4 * psi, "optimizer": 8 * psi}
    for stage, variant in enumerate(STAGES):
        cfg = ZeroConfig(layers=2, hidden=8, batch=P, dp=P, dtype="float32")
        mem = world.run(run_pattern, "zero", cfg, variant, 0)[0]["outputs"]["stats"]["memory"]
        shard = {"params": stage >= 3, "grads": stage >= 2, "optimizer": stage >= 1}
        assert mem == {k: v // P if shard[k] else v for k, v in full.items()}
        if stage == 0:
            assert mem["params"] + mem["optimizer"] == 12 * psi
    mixed = world.run(run_pattern, "zero", ZeroConfig(layers=2, hidden=8, batch=P, dp=P,
                                                      dtype="bfloat16"), "ddp", 0)[0]
    # bf16 weights 2 B + fp32 master 4 B + moments 8 B = 14 B, plus gradients accumulated in fp32
    assert mixed["outputs"]["stats"]["memory"] == {"params": 2 * psi, "grads": 4 * psi,
                                                   "optimizer": 12 * psi}


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize(("bad", "rule"), [(dict(dp=3), "dp=3"), (dict(batch=3), "batch=3"),
                                           (dict(lr=0), "lr=0"), (dict(micro=0), "micro=0"),
                                           (dict(dtype="int8"), "dtype='int8'")])
def test_bad_configs_are_refused(world, bad, rule):
    P = world.size
    cfg = ZeroConfig(**{**dict(batch=2 * P, dp=P), **bad})
    with pytest.raises(SPMDError, match=rule):
        world.run(run_pattern, "zero", cfg, "zero1", 0)


def _gathered_linear(ctx, n_in, n_out):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(n_out * n_in, generator=g, dtype=torch.float64)
    x = torch.randn(5, n_in, generator=g, dtype=torch.float64)
    P, r = ctx.size, ctx.rank
    c = -(-w.numel() // P)
    chunk = torch.cat([w, w.new_zeros(c * P - w.numel())])[r * c:(r + 1) * c].requires_grad_()
    with ctx.ledger.capture() as cap:
        y = x @ gathered(chunk, w.numel(), ctx.comm(), ctx.world).view(n_out, n_in).T
        y.sum().backward()
    return y.detach(), chunk.grad, [(e.op, e.count) for e in cap.entries]


@pytest.mark.world(sizes=[1, 2, 3, 4])
def test_any_layer_can_be_zero3_sharded_with_gathered(world):
    """The building block Ulysses + ZeRO-3 uses: a weight all-gathered before use, its gradient
    reduce-scattered; equal to the unsharded layer, each rank left with its gradient chunk."""
    n_in, n_out = 3, 4
    g = torch.Generator().manual_seed(3)
    w = torch.randn(n_out * n_in, generator=g, dtype=torch.float64).requires_grad_()
    x = torch.randn(5, n_in, generator=g, dtype=torch.float64)
    want = x @ w.view(n_out, n_in).T
    want.sum().backward()
    P = world.size
    c = -(-w.numel() // P)
    # every rank feeds the same samples: the reduce-scatter sums P equal gradients
    full_grad = P * torch.cat([w.grad, w.grad.new_zeros(c * P - w.numel())])
    for r, (y, grad, calls) in enumerate(world.run(_gathered_linear, n_in, n_out)):
        assert torch.allclose(y, want.detach(), rtol=1e-12, atol=1e-12)
        assert torch.allclose(grad, full_grad[r * c:(r + 1) * c], rtol=1e-12, atol=1e-12)
        if P > 1:
            assert calls == [("all_gather", c), ("reduce_scatter", c * P)]
