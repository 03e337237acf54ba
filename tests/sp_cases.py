"""SPMD cases for the Ulysses and ring-attention tests, with the deliberately broken variants
they must catch."""

from __future__ import annotations

import contextlib
from unittest import mock

import torch
from ulp import reference_nudges

from commbench.patterns import attention, ring_attention, ulysses
from commbench.patterns.seqpar import run_attention, run_zero3
from commbench.patterns.tp_ops import gather_from_tp

_S2H = ulysses._s2h


def _s2h_reshape_bug(x, ranges, comm, group):
    """DeepSpeed #5808's class of bug: a reshape with the right element count and the batch and
    source dims in the wrong order (only visible with batch > 1)."""
    out = _S2H(x, ranges, comm, group)
    b, s, m, d = out.shape
    P = group.size  # the all-to-all's [P, b, s/P] order, read as if it were [b, P, s/P]
    return out.view(b, P, s // P, m, d).transpose(0, 1).reshape(b, s, m, d)


def _s2h_reversed(x, ranges, comm, group):
    """Sequence shards reassembled in the wrong source order."""
    out = _S2H(x, ranges, comm, group)
    b, s, m, d = out.shape
    return out.view(b, group.size, s // group.size, m, d).flip(1).reshape(b, s, m, d)


def _gqa_off_by_one(heads, heads_total, kv_total, kv_first=0):
    """The KV head of each query head off by one within the local range (clamped)."""
    idx = [h // (heads_total // kv_total) - kv_first for h in heads]
    top = max(idx)
    return [min(i + 1, top) if top else i for i in idx]


def _merge_no_rescale(out, lse, o_i, lse_i):
    """Online softmax without rescaling the running output."""
    new = torch.logaddexp(lse, lse_i)
    out.add_(o_i * torch.exp(lse_i - new).transpose(1, 2)[..., None])
    lse.copy_(new)


def _mutation(mutant: str | None, world_size: int):
    if mutant == "layout_reshape":
        return mock.patch.object(ulysses, "_s2h", _s2h_reshape_bug)
    if mutant == "wrong_permutation":
        return mock.patch.object(ulysses, "_s2h", _s2h_reversed)
    if mutant == "gqa_off_by_one":
        return mock.patch.object(ulysses, "gqa_index", _gqa_off_by_one)
    if mutant == "no_rescale":
        return mock.patch.object(ring_attention, "_merge", _merge_no_rescale)
    if mutant == "skipped_step":
        real, calls = ring_attention._forward_block, [0]

        def skip_last(*args):
            calls[0] += 1
            if calls[0] % world_size:  # the last ring step's block is never computed
                real(*args)
        return mock.patch.object(ring_attention, "_forward_block", skip_last)
    if mutant == "dkv_not_returned":
        real_home = ring_attention._return_home
        return mock.patch.object(ring_attention, "_return_home",
                                 lambda *a: torch.zeros_like(real_home(*a)))
    if mutant == "naive_no_reduce_scatter":
        return mock.patch.object(attention, "gather_from_sp",
                                 lambda t, comm, group, dim: gather_from_tp(t, comm, group, dim))
    if mutant is not None:
        raise ValueError(f"unknown mutant {mutant!r}")
    return contextlib.nullcontext()


def attention_case(ctx, cfg, seed: int, variant: str, mutant: str | None = None):
    with _mutation(mutant, cfg.sp):
        return run_attention(ctx, cfg, seed, variant)


def zero3_case(ctx, cfg, seed: int):
    return run_zero3(ctx, cfg, seed)


def close(got: torch.Tensor, want: torch.Tensor, refs32: list, dtype: str) -> bool:
    """float64: rtol = atol = 1e-10 (only the summation order differs from the oracle, ~1e-15
    per operation). float32: within 8x the largest error of the unsharded float32 computation,
    as is and with its inputs nudged by one ulp (:mod:`ulp`; its sums run in another order),
    plus 1e-6 x max(1, largest value): the inputs are standard normal, so the terms that cancel
    into a small gradient (softmax backward: p (dP - D)) are of order 1 and leave ~eps32 =
    1.2e-7 of absolute rounding however small the result is."""
    got = got.double()
    if dtype == "float64":
        return torch.allclose(got, want, rtol=1e-10, atol=1e-10)
    if not got.numel():
        return True
    return bool((got - want).abs().max() <= 8 * max((r - want).abs().max() for r in refs32)
                + 1e-6 * max(1.0, float(want.abs().max())))


def judge_attention(world, cfg, seed: int, variant: str, mutant: str | None = None) -> list[str]:
    from commbench.patterns.attention import oracle_attention
    from commbench.patterns.seqpar import expected, predicted

    oracle = oracle_attention(cfg, seed)
    refs32 = [oracle_attention(cfg, seed, torch.float32, nudge) for nudge in reference_nudges()
              ] if cfg.dtype == "float32" else []
    problems = []
    for r, out in enumerate(world.run(attention_case, cfg, seed, variant, mutant)):
        refs = [expected(ref, cfg, r) for ref in refs32]
        for name, want in expected(oracle, cfg, r).items():
            if out[name].shape != want.shape or not close(out[name], want,
                                                          [ref[name] for ref in refs], cfg.dtype):
                problems.append(f"rank {r}: {name} differs from the oracle")
        got = sorted((op, s, rc) for op, g, c, dt, s, rc in out["ledger"] if g == out["sp"])
        if got != sorted(predicted(cfg, variant, r % cfg.sp)):
            problems.append(f"rank {r}: ledger {got} != predicted")
        if any(g != out["sp"] for _, g, *_ in out["ledger"]):
            problems.append(f"rank {r}: traffic outside the SP group")
    return problems
