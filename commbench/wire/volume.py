"""Bytes per rank: one small pure function per collective.

The ledger books every collective that a transport performs natively (gloo's, MPI's, NCCL's own)
at the volume of the bandwidth-optimal schedule that NCCL runs for large messages, counted per rank
and exactly, also when the element count does not divide by the group size:

* all-reduce: ring reduce-scatter then ring all-gather over the chunks of :func:`split_sizes`;
  rank i sends every chunk but its own in the first pass and every chunk but chunk i+1 in the
  second, so ``sent = 2*count - c[i] - c[i+1]`` and ``recv = 2*count - c[i-1] - c[i]`` elements.
  With count divisible by n that is the familiar 2(n-1)/n * S.
* all-gather, reduce-scatter: ring, (n-1) * c each way, c the per-rank block.
* broadcast, reduce: NCCL's ring chain (root first for broadcast, root last for reduce): every rank
  on the chain forwards the whole buffer once.
* gather, scatter, all-to-all(v), send/recv: direct, what leaves and enters this rank.

These are the bytes a rank must move at the least (the busbw bound of nccl-tests), not what the
transport's own algorithm happens to send; commbench's own algorithms, built from send/recv, are
booked call by call from the buffers they really pass.
"""

from __future__ import annotations

__all__ = ["booked", "split_sizes"]


def split_sizes(count: int, n: int) -> list[int]:
    """Split ``count`` items into ``n`` parts, the first ``count % n`` one larger: 7 over 4 is
    [2, 2, 2, 1]. The ring's chunks, and Ulysses' heads per rank (DeepSpeed's
    ``get_shard_size_list``), are this split."""
    if n < 1:
        raise ValueError(f"n={n}: must be >= 1")
    if count < 0:
        raise ValueError(f"count={count}: must be >= 0")
    base, extra = divmod(count, n)
    return [base + (1 if k < extra else 0) for k in range(n)]


def _all_reduce(n: int, i: int, count: int) -> tuple[int, int]:
    c = split_sizes(count, n)
    if n == 1:
        return 0, 0
    return 2 * count - c[i] - c[(i + 1) % n], 2 * count - c[(i - 1) % n] - c[i]


def _chain(n: int, position: int) -> tuple[int, int]:
    """A rank at ``position`` of an n-rank chain: sends unless last, receives unless first."""
    return (1 if position < n - 1 else 0), (1 if position > 0 else 0)


def booked(op: str, n: int, i: int, count: int, itemsize: int, *, root: int = 0,
           in_splits: list[int] | None = None, out_splits: list[int] | None = None,
           row: int = 1) -> tuple[int, int]:
    """(bytes sent, bytes received) by group member ``i`` of ``n`` for one call of ``op``.

    count: elements of this rank's input buffer (for ``scatter``, of the root's whole buffer; for
    ``all_gather`` and ``gather``, of this rank's contribution).
    in_splits/out_splits: rows sent to / received from each member, for ``all_to_all``; a row has
    ``row`` elements.
    """
    if not 0 <= i < n:
        raise ValueError(f"member index {i}: must be in 0..{n - 1}")
    if op == "all_reduce":
        s, r = _all_reduce(n, i, count)
    elif op in ("all_gather",):
        s = r = (n - 1) * count
    elif op == "reduce_scatter":
        if count % n:
            raise ValueError(f"reduce_scatter count {count}: not a multiple of group size {n}")
        s = r = (n - 1) * (count // n)
    elif op == "all_to_all":
        if in_splits is None or out_splits is None:
            raise ValueError("all_to_all needs in_splits and out_splits")
        s = (sum(in_splits) - in_splits[i]) * row
        r = (sum(out_splits) - out_splits[i]) * row
    elif op == "broadcast":
        fs, fr = _chain(n, (i - root) % n)
        s, r = fs * count, fr * count
    elif op == "reduce":
        fs, fr = _chain(n, (i - root - 1) % n)
        s, r = fs * count, fr * count
    elif op == "gather":
        s, r = (0, (n - 1) * count) if i == root else (count, 0)
    elif op == "scatter":
        block = count // n
        s, r = ((n - 1) * block, 0) if i == root else (0, block)
    elif op in ("send", "isend"):
        s, r = count, 0
    elif op in ("recv", "irecv"):
        s, r = 0, count
    elif op == "barrier":
        s = r = 0
    else:
        raise ValueError(f"op {op!r}: no volume formula")
    return s * itemsize, r * itemsize
