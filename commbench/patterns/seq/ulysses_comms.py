"""DeepSpeed-Ulysses sequence parallelism (Jacobs et al. 2023, arXiv:2309.14509): the sequence-to-
head all-to-all before attention and the head-to-sequence all-to-all after it.

* :func:`seq_to_head`: x [b, s/P, H, d] -> [b, s, H_r, d]; member r receives its head range from
  every member's sequence shard. Backward is :func:`head_to_seq` of the gradient.
* :func:`head_to_seq`: o [b, s, H_r, d] -> [b, s/P, H, d]; the inverse. Backward is
  :func:`seq_to_head`.
* :func:`ulysses_attention`: 3 all-to-alls in (q, k, v), local attention over the whole
  sequence for this rank's heads, 1 all-to-all out; backward 4 more.

The all-to-all body of the sequence-to-head exchange is a part of the pattern
(``UlyssesParts.seq_to_head``, default :func:`s2h`), so a broken reshape can stand in for it.

Heads not divisible by P are split unevenly (the first H mod P ranks get one more, DeepSpeed's
``get_shard_size_list``). Under grouped-query attention a rank receives the KV heads its query
heads read; with fewer KV heads than ranks those heads reach several ranks (replicated) and their
gradients are summed on the way back. Head ranges may overlap, so the backward of
:func:`seq_to_head` adds, never overwrites. With P = 1 nothing is communicated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from commbench.patterns.mappings import gather_from_sp, gather_from_tp
from commbench.patterns.seq.attention import attend, gqa_index, positions
from commbench.patterns.seq.configs import AttnConfig, Ranges, head_ranges, kv_ranges
from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["UlyssesParts", "gather_without_reduce_scatter", "h2s", "head_to_seq",
           "kv_index_off_by_one", "s2h", "s2h_reversed_sources", "s2h_transposed_batch",
           "seq_to_head", "ulysses_attention"]

def s2h(x: torch.Tensor, ranges: Ranges, comm: Comm, group: Group) -> torch.Tensor:
    """The sequence-to-head all-to-all: x [b, n, H, d] -> [b, P n, H_r, d]."""
    b, n, _, d = x.shape
    P, (lo, hi) = group.size, ranges[group.index]
    send = torch.cat([x[:, :, a:z].reshape(-1) for a, z in ranges])
    out = comm.all_to_all(send, group, [b * n * (z - a) * d for a, z in ranges],
                          [b * n * (hi - lo) * d] * P)
    # dim 0 of out is the source member, whose sequence shard comes in that order
    return out.view(P, b, n, hi - lo, d).transpose(0, 1).reshape(b, P * n, hi - lo, d)


def h2s(y: torch.Tensor, ranges: Ranges, heads: int, comm: Comm, group: Group) -> torch.Tensor:
    """The head-to-sequence all-to-all: y [b, s, H_r, d] -> [b, s/P, H, d]; heads that reach
    several members (replicated KV heads) add up."""
    b, s, m, d = y.shape
    P = group.size
    n = s // P
    send = y.view(b, P, n, m, d).transpose(0, 1).reshape(-1)
    out = comm.all_to_all(send, group, [b * n * m * d] * P,
                          [b * n * (z - a) * d for a, z in ranges])
    x = y.new_zeros((b, n, heads, d))
    for block, (a, z) in zip(out.split([b * n * (z - a) * d for a, z in ranges]), ranges,
                             strict=True):
        x[:, :, a:z] += block.view(b, n, z - a, d)
    return x


class _SeqToHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ranges, comm, group, body):
        ctx.ranges, ctx.heads, ctx.comm, ctx.group = ranges, x.shape[2], comm, group
        return body(x, ranges, comm, group)

    @staticmethod
    def backward(ctx, dy):
        return h2s(dy.contiguous(), ctx.ranges, ctx.heads, ctx.comm, ctx.group), None, None, \
            None, None


class _HeadToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, ranges, heads, comm, group, body):
        ctx.ranges, ctx.comm, ctx.group, ctx.body = ranges, comm, group, body
        return h2s(y, ranges, heads, comm, group)

    @staticmethod
    def backward(ctx, dx):
        return ctx.body(dx.contiguous(), ctx.ranges, ctx.comm, ctx.group), None, None, None, \
            None, None


def seq_to_head(x: torch.Tensor, ranges: Ranges, comm: Comm, group: Group,
                body=s2h) -> torch.Tensor:
    """x [b, s/P, H, d] -> [b, s, H_r, d], member r getting heads ``ranges[r]``."""
    return x if group.size == 1 else _SeqToHead.apply(x.contiguous(), ranges, comm, group, body)


def head_to_seq(y: torch.Tensor, ranges: Ranges, heads: int, comm: Comm, group: Group,
                body=s2h) -> torch.Tensor:
    """y [b, s, H_r, d] -> [b, s/P, H, d]; the inverse of :func:`seq_to_head` (``body`` is the
    sequence-to-head exchange its backward runs)."""
    return y if group.size == 1 else \
        _HeadToSeq.apply(y.contiguous(), ranges, heads, comm, group, body)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: AttnConfig,
                      comm: Comm, group: Group, parts) -> torch.Tensor:
    """q [b, s/P, H, d], k/v [b, s/P, H_kv, d] -> attention output [b, s/P, H, d]."""
    P, r = group.size, group.index
    qr, kr = head_ranges(cfg.heads, P), kv_ranges(cfg.heads, cfg.kv, P)
    body = parts.seq_to_head
    qh = seq_to_head(q, qr, comm, group, body)
    kh, vh = (seq_to_head(t, kr, comm, group, body) for t in (k, v))
    pos = torch.cat([positions(cfg, i, q.device) for i in range(P)])
    o = attend(qh, kh, vh, parts.kv_index(range(*qr[r]), cfg.heads, cfg.kv, kr[r][0]), pos, pos,
               cfg.causal)
    return head_to_seq(o, qr, cfg.heads, comm, group, body)


@dataclass(frozen=True)
class UlyssesParts:
    """The swappable operators of Ulysses and of its naive all-gather counterpart."""

    seq_to_head: Callable = s2h           # the sequence -> head all-to-all body
    kv_index: Callable = gqa_index        # query head -> local KV head
    gather_kv: Callable = gather_from_sp  # naive: K, V all-gathered along the sequence


# -- broken parts: each a bug class the contract must catch ----------------------------------
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
