"""Broken parts of the sequence-parallel patterns: each is a bug class the contract must catch."""

from __future__ import annotations

import torch

from commbench.patterns.dp.zero_comms import gathered
from commbench.patterns.seq.ring_attention_comms import forward_block, return_home
from commbench.patterns.seq.ulysses_comms import s2h
from commbench.patterns.tp.communications import gather_from_tp

__all__ = ["gather_without_reduce_scatter", "gathered_without_reduce_scatter",
           "kv_index_off_by_one", "merge_without_rescale", "no_return_home",
           "s2h_reversed_sources", "s2h_transposed_batch", "skip_last_hop"]


def s2h_transposed_batch(x, ranges, comm, group):
    """DeepSpeed #5808's class of bug: a reshape with the right element count and the batch and
    source dims in the wrong order (only visible with batch > 1)."""
    out = s2h(x, ranges, comm, group)
    b, s, m, d = out.shape
    P = group.size  # the all-to-all's [P, b, s/P] order, read as if it were [b, P, s/P]
    return out.view(b, P, s // P, m, d).transpose(0, 1).reshape(b, s, m, d)


def s2h_reversed_sources(x, ranges, comm, group):
    """Sequence shards reassembled in the wrong source order."""
    out = s2h(x, ranges, comm, group)
    b, s, m, d = out.shape
    return out.view(b, group.size, s // group.size, m, d).flip(1).reshape(b, s, m, d)


def kv_index_off_by_one(heads, heads_total, kv_total, kv_first=0):
    """The KV head of each query head off by one within the local range (clamped)."""
    idx = [h // (heads_total // kv_total) - kv_first for h in heads]
    top = max(idx, default=0)
    return [min(i + 1, top) if top else i for i in idx]


def gather_without_reduce_scatter(t, comm, group, dim):
    """The naive K/V all-gather whose backward keeps its slice instead of reduce-scattering."""
    return gather_from_tp(t, comm, group, dim)


def merge_without_rescale(out, lse, o_i, lse_i):
    """Online softmax without rescaling the running output."""
    new = torch.logaddexp(lse, lse_i)
    out.add_(o_i * torch.exp(lse_i - new).transpose(1, 2)[..., None])
    lse.copy_(new)


def skip_last_hop(q, k, v, idx, pos_q, pos_k, causal, out, lse, merge, hop, hops):
    """The last ring hop's block is never computed (its K/V still travel)."""
    if hop < hops - 1:
        forward_block(q, k, v, idx, pos_q, pos_k, causal, out, lse, merge, hop, hops)


def no_return_home(comm, group, acc):
    """The dK/dV accumulators make their last hop home and are dropped there: each block keeps
    only its own rank's share of the gradient."""
    return torch.zeros_like(return_home(comm, group, acc))


def _own_slice(grad, comm, group, c):
    i = group.index
    full = torch.cat([grad, grad.new_zeros(max(0, (i + 1) * c - grad.numel()))])
    return full[i * c:(i + 1) * c]


def gathered_without_reduce_scatter(chunk, numel, comm, group):
    """ZeRO-3's weight gather whose backward keeps this rank's slice of its own gradient
    instead of reduce-scattering the sum over the group."""
    return gathered(chunk, numel, comm, group, back=_own_slice)
