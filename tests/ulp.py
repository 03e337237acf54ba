"""One-ulp nudges for float32 reference runs: how much one problem instance amplifies rounding.

A float32 result is judged against the float64 truth by how close an unsharded float32 run of the
same computation gets. One run's error can be small by luck of cancellation; runs whose inputs
are each moved by one float32 ulp (up, down or not at all) are equally right answers, and the
largest of their errors is the scale a sharded run, whose sums go in another order, is held to.
"""

from __future__ import annotations

import torch

DRAWS = 3  # nudged runs besides the plain one


def nudger(draw: int):
    """A function moving each element of a tensor one ulp up, down or not at all, seeded."""
    g = torch.Generator().manual_seed(draw)

    def nudge(t: torch.Tensor) -> torch.Tensor:
        u = torch.randint(-1, 2, t.shape, generator=g)
        inf = torch.full_like(t, float("inf"))
        return torch.where(u > 0, torch.nextafter(t, inf),
                           torch.where(u < 0, torch.nextafter(t, -inf), t))

    return nudge


def reference_nudges() -> list:
    """The nudges of the float32 reference runs: None (as is), then :data:`DRAWS` seeded ones."""
    return [None] + [nudger(k) for k in range(DRAWS)]
