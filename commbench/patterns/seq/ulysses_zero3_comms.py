"""The operators of DeepSpeed-Ulysses with ZeRO-3 (the pattern: seq/ulysses_zero3.py): the
layer's projections around the attention, the seeded data, the oracle, the parts and the broken
ones.

Shapes: x, y [b, s/P, h] this rank's tokens; chunk [c]; gathered w [numel].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from commbench.patterns.dp.zero_comms import gathered
from commbench.patterns.seq.attention import attend, gqa_index, naive_attention
from commbench.patterns.seq.configs import AttnConfig, projection_numel
from commbench.patterns.seq.ulysses_comms import UlyssesParts, ulysses_attention

__all__ = ["Zero3Parts", "gathered_without_reduce_scatter", "projected_attention", "zero3_data",
           "zero3_oracle", "zero3_step"]


def zero3_data(cfg: AttnConfig, seed: int) -> dict[str, torch.Tensor]:
    """x and dy [b, s, h], the flat weights w [numel]: float64, on the CPU."""
    g = torch.Generator().manual_seed(seed + 1)
    h = cfg.heads * cfg.head_dim
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    return {"x": r(cfg.batch, cfg.seq, h), "w": r(projection_numel(cfg)) / h ** 0.5,
            "dy": r(cfg.batch, cfg.seq, h)}


def projected_attention(x, w, cfg: AttnConfig, attention):
    """x [b, n, h] -> projections -> attention -> output projection [b, n, h]."""
    H, K, d = cfg.heads, cfg.kv, cfg.head_dim
    h, b, n = H * d, x.shape[0], x.shape[1]
    wq, wk, wv, wo = w.split([h * h, K * d * h, K * d * h, h * h])
    q = (x @ wq.view(h, h).T).view(b, n, H, d)
    k, v = ((x @ t.view(K * d, h).T).view(b, n, K, d) for t in (wk, wv))
    return attention(q, k, v).reshape(b, n, h) @ wo.view(h, h).T


@dataclass(frozen=True)
class Zero3Parts(UlyssesParts):
    """Ulysses' parts, and ZeRO-3's gather of the sharded weights."""

    gather_weights: Callable = gathered


def zero3_oracle(cfg: AttnConfig, seed: int, dtype=torch.float64, nudge=None) -> dict:
    """y, dx and dw of the unsharded layer in one process (float64: the truth)."""
    cast = (lambda t: nudge(t.to(dtype))) if nudge else (lambda t: t.to(dtype))
    d = {k: cast(v) for k, v in zero3_data(cfg, seed).items()}
    x, w = d["x"].requires_grad_(), d["w"].requires_grad_()
    pos = torch.arange(cfg.seq)
    idx = gqa_index(range(cfg.heads), cfg.heads, cfg.kv)
    y = projected_attention(x, w, cfg, lambda q, k, v: attend(q, k, v, idx, pos, pos, cfg.causal))
    y.backward(d["dy"])
    return {"y": y.detach(), "dx": x.grad, "dw": w.grad}


def zero3_step(ctx, cfg: AttnConfig, local: dict, variant: str, groups: dict, parts) -> dict:
    """One layer forward + backward on this rank: weights gathered over ``dp_sp``, attention by
    Ulysses (or the naive all-gather of K and V) over ``sp``."""
    comm = ctx.comm()
    chunk, x = (local[k].detach().requires_grad_() for k in ("chunk", "x"))
    full = parts.gather_weights(chunk, projection_numel(cfg), comm, groups["dp_sp"])
    attention = ulysses_attention if variant == "ulysses" else naive_attention
    y = projected_attention(x, full, cfg,
                            lambda q, k, v: attention(q, k, v, cfg, comm, groups["sp"], parts))
    y.backward(local["dy"])
    return {"y": y.detach(), "dx": x.grad, "dchunk": chunk.grad}


# -- broken parts: each a bug class the contract must catch ----------------------------------
def _own_slice(grad, comm, group, c):
    i = group.index
    full = torch.cat([grad, grad.new_zeros(max(0, (i + 1) * c - grad.numel()))])
    return full[i * c:(i + 1) * c]


def gathered_without_reduce_scatter(chunk, numel, comm, group):
    """ZeRO-3's weight gather whose backward keeps this rank's slice of its own gradient
    instead of reduce-scattering the sum over the group."""
    return gathered(chunk, numel, comm, group, back=_own_slice)
