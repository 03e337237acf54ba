"""The alpha-beta-gamma model (Hockney; Thakur, Rabenseifner & Gropp 2005) for every collective
and algorithm commbench runs, and its calibration on the machine at hand.

    T = alpha * steps + beta * bytes + gamma * reduced   (+ delta * bytes, past the knee)

steps: messages on the critical path; bytes: bytes a rank sends on it; reduced: bytes it
combines. S is nccl-tests' size (all-gather / reduce-scatter / all-to-all: the whole buffer).

Each algorithm's own fit, where a ping-pong sweep was calibrated, prices its messages with the
measured point-to-point curve p(m) (one-way time of one message of m bytes; Hockney's model
measured rather than assumed linear, as LogGP's protocol regimes need):

    T = alpha * steps + scale * steps * p(bytes / steps) + gamma * reduced + delta * beyond

so a transport's protocol switches (eager, rendezvous, single-copy) carry over from ping-pong
to every algorithm, each with its own per-step overhead, scale, reduction rate and knee; or by
the straight line (beta * bytes); either with two regimes split at a size (a library's own
switch of algorithm or protocol): whichever predicts the algorithm's held-out calibration rows
best (:mod:`commbench.costmodel.forms`). The local model that studies judge and rows carry is
each algorithm's line times its residual ratios, interpolated between its calibration sizes
(``fitting.fit(..., correct=True)``; :mod:`commbench.costmodel.correction`).

Two classes of cost are calibrated separately, because they are different code: ``lib`` (the
transport's own collectives and its raw point-to-point, compiled) and ``py`` (algorithms built
here from point-to-point through commbench's comm layer, a Python call per message).
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass

from commbench.collectives import ALGORITHMS
from commbench.costmodel.correction import Correction

__all__ = ["Curve", "Fit", "Params", "beyond", "cost_class", "terms"]


def terms(op: str, algo: str, n: int, size: float) -> tuple[float, float, float]:
    """(steps, bytes sent on the critical path, bytes reduced) of one call: the algorithm's
    record's own terms (:mod:`commbench.collectives`)."""
    try:
        record = ALGORITHMS[(op, algo)]
    except KeyError:
        raise ValueError(f"no alpha-beta terms for {op}/{algo}") from None
    return record.cost(n, size)


def cost_class(op: str, algo: str) -> str:
    """``lib`` for the transport's own calls (and its raw ping-pong), ``py`` for commbench's."""
    return "lib" if algo == "native" and op != "sendrecv" else "py"


@dataclass(frozen=True)
class Params:
    alpha: float  # seconds per message
    beta: float   # seconds per byte sent
    gamma: float  # seconds per byte reduced
    delta: float = 0.0  # seconds per byte sent, from the knee on (see :func:`beyond`)
    scale: float = 0.0  # times the point-to-point curve's price of the messages (see Curve)

    def time(self, t: tuple[float, float, float], over: float = 0.0, priced: float = 0.0) -> float:
        return (self.alpha * t[0] + self.beta * t[1] + self.gamma * t[2] + self.delta * over
                + self.scale * priced)


@dataclass(frozen=True)
class Curve:
    """A measured one-way point-to-point time per message size: ``points`` (bytes, seconds),
    increasing in bytes. Linear between points (a linear transport is reproduced exactly);
    beyond either end the end segment's line, never sloping down."""

    points: tuple[tuple[float, float], ...]

    def __call__(self, m: float) -> float:
        pts = self.points
        if m <= 0:
            return 0.0
        k = min(max(1, bisect.bisect_left([p[0] for p in pts], m)), len(pts) - 1)
        (x0, y0), (x1, y1) = pts[k - 1], pts[k]
        slope = (y1 - y0) / (x1 - x0)
        if not pts[0][0] <= m <= pts[-1][0]:
            slope = max(slope, 0.0)
            x0, y0 = (x1, y1) if m > x1 else (x0, y0)
        return max(y0 + slope * (m - x0), 0.0)

    def price(self, t: tuple[float, float, float]) -> float:
        """Seconds for ``steps`` messages of ``bytes / steps`` each, in turn."""
        return t[0] * self(t[1] / t[0]) if t[0] else 0.0

    @staticmethod
    def from_rows(rows: list[dict]) -> Curve | None:
        """The curve of the ping-pong rows (op, size, time_us: one way), None under 3 sizes."""
        pts = sorted({r["size"]: r["time_us"] * 1e-6 for r in rows
                      if r["op"] == "pingpong" and r["time_us"] > 0}.items())
        return Curve(tuple(pts)) if len(pts) >= 3 else None


