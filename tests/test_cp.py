"""Context parallelism: ring attention (online-softmax merge, dK/dV travelling the ring) against
the oracle, its bytes, the load-balanced split, and the broken variants it must catch.
Tolerances: see ``sp_cases.close``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sp_cases import attention_case, judge_attention
from test_ulysses import configs

from commbench.patterns.attention import AttnConfig
from commbench.patterns.ring_attention import causal_work
from commbench.runtime.errors import SPMDError

pytestmark = [pytest.mark.cp]


@pytest.mark.world(sizes=[1, 2, 3, 4])
@given(data=st.data(), seed=st.integers(0, 999))
def test_ring_attention_matches_the_oracle_and_the_predicted_bytes(world, data, seed):
    cfg = data.draw(configs(world.size, ("contiguous", "zigzag")), label="cfg")
    assert judge_attention(world, cfg, seed, "ring") == []


@pytest.mark.world(sizes=[2, 4])
@given(data=st.data(), seed=st.integers(0, 99))
def test_naive_all_gather_of_kv_matches_the_oracle(world, data, seed):
    cfg = data.draw(configs(world.size, ("contiguous", "zigzag")), label="cfg")
    assert judge_attention(world, cfg, seed, "naive") == []


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("kv_heads", [0, 1])
def test_forward_sends_2_n_hkv_p_minus_1_over_p_and_backward_twice_that(world, kv_heads):
    P = world.size
    cfg = AttnConfig(batch=2, seq=4 * P, heads=4, kv_heads=kv_heads, head_dim=3, sp=P,
                     causal=True, layout="zigzag", dtype="float32")
    N, hkv = cfg.batch * cfg.seq, cfg.kv * cfg.head_dim
    for out in world.run(attention_case, cfg, 0, "ring"):
        fwd = sum(s for op, *_, s, _ in out["ledger_fwd"])
        total = sum(s for op, *_, s, _ in out["ledger"])
        assert fwd == 2 * N * hkv * (P - 1) // P * 4
        assert total - fwd == 2 * fwd


def test_zigzag_balances_causal_work_and_contiguous_does_not():
    for P in (2, 4, 8):
        zig = causal_work(AttnConfig(seq=16 * P, sp=P, causal=True, layout="zigzag"))
        flat = causal_work(AttnConfig(seq=16 * P, sp=P, causal=True))
        assert len(set(zig)) == 1
        n = 16  # tokens per rank; rank r sees r whole blocks and its own triangle
        assert flat == [r * n * n + n * (n + 1) // 2 for r in range(P)]
        assert sum(zig) == sum(flat) == (16 * P) * (16 * P + 1) // 2


@pytest.mark.world(sizes=[2, 4])
def test_a_sequence_the_zigzag_cannot_split_is_refused(world):
    cfg = AttnConfig(seq=2 * world.size + 2, sp=world.size, causal=True, layout="zigzag")
    with pytest.raises(SPMDError, match=f"seq={cfg.seq}: must be a multiple of {2 * world.size}"):
        world.run(attention_case, cfg, 0, "ring")


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("mutant", ["no_rescale", "skipped_step", "dkv_not_returned"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_properties_catch_broken_variants(world, mutant, dtype):
    P = world.size
    cfg = AttnConfig(batch=2, seq=4 * P, heads=4, kv_heads=2, head_dim=3, sp=P, causal=True,
                     layout="zigzag", dtype=dtype)
    assert judge_attention(world, cfg, 5, "ring", mutant), f"{mutant} went unnoticed"
