"""Context parallelism by ring attention (Liu et al. 2023, arXiv:2310.01889; the blockwise
online softmax of Milakov & Gimelshein 2018 / FlashAttention, Dao et al. 2022).

Each rank keeps its queries q [b, n, H, d] (n = s/P) and passes its K/V block [b, n, H_kv, d]
round the ring (rank r sends to r+1, receives from r-1) in P-1 hops, posted before the block on
hand is computed so the transfer overlaps the work. Partial outputs merge by their log-sum-exp:
lse = logaddexp(lse_a, lse_b), o = o_a e^(lse_a - lse) + o_b e^(lse_b - lse).

Backward recomputes each block's probabilities from the saved lse. K/V travel the ring again;
the dK/dV accumulator of each block follows one hop behind, collecting every other rank's share,
and a last hop brings it home: P-1 hops of K/V and P-1 of dK/dV, twice the forward bytes.

With the zigzag layout (2P chunks, rank r holds chunks r and 2P-1-r), causal attention gives
every rank the same work; chunk pairs that are wholly masked are skipped, so the balance shows in
time. Blocks are computed chunk against chunk; every query sees at least its own position.

The merge, the per-hop block and the dK/dV homecoming are parts of the pattern (:class:`RingAttentionParts`),
so a merge that forgets to rescale can stand in for the real one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from commbench.patterns.mappings import gather_from_sp
from commbench.patterns.seq.attention import gqa_index, positions
from commbench.patterns.seq.configs import AttnConfig
from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["Block", "RingAttentionParts", "Softmax", "causal_work", "forward_block", "merge",
           "merge_without_rescale", "no_return_home", "return_home", "ring_attention",
           "skip_last_hop"]


def _pairs(pos_q: torch.Tensor, pos_k: torch.Tensor, causal: bool):
    """(query rows, key rows) chunk pairs with at least one visible score."""
    out = []
    for qs in torch.arange(len(pos_q), device=pos_q.device).chunk(2):
        for ks in torch.arange(len(pos_k), device=pos_k.device).chunk(2):
            if len(qs) and len(ks) and (not causal or pos_k[ks].min() <= pos_q[qs].max()):
                out.append((qs, ks))
    return out


def _scores(q, ke, pos_q, pos_k, causal):
    s = torch.einsum("bqhd,bkhd->bhqk", q, ke) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(pos_k[None, :] > pos_q[:, None], float("-inf"))
    return s


def merge(out, lse, o_i, lse_i):
    """Online-softmax merge into out [b, q, H, d], lse [b, H, q] (in place)."""
    new = torch.logaddexp(lse, lse_i)
    safe = torch.where(torch.isfinite(new), new, torch.zeros_like(new))
    a, c = torch.exp(lse - safe), torch.exp(lse_i - safe)
    out.mul_(a.transpose(1, 2)[..., None]).add_(o_i * c.transpose(1, 2)[..., None])
    lse.copy_(new)


@dataclass(frozen=True)
class Block:
    """This rank's queries against one K/V block: q [b, n, H, d], k and v [b, n, H_kv, d] (the
    block of the rank ``hop`` places back round the ring), idx [H] the KV head of each query
    head, pos_q and pos_k [n] their positions in the sequence, causal: mask the future."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    idx: torch.Tensor
    pos_q: torch.Tensor
    pos_k: torch.Tensor
    causal: bool

    def pairs(self):
        """(query rows, key rows) chunk pairs with at least one visible score."""
        return _pairs(self.pos_q, self.pos_k, self.causal)

    def keys(self, ks) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``ks`` of K and V, one head per query head [b, len(ks), H, d]."""
        return self.k[:, ks].index_select(2, self.idx), self.v[:, ks].index_select(2, self.idx)

    def scores(self, qs, ks, ke: torch.Tensor) -> torch.Tensor:
        return _scores(self.q[:, qs], ke, self.pos_q[qs], self.pos_k[ks], self.causal)


@dataclass(frozen=True)
class Softmax:
    """The online softmax so far: out [b, n, H, d] and lse [b, H, n], merged into in place."""

    out: torch.Tensor
    lse: torch.Tensor


def forward_block(block: Block, acc: Softmax, merge, hop: int, hops: int) -> None:
    """Merge this hop's K/V block (hop ``hop`` of ``hops``) into ``acc`` by ``merge``."""
    for qs, ks in block.pairs():
        ke, ve = block.keys(ks)
        s = block.scores(qs, ks, ke)
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(s - m)
        den = p.sum(-1, keepdim=True)
        o = torch.einsum("bhqk,bkhd->bqhd", p / den.clamp_min(1e-300), ve)
        o_rows, l_rows = acc.out[:, qs], acc.lse[:, :, qs]
        merge(o_rows, l_rows, o, (m + torch.log(den)).squeeze(-1))
        acc.out[:, qs], acc.lse[:, :, qs] = o_rows, l_rows


def _backward_block(block: Block, dout, lse, delta, dq, dk, dv) -> None:
    """Add this block's share of dq, and of the block's dk and dv, recomputing its
    probabilities from the forward's lse; delta [b, H, n] = rowsum(dout * out)."""
    q, idx = block.q, block.idx
    scale = 1 / math.sqrt(q.shape[-1])
    for qs, ks in block.pairs():
        ke, ve = block.keys(ks)
        p = torch.exp(block.scores(qs, ks, ke) - lse[:, :, qs, None])
        do = dout[:, qs]
        dv[:, ks] += torch.zeros_like(dv[:, ks]).index_add_(
            2, idx, torch.einsum("bhqk,bqhd->bkhd", p, do))
        ds = p * (torch.einsum("bqhd,bkhd->bhqk", do, ve) - delta[:, :, qs, None])
        dq[:, qs] += torch.einsum("bhqk,bkhd->bqhd", ds, ke) * scale
        dk[:, ks] += torch.zeros_like(dk[:, ks]).index_add_(
            2, idx, torch.einsum("bhqk,bqhd->bkhd", ds, q[:, qs]) * scale)


