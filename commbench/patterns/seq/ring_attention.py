"""Ring attention as a pattern: K/V blocks round the ring (its operators and broken parts:
seq/ring_attention_comms.py; the attention pattern it shares with Ulysses, its predicted calls
and tolerance: seq/attention_pattern.py; the config: seq/configs.py; the oracle:
seq/attention.py).

Predicted calls of SP member r for one attention forward + backward, with n = s/P local tokens
and b the local batch: forward, P-1 sends and receives of K and V, 2 b n H_kv d e bytes each;
backward, P-1 of K and V and P-1 of dK and dV: 2 (P-1)/P * b s H_kv d e forward, twice that
backward.
"""

from __future__ import annotations

from commbench.names import ITEMSIZE
from commbench.patterns.base import Broken, Call
from commbench.patterns.seq.attention_pattern import ATTN_MODELS, AttentionPattern, example
from commbench.patterns.seq.configs import AttnConfig

__all__ = ["RingAttention", "ring_calls"]


def ring_calls(cfg: AttnConfig, r: int) -> list[Call]:
    """The calls SP member ``r`` makes in one ring attention forward + backward."""
    P = cfg.sp
    if P == 1:
        return []
    kv = 2 * cfg.batch // cfg.dp * cfg.seq // P * cfg.kv * cfg.head_dim * ITEMSIZE[cfg.dtype]
    return [Call("isend", "sp", kv, kv, 0), Call("irecv", "sp", kv, 0, kv)] * (3 * (P - 1))


class RingAttention(AttentionPattern):
    """Context parallelism by ring attention (Liu et al. 2023): K/V blocks round the ring."""

    name, markers = "ring_attention", ("cp",)
    variants, naive, optimized = ("naive", "ring"), "naive", "ring"
    parts_from = "seq.ring_attention_comms:RingAttentionParts"
    broken = tuple(
        Broken(name, "ring", {part: f"seq.ring_attention_comms:{fn}"}, why,
               lambda P: example(P, batch=2, seq=4 * P, heads=4, kv_heads=2, head_dim=3,
                                  causal=True, layout="zigzag"))
        for name, part, fn, why in (
            ("no_rescale", "merge", "merge_without_rescale",
             "online softmax that does not rescale the running output"),
            ("skipped_hop", "forward_block", "skip_last_hop",
             "the last hop's K/V block never computed"),
            ("dkv_not_returned", "return_home", "no_return_home",
             "dK/dV accumulators dropped at the end of their trip")))

    def bench_configs(self, world_size: int) -> list[AttnConfig]:
        return [AttnConfig(batch=b, seq=s * world_size, heads=H, kv_heads=K, head_dim=d,
                           sp=world_size, causal=True, layout=layout, dtype="float32")
                for b, s, H, K, d in ATTN_MODELS for layout in ("zigzag", "contiguous")]

    def metrics(self, cfg: AttnConfig, variant: str, outs: list[dict]) -> dict:
        # lazy: imports torch
        from commbench.patterns.seq.ring_attention_comms import causal_work

        work = causal_work(cfg)
        return {"work max/min": round(max(work) / min(work), 2)}

    def attention(self, variant: str):
        # lazy: imports torch
        from commbench.patterns.seq.attention import naive_attention

        # lazy: imports torch
        from commbench.patterns.seq.ring_attention_comms import ring_attention

        return {"ring": ring_attention, "naive": naive_attention}[variant]

    layout_kind = "ring"

    def optimized_calls(self, cfg: AttnConfig, r: int) -> list[Call]:
        return ring_calls(cfg, r)
