"""DeepSpeed-Ulysses: the sequence <-> head all-to-alls, the attention built on them, the naive
all-gather of K and V, and Ulysses with ZeRO-3. Tolerances: see ``sp_cases.close``.

Layout is checked bit-exactly with hash-encoded inputs (value = position, batch, head and
channel), because a round trip alone passes with a transposed intermediate (DeepSpeed #5808)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from sp_cases import attention_case, judge_attention, zero3_case

from commbench.patterns.attention import AttnConfig
from commbench.patterns.seqpar import expected, oracle_zero3, predicted
from commbench.patterns.ulysses import head_ranges, head_to_seq, kv_ranges, seq_to_head, split_sizes
from commbench.runtime.errors import SPMDError
from commbench.wire.volume import booked

pytestmark = [pytest.mark.ulysses]


@st.composite
def configs(draw, world_size: int, layouts=("contiguous",)):
    sp = draw(st.sampled_from([d for d in range(1, world_size + 1) if world_size % d == 0]))
    dp = world_size // sp
    heads = draw(st.integers(sp, 2 * sp + 1))
    kv = draw(st.sampled_from([k for k in range(1, heads + 1) if heads % k == 0]))
    layout = draw(st.sampled_from(layouts))
    chunks = sp * (2 if layout == "zigzag" else 1)
    return AttnConfig(batch=dp * draw(st.integers(1, 2)), seq=chunks * draw(st.integers(1, 3)),
                      heads=heads, kv_heads=kv, head_dim=draw(st.sampled_from([1, 3, 4])),
                      sp=sp, dp=dp, causal=draw(st.booleans()), layout=layout,
                      dtype=draw(st.sampled_from(["float64", "float32"])))


def test_split_sizes_follow_deepspeed():
    assert split_sizes(7, 4) == [2, 2, 2, 1]
    assert head_ranges(7, 4) == [(0, 2), (2, 4), (4, 6), (6, 7)]
    assert kv_ranges(8, 2, 4) == [(0, 1), (0, 1), (1, 2), (1, 2)]  # KV heads replicated
    assert kv_ranges(6, 3, 4) == [(0, 1), (1, 2), (2, 3), (2, 3)]


def _hashed(b, s, h, d):
    """value = 1000 b + 10 pos + h + d / 100: every element says where it belongs."""
    return (1000 * torch.arange(b)[:, None, None, None] + 10 * torch.arange(s)[None, :, None, None]
            + torch.arange(h)[None, None, :, None]
            + torch.arange(d)[None, None, None, :] / 100).double()


def placement_case(ctx, b, n, heads, kv, d, mutant=None):
    from sp_cases import _mutation

    P, r = ctx.size, ctx.rank
    comm, group = ctx.comm(), ctx.world
    out = {}
    with _mutation(mutant, P), ctx.ledger.capture() as cap:
        for name, h, ranges in (("q", heads, head_ranges(heads, P)),
                                ("kv", kv, kv_ranges(heads, kv, P))):
            x = _hashed(b, n * P, h, d)[:, r * n:(r + 1) * n]
            y = seq_to_head(x, ranges, comm, group)
            out[name] = y
            if name == "q":
                out["back"] = torch.equal(head_to_seq(y, ranges, h, comm, group), x)
    out["ledger"] = [(e.sent, e.recv) for e in cap.entries]
    return out


@pytest.mark.world(sizes=[1, 2, 3, 4])
@given(b=st.integers(1, 3), n=st.integers(1, 3), extra=st.integers(0, 5), d=st.integers(1, 3),
       data=st.data())
def test_seq_to_head_puts_every_element_in_place(world, b, n, extra, d, data):
    P = world.size
    heads = P + extra
    kv = data.draw(st.sampled_from([k for k in range(1, heads + 1) if heads % k == 0]))
    for r, out in enumerate(world.run(placement_case, b, n, heads, kv, d)):
        lo, hi = head_ranges(heads, P)[r]
        klo, khi = kv_ranges(heads, kv, P)[r]
        assert torch.equal(out["q"], _hashed(b, n * P, heads, d)[:, :, lo:hi])
        assert torch.equal(out["kv"], _hashed(b, n * P, kv, d)[:, :, klo:khi])
        assert out["back"]
        if P > 1:
            m = [b * n * (z - a) * d * 8 for a, z in head_ranges(heads, P)]
            k = [b * n * (z - a) * d * 8 for a, z in kv_ranges(heads, kv, P)]
            want = [booked("all_to_all", P, r, 0, 1, in_splits=m, out_splits=[m[r]] * P),
                    booked("all_to_all", P, r, 0, 1, in_splits=[m[r]] * P, out_splits=m),
                    booked("all_to_all", P, r, 0, 1, in_splits=k, out_splits=[k[r]] * P)]
            assert sorted(out["ledger"]) == sorted(want)


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("mutant", ["layout_reshape", "wrong_permutation"])
def test_placement_catches_broken_layouts(world, mutant):
    outs = world.run(placement_case, 2, 2, world.size + 1, 1, 2, mutant)
    heads = world.size + 1
    assert any(not torch.equal(o["q"], _hashed(2, 2 * world.size, heads, 2)[:, :, a:z])
               for o, (a, z) in zip(outs, head_ranges(heads, world.size), strict=True))


@pytest.mark.world(sizes=[1, 2, 3, 4])
@given(data=st.data(), seed=st.integers(0, 999), naive=st.booleans())
def test_ulysses_matches_the_oracle_and_the_predicted_bytes(world, data, seed, naive):
    cfg = data.draw(configs(world.size, ("contiguous", "zigzag")), label="cfg")
    assert judge_attention(world, cfg, seed, "naive" if naive else "ulysses") == []


@pytest.mark.world(sizes=[2, 4])
def test_eight_all_to_alls_of_n_h_over_p_squared(world):
    """Even heads, no GQA: 4 all-to-alls forward and 4 backward, each (P-1)/P^2 * N h elements
    per rank for N = b s tokens and h = H d."""
    P = world.size
    cfg = AttnConfig(batch=2, seq=4 * P, heads=2 * P, head_dim=4, sp=P, dtype="float32")
    for out in world.run(attention_case, cfg, 0, "ulysses"):
        N, h = cfg.batch * cfg.seq, cfg.heads * cfg.head_dim
        assert [(op, s) for op, _, _, _, s, _ in out["ledger"]] == \
            [("all_to_all", N * h * (P - 1) // P ** 2 * 4)] * 8
        assert len(out["ledger_fwd"]) == 4


@pytest.mark.world(sizes=[2, 4])
@given(data=st.data(), seed=st.integers(0, 99))
def test_ulysses_with_zero3(world, data, seed):
    """Weights all-gathered over the world before the layer, gradients reduce-scattered."""
    cfg = data.draw(configs(world.size), label="cfg")
    cfg = AttnConfig(**{**cfg.as_dict(), "dtype": "float64"})
    oracle = oracle_zero3(cfg, seed)
    W, numel = world.size, oracle["dw"].numel()
    c = -(-numel // W)
    dw = torch.cat([oracle["dw"], oracle["dw"].new_zeros(c * W - numel)])
    for r, out in enumerate(world.run(zero3_case, cfg, seed)):
        want = expected({"y": oracle["y"], "dx": oracle["dx"]}, cfg, r)
        assert torch.allclose(out["y"], want["y"], rtol=1e-10, atol=1e-10)
        assert torch.allclose(out["dx"], want["dx"], rtol=1e-10, atol=1e-10)
        assert torch.allclose(out["dchunk"], dw[r * c:(r + 1) * c], rtol=1e-10, atol=1e-10)
        zero = sorted((op, g, s, rc) for op, g, _, _, s, rc in out["ledger"] if op != "all_to_all")
        assert zero == sorted([("all_gather", out["world"], *booked("all_gather", W, r, c, 8)),
                               ("reduce_scatter", out["world"],
                                *booked("reduce_scatter", W, r, c * W, 8))])
        a2a = sorted((op, s, rc) for op, g, _, _, s, rc in out["ledger"] if op == "all_to_all")
        assert a2a == sorted(predicted(cfg, "ulysses", r % cfg.sp))


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("bad", [dict(heads=1, kv_heads=1), dict(kv_heads=3), dict(seq=3),
                                 dict(sp=1), dict(batch=0), dict(layout="diagonal")])
def test_configs_that_cannot_work_are_refused_before_any_collective(world, bad):
    cfg = AttnConfig(**{**dict(batch=2, seq=8, heads=4, sp=world.size), **bad})
    with pytest.raises(ValueError) as direct:
        cfg.validate(world.size, ulysses=True)
    with pytest.raises(SPMDError, match=str(direct.value).split(":")[0]):
        world.run(attention_case, cfg, 0, "ulysses")


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize(("mutant", "variant"), [
    ("layout_reshape", "ulysses"), ("wrong_permutation", "ulysses"),
    ("gqa_off_by_one", "ulysses"), ("naive_no_reduce_scatter", "naive")])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_properties_catch_broken_variants(world, mutant, variant, dtype):
    P = world.size
    cfg = AttnConfig(batch=2, seq=2 * P, heads=4 * P, kv_heads=2 * P, head_dim=3, sp=P, causal=True,
                     dtype=dtype)
    assert judge_attention(world, cfg, 5, variant, mutant), f"{mutant} went unnoticed"
