"""The ring algorithms' send/recv code: the schedules of :mod:`commbench.collectives.schedules`
run through the comm layer (records: :mod:`commbench.collectives.ring`).

Shapes (P = group size, c_j = chunk j's length, S = c_0 + ... + c_{P-1}):
    x      [S]      this rank's input, flattened
    rs     [c_i]    ring_reduce_scatter's result on member i
    ag     [S]      ring_all_gather's result, chunks in member order
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from commbench.collectives._p2p import finish_avg, flat, run_steps
from commbench.collectives.algorithm import Step
from commbench.collectives.schedules import ag_schedule, ring_steps, rs_schedule
from commbench.ops import offsets, split_sizes
from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["RING", "RingParts", "ring_all_gather", "ring_all_reduce", "ring_reduce_scatter"]


@dataclass(frozen=True)
class RingParts:
    """The ring's swappable steps: how the buffer is cut, and the reduce-scatter's steps."""

    split: Callable[[int, int], list[int]] = split_sizes
    rs_steps: Callable[[int, int, list[int]], list[Step]] = rs_schedule


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
        run_steps(comm, buf, group, parts.rs_steps(group.size, group.index, counts), op)
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
        run_steps(comm, buf, group, ag_schedule(n, group.index, counts))
    return buf


def ring_all_reduce(comm: Comm, x: torch.Tensor, group: Group, *, op: str = "sum",
                    parts: RingParts = RING) -> torch.Tensor:
    """Ring reduce-scatter then ring all-gather; ``x`` [*] -> same shape, on every member."""
    buf = flat(x)
    with comm.ledger.scope("ring_all_reduce"):
        run_steps(comm, buf, group, ring_steps(group.size, group.index, buf.numel(),
                                               split=parts.split, rs=parts.rs_steps), op)
    return buf.reshape(x.shape)
