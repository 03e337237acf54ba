"""Bytes each member sends and receives in one call of each algorithm built here (pure).

Each formula follows its algorithm's schedule (the module docstrings); the tests hold the ledger,
which books every message from the tensor actually passed, against these, and hold these against
the textbook closed forms where those apply (ring 2(P-1)/P * S, Rabenseifner 2(p-1)/p * S,
recursive doubling log2(P) * S, Bruck (P/2) log2(P) blocks).
"""

from __future__ import annotations

import math

from commbench.collectives.alltoall import bruck_blocks_per_step
from commbench.collectives.doubling import fold_layout, halving_ranges
from commbench.collectives.tree import tree_children
from commbench.wire.volume import booked, split_sizes

__all__ = ["predict"]


def _ring_rs(n: int, i: int, count: int) -> tuple[int, int]:
    c = split_sizes(count, n)
    return (count - c[i], count - c[(i - 1) % n]) if n > 1 else (0, 0)


def _fold(n: int, i: int, count: int) -> tuple[int, int]:
    _, r, _ = fold_layout(n, i)
    return (count, count) if i < 2 * r else (0, 0)


def _rabenseifner(n: int, i: int, count: int) -> tuple[int, int]:
    p, _, new = fold_layout(n, i)
    s, r = _fold(n, i, count)
    if new < 0:
        return s, r
    b = [0]
    for c in split_sizes(count, p):
        b.append(b[-1] + c)
    moved = sum((b[kh] - b[kl]) + (b[sh] - b[sl]) for kl, kh, sl, sh in halving_ranges(p, new))
    return s + moved, r + moved


def _recursive_doubling(n: int, i: int, count: int) -> tuple[int, int]:
    p, _, new = fold_layout(n, i)
    s, r = _fold(n, i, count)
    steps = int(math.log2(p)) if new >= 0 else 0
    return s + steps * count, r + steps * count


def predict(op: str, algo: str, n: int, i: int, count: int, itemsize: int, *, root: int = 0,
            in_splits: list[int] | None = None, out_splits: list[int] | None = None, row: int = 1,
            local: int | None = None) -> tuple[int, int]:
    """(bytes sent, bytes received) by member ``i`` of ``n`` for one call of ``algo``.

    count: elements of this member's input (all_gather: its block; all_to_all: its whole buffer).
    local: ranks per node, for the hierarchical algorithm.
    """
    if algo == "native":
        kw = {"root": root} if op in ("broadcast", "reduce", "gather", "scatter") else {}
        if op == "all_to_all":
            kw = {"in_splits": in_splits, "out_splits": out_splits, "row": row}
        return booked(op, n, i, count, itemsize, **kw)
    key = (op, algo.removesuffix("_compiled"))  # a compiled schedule moves what its source does
    if key == ("all_reduce", "ring"):
        s, r = booked("all_reduce", n, i, count, 1)
    elif key == ("reduce_scatter", "ring"):
        s, r = _ring_rs(n, i, count)
    elif key == ("all_gather", "ring"):
        s = r = (n - 1) * count
    elif key == ("all_reduce", "naive"):
        s = r = (n - 1) * count if i == 0 else (count if n > 1 else 0)
    elif key == ("all_reduce", "recursive_doubling"):
        s, r = _recursive_doubling(n, i, count)
    elif key == ("all_reduce", "rabenseifner"):
        s, r = _rabenseifner(n, i, count)
    elif key in (("broadcast", "binomial"), ("reduce", "binomial")):
        parent, children = tree_children(n, (i - root) % n)
        down, up = len(children) * count, (count if parent is not None else 0)
        s, r = (down, up) if op == "broadcast" else (up, down)
    elif key == ("all_to_all", "pairwise"):
        if in_splits is None or out_splits is None:
            raise ValueError("pairwise all_to_all needs in_splits and out_splits")
        s = (sum(in_splits) - in_splits[i]) * row
        r = (sum(out_splits) - out_splits[i]) * row
    elif key == ("all_to_all", "bruck"):
        block = count // n
        s = r = sum(bruck_blocks_per_step(n)) * block
    elif key == ("all_reduce", "hierarchical"):
        if not local or n % local:
            raise ValueError(f"hierarchical: local={local} must divide the group size {n}")
        nodes, li = n // local, i % local
        c = split_sizes(count, local)
        s1, r1 = _ring_rs(local, li, count)
        s2, r2 = booked("all_reduce", nodes, i // local, c[li], 1)
        s3, r3 = count - c[(li + 1) % local], count - c[li]
        if local == 1:
            s3 = r3 = 0
        s, r = s1 + s2 + s3, r1 + r2 + r3
    else:
        raise ValueError(f"no algorithm {algo!r} for {op!r}")
    return s * itemsize, r * itemsize
