"""The schedules of the algorithms built from send/recv, each written once as member i's list of
:class:`~commbench.collectives.algorithm.Step` (who sends which block to whom, whether what comes
in is reduced or overwrites), with the block and peer rules they share: the ring's chunks
(:func:`commbench.ops.split_sizes`), recursive doubling's fold of a non-power-of-two group,
recursive halving's block ranges, the binomial tree. Every reader takes them from here: the
records count their bytes (:func:`~commbench.collectives.algorithm.traffic`), the send/recv code
runs them (:func:`~commbench.collectives._p2p.run_steps`), the compiled replay binds them to fixed
buffers, and the numerics read their summation depth (:mod:`commbench.collectives.simulate`).
Pure: no torch."""

from __future__ import annotations

from commbench.collectives.algorithm import Step
from commbench.ops import offsets, split_sizes

__all__ = ["ag_schedule", "broadcast_steps", "doubling_steps", "fold_layout", "halving_ranges",
           "member", "naive_steps", "rabenseifner_steps", "reduce_steps", "ring_steps",
           "rs_schedule", "tree_children"]

def fold_layout(n: int, i: int) -> tuple[int, int, int]:
    """(p, r, new): the power of two, the extra members, and member i's active number (-1: folded)."""
    p = 1 << (n.bit_length() - 1)
    r = n - p
    if i < 2 * r:
        return p, r, (i // 2 if i % 2 else -1)
    return p, r, i - r


def member(new: int, r: int) -> int:
    """Group index of active member ``new``."""
    return 2 * new + 1 if new < r else new + r


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


def tree_children(n: int, v: int) -> tuple[int | None, list[int]]:
    """(parent, children) of relative member v in the binomial tree of n members."""
    low = v & -v if v else 1 << n.bit_length()
    parent = v - low if v else None
    children, m = [], 1
    while m < low and v + m < n:
        children.append(v + m)
        m <<= 1
    return parent, children


# -- the ring (Patarasuk and Yuan 2009): collectives/ring.py ---------------------------------
def rs_schedule(n: int, i: int, counts: list[int]) -> list[Step]:
    """The reduce-scatter's P-1 steps of member i over chunks of ``counts``: the one place the
    ring's reduce-scatter is written (its send/recv code, bytes and compiled replay read it)."""
    b = offsets(counts)
    nxt, prv = (i + 1) % n, (i - 1) % n
    return [Step((b[s], b[s + 1]), nxt, (b[r], b[r + 1]), prv, reduce=True)
            for s, r in (((i - k - 1) % n, (i - k - 2) % n) for k in range(n - 1))]


def ag_schedule(n: int, i: int, counts: list[int]) -> list[Step]:
    """The all-gather's P-1 steps of member i: member j's block is chunk j of ``counts``."""
    b = offsets(counts)
    nxt, prv = (i + 1) % n, (i - 1) % n
    return [Step((b[s], b[s + 1]), nxt, (b[r], b[r + 1]), prv)
            for s, r in (((i - k) % n, (i - k - 1) % n) for k in range(n - 1))]


def ring_steps(n: int, i: int, count: int, split=split_sizes, rs=rs_schedule) -> list[Step]:
    """The ring all-reduce as member i's steps: reduce-scatter, its chunk averaged, all-gather."""
    c = split(count, n)
    b = offsets(c)
    return rs(n, i, c) + [Step(avg=(b[i], b[i + 1]))] + ag_schedule(n, i, c)


# -- recursive doubling and Rabenseifner: collectives/doubling.py --------------------------------
def _fold_steps(n: int, i: int, count: int) -> tuple[list[Step], list[Step]]:
    """The non-power-of-two fold and unfold as steps."""
    _, r, _ = fold_layout(n, i)
    if i >= 2 * r:
        return [], []
    whole = (0, count)
    if i % 2 == 0:
        return [Step(send=whole, dst=i + 1)], [Step(recv=whole, src=i + 1)]
    return [Step(recv=whole, src=i - 1, reduce=True)], [Step(send=whole, dst=i - 1)]


def doubling_steps(n: int, i: int, count: int, split=split_sizes) -> list[Step]:
    """Recursive doubling as member i's steps (:func:`~.doubling_comms.recursive_doubling_all_reduce`)."""
    p, r, new = fold_layout(n, i)
    fold, unfold = _fold_steps(n, i, count)
    out, d = list(fold), 1
    while new >= 0 and d < p:
        peer = member(new ^ d, r)
        out.append(Step((0, count), peer, (0, count), peer, reduce=True))
        d <<= 1
    return out + unfold + [Step(avg=(0, count))]


def rabenseifner_steps(n: int, i: int, count: int, split=split_sizes) -> list[Step]:
    """Rabenseifner's all-reduce as member i's steps (:func:`~.doubling_comms.rabenseifner_all_reduce`)."""
    p, r, new = fold_layout(n, i)
    fold, unfold = _fold_steps(n, i, count)
    out = list(fold)
    if new >= 0:
        b = offsets(split(count, p))
        steps, d = halving_ranges(p, new), p >> 1
        for kl, kh, sl, sh in steps:
            peer = member(new ^ d, r)
            out.append(Step((b[sl], b[sh]), peer, (b[kl], b[kh]), peer, reduce=True))
            d >>= 1
        out.append(Step(avg=(b[new], b[new + 1])))
        d = 1
        for kl, kh, sl, sh in reversed(steps):
            peer = member(new ^ d, r)
            out.append(Step((b[kl], b[kh]), peer, (b[sl], b[sh]), peer))
            d <<= 1
    return out + unfold


# -- the naive all-reduce and the binomial trees: collectives/tree.py -----------------------------
def naive_steps(n: int, i: int, count: int, split=split_sizes) -> list[Step]:
    """The naive all-reduce as member i's steps: member 0 combines every vector in member order,
    then sends the result to every member (:func:`~.tree_comms.naive_all_reduce`). Its receives
    are posted together, one scratch block each, and so are its sends: gloo sends only once the
    receiver has posted (a rendezvous), so receives posted one after another cost a round trip
    each (docs/decisions.md)."""
    whole = (0, count)
    if n == 1:
        return [Step(avg=whole)]
    if i:
        return [Step(send=whole, dst=0), Step(recv=whole, src=0)]
    return ([Step(recv=whole, src=j, reduce=True, slot=j - 1, joint=j < n - 1)
             for j in range(1, n)] + [Step(avg=whole)]
            + [Step(send=whole, dst=j, joint=j < n - 1) for j in range(1, n)])


def broadcast_steps(n: int, i: int, count: int, root: int = 0) -> list[Step]:
    """The binomial broadcast as member i's steps: receive from the parent, then send to each
    child, the farthest subtree first (it has the most rounds left)."""
    parent, children = tree_children(n, (i - root) % n)
    whole = (0, count)
    out = [] if parent is None else [Step(recv=whole, src=(parent + root) % n)]
    return out + [Step(send=whole, dst=(c + root) % n) for c in reversed(children)]


def reduce_steps(n: int, i: int, count: int, root: int = 0) -> list[Step]:
    """The binomial reduce as member i's steps: combine each child's partial result, then send
    to the parent; the root divides at the end (op avg)."""
    parent, children = tree_children(n, (i - root) % n)
    whole = (0, count)
    out = [Step(recv=whole, src=(c + root) % n, reduce=True) for c in children]
    return out + [Step(avg=whole) if parent is None else Step(send=whole, dst=(parent + root) % n)]
