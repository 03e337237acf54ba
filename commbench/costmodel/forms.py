"""Each algorithm's form in the alpha-beta model before the residual correction (scored beside the
corrected line by the model study; :mod:`commbench.costmodel.correction`), chosen on its own
calibration rows.

* ``line``: T = alpha steps + beta bytes + gamma reduced (+ delta beyond the knee);
* ``curve``: beta bytes replaced by scale x the ping-pong curve's price of the messages
  (:class:`commbench.costmodel.alphabeta.Curve`);
* ``split`` and ``split curve``: two regimes, each with its own constants, below and from a
  break size. A library that switches algorithm or protocol by size has a different line on each
  side: MPICH's all-reduce goes from recursive doubling to Rabenseifner past 2 KiB and its
  messages from eager to rendezvous past the eager limit, NCCL's protocols from LL to LL128 to
  Simple, and the ping-pong curve carries over only the point-to-point part of that. The break
  lies halfway (geometrically) between two calibration sizes, each side keeping at least
  :data:`MIN_SIDE` rows, where the two fits leave the least squared relative residual.

The form is the one whose fits predict the algorithm's own calibration rows best when each is
left out in turn (median relative error; ties go to the simpler form, in :data:`FORMS` order).
No evaluation row takes part in the choice.
"""

from __future__ import annotations

import numpy as np

from commbench.costmodel import alphabeta as ab
from commbench.costmodel.lsq import fit_rows

__all__ = ["FORMS", "MIN_SIDE", "TIE", "choose", "fit_form", "predictor", "split_fit", "usable"]

FORMS = ("line", "curve", "split", "split curve")
MIN_SIDE = 3  # rows on each side of a break: two regimes of alpha, beta, gamma
TIE = 1e-9  # median relative errors this close are a tie (rounding), won by the simpler form


def split_fit(rows: list[dict], n: int, knee: float, curve: ab.Curve | None,
              residuals: list[dict] | None = None, label: str = ""
              ) -> tuple[ab.Params, float, ab.Params] | None:
    """(constants below, break size in bytes, constants from it), or None with too few rows."""
    rows = sorted(rows, key=lambda r: r["size"])
    best = None
    for k in range(MIN_SIDE, len(rows) - MIN_SIDE + 1):
        lo, hi = rows[:k], rows[k:]
        if lo[-1]["size"] == hi[0]["size"]:
            continue
        res: list[dict] = []
        p_lo = fit_rows(lo, n, label, res, knee, curve)
        p_hi = fit_rows(hi, n, label, res, knee, curve)
        err = sum(r["rel_error"] ** 2 for r in res)
        if best is None or err < best[0]:
            best = (err, p_lo, (lo[-1]["size"] * hi[0]["size"]) ** 0.5, p_hi, res)
    if best is None:
        return None
    if residuals is not None:
        residuals += best[4]
    return best[1], best[2], best[3]


def fit_form(rows: list[dict], n: int, knee: float, curve: ab.Curve | None, form: str,
             residuals: list[dict], label: str) -> tuple[ab.Params, tuple[float, ab.Params] | None]:
    """One algorithm's constants in ``form``: (constants, None) or, split, (constants below the
    break, (break bytes, constants from it))."""
    priced = curve if form.endswith("curve") else None
    if form.startswith("split"):
        got = split_fit(rows, n, knee, priced, residuals, label)
        if got is not None:
            return got[0], (got[1], got[2])
    return fit_rows(rows, n, label, residuals, knee, priced), None


def predictor(rows: list[dict], n: int, knee: float, curve: ab.Curve | None, form: str):
    """size -> predicted us of ``rows``' collective and algorithm, fitted to them in ``form``."""
    op, algo = rows[0]["op"], rows[0]["algo"]
    key = f"{op}/{algo}"
    own, above = fit_form(rows, n, knee, curve, form, [], "")
    model = ab.Fit({}, [], {key: own}, knee, curve if form.endswith("curve") else None,
                   {key: above} if above else None)
    return lambda size: model.predict_us(op, algo, n, size)


def usable(forms: tuple[str, ...], nrows: int, curve: ab.Curve | None) -> list[str]:
    """``forms`` that ``nrows`` rows can be fitted in, in :data:`FORMS` order: those needing a
    curve only with one, splits only with :data:`MIN_SIDE` rows on each side."""
    return [f for f in FORMS if f in forms and (curve is not None or not f.endswith("curve"))
            and (not f.startswith("split") or nrows >= 2 * MIN_SIDE)]


def choose(rows: list[dict], n: int, knee: float, curve: ab.Curve | None,
           forms: tuple[str, ...] = FORMS) -> str:
    """The form among ``forms`` (those needing a curve only with one; splits only with enough
    rows) that predicts each of ``rows`` best from the others."""
    unknown = [f for f in forms if f not in FORMS]
    if unknown:
        raise ValueError(f"forms={unknown}: each must be one of {', '.join(FORMS)}")
    ok = usable(forms, len(rows) - 1, curve)  # each fit leaves one row out
    if len(ok) < 2:
        return ok[0] if ok else "line"

    def loo(form: str) -> float:
        errs = []
        for k, out in enumerate(rows):
            pred = predictor(rows[:k] + rows[k + 1:], n, knee, curve, form)(out["size"])
            errs.append(abs(pred - out["time_us"]) / out["time_us"])
        return float(np.median(errs))

    scores = {f: loo(f) for f in ok}
    best = min(scores.values())
    return next(f for f in ok if scores[f] <= best + TIE)  # ok is in FORMS order
