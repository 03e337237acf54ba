"""ZeRO-1/2/3 and DDP after k Adam steps against the single-process oracle; bytes and memory.

Tolerances: float64 runs agree with the float64 oracle to rtol = atol = 1e-10 (sums over ranks in
another order). float32 and mixed-precision (bf16 compute, fp32 master, moments and gradient
reduction) runs are compared with the oracle run in the same precision on the same P batch
slices (``oracle_train(..., slices=P)``): only the order of the fp32 gradient sum over ranks
and micro-batches differs. The bound is 1e-5 of the largest weight plus 8x the spread between
two oracle runs that sum in opposite orders: Adam divides by sqrt(v), so where a gradient
nearly cancels the order of its sum alone moves the weights, and the spread measures by how
much. Against the float64 truth they could not be held to any useful bound: a rounding that
flips a tiny gradient's sign moves a weight by 2 * lr.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from commbench.patterns.zero import predicted_calls, train
from commbench.patterns.zero_model import DTYPES, ZeroConfig, flat_size, oracle_train
from commbench.runtime.errors import SPMDError
from commbench.wire.volume import booked

pytestmark = pytest.mark.zero


def judge(world, cfg: ZeroConfig, seed: int, mutant: str | None = None) -> list[str]:
    P = world.size
    want = oracle_train(cfg, seed) if cfg.dtype == "float64" else \
        oracle_train(cfg, seed, DTYPES[cfg.dtype], slices=P)
    spread = [torch.zeros(()) for _ in want] if cfg.dtype == "float64" else \
        [(a - b).abs().max() if a.numel() else torch.zeros(()) for a, b in
         zip(want, oracle_train(cfg, seed, DTYPES[cfg.dtype], slices=P, reverse=True))]
    outs = world.run(train, cfg, seed, True, mutant)
    problems = []
    for r, out in enumerate(outs):
        for k, (got, w) in enumerate(zip(out["params"], want)):
            err = (got - w).abs().max().item() if got.numel() else 0.0
            bound = (1e-10 if cfg.dtype == "float64" else 1e-5) * (1 + w.abs().max().item()) \
                + 8 * spread[k].item()
            if err > bound:
                problems.append(f"rank {r}: layer {k} differs by {err:.3g} (bound {bound:.3g})")
        calls = sorted((op, n) for op, n, _, _ in out["ledger"])
        if P > 1 and calls != sorted(predicted_calls(cfg, P)):
            problems.append(f"rank {r}: calls {calls} != predicted {sorted(predicted_calls(cfg, P))}")
        itemsize = torch.empty((), dtype=DTYPES[cfg.dtype]).element_size()
        for op, n, sent, _ in out["ledger"]:
            # parameters move in the compute dtype; gradients in the master dtype (fp32 if mixed)
            size = itemsize if op == "all_gather" else (4 if cfg.mixed else itemsize)
            if sent != booked(op, P, r, n, size)[0]:
                problems.append(f"rank {r}: {op} of {n} booked {sent} B, formula "
                                f"{booked(op, P, r, n, size)[0]}")
    return problems


@st.composite
def configs(draw, world_size: int, stages=(0, 1, 2, 3)):
    return ZeroConfig(stage=draw(st.sampled_from(stages)), layers=draw(st.integers(1, 3)),
                      hidden=draw(st.integers(1, 5)), batch=world_size * draw(st.integers(1, 2)),
                      micro=draw(st.integers(1, 3)), steps=draw(st.integers(1, 3)),
                      dtype=draw(st.sampled_from(["float64", "float64", "float32", "bfloat16"])))


@pytest.mark.world(sizes=[1, 2, 3, 4])
@given(data=st.data(), seed=st.integers(0, 999))
def test_every_stage_trains_like_the_oracle(world, data, seed):
    cfg = data.draw(configs(world.size), label="cfg")  # hidden 1: layers smaller than the world
    assert judge(world, cfg, seed) == []


@pytest.mark.world(sizes=[2, 4])
def test_bytes_per_step_against_ddp(world):
    """Per rank per step: DDP 2(P-1)/P*Psi = ZeRO-1 = ZeRO-2 (one micro-batch); ZeRO-3 3(P-1)/P*Psi,
    1.5x DDP; with m micro-batches ZeRO-2 moves (m+1)/2x and ZeRO-3 3m/2x what DDP moves."""
    P = world.size
    sent = {}
    for stage in range(4):
        for micro in (1, 4):
            cfg = ZeroConfig(stage=stage, layers=2, hidden=8, batch=P, micro=micro, steps=1)
            out = world.run(train, cfg, 0)[0]
            sent[stage, micro] = sum(e[2] for e in out["ledger"])
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
    for stage in range(4):
        cfg = ZeroConfig(stage=stage, layers=2, hidden=8, batch=P, dtype="float32")
        mem = world.run(train, cfg, 0)[0]["memory"]
        shard = {"params": stage >= 3, "grads": stage >= 2, "optimizer": stage >= 1}
        assert mem == {k: v // P if shard[k] else v for k, v in full.items()}
        if stage == 0:
            assert mem["params"] + mem["optimizer"] == 12 * psi
    mixed = world.run(train, ZeroConfig(stage=0, layers=2, hidden=8, batch=P,
                                        dtype="bfloat16"), 0)[0]["memory"]
    # bf16 weights 2 B + fp32 master 4 B + moments 8 B = 14 B, plus gradients accumulated in fp32
    assert mixed == {"params": 2 * psi, "grads": 4 * psi, "optimizer": 12 * psi}


@pytest.mark.world(sizes=[2])
@pytest.mark.parametrize(("bad", "rule"), [(dict(stage=4), "stage=4"), (dict(batch=3), "batch=3"),
                                           (dict(lr=0), "lr=0"), (dict(micro=0), "micro=0")])
def test_bad_configs_are_refused(world, bad, rule):
    cfg = ZeroConfig(**{**dict(batch=4), **bad})
    with pytest.raises(SPMDError, match=rule):
        world.run(train, cfg, 0)


@pytest.mark.world(sizes=[2, 3])
@pytest.mark.parametrize(("mutant", "stage"), [("shard_off_by_one", 1), ("no_reduce_scatter", 2),
                                               ("stale_prefetch", 3)])
def test_properties_catch_broken_variants(world, mutant, stage):
    cfg = ZeroConfig(stage=stage, layers=2, hidden=3, batch=world.size * 2, micro=1, steps=2)
    assert judge(world, cfg, 1, mutant), f"{mutant} went unnoticed"


def _gathered_linear(ctx, n_in, n_out):
    from commbench.patterns.zero import gathered

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


@pytest.mark.world(sizes=[1, 2, 3])
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
