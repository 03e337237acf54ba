"""The all-reduce algorithms as step lists: per member, what to send to whom, what to receive
from whom, and whether to combine it, in order.

The same blocks, peers and order of operations as the readable reference in :mod:`ring`,
:mod:`doubling` and :mod:`tree` (so a replay gives bitwise the same results); :mod:`schedule`
binds a list to fixed buffers and replays it. Ranges are element offsets into the flat vector buf [S].
"""

from __future__ import annotations

from dataclasses import dataclass

from commbench.collectives._p2p import offsets
from commbench.collectives.doubling import _member, fold_layout, halving_ranges
from commbench.wire.ops import split_sizes

__all__ = ["SCHEDULES", "Step", "step_list"]


@dataclass(frozen=True, slots=True)
class Step:
    """One step of one member: send buf[send] to ``dst`` while receiving buf-sized ``recv`` from
    ``src``; ``reduce``: combine what came into buf[recv] (else it overwrites buf[recv]).
    ``avg``: no message, divide buf[avg] by the group size (op avg only).

    ``joint``: posted together with the next step, and so on along a run of joint steps ended
    by one that is not: every message of the run is started at once; then each step in order
    waits for its receive (all the run's sends after the first) and combines it. A run's
    combined receives land in distinct scratch blocks, ``slot`` 0, 1, ...; no step of a run may
    combine into what one of its sends reads before that send completes (the first's may: the
    sends are waited before it combines)."""

    send: tuple[int, int] | None = None
    dst: int = -1
    recv: tuple[int, int] | None = None
    src: int = -1
    reduce: bool = False
    avg: tuple[int, int] | None = None
    slot: int = 0
    joint: bool = False


def _ring(n: int, i: int, count: int, split=split_sizes) -> list[Step]:
    """Ring reduce-scatter then ring all-gather (:mod:`commbench.collectives.ring`)."""
    b = offsets(split(count, n))
    nxt, prv, out = (i + 1) % n, (i - 1) % n, []
    for k in range(n - 1):
        s, r = (i - k - 1) % n, (i - k - 2) % n
        out.append(Step((b[s], b[s + 1]), nxt, (b[r], b[r + 1]), prv, reduce=True))
    out.append(Step(avg=(b[i], b[i + 1])))
    for k in range(n - 1):
        s, r = (i - k) % n, (i - k - 1) % n
        out.append(Step((b[s], b[s + 1]), nxt, (b[r], b[r + 1]), prv))
    return out


def _fold(n: int, i: int, count: int) -> tuple[list[Step], list[Step]]:
    """The non-power-of-two fold and unfold of :mod:`commbench.collectives.doubling`."""
    _, r, _ = fold_layout(n, i)
    if i >= 2 * r:
        return [], []
    whole = (0, count)
    if i % 2 == 0:
        return [Step(send=whole, dst=i + 1)], [Step(recv=whole, src=i + 1)]
    return [Step(recv=whole, src=i - 1, reduce=True)], [Step(send=whole, dst=i - 1)]


def _doubling(n: int, i: int, count: int, split=split_sizes) -> list[Step]:
    p, r, new = fold_layout(n, i)
    fold, unfold = _fold(n, i, count)
    out, d = list(fold), 1
    while new >= 0 and d < p:
        peer = _member(new ^ d, r)
        out.append(Step((0, count), peer, (0, count), peer, reduce=True))
        d <<= 1
    return out + unfold + [Step(avg=(0, count))]


def _rabenseifner(n: int, i: int, count: int, split=split_sizes) -> list[Step]:
    p, r, new = fold_layout(n, i)
    fold, unfold = _fold(n, i, count)
    out = list(fold)
    if new >= 0:
        b = offsets(split(count, p))
        steps, d = halving_ranges(p, new), p >> 1
        for kl, kh, sl, sh in steps:
            peer = _member(new ^ d, r)
            out.append(Step((b[sl], b[sh]), peer, (b[kl], b[kh]), peer, reduce=True))
            d >>= 1
        out.append(Step(avg=(b[new], b[new + 1])))
        d = 1
        for kl, kh, sl, sh in reversed(steps):
            peer = _member(new ^ d, r)
            out.append(Step((b[kl], b[kh]), peer, (b[sl], b[sh]), peer))
            d <<= 1
    return out + unfold


def _naive(n: int, i: int, count: int, split=split_sizes) -> list[Step]:
    """Member 0 combines every vector in member order, then sends the result to every member
    (:func:`commbench.collectives.tree.naive_all_reduce`). Its receives are posted together, one
    scratch block each, and so are its sends: gloo sends only once the receiver has posted (a
    rendezvous), so receives posted one after another cost a round trip each
    (docs/decisions.md)."""
    whole = (0, count)
    if n == 1:
        return [Step(avg=whole)]
    if i:
        return [Step(send=whole, dst=0), Step(recv=whole, src=0)]
    return ([Step(recv=whole, src=j, reduce=True, slot=j - 1, joint=j < n - 1)
             for j in range(1, n)] + [Step(avg=whole)]
            + [Step(send=whole, dst=j, joint=j < n - 1) for j in range(1, n)])


SCHEDULES = {"naive": _naive, "ring": _ring, "recursive_doubling": _doubling, "rabenseifner": _rabenseifner}


def step_list(algo: str, n: int, i: int, count: int, split=split_sizes) -> list[Step]:
    """Member ``i``'s steps of ``algo`` for a vector of ``count`` elements in a group of ``n``,
    its blocks cut by ``split`` (count, parts) where the algorithm cuts any."""
    if algo not in SCHEDULES:
        raise ValueError(f"algo={algo!r}: must be one of {', '.join(SCHEDULES)}")
    return SCHEDULES[algo](n, i, count, split=split)
