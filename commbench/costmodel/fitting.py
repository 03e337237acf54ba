"""Calibration of the alpha-beta model: every cost class and every algorithm fitted to the rows
of a model study (:mod:`commbench.studies.model`)."""

from __future__ import annotations

from commbench.costmodel.alphabeta import Curve, Fit, Params, cost_class
from commbench.costmodel.correction import Correction
from commbench.costmodel.forms import FORMS, choose, fit_form
from commbench.costmodel.lsq import fit_rows

__all__ = ["CALIBRATION", "fit"]


CALIBRATION = (("pingpong", "native"), ("all_reduce", "native"), ("sendrecv", "native"),
               ("all_reduce", "ring"))


def fit(rows: list[dict], n: int, per_algo: bool = True, knee: float = 0.0,
        forms: tuple[str, ...] | None = None, correct: bool = False) -> Fit:
    """Fit alpha, beta, gamma per cost class on the calibration cases (ping-pong, the
    transport's all-reduce, commbench's sendrecv and ring all-reduce), and, with ``per_algo``,
    each algorithm's own on its rows (op, algo, size, time_us) in the form among ``forms``
    (default: all of :data:`commbench.costmodel.forms.FORMS`) that predicts its held-out rows
    best: alpha, gamma and beta or, where ping-pong rows give a :class:`Curve`, the curve's
    scale, once or per regime; with a ``knee`` (bytes), delta for the bytes of calls from that
    size on. With ``correct``, each algorithm's fit is multiplied by its residual ratios,
    interpolated between its calibration sizes (:mod:`commbench.costmodel.correction`)."""
    rows = [r for r in rows if r["time_us"] > 0]
    classes: dict[str, Params] = {}
    residuals: list[dict] = []
    for cls in ("lib", "py"):
        mine = [r for r in rows if (r["op"], r["algo"]) in CALIBRATION
                and cost_class(r["op"], r["algo"]) == cls]
        if mine:
            classes[cls] = fit_rows(mine, n, cls, residuals)
    algos, above, fixes = {}, {}, {}
    curve = Curve.from_rows(rows) if per_algo else None
    if per_algo:
        for key in sorted({(r["op"], r["algo"]) for r in rows}):
            mine = [r for r in rows if (r["op"], r["algo"]) == key]
            if len(mine) >= 3 + bool(knee):
                label = "/".join(key)
                form = choose(mine, n, knee, curve, forms or FORMS)
                start = len(residuals)
                algos[label], hi = fit_form(mine, n, knee, curve, form, residuals, label)
                if hi is not None:
                    above[label] = hi
                fix = Correction.from_residuals(residuals[start:]) if correct else None
                if fix is not None:
                    fixes[label] = fix
    return Fit(classes, residuals, algos, knee, curve, above or None, fixes or None)
