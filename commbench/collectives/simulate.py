"""Every member's schedule (:class:`~commbench.collectives.algorithm.Step` lists) run together on
paper: what each element of each member's result holds, and how long the longest chain takes.
Pure: no torch, no messages. The algorithms' schedules are written once; this reads them for the
two facts other modules would otherwise write a second time:

* **summation depth**: the additions on the longest chain that builds one element, which bounds
  the rounding error (:func:`commbench.studies.numerics.depth`);
* **critical path**: the alpha-beta model's three terms (messages, elements sent, elements
  reduced on the longest chain). Each member has one port out, taken by its sends in the order
  it posts them, and one port in, taken by its receives in the order it makes them: a message
  leaves when it is posted and the sender's port is free, arrives once the receiver's port is
  free too, and takes ``1`` message and ``len`` elements of each port; a reduction takes
  ``len`` elements of the receiver's time. Each term is its own run (the other
  two weighted zero), as the closed forms in the records are written
  (:attr:`~commbench.collectives.algorithm.Algorithm.terms`, checked against this in the tests).

It also says whether a schedule is complete: every element of every member's result holding every
member's contribution exactly once (``avg`` steps only divide, so they are skipped here), and
whether it deadlocks under buffered sends (a receive nothing ever sends).

Shapes: count elements per member; a member's ``buf`` [count] of (contributors bitmask, depth).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from commbench.collectives.algorithm import Step

__all__ = ["Paper", "simulate"]


@dataclass(frozen=True)
class Paper:
    """The outcome of :func:`simulate`: ``masks[i][e]`` the members whose input element e of
    member i's result holds (bitmask; a contribution twice makes the mask's count wrong, so
    ``counted`` tallies contributions), ``depth`` the longest addition chain, ``terms`` (messages,
    elements, elements reduced) on the critical path."""

    masks: tuple[tuple[int, ...], ...]
    counted: tuple[tuple[int, ...], ...]
    depth: int
    terms: tuple[float, float, float]

    def complete(self, blocks=None) -> bool:
        """Every member's elements (or, per member, only ``blocks[i]`` = (lo, hi)) hold each
        member's contribution exactly once."""
        n = len(self.masks)
        full = (1 << n) - 1
        for i in range(n):
            lo, hi = blocks[i] if blocks is not None else (0, len(self.masks[i]))
            if any(m != full or c != n for m, c in zip(self.masks[i][lo:hi], self.counted[i][lo:hi])):
                return False
        return True


def _run(schedules: list[list[Step]], count: int, weight: tuple[float, float, float]):
    """One run of every member's schedule; returns (bufs, critical time) under ``weight``."""
    n = len(schedules)
    a, b, g = weight
    bufs = [[(1 << i, 0, 1)] * count for i in range(n)]  # (mask, depth, contributions)
    chan: dict[tuple[int, int], deque] = {}
    clock, out_free, in_free = [0.0] * n, [0.0] * n, [0.0] * n
    pos, posted = [0] * n, [False] * n
    left = sum(len(s) for s in schedules)
    while left:
        moved = False
        for i in range(n):
            while pos[i] < len(schedules[i]):
                s = schedules[i][pos[i]]
                if s.avg is not None:
                    pos[i] += 1
                    left -= 1
                    continue
                if s.send is not None and not posted[i]:
                    lo, hi = s.send
                    start = max(clock[i], out_free[i])
                    out_free[i] = start + a + b * (hi - lo)
                    chan.setdefault((i, s.dst), deque()).append((bufs[i][lo:hi], start))
                    posted[i] = True
                if s.recv is not None:
                    q = chan.get((s.src, i))
                    if not q:
                        break
                    data, start = q.popleft()
                    lo, hi = s.recv
                    if len(data) != hi - lo:
                        raise ValueError(f"member {i} step {pos[i]}: receives {hi - lo} elements, "
                                         f"member {s.src} sent {len(data)}")
                    in_free[i] = max(start, in_free[i]) + a + b * len(data)
                    clock[i] = max(clock[i], in_free[i])
                    if s.reduce:
                        bufs[i][lo:hi] = [(m1 | m2, max(d1, d2) + 1, c1 + c2) for (m1, d1, c1), (m2, d2, c2)
                                          in zip(data, bufs[i][lo:hi])]
                        clock[i] += g * (hi - lo)
                    else:
                        bufs[i][lo:hi] = data
                elif s.send is not None:
                    clock[i] = max(clock[i], out_free[i])
                posted[i] = False
                pos[i] += 1
                left -= 1
                moved = True
        if left and not moved:
            stuck = [f"member {i} step {pos[i]} (recv from {schedules[i][pos[i]].src})"
                     for i in range(n) if pos[i] < len(schedules[i])]
            raise ValueError("schedule deadlocks: " + "; ".join(stuck))
    return bufs, max(clock) if n else 0.0


def simulate(schedules: list[list[Step]], count: int) -> Paper:
    """Run every member's ``schedules[i]`` over ``count`` elements (module docstring)."""
    bufs, t_msg = _run(schedules, count, (1.0, 0.0, 0.0))
    _, t_el = _run(schedules, count, (0.0, 1.0, 0.0))
    _, t_red = _run(schedules, count, (0.0, 0.0, 1.0))
    masks = tuple(tuple(e[0] for e in buf) for buf in bufs)
    counted = tuple(tuple(e[2] for e in buf) for buf in bufs)
    depth = max((e[1] for buf in bufs for e in buf), default=0)
    return Paper(masks, counted, depth, (t_msg, t_el, t_red))
