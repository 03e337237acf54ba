"""DeepSpeed-Ulysses with ZeRO-3: an attention layer whose projections are sharded over every rank.

The flat projection weights w = [Wq, Wk, Wv, Wo] (2 h^2 + 2 H_kv d h elements, h = H d) are cut
into W chunks of c = ceil(numel / W) over the ``dp x sp`` world; the layer all-gathers them just
before use and reduce-scatters their gradient in backward (ZeRO-3's parameter and gradient
partitioning), while the attention between the projections runs Ulysses' all-to-alls (or the
naive all-gather of K and V) on the SP group.

Shapes: x, y [b, s/P, h] this rank's tokens; chunk [c]; gathered w [numel].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from commbench.patterns.base import Broken, Call, Pattern, reference_nudges
from commbench.patterns.dp.zero_comms import gathered
from commbench.patterns.seq import broken
from commbench.patterns.seq.attention import AttnConfig, attend, gqa_index, local_tokens
from commbench.patterns.seq.attention_pattern import (
    ATTENTION,
    TOLERANCE,
    SeqParts,
    attention_calls,
    attn_configs,
)
from commbench.wire.dtypes import DTYPES
from commbench.wire.ops import booked

__all__ = ["UlyssesZero3"]


def _numel(cfg: AttnConfig) -> int:
    h = cfg.heads * cfg.head_dim
    return 2 * h * h + 2 * cfg.kv * cfg.head_dim * h


def _data(cfg: AttnConfig, seed: int) -> dict[str, torch.Tensor]:
    """x and dy [b, s, h], the flat weights w [numel]: float64, on the CPU."""
    g = torch.Generator().manual_seed(seed + 1)
    h = cfg.heads * cfg.head_dim
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    return {"x": r(cfg.batch, cfg.seq, h), "w": r(_numel(cfg)) / h ** 0.5,
            "dy": r(cfg.batch, cfg.seq, h)}


def _layer(x, w, cfg: AttnConfig, attention):
    """x [b, n, h] -> projections -> attention -> output projection [b, n, h]."""
    H, K, d = cfg.heads, cfg.kv, cfg.head_dim
    h, b, n = H * d, x.shape[0], x.shape[1]
    wq, wk, wv, wo = w.split([h * h, K * d * h, K * d * h, h * h])
    q = (x @ wq.view(h, h).T).view(b, n, H, d)
    k, v = ((x @ t.view(K * d, h).T).view(b, n, K, d) for t in (wk, wv))
    return attention(q, k, v).reshape(b, n, h) @ wo.view(h, h).T


def _chunk(cfg: AttnConfig, world: int) -> int:
    return -(-_numel(cfg) // world)


@dataclass(frozen=True)
class Zero3Parts(SeqParts):
    """The sequence-parallel parts, and ZeRO-3's gather of the sharded weights."""

    gather_weights: Callable = gathered


class UlyssesZero3(Pattern):
    """Ulysses attention inside a layer whose weights ZeRO-3 gathers and reduce-scatters."""

    name, markers = "ulysses_zero3", ("ulysses", "zero")
    variants, naive, optimized = ("naive", "ulysses"), "naive", "ulysses"
    axes, combos = ("sp", "dp_sp"), (("dp", "sp"),)
    Config = AttnConfig
    tolerance = TOLERANCE
    parts = Zero3Parts()
    broken = (Broken("weights_not_reduce_scattered", "ulysses",
                     {"gather_weights": broken.gathered_without_reduce_scatter},
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
        return {k: v.to(device=device, dtype=DTYPES[cfg.dtype]) for k, v in _data(cfg, seed).items()}

    def shard(self, cfg: AttnConfig, inputs: dict, groups: dict, variant: str, parts) -> dict:
        sp, dp, world = groups["sp"].index, groups["dp"].index, groups["dp_sp"]
        c, w = _chunk(cfg, world.size), inputs["w"]
        padded = torch.cat([w, w.new_zeros(c * world.size - w.numel())])
        return {"x": local_tokens(inputs["x"], cfg, sp, dp),
                "dy": local_tokens(inputs["dy"], cfg, sp, dp),
                "chunk": padded[world.index * c:(world.index + 1) * c].clone()}

    def oracle(self, cfg: AttnConfig, seed: int, dtype=torch.float64, nudge=None) -> dict:
        cast = (lambda t: nudge(t.to(dtype))) if nudge else (lambda t: t.to(dtype))
        d = {k: cast(v) for k, v in _data(cfg, seed).items()}
        x, w = d["x"].requires_grad_(), d["w"].requires_grad_()
        pos = torch.arange(cfg.seq)
        idx = gqa_index(range(cfg.heads), cfg.heads, cfg.kv)
        y = _layer(x, w, cfg, lambda q, k, v: attend(q, k, v, idx, pos, pos, cfg.causal))
        y.backward(d["dy"])
        return {"y": y.detach(), "dx": x.grad, "dw": w.grad}

    def references(self, cfg: AttnConfig, seed: int) -> list[dict]:
        if cfg.dtype == "float64":
            return []
        return [self.oracle(cfg, seed, torch.float32, n) for n in reference_nudges()]

    def expected(self, oracle: dict, cfg: AttnConfig, rank: int, variant: str) -> dict:
        W = cfg.sp * cfg.dp
        c = _chunk(cfg, W)
        dw = torch.cat([oracle["dw"], oracle["dw"].new_zeros(c * W - oracle["dw"].numel())])
        at = self.coords(cfg, rank)
        sp, dp = at["sp"], at["dp"]
        return {"y": local_tokens(oracle["y"], cfg, sp, dp),
                "dx": local_tokens(oracle["dx"], cfg, sp, dp), "dchunk": dw[rank * c:(rank + 1) * c]}

    def step(self, ctx, cfg: AttnConfig, local: dict, variant: str, groups: dict, parts) -> dict:
        comm = ctx.comm()
        chunk, x = (local[k].detach().requires_grad_() for k in ("chunk", "x"))
        full = parts.gather_weights(chunk, _numel(cfg), comm, groups["dp_sp"])
        attention = ATTENTION[variant]
        y = _layer(x, full, cfg, lambda q, k, v: attention(q, k, v, cfg, comm, groups["sp"], parts))
        y.backward(local["dy"])
        return {"y": y.detach(), "dx": x.grad, "dchunk": chunk.grad}

    def predicted(self, cfg: AttnConfig, variant: str, rank: int, seed=None) -> list[Call]:
        W, e = cfg.sp * cfg.dp, DTYPES[cfg.dtype].itemsize
        c = _chunk(cfg, W)
        zero = [  # booked at a world of one too, with nothing sent
            Call("all_gather", "dp_sp", c * e, *booked("all_gather", W, rank, c, e)),
            Call("reduce_scatter", "dp_sp", c * W * e, *booked("reduce_scatter", W, rank, c * W, e))]
        return attention_calls(cfg, variant, self.coords(cfg, rank)["sp"]) + zero
