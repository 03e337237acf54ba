"""MoE beyond the contract (tests/test_patterns.py): the capacity formula, a starved capacity
dropping whole tokens to zero, TP ranks that would drop tokens independently, and configs
refused before any collective."""

from __future__ import annotations

import re

import pytest
import torch

from commbench.patterns.moe.configs import MoEConfig, capacity
from commbench.patterns.run import run_pattern
from commbench.runtime.errors import SPMDError

pytestmark = [pytest.mark.moe]


def test_capacity_formula_and_minimum():
    cfg = MoEConfig(experts=8, top_k=2, capacity_factor=1.25, min_capacity=4)
    assert capacity(cfg, 64) == 20  # ceil(2 * 1.25 * 64 / 8)
    assert capacity(cfg, 4) == 4    # the minimum
    assert capacity(MoEConfig(experts=8, capacity_factor=1.25, tp=4, ffn=8), 64) == 20
    assert capacity(MoEConfig(experts=8, capacity_factor=1.0, tp=3, ffn=3), 7) == 3
    # cases where a floor, a rounding to nearest, or a rounding down to the TP size differ
    assert capacity(MoEConfig(experts=8, top_k=2, capacity_factor=1.0), 9) == 3  # 2.25 up
    assert capacity(MoEConfig(experts=4, top_k=1, capacity_factor=1.0), 7) == 2  # 1.75 up
    assert capacity(MoEConfig(experts=8, top_k=2, capacity_factor=1.0, tp=2, ffn=2), 9) == 4
    assert capacity(MoEConfig(experts=8, top_k=2, capacity_factor=0.5, min_capacity=3), 9) == 3


@pytest.mark.ep
@pytest.mark.world(sizes=[2, 4])
def test_starved_capacity_drops_whole_tokens_to_zero(world):
    P = world.size
    cfg = MoEConfig(tokens=tuple([8, 0, 5, 3][:P]), experts=P, ep=P, capacity_factor=0.1)
    for variant in ("capacity", "variable", "naive"):
        outs = world.run(run_pattern, "moe", cfg, variant, 1)
        lost = [o["outputs"]["y"][~o["outputs"]["kept"].any(1)] for o in outs]
        assert sum(len(t) for t in lost) > 0
        assert all(torch.equal(t, torch.zeros_like(t)) for t in lost)


@pytest.mark.ep
@pytest.mark.world(sizes=[2, 4])
def test_tp_ranks_that_drop_tokens_independently_are_stopped(world):
    """The notes' rule: the MoE input under TP must not drop tokens independently on each TP
    rank. With the routing check (default) the layer refuses; without it, the contract catches
    the wrong output (the broken variant independent_drops)."""
    cfg = MoEConfig(tokens=(16,) * (world.size // 2), experts=4, ep=world.size // 2, tp=2,
                    ffn=4, capacity_factor=2.0)
    with pytest.raises(SPMDError, match="must not be dropped independently"):
        world.run(run_pattern, "moe", cfg, "capacity", 3, "independent_drops")


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
        world.run(run_pattern, "moe", cfg, variant, 0)


def test_capacity_factor_zero_names_value_and_rule():
    with pytest.raises(ValueError, match=r"^capacity_factor=0: must be > 0$"):
        MoEConfig(capacity_factor=0).validate(1)


@pytest.mark.world(sizes=[2, 4])
def test_the_ep_claim_finds_its_groups_when_dp_is_one(world):
    """At 2 ranks ep = 2 and dp = 1: the `ep` and `dp_ep` groups hold the same ranks; each call
    must still be booked under the group the pattern predicts it on."""
    from commbench.studies.claims import measure_claim
    from commbench.studies.claims_list import CLAIMS

    claim = next(c for c in CLAIMS if c.text.startswith("EP: all-to-all dispatch"))
    row = measure_claim(world, claim)
    assert row["ledger_matches_prediction"], row["measured"]
    assert "dp_ep" in row["measured"] and "all_to_all" in row["measured"]
