"""Recursive doubling and Rabenseifner's all-reduce, for any group size.

Non-powers of two (Thakur, Rabenseifner and Gropp 2005, as MPICH does it): with p the largest power
of two <= P and r = P - p, the first 2r members pair up; each even one sends its whole vector to
its odd neighbour and sits out, leaving p active members numbered ``new = i // 2`` (i < 2r) or
``i - r``; at the end each odd one sends the result back to its even neighbour.

* recursive doubling: log2(p) steps; at distance d the active members ``new`` and ``new ^ d``
  exchange their whole vectors and both combine. Every member moves log2(p) * S each way (plus S
  for the fold): fewest steps, most bytes; the small-message algorithm.
* Rabenseifner: recursive halving reduce-scatter (at distance d = p/2, p/4, ..., 1, keep the half of
  the current block range on this side of ``new``'s bit, send the other half), then recursive
  doubling all-gather back up. Each active member moves about 2(p-1)/p * S: the large-message one.

Blocks are the p chunks of :func:`commbench.wire.ops.split_sizes`, so any count works.
Shapes: x [*] -> out [*], the same on every member.
"""

from __future__ import annotations

import torch

from commbench.collectives._p2p import combine, exchange, finish_avg, flat
from commbench.collectives.algorithm import Algorithm
from commbench.runtime.group import Group
from commbench.wire.comm import Comm
from commbench.wire.ops import split_sizes

__all__ = ["RECORDS", "fold_layout", "rabenseifner_all_reduce", "recursive_doubling_all_reduce"]


def fold_layout(n: int, i: int) -> tuple[int, int, int]:
    """(p, r, new): the power of two, the extra members, and member i's active number (-1: folded)."""
    p = 1 << (n.bit_length() - 1)
    r = n - p
    if i < 2 * r:
        return p, r, (i // 2 if i % 2 else -1)
    return p, r, i - r


def _member(new: int, r: int) -> int:
    """Group index of active member ``new``."""
    return 2 * new + 1 if new < r else new + r


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
                peer = _member(new ^ d, r)
                got = exchange(comm, buf, peer, buf, peer, group)
                buf = combine(got, buf, op)
                d <<= 1
        buf = _unfold(comm, buf, group, r)
    return finish_avg(buf, op, group.size).reshape(x.shape)


def halving_ranges(p: int, new: int) -> list[tuple[int, int, int, int]]:
    """Recursive halving of member ``new``: per step (keep_lo, keep_hi, send_lo, send_hi) in blocks."""
    lo, hi, d, out = 0, p, p >> 1, []
    while d >= 1:
        mid = lo + (hi - lo) // 2
        if new & d:
            out.append((mid, hi, lo, mid))
            lo = mid
        else:
            out.append((lo, mid, mid, hi))
            hi = mid
        d >>= 1
    return out


def rabenseifner_all_reduce(comm: Comm, x: torch.Tensor, group: Group, *,
                            op: str = "sum") -> torch.Tensor:
    buf = flat(x)
    p, r, new = fold_layout(group.size, group.index)
    b = [0]
    for c in split_sizes(buf.numel(), p):
        b.append(b[-1] + c)
    with comm.ledger.scope("rabenseifner"):
        buf = _fold(comm, buf, group, r, op)
        if new >= 0:
            steps = halving_ranges(p, new)
            d = p >> 1
            for keep_lo, keep_hi, send_lo, send_hi in steps:  # reduce-scatter
                peer = _member(new ^ d, r)
                keep = buf[b[keep_lo]:b[keep_hi]]
                got = exchange(comm, buf[b[send_lo]:b[send_hi]], peer, keep, peer, group)
                buf[b[keep_lo]:b[keep_hi]] = combine(got, keep, op)
                d >>= 1
            finish_avg(buf[b[new]:b[new + 1]], op, group.size)
            d = 1
            for keep_lo, keep_hi, send_lo, send_hi in reversed(steps):  # all-gather
                peer = _member(new ^ d, r)
                # what was kept at this level is now complete here; the partner completed the rest
                got = exchange(comm, buf[b[keep_lo]:b[keep_hi]], peer, buf[b[send_lo]:b[send_hi]],
                               peer, group)
                buf[b[send_lo]:b[send_hi]] = got
                d <<= 1
        buf = _unfold(comm, buf, group, r)
    return buf.reshape(x.shape)


def _fold_elements(n: int, i: int, count: int) -> tuple[int, int]:
    _, r, _ = fold_layout(n, i)
    return (count, count) if i < 2 * r else (0, 0)


def _rd_elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
    p, _, new = fold_layout(n, i)
    s, r = _fold_elements(n, i, count)
    steps = (p.bit_length() - 1) if new >= 0 else 0
    return s + steps * count, r + steps * count


def _rab_elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
    p, _, new = fold_layout(n, i)
    s, r = _fold_elements(n, i, count)
    if new < 0:
        return s, r
    b = [0]
    for c in split_sizes(count, p):
        b.append(b[-1] + c)
    moved = sum((b[kh] - b[kl]) + (b[sh] - b[sl]) for kl, kh, sl, sh in halving_ranges(p, new))
    return s + moved, r + moved


def _rd_terms(n: int, S: float) -> tuple[float, float, float]:
    p = 1 << (n.bit_length() - 1)
    extra, lp = int(n > p), p.bit_length() - 1
    return lp + 2 * extra, S * (lp + 2 * extra), S * (lp + extra)


def _rab_terms(n: int, S: float) -> tuple[float, float, float]:
    p = 1 << (n.bit_length() - 1)
    extra, lp = int(n > p), p.bit_length() - 1
    return 2 * lp + 2 * extra, 2 * (p - 1) / p * S + 2 * extra * S, (p - 1) / p * S + extra * S


RECORDS = (
    Algorithm("all_reduce", "recursive_doubling", recursive_doubling_all_reduce, _rd_elements,
              _rd_terms),
    Algorithm("all_reduce", "rabenseifner", rabenseifner_all_reduce, _rab_elements, _rab_terms),
)
