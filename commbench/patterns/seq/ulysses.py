"""DeepSpeed-Ulysses as a pattern: the sequence <-> head all-to-alls around attention (its
operators and broken parts: seq/ulysses_comms.py; the attention pattern it shares with ring
attention, its predicted calls and tolerance: seq/attention_pattern.py; the config and head
ranges: seq/configs.py; the oracle: seq/attention.py).

Predicted calls of SP member r for one attention forward + backward, with n = s/P local tokens,
b the local batch, e bytes per element and H_j / K_j the query / KV heads member j attends to:
forward, an all-to-all of q (sends b n H_j d e to each j != r), of k and of v (b n K_j d e), and
of the output (b n H_r d e to each j != r); backward, the same four mirrored. Even heads and no
GQA: each of the 8 moves (P-1)/P^2 * b s H d elements per rank.
"""

from __future__ import annotations

from commbench.names import ITEMSIZE
from commbench.ops import booked
from commbench.patterns.base import Broken, Call
from commbench.patterns.seq.attention_pattern import ATTN_MODELS, AttentionPattern, example
from commbench.patterns.seq.configs import AttnConfig, head_ranges, kv_ranges

__all__ = ["Ulysses", "ulysses_calls"]


def _a2a(P: int, r: int, e: int, in_splits: list[int], out_splits: list[int]) -> Call:
    s, rc = booked("all_to_all", P, r, 0, e, in_splits=in_splits, out_splits=out_splits)
    return Call("all_to_all", "sp", sum(in_splits) * e, s, rc)


def ulysses_calls(cfg: AttnConfig, r: int) -> list[Call]:
    """The calls SP member ``r`` makes in one Ulysses attention forward + backward."""
    P = cfg.sp
    if P == 1:
        return []
    e = ITEMSIZE[cfg.dtype]
    b, n, d = cfg.batch // cfg.dp, cfg.seq // P, cfg.head_dim
    calls = []
    for ranges in (head_ranges(cfg.heads, P), *[kv_ranges(cfg.heads, cfg.kv, P)] * 2):
        m = [b * n * (z - a) * d for a, z in ranges]
        calls += [_a2a(P, r, e, m, [m[r]] * P),  # sequence -> head, and in backward its mirror
                  _a2a(P, r, e, [m[r]] * P, m)]
    m = [b * n * (z - a) * d for a, z in head_ranges(cfg.heads, P)]
    return calls + [_a2a(P, r, e, [m[r]] * P, m), _a2a(P, r, e, m, [m[r]] * P)]


class Ulysses(AttentionPattern):
    """DeepSpeed-Ulysses (Jacobs et al. 2023): sequence <-> head all-to-alls around attention."""

    name, markers = "ulysses", ("ulysses",)
    variants, naive, optimized = ("naive", "ulysses"), "naive", "ulysses"
    parts_from = "seq.ulysses_comms:UlyssesParts"
    broken = tuple(
        Broken(name, variant, {part: f"seq.ulysses_comms:{fn}"}, why,
               lambda P: example(P, batch=2, seq=2 * P, heads=4 * P, kv_heads=2 * P, head_dim=3,
                                  causal=True))
        for name, variant, part, fn, why in (
            ("transposed_batch", "ulysses", "seq_to_head", "s2h_transposed_batch",
             "a reshape with the batch and source dims swapped (DeepSpeed #5808)"),
            ("reversed_sources", "ulysses", "seq_to_head", "s2h_reversed_sources",
             "sequence shards reassembled in the wrong source order"),
            ("kv_off_by_one", "ulysses", "kv_index", "kv_index_off_by_one",
             "grouped-query attention reading the neighbouring KV head"),
            ("naive_no_reduce_scatter", "naive", "gather_kv", "gather_without_reduce_scatter",
             "the all-gather of K and V whose backward drops the other ranks' gradients")))

    def bench_configs(self, world_size: int) -> list[AttnConfig]:
        return [AttnConfig(batch=b, seq=s * world_size, heads=H, kv_heads=K, head_dim=d,
                           sp=world_size, causal=True, dtype="float32")
                for b, s, H, K, d in ATTN_MODELS]

    def attention(self, variant: str):
        # lazy: imports torch
        from commbench.patterns.seq.attention import naive_attention

        # lazy: imports torch
        from commbench.patterns.seq.ulysses_comms import ulysses_attention

        return {"ulysses": ulysses_attention, "naive": naive_attention}[variant]

    layout_kind = "ulysses"

    def optimized_calls(self, cfg: AttnConfig, r: int) -> list[Call]:
        return ulysses_calls(cfg, r)
