"""The residual correction of each algorithm's alpha-beta line: the calibrated local model.

    T(S) = line(S) * r(S),   r(S_k) = measured(S_k) / line(S_k) at each calibration size S_k,

with r interpolated between neighbouring calibration sizes linearly in (log S, log r), and held
at the end ratio beyond the calibrated range. The line (alpha steps + beta bytes + gamma
reduced, + delta past the knee) gives the shape between two calibration sizes (the latency
plateau, the slope per byte); the measured ratios give what a line cannot: a library's own
switches of algorithm or protocol by size (MPICH's broadcast has three regimes at 4 ranks), and
cache effects. At a calibration size the model returns that row's measurement: judged there,
its error is the machine's noise; between them, it is a prediction.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

__all__ = ["Correction"]


@dataclass(frozen=True)
class Correction:
    """``points``: (size in bytes, measured / fitted), increasing in size, ratios > 0."""

    points: tuple[tuple[float, float], ...]

    def __post_init__(self):
        sizes = [p[0] for p in self.points]
        if not self.points or any(s <= 0 for s in sizes) or sizes != sorted(set(sizes)):
            raise ValueError(f"correction sizes={sizes}: must be positive and increasing")
        bad = [r for _, r in self.points if not r > 0]
        if bad:
            raise ValueError(f"correction ratios={bad}: must be > 0")

    def __call__(self, size: float) -> float:
        pts = self.points
        if size <= pts[0][0]:
            return pts[0][1]
        if size >= pts[-1][0]:
            return pts[-1][1]
        k = bisect.bisect_left([p[0] for p in pts], size)
        (s0, r0), (s1, r1) = pts[k - 1], pts[k]
        w = math.log(size / s0) / math.log(s1 / s0)
        return math.exp((1 - w) * math.log(r0) + w * math.log(r1))

    @staticmethod
    def from_residuals(residuals: list[dict]) -> Correction | None:
        """The ratios of one fit's residual rows (size, measured_us, fitted_us); rows at one
        size pooled by their geometric mean. None without a row or with a non-positive time."""
        by: dict[float, list[float]] = {}
        for r in residuals:
            if r["measured_us"] <= 0 or r["fitted_us"] <= 0:
                return None
            by.setdefault(float(r["size"]), []).append(math.log(r["measured_us"] / r["fitted_us"]))
        if not by:
            return None
        return Correction(tuple((s, math.exp(sum(v) / len(v))) for s, v in sorted(by.items())))
