"""MoE: GShard top-2 gating with capacity against a token-by-token reference; expert
parallelism (capacity layout, variable layout, naive all-gather), EP+DP and EP+TP against the
single-process oracle, with the ledger held to the prediction."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from moe_cases import _mutation, judge_moe, loop_gating, moe_case

from commbench.patterns.moe_gating import MoEConfig, capacity, gshard_gating
from commbench.runtime.errors import SPMDError

pytestmark = [pytest.mark.moe]


@st.composite
def gate_configs(draw):
    E = draw(st.integers(1, 6))
    return MoEConfig(tokens=(draw(st.integers(0, 14)),), experts=E,
                     top_k=draw(st.integers(1, min(2, E))),
                     capacity_factor=draw(st.sampled_from([0.1, 0.5, 1.0, 1.5, 4.0])),
                     min_capacity=draw(st.integers(1, 3)), random_routing=draw(st.booleans()))


def _check_gating(cfg: MoEConfig, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    T = cfg.tokens[0]
    logits = torch.randn(T, cfg.experts, generator=g, dtype=torch.float64)
    u = torch.rand(T, generator=g, dtype=torch.float64)
    cap = capacity(cfg, T)
    gate = gshard_gating(logits, cfg, cap, u)
    ref, aux = loop_gating(logits, cfg, cap, u)
    problems = []
    if not torch.allclose(gate.combine, ref, rtol=1e-12, atol=1e-12):
        problems.append("combine weights differ from the token-by-token reference")
    if not torch.equal(gate.dispatch, ref > 0):
        problems.append("dispatch mask differs")
    if abs(float(gate.l_aux) - aux) > 1e-12:
        problems.append(f"l_aux {float(gate.l_aux)} != {aux}")
    if (gate.dispatch.sum(0) > 1).any():
        problems.append("two tokens in one buffer slot")
    return problems


@given(cfg=gate_configs(), seed=st.integers(0, 9999))
def test_gating_matches_the_token_by_token_reference(cfg, seed):
    assert _check_gating(cfg, seed) == []


def test_gating_property_catches_second_choices_not_queued_after_first():
    cfg = MoEConfig(tokens=(12,), experts=3, top_k=2, capacity_factor=1.0, random_routing=False)
    with _mutation("no_second_offset", 0):
        assert any(_check_gating(cfg, s) for s in range(5))


def test_capacity_formula_and_minimum():
    cfg = MoEConfig(experts=8, top_k=2, capacity_factor=1.25, min_capacity=4)
    assert capacity(cfg, 64) == 20  # ceil(2 * 1.25 * 64 / 8)
    assert capacity(cfg, 4) == 4    # the minimum
    assert capacity(MoEConfig(experts=8, capacity_factor=1.25, tp=4, ffn=8), 64) == 20
    assert capacity(MoEConfig(experts=8, capacity_factor=1.0, tp=3, ffn=3), 7) == 3


@st.composite
def ep_configs(draw, world_size: int, variants=("capacity", "variable", "naive")):
    variant = draw(st.sampled_from(variants))
    tp = 1 if variant != "capacity" else draw(st.sampled_from(
        [t for t in (1, 2) if world_size % t == 0]))
    ep = draw(st.sampled_from([e for e in range(1, world_size // tp + 1)
                               if (world_size // tp) % e == 0]))
    dp = world_size // tp // ep
    E = ep * draw(st.integers(1, 2))
    return variant, MoEConfig(
        tokens=tuple(draw(st.lists(st.integers(0, 9), min_size=dp * ep, max_size=dp * ep))),
        model=draw(st.integers(1, 4)), ffn=tp * draw(st.integers(1, 3)), experts=E,
        top_k=draw(st.integers(1, min(2, E))),
        capacity_factor=draw(st.sampled_from([0.1, 0.5, 1.0, 2.0, 4.0])),
        min_capacity=draw(st.integers(1, 2)), random_routing=draw(st.booleans()),
        ep=ep, dp=dp, tp=tp)


@pytest.mark.ep
@pytest.mark.world(sizes=[1, 2, 3, 4])
@given(data=st.data(), seed=st.integers(0, 999))
def test_expert_parallel_layer_matches_the_oracle(world, data, seed):
    variant, cfg = data.draw(ep_configs(world.size), label="cfg")
    assert judge_moe(world, cfg, seed, variant) == []


@pytest.mark.ep
@pytest.mark.world(sizes=[2, 4])
@given(data=st.data(), seed=st.integers(0, 99))
def test_ep_with_tp_splits_capacity_and_matches_the_oracle(world, data, seed):
    _, cfg = data.draw(ep_configs(world.size, ("capacity",)).filter(lambda vc: vc[1].tp > 1),
                       label="cfg")
    assert judge_moe(world, cfg, seed, "capacity") == []


@pytest.mark.ep
@pytest.mark.world(sizes=[2, 4])
def test_starved_capacity_drops_whole_tokens_to_zero(world):
    P = world.size
    cfg = MoEConfig(tokens=tuple([8, 0, 5, 3][:P]), experts=P, ep=P, capacity_factor=0.1)
    for variant in ("capacity", "variable", "naive"):
        outs = world.run(moe_case, cfg, 1, variant)
        lost = [o["y"][~o["kept"].any(1)] for o in outs]
        assert sum(len(t) for t in lost) > 0 and all(torch.equal(t, torch.zeros_like(t))
                                                     for t in lost)
        assert judge_moe(world, cfg, 1, variant) == []


@pytest.mark.ep
@pytest.mark.world(sizes=[2, 4])
def test_tp_ranks_that_drop_tokens_independently_are_stopped(world):
    """The notes' rule: the MoE input under TP must not drop tokens independently on each TP
    rank. With the routing check (default) the layer refuses; without it, the output is wrong."""
    cfg = MoEConfig(tokens=(16,) * (world.size // 2), experts=4, ep=world.size // 2, tp=2,
                    ffn=4, capacity_factor=2.0)
    with pytest.raises(SPMDError, match="must not be dropped independently"):
        world.run(moe_case, cfg, 3, "capacity", "independent_drops")
    unchecked = MoEConfig(**{**cfg.as_dict(), "check_routing": False})
    assert judge_moe(world, unchecked, 3, "capacity", "independent_drops")


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("bad", [
    dict(capacity_factor=0), dict(capacity_factor=-1.0), dict(experts=3), dict(top_k=3),
    dict(tokens=(1,)), dict(tokens=(-1, 2, 2, 2)), dict(min_capacity=0),
    dict(tp=2, variant="variable")])
def test_configs_that_cannot_work_are_refused_before_any_collective(world, bad):
    P, bad = world.size, dict(bad)
    base = dict(tokens=(2,) * P, experts=2 * P, ep=P, ffn=4)
    variant = bad.pop("variant", "capacity")
    if "tp" in bad:
        base.update(ep=P // 2, tokens=(2,) * (P // 2))
    if bad.get("tokens") == (-1, 2, 2, 2):
        bad["tokens"] = (-1,) + (2,) * (P - 1)
    cfg = MoEConfig(**{**base, **bad})
    with pytest.raises(ValueError) as direct:
        cfg.validate(P, variant)
    with pytest.raises(SPMDError, match=re.escape(str(direct.value))):
        world.run(moe_case, cfg, 0, variant)


def test_capacity_factor_zero_names_value_and_rule():
    with pytest.raises(ValueError, match=r"^capacity_factor=0: must be > 0$"):
        MoEConfig(capacity_factor=0).validate(1)


@pytest.mark.ep
@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize(("mutant", "grid"), [
    ("wrong_permutation", "ep"), ("dropped_not_zeroed", "ep"), ("wrong_grad_group", "ep_dp")])
def test_properties_catch_broken_variants(world, mutant, grid):
    P = world.size
    if grid == "ep_dp" and P < 4:
        pytest.skip("the expert-data-parallel group differs from the dense one only with ep > 1 "
                    "and dp > 1: 4 ranks")
    ep, dp = (P, 1) if grid == "ep" else (P // 2, 2)
    cfg = MoEConfig(tokens=(9, 4, 0, 7)[:P], experts=2 * ep, ep=ep, dp=dp, capacity_factor=0.5)
    assert judge_moe(world, cfg, 2, "capacity", mutant), f"{mutant} went unnoticed"
