"""DeepSpeed-Ulysses as a pattern: the sequence <-> head all-to-alls around attention (its
operators and broken parts: seq/ulysses_comms.py; the attention pattern it shares with ring
attention, its predicted calls and tolerance: seq/attention_pattern.py; the config and head
ranges: seq/configs.py; the oracle: seq/attention.py)."""

from __future__ import annotations

from commbench.patterns.base import Broken
from commbench.patterns.seq.attention_pattern import ATTN_MODELS, AttentionPattern, example
from commbench.patterns.seq.configs import AttnConfig

__all__ = ["Ulysses"]


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
        from commbench.patterns.seq.attention import naive_attention
        from commbench.patterns.seq.ulysses_comms import ulysses_attention

        return {"ulysses": ulysses_attention, "naive": naive_attention}[variant]
