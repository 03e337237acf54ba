"""Intervals as their union: sorted, overlapping and touching ones merged (pure). A rank's
computation kernels are kept so (what communication is hidden behind), and a step's calls are
measured so."""

from __future__ import annotations

from array import array

__all__ = ["OnlineUnion", "union"]


class OnlineUnion:
    """Intervals merged into their union as they come, in two float arrays: an interval that
    starts at or after the last merged one's start extends it or follows it; one that starts
    earlier (kernels of several streams written out of order) waits, and is merged in at the
    end (:func:`union`). A trace whose kernels come in order keeps only the union, not every
    kernel's interval."""

    def __init__(self) -> None:
        self.lo, self.hi = array("d"), array("d")
        self.late: list[tuple[float, float]] = []

    def add(self, a: float, b: float) -> None:
        lo, hi = self.lo, self.hi
        if lo and a >= lo[-1]:
            if a <= hi[-1]:
                if b > hi[-1]:
                    hi[-1] = b
                return
        elif lo:
            self.late.append((a, b))
            return
        lo.append(a)
        hi.append(b)

    def spans(self) -> tuple[array, array]:
        """The union: (starts, ends), sorted, overlapping and touching intervals merged."""
        if not self.late:
            return self.lo, self.hi
        spans = union([*zip(self.lo, self.hi, strict=True), *self.late])
        return array("d", (a for a, _ in spans)), array("d", (b for _, b in spans))


def union(spans) -> list[tuple[float, float]]:
    """The union of (start, end) intervals: sorted, overlapping and touching ones merged."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out
