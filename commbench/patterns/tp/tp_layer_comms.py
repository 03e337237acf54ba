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

Variants: ``tp`` (f and g), ``sp`` (Korthikanti 2022: all-gather and reduce-scatter along the
sequence), ``sp_regather`` (Megatron's memory saving under SP: the column linear keeps its
sequence shard and all-gathers it again in backward for the weight gradient, one more all-gather
per column linear), ``naive`` (every column output all-gathered, and cut again before the row
linear). The operators are parts (:class:`TPParts`), so a broken f can stand in for Megatron's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from commbench.patterns.buckets import DDP, naive_sync
from commbench.patterns.mappings import (
    _ag,
    _rs,
    copy_to_tp,
    gather_from_sp,
    gather_from_tp,
    reduce_from_tp,
    reduce_scatter_to_sp,
    scatter_to_tp,
)
from commbench.patterns.tp.configs import MLP_WEIGHTS, SP_VARIANTS, TPConfig, replicated
from commbench.patterns.tp.model import LayerWeights, attention
from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["TPParts", "copy_without_all_reduce", "heads_off_by_one", "layer_step", "local_slice",
           "no_replicated_sync", "shard_weights", "sync_replicated_grads", "tp_layer"]


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


def _column(x, w, b, variant: str, comm: Comm, group: Group, parts: TPParts) -> torch.Tensor:
    if variant == "sp_regather" and group.size > 1:
        return _SPColumnRegather.apply(x, w, b, comm, group)
    full = parts.sp_gather(x, comm, group) if variant in SP_VARIANTS else parts.f(x, comm, group)
    return full @ w.T + b


def _row(x, w, b, variant: str, comm: Comm, group: Group, parts: TPParts) -> torch.Tensor:
    part = x @ w.T
    if variant in SP_VARIANTS:
        return parts.sp_reduce_scatter(part, comm, group) + b
    return parts.g(part, comm, group) + b


def tp_layer(x, w: LayerWeights, cfg: TPConfig, variant: str, comm: Comm, group: Group, m1, m2,
             parts: TPParts, mlp_only: bool = False) -> torch.Tensor:
    """One layer on this rank. x, m1, m2, y [b, s, h] (SP: [b, s/P, h]); w from shard_weights.
    ``mlp_only`` runs the MLP block alone (x2 = x)."""
    h, P = cfg.hidden, group.size
    if mlp_only:
        return _mlp(x, w, cfg, variant, comm, group, m2, parts)
    ln1 = F.layer_norm(x, (h,), w.ln1_w, w.ln1_b)
    qkv = _column(ln1, w.wqkv, w.bqkv, variant, comm, group, parts)  # [b, s, 3h/P]
    if variant == "naive":  # gather every column output, compute all heads, cut again
        full = parts.gather(qkv, comm, group)  # [b, s, 3h] in rank-major blocks
        full = _rank_major_to_qkv(full, P)
        ctx = parts.scatter(attention(full, cfg.heads, cfg.causal), comm, group)  # head-major
    else:
        ctx = attention(qkv, cfg.heads // P, cfg.causal)  # [b, s, h/P]
    x2 = x + _row(ctx, w.wo, w.bo, variant, comm, group, parts) * m1
    return _mlp(x2, w, cfg, variant, comm, group, m2, parts)


def _mlp(x2, w: LayerWeights, cfg: TPConfig, variant: str, comm: Comm, group: Group, m2,
         parts: TPParts):
    ln2 = F.layer_norm(x2, (cfg.hidden,), w.ln2_w, w.ln2_b)
    up = _column(ln2, w.w1, w.b1, variant, comm, group, parts)
    if variant == "naive":
        up = parts.scatter(parts.gather(up, comm, group), comm, group)
    return x2 + _row(F.gelu(up), w.w2, w.b2, variant, comm, group, parts) * m2


def _rank_major_to_qkv(t: torch.Tensor, P: int) -> torch.Tensor:
    """[.., P blocks of (q_r, k_r, v_r)] -> [.., q (all heads), k, v]."""
    parts = [blk.chunk(3, -1) for blk in t.chunk(P, -1)]
    return torch.cat([torch.cat([p[j] for p in parts], -1) for j in range(3)], -1)


def sync_replicated_grads(w: LayerWeights, comm: Comm, group: Group, mlp_only: bool = False
                          ) -> None:
    """Under SP each rank's LayerNorm and row-bias gradients cover its sequence shard only: sum
    them over TP (one all-reduce of the six vectors, 6h elements; the MLP block alone: 3h)."""
    if group.size == 1:
        return
    grads = [getattr(w, k).grad for k in replicated(mlp_only)]
    total = comm.all_reduce(torch.cat([g.reshape(-1) for g in grads]), group)
    for g, part in zip(grads, total.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))


