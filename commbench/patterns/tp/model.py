"""The transformer layer of the TP/SP and DDP patterns: seeded weights and the oracle (its
config: tp/configs.py).

Every rank builds the same full weights from ``(cfg, seed)`` and slices its shard, so nothing large
crosses from the driver; the oracle runs the unsharded layer in float64 with autograd. The layer
runs whole (attention and MLP blocks) or as its MLP block alone (``mlp_only``: x2 = x).

Layer (pre-LN, Shoeybi 2019 Fig. 2): y = x2 + drop(MLP(LN2(x2))), x2 = x + drop(Attn(LN1(x))).
Shapes: x, y [b, s, h]; Wqkv [3h, h] (q, k, v blocks, heads of d = h/H); Wo [h, h]; W1 [f, h];
W2 [h, f]. Embedding E [V, h], tied with the LM head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from commbench.patterns.tp.configs import TPConfig

__all__ = ["LayerWeights", "attention", "init_weights", "inputs", "oracle_layer"]

@dataclass
class LayerWeights:
    ln1_w: torch.Tensor
    ln1_b: torch.Tensor
    wqkv: torch.Tensor
    bqkv: torch.Tensor
    wo: torch.Tensor
    bo: torch.Tensor
    ln2_w: torch.Tensor
    ln2_b: torch.Tensor
    w1: torch.Tensor
    b1: torch.Tensor
    w2: torch.Tensor
    b2: torch.Tensor

    def named(self) -> dict[str, torch.Tensor]:
        return dict(vars(self))


def init_weights(cfg: TPConfig, seed: int, dtype: torch.dtype = torch.float64) -> LayerWeights:
    g = torch.Generator().manual_seed(seed)
    h, f = cfg.hidden, cfg.ffn

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    return LayerWeights(
        ln1_w=1 + rnd(h, scale=0.1), ln1_b=rnd(h, scale=0.1),
        wqkv=rnd(3 * h, h, scale=h ** -0.5), bqkv=rnd(3 * h, scale=0.1),
        wo=rnd(h, h, scale=h ** -0.5), bo=rnd(h, scale=0.1),
        ln2_w=1 + rnd(h, scale=0.1), ln2_b=rnd(h, scale=0.1),
        w1=rnd(f, h, scale=h ** -0.5), b1=rnd(f, scale=0.1),
        w2=rnd(h, f, scale=f ** -0.5), b2=rnd(h, scale=0.1))


def inputs(cfg: TPConfig, seed: int, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    """x [b, s, h], the output gradient dy [b, s, h], dropout masks, token ids and targets [b, s]."""
    g = torch.Generator().manual_seed(seed + 1)
    b, s, h = cfg.batch, cfg.seq, cfg.hidden
    keep = 1 - cfg.dropout
    masks = [(torch.rand(b, s, h, generator=g) < keep).to(dtype) / keep for _ in range(2)]
    return {"x": torch.randn(b, s, h, generator=g, dtype=torch.float64).to(dtype),
            "dy": torch.randn(b, s, h, generator=g, dtype=torch.float64).to(dtype),
            "mask1": masks[0], "mask2": masks[1],
            "ids": torch.randint(0, cfg.vocab, (b, s), generator=g),
            "targets": torch.randint(0, cfg.vocab, (b, s), generator=g),
            "embedding": torch.randn(cfg.vocab, h, generator=g, dtype=torch.float64).to(dtype)}


def attention(qkv: torch.Tensor, heads: int, causal: bool) -> torch.Tensor:
    """Local multi-head attention. qkv [b, s, 3*H*d] (q, k, v blocks) -> [b, s, H*d]."""
    b, s, three_hd = qkv.shape
    d = three_hd // (3 * heads)
    q, k, v = (t.reshape(b, s, heads, d).transpose(1, 2) for t in qkv.split(heads * d, dim=-1))
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)  # [b, H, s, s]
    if causal:
        mask = torch.ones(s, s, dtype=torch.bool, device=qkv.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, heads * d)


def layer(x, w: LayerWeights, cfg: TPConfig, m1, m2, mlp_only: bool = False) -> torch.Tensor:
    """The unsharded layer (the oracle's forward)."""
    h = cfg.hidden
    x2 = x
    if not mlp_only:
        a = attention(F.layer_norm(x, (h,), w.ln1_w, w.ln1_b) @ w.wqkv.T + w.bqkv, cfg.heads,
                      cfg.causal) @ w.wo.T + w.bo
        x2 = x + a * m1
    u = F.gelu(F.layer_norm(x2, (h,), w.ln2_w, w.ln2_b) @ w.w1.T + w.b1)
    return x2 + (u @ w.w2.T + w.b2) * m2


def oracle_layer(cfg: TPConfig, seed: int, dtype: torch.dtype = torch.float64, nudge=None,
                 mlp_only: bool = False) -> dict[str, torch.Tensor]:
    """Output y, dx and every weight gradient of the full layer in one process (float64: the
    truth; float32: how close an unsharded float32 computation gets to it). ``nudge``: applied
    to every weight, x and dy, not to the dropout masks (a reference run moved by an ulp,
    :mod:`commbench.patterns.judge`). ``mlp_only``: the MLP block alone, whose attention
    weights have no gradient."""
    w = init_weights(cfg, seed, dtype)
    d = inputs(cfg, seed, dtype)
    nudge = nudge or torch.clone
    params = {k: nudge(v).requires_grad_() for k, v in w.named().items()}
    x = nudge(d["x"]).requires_grad_()
    y = layer(x, LayerWeights(**params), cfg, d["mask1"], d["mask2"], mlp_only)
    y.backward(nudge(d["dy"]))
    return {"y": y.detach().double(), "dx": x.grad.double(),
            **{f"d{k}": p.grad.double() for k, p in params.items() if p.grad is not None}}