def beyond(t: tuple[float, float, float], size: float, knee: float) -> float:
    """The bytes of a call that pay past the knee (the last-level cache): all of them from a
    size of ``knee`` on, none below. From there a call's buffers no longer fit the cache, and
    from glibc's largest mmap threshold (32 MiB) every buffer allocated per call is fresh pages:
    every byte costs more, not only those past the knee (in the studies of the 32 MiB rows,
    which no calibration size falls on, up to 8x the line through smaller sizes)."""
    return t[1] if knee and size >= knee else 0.0


@dataclass(frozen=True)
class Fit:
    """Calibrated parameters per cost class and, where calibrated, per algorithm (with a knee
    term when ``knee`` > 0); with the calibration residuals."""

    classes: dict[str, Params]
    residuals: list[dict]
    algos: dict[str, Params] | None = None  # "op/algo" -> its own constants
    knee: float = 0.0  # bytes; 0: no knee term
    curve: Curve | None = None  # ping-pong's, pricing each algorithm's messages; None: beta
    above: dict[str, tuple[float, Params]] | None = None  # "op/algo" -> (break bytes, constants)
    corrections: dict[str, Correction] | None = None  # "op/algo" -> its residual ratios

    def predict_us(self, op: str, algo: str, n: int, size: float, per_algo: bool = True) -> float:
        key = f"{op}/{algo}"
        own = (self.algos or {}).get(key) if per_algo else None
        t = terms(op, algo, n, size)
        if own is None:
            return self.classes[cost_class(op, algo)].time(t) * 1e6
        hi = (self.above or {}).get(key)
        if hi is not None and size >= hi[0]:
            own = hi[1]
        priced = self.curve.price(t) if self.curve else 0.0
        fix = (self.corrections or {}).get(key)
        return own.time(t, beyond(t, size, self.knee), priced) * 1e6 * (fix(size) if fix else 1.0)

    def as_dict(self) -> dict:
        return {"classes": {k: asdict(v) for k, v in self.classes.items()},
                "algorithms": {k: asdict(v) for k, v in (self.algos or {}).items()},
                "above": {k: {"from_bytes": b, **asdict(p)} for k, (b, p)
                          in (self.above or {}).items()},
                "knee_bytes": self.knee, "residuals": self.residuals,
                "curve": [list(p) for p in self.curve.points] if self.curve else None,
                "corrections": {k: [list(p) for p in c.points]
                                for k, c in (self.corrections or {}).items()}}

    @staticmethod
    def from_dict(d: dict) -> Fit:
        curve = d.get("curve")
        above = {k: (v["from_bytes"], Params(**{f: x for f, x in v.items() if f != "from_bytes"}))
                 for k, v in d.get("above", {}).items()}
        fixes = {k: Correction(tuple(map(tuple, v))) for k, v in d.get("corrections", {}).items()}
        return Fit({k: Params(**v) for k, v in d["classes"].items()}, d.get("residuals", []),
                   {k: Params(**v) for k, v in d.get("algorithms", {}).items()},
                   d.get("knee_bytes", 0.0), Curve(tuple(map(tuple, curve))) if curve else None,
                   above or None, fixes or None)
