"""DeepSpeed-Ulysses sequence parallelism (Jacobs et al. 2023, arXiv:2309.14509): the sequence-to-
head all-to-all before attention and the head-to-sequence all-to-all after it.

* :func:`seq_to_head`: x [b, s/P, H, d] -> [b, s, H_r, d]; member r receives its head range from
  every member's sequence shard. Backward is :func:`head_to_seq` of the gradient.
* :func:`head_to_seq`: o [b, s, H_r, d] -> [b, s/P, H, d]; the inverse. Backward is
  :func:`seq_to_head`.
* :func:`ulysses_attention`: 3 all-to-alls in (q, k, v), local attention over the whole
  sequence for this rank's heads, 1 all-to-all out; backward 4 more.

Heads not divisible by P are split unevenly (the first H mod P ranks get one more, DeepSpeed's
``get_shard_size_list``). Under grouped-query attention a rank receives the KV heads its query
heads read; with fewer KV heads than ranks those heads reach several ranks (replicated) and their
gradients are summed on the way back. Head ranges may overlap, so the backward of
:func:`seq_to_head` adds, never overwrites. With P = 1 nothing is communicated.
"""

from __future__ import annotations

import torch

from commbench.patterns.attention import AttnConfig, attend, gqa_index, positions
from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["head_ranges", "head_to_seq", "kv_ranges", "seq_to_head", "split_sizes",
           "ulysses_attention"]

Ranges = list[tuple[int, int]]


def split_sizes(n: int, P: int) -> list[int]:
    """n items over P members, the first n mod P get one more: 7 over 4 -> [2, 2, 2, 1]."""
    return [n // P + (1 if r < n % P else 0) for r in range(P)]


def head_ranges(heads: int, P: int) -> Ranges:
    """[lo, hi) of the query heads each member attends to after the all-to-all."""
    out, lo = [], 0
    for n in split_sizes(heads, P):
        out.append((lo, lo + n))
        lo += n
    return out


def kv_ranges(heads: int, kv: int, P: int) -> Ranges:
    """[lo, hi) of the KV heads each member needs for its query heads (they may overlap)."""
    g = heads // kv
    return [(lo // g, (hi - 1) // g + 1) for lo, hi in head_ranges(heads, P)]


def _s2h(x: torch.Tensor, ranges: Ranges, comm: Comm, group: Group) -> torch.Tensor:
    b, n, _, d = x.shape
    P, (lo, hi) = group.size, ranges[group.index]
    send = torch.cat([x[:, :, a:z].reshape(-1) for a, z in ranges])
    out = comm.all_to_all(send, group, [b * n * (z - a) * d for a, z in ranges],
                          [b * n * (hi - lo) * d] * P)
    # dim 0 of out is the source member, whose sequence shard comes in that order
    return out.view(P, b, n, hi - lo, d).transpose(0, 1).reshape(b, P * n, hi - lo, d)


def _h2s(y: torch.Tensor, ranges: Ranges, heads: int, comm: Comm, group: Group) -> torch.Tensor:
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
    def forward(ctx, x, ranges, comm, group):
        ctx.ranges, ctx.heads, ctx.comm, ctx.group = ranges, x.shape[2], comm, group
        return _s2h(x, ranges, comm, group)

    @staticmethod
    def backward(ctx, dy):
        return _h2s(dy.contiguous(), ctx.ranges, ctx.heads, ctx.comm, ctx.group), None, None, None


class _HeadToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, ranges, heads, comm, group):
        ctx.ranges, ctx.comm, ctx.group = ranges, comm, group
        return _h2s(y, ranges, heads, comm, group)

    @staticmethod
    def backward(ctx, dx):
        return _s2h(dx.contiguous(), ctx.ranges, ctx.comm, ctx.group), None, None, None, None


def seq_to_head(x: torch.Tensor, ranges: Ranges, comm: Comm, group: Group) -> torch.Tensor:
    """x [b, s/P, H, d] -> [b, s, H_r, d], member r getting heads ``ranges[r]``."""
    return x if group.size == 1 else _SeqToHead.apply(x.contiguous(), ranges, comm, group)


def head_to_seq(y: torch.Tensor, ranges: Ranges, heads: int, comm: Comm,
                group: Group) -> torch.Tensor:
    """y [b, s, H_r, d] -> [b, s/P, H, d]; the inverse of :func:`seq_to_head`."""
    return y if group.size == 1 else _HeadToSeq.apply(y.contiguous(), ranges, heads, comm, group)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: AttnConfig,
                      comm: Comm, group: Group) -> torch.Tensor:
    """q [b, s/P, H, d], k/v [b, s/P, H_kv, d] -> attention output [b, s/P, H, d]."""
    P, r = group.size, group.index
    qr, kr = head_ranges(cfg.heads, P), kv_ranges(cfg.heads, cfg.kv, P)
    qh = seq_to_head(q, qr, comm, group)
    kh, vh = (seq_to_head(t, kr, comm, group) for t in (k, v))
    pos = torch.cat([positions(cfg, i) for i in range(P)])
    o = attend(qh, kh, vh, gqa_index(range(*qr[r]), cfg.heads, cfg.kv, kr[r][0]), pos, pos,
               cfg.causal)
    return head_to_seq(o, qr, cfg.heads, comm, group)
