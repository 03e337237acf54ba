"""DeepSpeed-Ulysses beyond the contract (tests/test_patterns.py): the head split, every element's
place after the all-to-all, the textbook volume, and configs refused before any collective.

Layout is checked bit-exactly with hash-encoded inputs (value = position, batch, head and
channel), because a round trip alone passes with a transposed intermediate (DeepSpeed #5808)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from commbench.ops import booked, split_sizes
from commbench.patterns.run import run_pattern
from commbench.patterns.seq.configs import AttnConfig, head_ranges, kv_ranges
from commbench.patterns.seq.ulysses_comms import (
    head_to_seq,
    s2h,
    s2h_reversed_sources,
    s2h_transposed_batch,
    seq_to_head,
)
from commbench.runtime.errors import SPMDError

pytestmark = [pytest.mark.ulysses]


def test_heads_split_as_deepspeed_splits_them():
    assert split_sizes(7, 4) == [2, 2, 2, 1]
    assert head_ranges(7, 4) == [(0, 2), (2, 4), (4, 6), (6, 7)]
    assert kv_ranges(8, 2, 4) == [(0, 1), (0, 1), (1, 2), (1, 2)]  # KV heads replicated
    assert kv_ranges(6, 3, 4) == [(0, 1), (1, 2), (2, 3), (2, 3)]


def _hashed(b, s, h, d):
    """value = 1000 b + 10 pos + h + d / 100: every element says where it belongs."""
    return (1000 * torch.arange(b)[:, None, None, None] + 10 * torch.arange(s)[None, :, None, None]
            + torch.arange(h)[None, None, :, None]
            + torch.arange(d)[None, None, None, :] / 100).double()


BODIES = {"s2h": s2h, "transposed_batch": s2h_transposed_batch,
          "reversed_sources": s2h_reversed_sources}


def placement_case(ctx, b, n, heads, kv, d, body="s2h"):
    P, r = ctx.size, ctx.rank
    comm, group = ctx.comm(), ctx.world
    out = {}
    with ctx.ledger.capture() as cap:
        for name, h, ranges in (("q", heads, head_ranges(heads, P)),
                                ("kv", kv, kv_ranges(heads, kv, P))):
            x = _hashed(b, n * P, h, d)[:, r * n:(r + 1) * n]
            y = seq_to_head(x, ranges, comm, group, BODIES[body])
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
@pytest.mark.parametrize("body", ["transposed_batch", "reversed_sources"])
def test_placement_catches_broken_layouts(world, body):
    heads = world.size + 1
    outs = world.run(placement_case, 2, 2, heads, 1, 2, body)
    assert any(not torch.equal(o["q"], _hashed(2, 2 * world.size, heads, 2)[:, :, a:z])
               for o, (a, z) in zip(outs, head_ranges(heads, world.size), strict=True))


@pytest.mark.world(sizes=[2, 4])
def test_eight_all_to_alls_of_n_h_over_p_squared(world):
    """Even heads, no GQA: 4 all-to-alls forward and 4 backward, each (P-1)/P^2 * N h elements
    per rank for N = b s tokens and h = H d: the textbook figure, apart from the prediction."""
    P = world.size
    cfg = AttnConfig(batch=2, seq=4 * P, heads=2 * P, head_dim=4, sp=P, dtype="float32")
    N, h = cfg.batch * cfg.seq, cfg.heads * cfg.head_dim
    for out in world.run(run_pattern, "ulysses", cfg, "ulysses", 0):
        assert [(op, axis, sent) for op, axis, _, sent, _ in out["ledger"]] == \
            [("all_to_all", "sp", N * h * (P - 1) // P ** 2 * 4)] * 8
        assert out["outputs"]["stats"]["forward_sent"] == 4 * N * h * (P - 1) // P ** 2 * 4


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("bad", [dict(heads=1, kv_heads=1), dict(kv_heads=3), dict(seq=3),
                                 dict(sp=1), dict(batch=0), dict(layout="diagonal")])
def test_configs_that_cannot_work_are_refused_before_any_collective(world, bad):
    cfg = AttnConfig(**{**dict(batch=2, seq=8, heads=4, sp=world.size), **bad})
    with pytest.raises(ValueError) as direct:
        cfg.validate(world.size, "ulysses")
    with pytest.raises(SPMDError, match=str(direct.value).split(":")[0]):
        world.run(run_pattern, "ulysses", cfg, "ulysses", 0)
