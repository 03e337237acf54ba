"""Recursive doubling and Rabenseifner's all-reduce from send/recv (records and the layout:
:mod:`commbench.collectives.doubling`). Shapes: x [*] -> out [*], the same on every member."""

from __future__ import annotations

import torch

from commbench.collectives._p2p import combine, exchange, finish_avg, flat
from commbench.collectives.blocks import fold_layout, halving_ranges, member
from commbench.ops import offsets, split_sizes
from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["rabenseifner_all_reduce", "recursive_doubling_all_reduce"]


def _fold(comm: Comm, buf: torch.Tensor, group: Group, r: int, op: str) -> torch.Tensor:
    i = group.index
    if i < 2 * r:
        if i % 2 == 0:
            exchange(comm, buf, i + 1, None, None, group)
        else:
            got = exchange(comm, None, None, buf, i - 1, group)
            buf = combine(got, buf, op)
    return buf


def _unfold(comm: Comm, buf: torch.Tensor, group: Group, r: int) -> torch.Tensor:
    i = group.index
    if i < 2 * r:
        if i % 2:
            exchange(comm, buf, i - 1, None, None, group)
        else:
            buf = exchange(comm, None, None, buf, i + 1, group)
    return buf


def recursive_doubling_all_reduce(comm: Comm, x: torch.Tensor, group: Group, *,
                                  op: str = "sum") -> torch.Tensor:
    buf = flat(x)
    p, r, new = fold_layout(group.size, group.index)
    with comm.ledger.scope("recursive_doubling"):
        buf = _fold(comm, buf, group, r, op)
        if new >= 0:
            d = 1
            while d < p:
                peer = member(new ^ d, r)
                got = exchange(comm, buf, peer, buf, peer, group)
                buf = combine(got, buf, op)
                d <<= 1
        buf = _unfold(comm, buf, group, r)
    return finish_avg(buf, op, group.size).reshape(x.shape)


def rabenseifner_all_reduce(comm: Comm, x: torch.Tensor, group: Group, *,
                            op: str = "sum") -> torch.Tensor:
    buf = flat(x)
    p, r, new = fold_layout(group.size, group.index)
    b = offsets(split_sizes(buf.numel(), p))
    with comm.ledger.scope("rabenseifner"):
        buf = _fold(comm, buf, group, r, op)
        if new >= 0:
            steps = halving_ranges(p, new)
            d = p >> 1
            for keep_lo, keep_hi, send_lo, send_hi in steps:  # reduce-scatter
                peer = member(new ^ d, r)
                keep = buf[b[keep_lo]:b[keep_hi]]
                got = exchange(comm, buf[b[send_lo]:b[send_hi]], peer, keep, peer, group)
                buf[b[keep_lo]:b[keep_hi]] = combine(got, keep, op)
                d >>= 1
            finish_avg(buf[b[new]:b[new + 1]], op, group.size)
            d = 1
            for keep_lo, keep_hi, send_lo, send_hi in reversed(steps):  # all-gather
                peer = member(new ^ d, r)
                # what was kept at this level is now complete here; the partner completed the rest
                got = exchange(comm, buf[b[keep_lo]:b[keep_hi]], peer, buf[b[send_lo]:b[send_hi]],
                               peer, group)
                buf[b[send_lo]:b[send_hi]] = got
                d <<= 1
        buf = _unfold(comm, buf, group, r)
    return buf.reshape(x.shape)
