"""Column- and row-parallel linears and the TP / TP+SP / naive transformer layer.

Megatron's layout (Shoeybi 2019 §3): the first linear of a block is split by columns (output
features), the second by rows (input features), so the activation between them stays sharded and
no communication is needed there. Why not A by rows: GELU(X1 A1 + X2 A2) != GELU(X1 A1) + GELU(X2 A2),
a row split of A would need a sum before the nonlinearity, i.e. one more all-reduce per block.

Per rank (P = TP group size, H heads, Hl = H/P):
    column  W [out/P, in]   x [b, s, in] whole    -> y [b, s, out/P]  (f before it; SP: all-gather)
    row     W [out, in/P]   x [b, s, in/P]        -> y [b, s, out]    (g after it;  SP: reduce-scatter)
    attention: Wqkv [3h/P, h] holds Hl whole heads of q, k and v; Wo [h, h/P]
    SP: x, y, LayerNorm and dropout on [b, s/P, h]; LayerNorm and row-bias gradients summed over TP.

``regather`` is Megatron's memory saving under SP: the column linear keeps its sequence shard and
all-gathers it again in backward for the weight gradient, one more all-gather per column linear.
The naive layer all-gathers every column output (and cuts it again before the row linear).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from commbench.patterns.tp.communications import (
    _ag,
    _rs,
    copy_to_tp,
    gather_from_sp,
    gather_from_tp,
    reduce_from_tp,
    reduce_scatter_to_sp,
    scatter_to_tp,
)
from commbench.patterns.tp_model import LayerWeights, TPConfig, attention
from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["REPLICATED_UNDER_SP", "shard_weights", "sync_replicated_grads", "tp_layer"]

REPLICATED_UNDER_SP = ("ln1_w", "ln1_b", "bo", "ln2_w", "ln2_b", "b2")


def shard_weights(w: LayerWeights, rank: int, P: int, cfg: TPConfig) -> LayerWeights:
    """This rank's shard of every weight (replicated ones whole)."""
    h, f = cfg.hidden, cfg.ffn
    hp, fp = h // P, f // P

    def heads(t: torch.Tensor) -> torch.Tensor:  # rows of q, k and v for this rank's heads
        return torch.cat([t[blk * h + rank * hp: blk * h + (rank + 1) * hp] for blk in range(3)])

    return LayerWeights(
        ln1_w=w.ln1_w, ln1_b=w.ln1_b, wqkv=heads(w.wqkv), bqkv=heads(w.bqkv),
        wo=w.wo[:, rank * hp:(rank + 1) * hp], bo=w.bo, ln2_w=w.ln2_w, ln2_b=w.ln2_b,
        w1=w.w1[rank * fp:(rank + 1) * fp], b1=w.b1[rank * fp:(rank + 1) * fp],
        w2=w.w2[:, rank * fp:(rank + 1) * fp], b2=w.b2)


class _SPColumnRegather(torch.autograd.Function):
    """SP column linear that stores its sequence shard, not the gathered input.

    forward: full = AG(x) [b, s, in]; y = full W^T + b.  backward: full = AG(x) again;
    dW = dy^T full; dx = RS(dy W) [b, s/P, in].
    """

    @staticmethod
    def forward(ctx, x, w, b, comm, group):
        ctx.save_for_backward(x, w)
        ctx.comm, ctx.group = comm, group
        return _ag(comm, x, group, 1) @ w.T + b

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        full = _ag(ctx.comm, x, ctx.group, 1)
        dw = dy.reshape(-1, dy.shape[-1]).T @ full.reshape(-1, full.shape[-1])
        dx = _rs(ctx.comm, dy @ w, ctx.group, 1)
        return dx, dw, dy.sum((0, 1)), None, None


def _column(x, w, b, cfg: TPConfig, comm: Comm, group: Group) -> torch.Tensor:
    if cfg.sequence_parallel and cfg.regather and group.size > 1:
        return _SPColumnRegather.apply(x, w, b, comm, group)
    full = gather_from_sp(x, comm, group) if cfg.sequence_parallel else copy_to_tp(x, comm, group)
    return full @ w.T + b


def _row(x, w, b, cfg: TPConfig, comm: Comm, group: Group) -> torch.Tensor:
    part = x @ w.T
    if cfg.sequence_parallel:
        return reduce_scatter_to_sp(part, comm, group) + b
    return reduce_from_tp(part, comm, group) + b


def tp_layer(x, w: LayerWeights, cfg: TPConfig, comm: Comm, group: Group, m1, m2,
             naive: bool = False, attention_block: bool = True) -> torch.Tensor:
    """One layer on this rank. x, m1, m2, y [b, s, h] (SP: [b, s/P, h]); w from shard_weights.
    ``attention_block=False`` runs the MLP block alone (x2 = x)."""
    h, P = cfg.hidden, group.size
    if not attention_block:
        return _mlp(x, x, w, cfg, comm, group, m2, naive)
    ln1 = F.layer_norm(x, (h,), w.ln1_w, w.ln1_b)
    qkv = _column(ln1, w.wqkv, w.bqkv, cfg, comm, group)  # [b, s, 3h/P]
    if naive:  # gather every column output, compute all heads, cut again for the row linear
        full = gather_from_tp(qkv, comm, group)  # [b, s, 3h] in rank-major blocks
        full = _rank_major_to_qkv(full, P)
        ctx = scatter_to_tp(attention(full, cfg.heads, cfg.causal), comm, group)  # head-major
    else:
        ctx = attention(qkv, cfg.heads // P, cfg.causal)  # [b, s, h/P]
    x2 = x + _row(ctx, w.wo, w.bo, cfg, comm, group) * m1
    return _mlp(x, x2, w, cfg, comm, group, m2, naive)


def _mlp(x, x2, w: LayerWeights, cfg: TPConfig, comm: Comm, group: Group, m2, naive: bool):
    up = _column(F.layer_norm(x2, (cfg.hidden,), w.ln2_w, w.ln2_b), w.w1, w.b1, cfg, comm, group)
    if naive:
        up = scatter_to_tp(gather_from_tp(up, comm, group), comm, group)
    return x2 + _row(F.gelu(up), w.w2, w.b2, cfg, comm, group) * m2


def _rank_major_to_qkv(t: torch.Tensor, P: int) -> torch.Tensor:
    """[.., P blocks of (q_r, k_r, v_r)] -> [.., q (all heads), k, v]."""
    parts = [blk.chunk(3, -1) for blk in t.chunk(P, -1)]
    return torch.cat([torch.cat([p[j] for p in parts], -1) for j in range(3)], -1)


def sync_replicated_grads(w: LayerWeights, comm: Comm, group: Group) -> None:
    """Under SP each rank's LayerNorm and row-bias gradients cover its sequence shard only: sum
    them over TP (one all-reduce of the six vectors, 6h elements)."""
    if group.size == 1:
        return
    grads = [getattr(w, k).grad for k in REPLICATED_UNDER_SP]
    total = comm.all_reduce(torch.cat([g.reshape(-1) for g in grads]), group)
    for g, part in zip(grads, total.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))
