"""Least squares of the alpha-beta model: one cost's constants from its measured rows."""

from __future__ import annotations

import numpy as np

from commbench.costmodel.alphabeta import Curve, Params, beyond, terms

__all__ = ["fit_rows", "nnls_relative"]


def nnls_relative(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """min sum ((A x - y) / y)^2 with x >= 0 (relative error; a small active-set loop)."""
    W = A / y[:, None]
    ones = np.ones_like(y)
    free = list(range(A.shape[1]))
    x = np.zeros(A.shape[1])
    while free:
        sol, *_ = np.linalg.lstsq(W[:, free], ones, rcond=None)
        if (sol >= 0).all():
            x[:] = 0
            x[free] = sol
            return x
        free.pop(int(np.argmin(sol)))
    return x


def fit_rows(rows: list[dict], n: int, label: str, residuals: list[dict],
              knee: float = 0.0, curve: Curve | None = None) -> Params:
    """Columns: steps, bytes (or, with a curve, the curve's price of the messages), reduced
    bytes and, with a knee, the bytes that pay past it."""
    def row(r):
        t = terms(r["op"], r["algo"], n, r["size"])
        cols = (t[0], curve.price(t) if curve else t[1], t[2])
        return (*cols, beyond(t, r["size"], knee)) if knee else cols

    A = np.array([row(r) for r in rows], dtype=float)
    y = np.array([r["time_us"] * 1e-6 for r in rows])
    # condition the columns (seconds per message, per byte; the curve's price is in seconds)
    scale = np.array([1e-6, 1.0 if curve else 1e-9, 1e-9, 1e-9][:A.shape[1]])
    x = nnls_relative(A * scale, y) * scale
    for r, t in zip(rows, A @ x, strict=True):
        residuals.append({"fit": label, "op": r["op"], "algo": r["algo"], "size": r["size"],
                          "measured_us": r["time_us"], "fitted_us": t * 1e6,
                          "rel_error": (t * 1e6 - r["time_us"]) / r["time_us"]})
    alpha, b, gamma, *delta = map(float, x)
    if curve:
        return Params(alpha, 0.0, gamma, *delta, scale=b)
    return Params(alpha, b, gamma, *delta)
