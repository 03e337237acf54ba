"""Expert parallelism (GShard, Lepikhin et al. 2020; DeepSpeed-MoE; DeepEP's dispatch layout):
the token dispatch and combine all-to-alls around the experts, in three ways.

Experts are FFNs relu(x W1_e) W2_e, no biases (a zero padding row stays zero); expert e lives on
EP member e // (E/P). Shapes: x [T, M] this group's tokens, buffers [E, C, M].

* :func:`moe_capacity` (GShard / DeepSpeed): dispatch into the capacity layout [E, C, M], one
  all-to-all with equal splits to the experts, one back. Under EP+TP each TP rank sends only its
  C/T slice of the capacity dimension into the EP all-to-all (DeepSpeed ``drop_tokens``) and the
  slices are all-gathered in TP afterwards (``gather_tokens``); the experts are TP-sharded
  (column W1, row W2, Megatron's f and g round them).
* :func:`moe_variable` (DeepEP-like): token counts per destination are exchanged first, then each
  token travels once per destination rank (not once per expert) with the weights of that rank's
  experts; each rank sends back one weighted row per token it received. No padding is sent.
* :func:`moe_naive`: all-gather every token (padded to the EP group's largest count) and its
  expert weights to every rank; each rank applies its experts to all of them; a reduce-scatter
  returns every token's sum to its owner.

All three apply the same gating (:mod:`commbench.patterns.moe.gating`), so they drop exactly the
same tokens. The dispatch all-to-all is a part (``a2a``), so a wrong permutation can stand in.
"""

from __future__ import annotations

import torch

from commbench.patterns.mappings import (
    copy_to_tp,
    gather_from_sp,
    gather_from_tp,
    reduce_from_tp,
    reduce_scatter_to_sp,
    scatter_to_tp,
)
from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["a2a", "expert_ffn", "moe_capacity", "moe_naive", "moe_variable"]


def expert_ffn(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """x [n, M], w1 [M, F], w2 [F, M] -> [n, M]."""
    return torch.relu(x @ w1) @ w2


class _A2A(torch.autograd.Function):
    """All-to-all of rows; its gradient goes back by the all-to-all with the splits swapped."""

    @staticmethod
    def forward(ctx, x, comm, group, in_splits, out_splits):
        ctx.args = comm, group, in_splits, out_splits
        return comm.all_to_all(x.contiguous(), group, in_splits, out_splits)

    @staticmethod
    def backward(ctx, dy):
        comm, group, in_splits, out_splits = ctx.args
        return comm.all_to_all(dy.contiguous(), group, out_splits, in_splits), None, None, None, None


def a2a(x, comm, group, in_splits=None, out_splits=None):
    """All-to-all of rows, differentiable: [sum(in_splits), *] -> [sum(out_splits), *]."""
    return x if group.size == 1 else _A2A.apply(x, comm, group, in_splits, out_splits)


def moe_capacity(x, combine, dispatch, w1, w2, comm: Comm, ep: Group, tp: Group, parts):
    """x [T, M]; combine/dispatch [T, E, C]; w1 [E/P, M, F/t], w2 [E/P, F/t, M] -> y [T, M]."""
    E, C = combine.shape[1], combine.shape[2]
    P, L, M = ep.size, w1.shape[0], x.shape[1]
    buf = torch.einsum("tec,tm->ecm", dispatch.to(x.dtype), x)     # [E, C, M]
    buf = _scatter_c(buf, comm, tp)                                  # [E, C/t, M]
    got = parts.a2a(buf, comm, ep).view(P, L, C // tp.size, M)      # [P, E/P, C/t, M] by source
    got = _gather_c(got, comm, tp, 2)                                # [P, E/P, C, M]
    outs = []
    for e in range(L):
        inp = copy_to_tp(got[:, e].reshape(P * C, M), comm, tp)
        outs.append(reduce_from_tp(expert_ffn(inp, w1[e], w2[e]), comm, tp).view(P, C, M))
    out = _scatter_c(torch.stack(outs, 1), comm, tp, 2)             # [P, E/P, C/t, M]
    back = parts.a2a(out.reshape(E, C // tp.size, M), comm, ep)      # [E, C/t, M] for my tokens
    return torch.einsum("tec,ecm->tm", combine, _gather_c(back, comm, tp))


def _scatter_c(t, comm, tp, dim=1):
    """Keep this TP rank's slice of the capacity dim; backward all-gathers (drop_tokens)."""
    return scatter_to_tp(t, comm, tp, dim)


def _gather_c(t, comm, tp, dim=1):
    """All-gather the capacity dim over TP; backward keeps this rank's slice (gather_tokens)."""
    return gather_from_tp(t, comm, tp, dim)


def _token_weights(combine: torch.Tensor) -> torch.Tensor:
    """[T, E, C] -> [T, E]: each kept choice's weight (0 where the token does not go)."""
    return combine.sum(2)


def moe_variable(x, combine, w1, w2, comm: Comm, ep: Group, parts) -> torch.Tensor:
    """x [T, M] -> y [T, M], sending each token once to each rank holding one of its experts."""
    P, L, M = ep.size, w1.shape[0], x.shape[1]
    w = _token_weights(combine).view(x.shape[0], P, L)               # [T, P, E/P]
    to_rank = (w != 0).any(2)                                         # is_token_in_rank [T, P]
    order = [torch.nonzero(to_rank[:, j])[:, 0] for j in range(P)]   # ascending token order
    sends = [len(o) for o in order]
    counts = comm.all_to_all(torch.tensor(sends, dtype=torch.int64, device=x.device), ep).tolist() \
        if P > 1 else sends
    rows = torch.cat([torch.cat([x[o], w[o, j]], 1) for j, o in enumerate(order)])
    got = parts.a2a(rows, comm, ep, sends, counts)                   # [R, M + E/P]
    xin, win = got[:, :M], got[:, M:]
    part = got.new_zeros((got.shape[0], M))
    for e in range(L):
        use = torch.nonzero(win[:, e] != 0)[:, 0]
        part = part.index_add(0, use, win[use, e, None] * expert_ffn(xin[use], w1[e], w2[e]))
    back = parts.a2a(part, comm, ep, counts, sends)                  # [sum(sends), M]
    return x.new_zeros(x.shape).index_add(0, torch.cat(order), back)


def moe_naive(x, combine, w1, w2, comm: Comm, ep: Group, tokens_max: int) -> torch.Tensor:
    """x [T, M] -> y [T, M] by an all-gather of every token to every rank."""
    L, M = w1.shape[0], x.shape[1]
    T, r = x.shape[0], ep.index
    w = _token_weights(combine)
    pad = torch.cat([x, w], 1)
    pad = torch.cat([pad, pad.new_zeros((tokens_max - T, pad.shape[1]))])
    every = gather_from_sp(pad, comm, ep, dim=0)                     # [P * T_max, M + E]
    xin, win = every[:, :M], every[:, M + r * L:M + (r + 1) * L]
    part = every.new_zeros((every.shape[0], M))
    for e in range(L):
        use = torch.nonzero(win[:, e] != 0)[:, 0]
        part = part.index_add(0, use, win[use, e, None] * expert_ffn(xin[use], w1[e], w2[e]))
    return reduce_scatter_to_sp(part, comm, ep, dim=0)[:T]
