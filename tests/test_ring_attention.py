"""Context parallelism beyond the contract (tests/test_patterns.py): ring attention's bytes
against the textbook figure, the load-balanced split, and a sequence it cannot split."""

from __future__ import annotations

import pytest

from commbench.patterns.run import run_pattern
from commbench.patterns.seq.configs import AttnConfig
from commbench.patterns.seq.ring_attention_comms import causal_work
from commbench.runtime.errors import SPMDError

pytestmark = [pytest.mark.cp]


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("kv_heads", [0, 1])
def test_forward_sends_2_n_hkv_p_minus_1_over_p_and_backward_twice_that(world, kv_heads):
    P = world.size
    cfg = AttnConfig(batch=2, seq=4 * P, heads=4, kv_heads=kv_heads, head_dim=3, sp=P,
                     causal=True, layout="zigzag", dtype="float32")
    N, hkv = cfg.batch * cfg.seq, cfg.kv * cfg.head_dim
    for out in world.run(run_pattern, "ring_attention", cfg, "ring", 0):
        fwd = out["outputs"]["stats"]["forward_sent"]
        total = sum(sent for *_, sent, _ in out["ledger"])
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
        world.run(run_pattern, "ring_attention", cfg, "ring", 0)