class _Hop:
    """A posted hop (one group call: the send to the next rank, the receive from the previous);
    ``wait()`` returns the previous rank's tensor."""

    def __init__(self, comm: Comm, group: Group, t: torch.Tensor, tag: int) -> None:
        P, r = group.size, group.index
        self._ex = comm.start_exchange([(t, (r + 1) % P)], [(t, (r - 1) % P)], group, tag=tag)

    def wait(self) -> torch.Tensor:
        return self._ex.wait()[0]


def return_home(comm: Comm, group: Group, acc: torch.Tensor) -> torch.Tensor:
    """The last hop: each dK/dV accumulator goes to the rank whose block it is."""
    return _Hop(comm, group, acc, 3).wait()


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cfg, comm, group, parts):
        P, r = group.size, group.index
        idx = torch.tensor(parts.kv_index(range(cfg.heads), cfg.heads, cfg.kv), device=q.device)
        pos_q = positions(cfg, r, q.device)
        b, n, H, d = q.shape
        out = q.new_zeros(q.shape)
        lse = q.new_full((b, H, n), float("-inf"))
        kv = torch.stack([k, v])
        acc = Softmax(out, lse)
        for hop in range(P):
            pending = _Hop(comm, group, kv, 1) if hop < P - 1 else None
            block = Block(q, kv[0], kv[1], idx, pos_q, positions(cfg, (r - hop) % P, q.device),
                          cfg.causal)
            parts.forward_block(block, acc, parts.merge, hop, P)
            if pending:
                kv = pending.wait()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cfg, ctx.comm, ctx.group, ctx.idx, ctx.parts = cfg, comm, group, idx, parts
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        cfg, comm, group, idx = ctx.cfg, ctx.comm, ctx.group, ctx.idx
        P, r = group.size, group.index
        pos_q, dout = positions(cfg, r, q.device), dout.contiguous()
        delta = (dout * out).sum(-1).transpose(1, 2)  # [b, H, n]
        dq = torch.zeros_like(q)
        own = k.new_zeros((2, *k.shape))
        _backward_block(Block(q, k, v, idx, pos_q, pos_q, cfg.causal), dout, lse, delta, dq,
                        own[0], own[1])
        kv, acc = torch.stack([k, v]), None
        for hop in range(1, P):
            kv_hop = _Hop(comm, group, kv, 2)
            # the accumulator of the block just done follows it one hop behind
            acc_hop = _Hop(comm, group, acc, 3) if acc is not None else None
            kv = kv_hop.wait()
            acc = acc_hop.wait() if acc_hop else torch.zeros_like(kv)
            block = Block(q, kv[0], kv[1], idx, pos_q, positions(cfg, (r - hop) % P, q.device),
                          cfg.causal)
            _backward_block(block, dout, lse, delta, dq, acc[0], acc[1])
        if P > 1:
            own += ctx.parts.return_home(comm, group, acc)
        return dq, own[0], own[1], None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: AttnConfig,
                   comm: Comm, group: Group, parts) -> torch.Tensor:
    """q [b, n, H, d], k/v [b, n, H_kv, d] at this rank's positions -> [b, n, H, d]."""
    return _RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), cfg, comm, group,
                                parts)


def causal_work(cfg: AttnConfig) -> list[int]:
    """Visible (query, key) scores each rank computes, per batch row and head: the load balance."""
    P = cfg.sp
    out = []
    for r in range(P):
        pq = positions(cfg, r, "cpu")
        out.append(sum(int((positions(cfg, j, "cpu")[None, :] <= pq[:, None]).sum())
                       if cfg.causal else len(pq) * cfg.seq // P for j in range(P)))
    return out


@dataclass(frozen=True)
class RingAttentionParts:
    """The swappable operators of ring attention and of its naive all-gather counterpart."""

    kv_index: Callable = gqa_index        # query head -> local KV head
    gather_kv: Callable = gather_from_sp  # naive: K, V all-gathered along the sequence
    merge: Callable = merge               # online-softmax merge of a block
    forward_block: Callable = forward_block
    return_home: Callable = return_home   # dK/dV's last hop


# -- broken parts: each a bug class the contract must catch ----------------------------------
def merge_without_rescale(out, lse, o_i, lse_i):
    """Online softmax without rescaling the running output."""
    new = torch.logaddexp(lse, lse_i)
    out.add_(o_i * torch.exp(lse_i - new).transpose(1, 2)[..., None])
    lse.copy_(new)


def skip_last_hop(block: Block, acc: Softmax, merge, hop: int, hops: int) -> None:
    """The last ring hop's block is never computed (its K/V still travel)."""
    if hop < hops - 1:
        forward_block(block, acc, merge, hop, hops)


def no_return_home(comm, group, acc):
    """The dK/dV accumulators make their last hop home and are dropped there: each block keeps
    only its own rank's share of the gradient."""
    return torch.zeros_like(return_home(comm, group, acc))