@dataclass(frozen=True)
class TPParts:
    """The swappable operators of the tensor-parallel steps (Megatron's names)."""

    f: Callable = copy_to_tp                  # identity forward, all-reduce backward
    g: Callable = reduce_from_tp              # all-reduce forward, identity backward
    sp_gather: Callable = gather_from_sp      # SP: all-gather forward, reduce-scatter backward
    sp_reduce_scatter: Callable = reduce_scatter_to_sp
    gather: Callable = gather_from_tp         # naive: all-gather the last dim
    scatter: Callable = scatter_to_tp         # naive: keep this rank's slice of it
    shard: Callable = shard_weights           # the full weights -> this rank's shard
    sync_replicated: Callable = sync_replicated_grads
    reducer: Callable = DDP                   # TP x DP: the data-parallel gradient reducer


def local_slice(t: torch.Tensor, cfg: TPConfig, dp_index: int, tp_index: int, seq: bool):
    """This rank's slice: its DP share of the batch, and under SP its TP share of the sequence."""
    b = cfg.batch // cfg.dp
    t = t[dp_index * b:(dp_index + 1) * b]
    if seq:
        s = cfg.seq // cfg.tp
        t = t[:, tp_index * s:(tp_index + 1) * s]
    return t.contiguous()


def layer_step(ctx, cfg: TPConfig, local: dict, variant: str, groups: dict, parts: TPParts,
               mlp_only: bool, sync: str) -> dict:
    """One layer (or MLP block) forward + backward on this rank, its gradients summed over DP by
    DDP's buckets (``sync="ddp"``) or one blocking all-reduce per parameter (``"naive"``)."""
    comm, tp, dp = ctx.comm(), groups["tp"], groups["dp"]
    names = MLP_WEIGHTS if mlp_only else tuple(local["weights"])
    params = {k: local["weights"][k].detach().requires_grad_() for k in names}
    w = LayerWeights(**{**local["weights"], **params})
    x = local["x"].detach().requires_grad_()
    start = len(ctx.ledger.entries)
    ddp = parts.reducer(list(params.values()), comm, dp, cfg.bucket_bytes) \
        if dp.size > 1 and sync == "ddp" else None
    y = tp_layer(x, w, cfg, variant, comm, tp, local["mask1"], local["mask2"], parts, mlp_only)
    y.backward(local["dy"])
    if ddp is not None:  # DP sums first: the buckets left with the gradients as they stood
        ddp.finish()
    elif dp.size > 1:
        naive_sync(list(params.values()), comm, dp)
    if variant in SP_VARIANTS:
        parts.sync_replicated(w, comm, tp, mlp_only)
    return {"y": y.detach(), "dx": x.grad, **{f"d{k}": p.grad for k, p in params.items()},
            "stats": {"ddp_issued": [i - start for i in ddp.issued_at] if ddp else []}}


# -- broken parts: each a bug class the contract must catch ----------------------------------
class _CopyNoReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return dy


def copy_without_all_reduce(x, comm, group):
    """Megatron's f that forgets its backward all-reduce: each rank keeps its partial dx."""
    return x if group.size == 1 else _CopyNoReduce.apply(x)


def heads_off_by_one(w, rank, P, cfg):
    """The attention heads sharded one head too far on rank 0 (a wrong split)."""
    out = shard_weights(w, rank, P, cfg)
    if rank == 0 and P > 1:
        out.wqkv = torch.roll(out.wqkv, cfg.hidden // cfg.heads, 0)
    return out


def no_replicated_sync(w, comm, group, mlp_only=False):
    """SP without the all-reduce of the LayerNorm and row-bias gradients over TP."""
