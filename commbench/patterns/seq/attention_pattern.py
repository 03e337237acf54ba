"""Attention with the sequence sharded, as a pattern shared by DeepSpeed-Ulysses (seq/ulysses.py)
and ring attention (seq/ring_attention.py), each against the naive all-gather of K and V, on a
``dp x sp`` grid (SP neighbours adjacent); torch-free (the oracle: seq/attention.py).

Predicted calls per rank on the SP group for one attention forward + backward of the naive
variant, with n = s/P local tokens and b the local batch: forward, an all-gather of K and V
(b n H_kv d each); backward, a reduce-scatter of dK and dV. Ulysses' calls: seq/ulysses.py;
ring attention's: seq/ring_attention.py.
"""

from __future__ import annotations

from commbench.names import ITEMSIZE
from commbench.ops import booked
from commbench.patterns.base import Call, Pattern, Tolerance, drawn, float32_references
from commbench.patterns.seq.configs import AttnConfig

__all__ = ["ATTN_MODELS", "AttentionPattern", "attn_configs", "example", "naive_calls"]

# (batch, seq per rank, heads, kv_heads, head_dim) of the studies
ATTN_MODELS = [(2, 64, 8, 8, 32), (2, 256, 8, 8, 32), (2, 256, 8, 2, 32)]


TOLERANCE = Tolerance(
    "float64: only the order of the sums differs from the oracle (~1e-15 relative per "
    "operation). float32: within 8x the largest error of the unsharded float32 computation, as "
    "is and with its inputs nudged by one ulp, plus 1e-6 x max(1, largest value): the inputs are "
    "standard normal, so the terms that cancel into a small gradient (softmax backward: "
    "p (dP - D)) are of order 1 and leave ~1.2e-7 of absolute rounding however small the "
    "result is.")


def attn_configs(world_size: int, layouts=("contiguous", "zigzag"),
                 dtypes=("float64", "float32")):
    """A hypothesis strategy of attention calls on ``world_size`` ranks."""
    return drawn(_draw, world_size, layouts, dtypes)


def _draw(draw, st, world_size: int, layouts, dtypes) -> AttnConfig:
    sp = draw(st.sampled_from([d for d in range(1, world_size + 1) if world_size % d == 0]))
    dp = world_size // sp
    heads = draw(st.integers(sp, 2 * sp + 1))
    kv = draw(st.sampled_from([k for k in range(1, heads + 1) if heads % k == 0]))
    layout = draw(st.sampled_from(layouts))
    chunks = sp * (2 if layout == "zigzag" else 1)
    return AttnConfig(batch=dp * draw(st.integers(1, 2)), seq=chunks * draw(st.integers(1, 3)),
                      heads=heads, kv_heads=kv, head_dim=draw(st.sampled_from([1, 3, 4])),
                      sp=sp, dp=dp, causal=draw(st.booleans()), layout=layout,
                      dtype=draw(st.sampled_from(dtypes)))


def naive_calls(cfg: AttnConfig, r: int) -> list[Call]:
    """The calls SP member ``r`` makes in one naive attention forward + backward."""
    P = cfg.sp
    if P == 1:
        return []
    e = ITEMSIZE[cfg.dtype]
    kv = cfg.batch // cfg.dp * cfg.seq // P * cfg.kv * cfg.head_dim
    return [Call("all_gather", "sp", kv * e, *booked("all_gather", P, r, kv, e))] * 2 + \
        [Call("reduce_scatter", "sp", P * kv * e, *booked("reduce_scatter", P, r, P * kv, e))] * 2


