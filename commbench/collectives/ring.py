"""Ring algorithms from send/recv: reduce-scatter, all-gather, and all-reduce as the two in turn.

The ring of the notes ("Ring All-reduce = Reduce-scatter + All-gather", Patarasuk and Yuan 2009):
the buffer is cut in P chunks (:func:`commbench.wire.ops.split_sizes`; the first ``count % P`` one
element longer, so any count works). Member i sends to i+1 and receives from i-1.

* reduce-scatter, step k = 0..P-2: send the running sum of chunk i-k-1, receive chunk i-k-2 and add
  this rank's part of it. After P-1 steps member i holds the full reduction of chunk i.
* all-gather, step k = 0..P-2: send chunk i-k, receive chunk i-k-1.

Shapes (P = group size, c_j = chunk j's length, S = c_0 + ... + c_{P-1}):
    x      [S]      this rank's input, flattened
    rs     [c_i]    ring_reduce_scatter's result on member i
    ag     [S]      ring_all_gather's result, chunks in member order

Per member i: reduce-scatter sends S - c_i and receives S - c_{i-1} elements; all-gather sends
S - c_{i+1} and receives S - c_i; all-reduce sends 2S - c_i - c_{i+1}: 2(P-1)/P * S when P divides S.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from commbench.collectives._p2p import combine, exchange, finish_avg, flat, offsets
from commbench.collectives.algorithm import Algorithm, BrokenAlgorithm
from commbench.runtime.group import Group
from commbench.wire.comm import Comm
from commbench.wire.ops import split_sizes

__all__ = ["RECORDS", "RingParts", "ring_all_gather", "ring_all_reduce", "ring_reduce_scatter"]


def _rs_steps(comm: Comm, buf: torch.Tensor, group: Group, counts: list[int], op: str,
              steps: int | None = None) -> None:
    """The reduce-scatter's ``steps`` (default all P-1) in place on ``buf``."""
    n, i = group.size, group.index
    b = offsets(counts)
    nxt, prv = (i + 1) % n, (i - 1) % n
    for k in range(n - 1 if steps is None else steps):
        s, r = (i - k - 1) % n, (i - k - 2) % n
        got = exchange(comm, buf[b[s]:b[s + 1]], nxt, buf[b[r]:b[r + 1]], prv, group)
        buf[b[r]:b[r + 1]] = combine(got, buf[b[r]:b[r + 1]], op)


def _ag_steps(comm: Comm, buf: torch.Tensor, group: Group, counts: list[int]) -> None:
    n, i = group.size, group.index
    b = offsets(counts)
    nxt, prv = (i + 1) % n, (i - 1) % n
    for k in range(n - 1):
        s, r = (i - k) % n, (i - k - 1) % n
        got = exchange(comm, buf[b[s]:b[s + 1]], nxt, buf[b[r]:b[r + 1]], prv, group)
        buf[b[r]:b[r + 1]] = got


def _skip_last_rs_step(comm: Comm, buf: torch.Tensor, group: Group, counts: list[int],
                      op: str) -> None:
    """Broken: the reduce-scatter stops one step early; one contribution per chunk is missing."""
    _rs_steps(comm, buf, group, counts, op, steps=group.size - 2)


def off_by_one_chunks(count: int, n: int) -> list[int]:
    """Broken: chunk boundaries shifted by one element (the first chunk one longer, the last one
    shorter); every member cuts the same wrong chunks."""
    c = split_sizes(count, n)
    if n > 1 and c[-1] > 0:
        c[0] += 1
        c[-1] -= 1
    return c


@dataclass(frozen=True)
class RingParts:
    """The ring's swappable steps: how the buffer is cut, and the reduce-scatter's steps."""

    split: Callable[[int, int], list[int]] = split_sizes
    rs_steps: Callable = _rs_steps


RING = RingParts()


def ring_reduce_scatter(comm: Comm, x: torch.Tensor, group: Group, *, op: str = "sum",
                        counts: list[int] | None = None, parts: RingParts = RING) -> torch.Tensor:
    """Member i gets the reduction of chunk i of ``x`` (chunks of ``counts``, default the
    parts' split)."""
    buf = flat(x)
    counts = counts or parts.split(buf.numel(), group.size)
    if sum(counts) != buf.numel() or len(counts) != group.size:
        raise ValueError(f"ring_reduce_scatter: counts {counts} do not cut {buf.numel()} "
                         f"elements into {group.size} chunks")
    with comm.ledger.scope("ring_reduce_scatter"):
        parts.rs_steps(comm, buf, group, counts, op)
    b = offsets(counts)
    return finish_avg(buf[b[group.index]:b[group.index + 1]].clone(), op, group.size)


def ring_all_gather(comm: Comm, x: torch.Tensor, group: Group,
                    counts: list[int] | None = None) -> torch.Tensor:
    """Concatenate every member's ``x`` (member j's of ``counts[j]`` elements) in member order."""
    mine = flat(x)
    n = group.size
    counts = counts or [mine.numel()] * n
    if len(counts) != n or counts[group.index] != mine.numel():
        raise ValueError(f"ring_all_gather: counts {counts} do not match {n} members with "
                         f"{mine.numel()} elements here")
    b = offsets(counts)
    buf = mine.new_empty(b[-1])
    buf[b[group.index]:b[group.index + 1]] = mine
    with comm.ledger.scope("ring_all_gather"):
        _ag_steps(comm, buf, group, counts)
    return buf


def ring_all_reduce(comm: Comm, x: torch.Tensor, group: Group, *, op: str = "sum",
                    parts: RingParts = RING) -> torch.Tensor:
    """Ring reduce-scatter then ring all-gather; ``x`` [*] -> same shape, on every member."""
    buf = flat(x)
    counts = parts.split(buf.numel(), group.size)
    with comm.ledger.scope("ring_all_reduce"):
        parts.rs_steps(comm, buf, group, counts, op)
        b = offsets(counts)
        i = group.index
        finish_avg(buf[b[i]:b[i + 1]], op, group.size)
        _ag_steps(comm, buf, group, counts)
    return buf.reshape(x.shape)


def _rs_elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
    c = split_sizes(count, n)
    return (count - c[i], count - c[(i - 1) % n]) if n > 1 else (0, 0)


def _ag_elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
    return (n - 1) * count, (n - 1) * count


def _ar_elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
    rs, ag = _rs_elements(n, i, count), split_sizes(count, n)
    # all-gather: every chunk but chunk i+1 goes out, every chunk but chunk i comes in
    return (rs[0] + count - ag[(i + 1) % n], rs[1] + count - ag[i]) if n > 1 else (0, 0)


BROKEN = (BrokenAlgorithm("skip_step", {"rs_steps": _skip_last_rs_step},
                          "the reduce-scatter stops a step early: a contribution is missing"),
          BrokenAlgorithm("off_by_one_chunk", {"split": off_by_one_chunks},
                          "the chunks cut one element off: the bytes differ from the formula"))
RECORDS = (
    Algorithm("all_reduce", "ring", ring_all_reduce, _ar_elements,
              lambda n, S: (2 * (n - 1), 2 * (n - 1) / n * S, (n - 1) / n * S),
              parts=RING, broken=BROKEN),
    Algorithm("reduce_scatter", "ring", ring_reduce_scatter, _rs_elements,
              lambda n, S: (n - 1, (n - 1) / n * S, (n - 1) / n * S), parts=RING,
              broken=BROKEN),
    Algorithm("all_gather", "ring", ring_all_gather, _ag_elements,
              lambda n, S: (n - 1, (n - 1) / n * S, 0.0)),
)
