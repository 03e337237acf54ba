"""How the algorithms built from send/recv pick their blocks and peers, read by both their
records (bytes, step lists) and their send/recv code: recursive doubling's fold of a
non-power-of-two group, recursive halving's block ranges, the binomial tree. (The ring's chunks
are :func:`commbench.ops.split_sizes`.) Pure: no torch."""

from __future__ import annotations

__all__ = ["fold_layout", "halving_ranges", "member", "tree_children"]


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