class AttentionPattern(Pattern):
    """One attention forward + backward; shared by Ulysses and ring attention, each naming
    its attention function by variant (:meth:`attention`)."""

    axes = ("sp",)
    Config = AttnConfig
    tolerance = TOLERANCE
    layouts: tuple[str, ...] = ("contiguous", "zigzag")

    def grid(self, cfg: AttnConfig) -> str:
        return f"dp={cfg.dp},sp={cfg.sp}"

    def configs(self, world_size: int, variant: str):
        return attn_configs(world_size, self.layouts, self.dtypes)

    def inputs(self, cfg: AttnConfig, seed: int, device) -> dict:
        # lazy: imports torch
        from commbench.patterns.seq.attention import attention_inputs

        # lazy: imports torch
        from commbench.wire.dtypes import DTYPES

        dt = DTYPES[cfg.dtype]
        return {k: v.to(device=device, dtype=dt) for k, v in attention_inputs(cfg, seed).items()}

    def shard(self, cfg: AttnConfig, inputs: dict, groups: dict, variant: str, parts) -> dict:
        # lazy: imports torch
        from commbench.patterns.seq.attention import local_tokens

        return {k: local_tokens(v, cfg, groups["sp"].index, groups["dp"].index)
                for k, v in inputs.items()}

    def oracle(self, cfg: AttnConfig, seed: int) -> dict:
        # lazy: imports torch
        from commbench.patterns.seq.attention import oracle_attention

        return oracle_attention(cfg, seed)

    def references(self, cfg: AttnConfig, seed: int) -> list[dict]:
        # lazy: imports torch
        from commbench.patterns.seq.attention import oracle_attention

        return float32_references(cfg, lambda dt, n: oracle_attention(cfg, seed, dt, n))

    def expected(self, oracle: dict, cfg: AttnConfig, rank: int, variant: str) -> dict:
        # lazy: imports torch
        from commbench.patterns.seq.attention import local_tokens

        c = self.coords(cfg, rank)
        return {k: local_tokens(v, cfg, c["sp"], c["dp"]) for k, v in oracle.items()}

    def step(self, ctx, cfg: AttnConfig, local: dict, variant: str, groups: dict, parts) -> dict:
        attention = self.attention(variant)
        q, k, v = (local[n].detach().requires_grad_() for n in ("q", "k", "v"))
        with ctx.ledger.capture() as forward:
            y = attention(q, k, v, cfg, ctx.comm(), groups["sp"], parts)
        y.backward(local["dy"])
        return {"y": y.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad,
                "stats": {"forward_sent": forward.sent}}

    layout_kind: str = ""  # the layout's cp_kind this pattern is (ring, ulysses)

    def layout_calls(self, lay, stage: int | None) -> dict[str, list[tuple[Call, int]]]:
        """Per layer and micro-batch, its optimized calls with H/t query and max(H_kv/t, 1) KV
        heads, when the layout's context parallelism is this pattern."""
        if lay.cp < 2 or lay.cp_kind != self.layout_kind:
            return {}
        kv = lay.kv_heads or lay.heads
        cfg = AttnConfig(batch=lay.micro_batch, seq=lay.seq, heads=lay.heads // lay.tp,
                         kv_heads=max(kv // lay.tp, 1), head_dim=lay.hidden // lay.heads,
                         sp=lay.cp, dtype=lay.act_dtype)
        return {"cp": [(c, lay.stage_layers * lay.micro_batches)
                       for c in self.optimized_calls(cfg, 0)]}

    def predicted(self, cfg: AttnConfig, variant: str, rank: int, seed=None) -> list[Call]:
        r = self.coords(cfg, rank)["sp"]
        return naive_calls(cfg, r) if variant == "naive" else self.optimized_calls(cfg, r)

    def optimized_calls(self, cfg: AttnConfig, r: int) -> list[Call]:
        """The calls SP member ``r`` makes in one forward + backward of the optimized variant."""
        raise NotImplementedError

    def attention(self, variant: str):
        """The attention function of ``variant``: q, k, v, cfg, comm, group, parts -> y."""
        raise NotImplementedError


def example(P: int, **kw) -> list[AttnConfig]:
    """Configs of ``sp=P`` in both dtypes at which a broken variant must be caught."""
    return [AttnConfig(**dict(kw, sp=P, dtype=dtype)) for dtype in ("float64", "float32")]
