"""DeepSpeed-Ulysses with ZeRO-3: an attention layer whose projections are sharded over every rank.

The flat projection weights w = [Wq, Wk, Wv, Wo] (2 h^2 + 2 H_kv d h elements, h = H d) are cut
into W chunks of c = ceil(numel / W) over the ``dp x sp`` world; the layer all-gathers them just
before use and reduce-scatters their gradient in backward (ZeRO-3's parameter and gradient
partitioning), while the attention between the projections runs Ulysses' all-to-alls (or the
naive all-gather of K and V) on the SP group.

Its operators, oracle and broken parts: seq/ulysses_zero3_comms.py; its predicted calls add
ZeRO-3's gather and reduce-scatter to Ulysses' (seq/ulysses.py).
"""

from __future__ import annotations

from commbench.names import ITEMSIZE
from commbench.ops import booked
from commbench.patterns.base import Broken, Call, Pattern, float32_references
from commbench.patterns.dp.zero import pad_to
from commbench.patterns.seq.attention_pattern import TOLERANCE, attn_configs, naive_calls
from commbench.patterns.seq.configs import AttnConfig, projection_chunk
from commbench.patterns.seq.ulysses import ulysses_calls

__all__ = ["UlyssesZero3"]


class UlyssesZero3(Pattern):
    """Ulysses attention inside a layer whose weights ZeRO-3 gathers and reduce-scatters."""

    name, markers = "ulysses_zero3", ("ulysses", "zero")
    variants, naive, optimized = ("naive", "ulysses"), "naive", "ulysses"
    axes, combos = ("sp", "dp_sp"), (("dp", "sp"),)
    Config = AttnConfig
    tolerance = TOLERANCE
    parts_from = "seq.ulysses_zero3_comms:Zero3Parts"
    broken = (Broken("weights_not_reduce_scattered", "ulysses",
                     {"gather_weights": "seq.ulysses_zero3_comms:gathered_without_reduce_scatter"},
                     "gathered weights whose backward keeps this rank's own gradient slice",
                     lambda P: [AttnConfig(batch=2, seq=2 * P, heads=2 * P, kv_heads=P,
                                           head_dim=3, sp=P, dtype=dt)
                                for dt in ("float64", "float32")]),)

    def grid(self, cfg: AttnConfig) -> str:
        return f"dp={cfg.dp},sp={cfg.sp}"

    def configs(self, world_size: int, variant: str):
        return attn_configs(world_size, ("contiguous",), self.dtypes)

    def bench_configs(self, world_size: int) -> list[AttnConfig]:
        return [AttnConfig(batch=2, seq=64 * world_size, heads=8, head_dim=32, sp=world_size,
                           causal=True, dtype="float32")]

    def inputs(self, cfg: AttnConfig, seed: int, device) -> dict:
        # lazy: imports torch
        from commbench.patterns.seq.ulysses_zero3_comms import zero3_data

        # lazy: imports torch
        from commbench.wire.dtypes import DTYPES

        return {k: v.to(device=device, dtype=DTYPES[cfg.dtype])
                for k, v in zero3_data(cfg, seed).items()}

    def shard(self, cfg: AttnConfig, inputs: dict, groups: dict, variant: str, parts) -> dict:
        # lazy: imports torch
        from commbench.patterns.seq.attention import local_tokens

        sp, dp, world = groups["sp"].index, groups["dp"].index, groups["dp_sp"]
        c = projection_chunk(cfg, world.size)
        padded = pad_to(inputs["w"], c * world.size)
        return {"x": local_tokens(inputs["x"], cfg, sp, dp),
                "dy": local_tokens(inputs["dy"], cfg, sp, dp),
                "chunk": padded[world.index * c:(world.index + 1) * c].clone()}

    def oracle(self, cfg: AttnConfig, seed: int) -> dict:
        # lazy: imports torch
        from commbench.patterns.seq.ulysses_zero3_comms import zero3_oracle

        return zero3_oracle(cfg, seed)

    def references(self, cfg: AttnConfig, seed: int) -> list[dict]:
        # lazy: imports torch
        from commbench.patterns.seq.ulysses_zero3_comms import zero3_oracle

        return float32_references(cfg, lambda dt, n: zero3_oracle(cfg, seed, dt, n))

    def expected(self, oracle: dict, cfg: AttnConfig, rank: int, variant: str) -> dict:
        # lazy: imports torch
        from commbench.patterns.seq.attention import local_tokens

        W = cfg.sp * cfg.dp
        c = projection_chunk(cfg, W)
        dw = pad_to(oracle["dw"], c * W)
        at = self.coords(cfg, rank)
        sp, dp = at["sp"], at["dp"]
        return {"y": local_tokens(oracle["y"], cfg, sp, dp),
                "dx": local_tokens(oracle["dx"], cfg, sp, dp), "dchunk": dw[rank * c:(rank + 1) * c]}

    def step(self, ctx, cfg: AttnConfig, local: dict, variant: str, groups: dict, parts) -> dict:
        # lazy: imports torch
        from commbench.patterns.seq.ulysses_zero3_comms import zero3_step

        return zero3_step(ctx, cfg, local, variant, groups, parts)

    def predicted(self, cfg: AttnConfig, variant: str, rank: int, seed=None) -> list[Call]:
        W, e = cfg.sp * cfg.dp, ITEMSIZE[cfg.dtype]
        c = projection_chunk(cfg, W)
        zero = [  # booked at a world of one too, with nothing sent
            Call("all_gather", "dp_sp", c * e, *booked("all_gather", W, rank, c, e)),
            Call("reduce_scatter", "dp_sp", c * W * e, *booked("reduce_scatter", W, rank, c * W, e))]
        r = self.coords(cfg, rank)["sp"]
        return (ulysses_calls if variant == "ulysses" else naive_calls)(cfg, r) + zero
