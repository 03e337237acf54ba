"""Judging the calibrated model: fit on calibration rows, predict evaluation rows, score both.

Used by the ``commbench run model`` study (:mod:`commbench.studies.model`), which measures, and by
``--refit``, which judges a stored study again with the current model.
"""

from __future__ import annotations

import datetime
import glob
import statistics

from commbench.costmodel.alphabeta import Curve, Fit
from commbench.costmodel.fitting import fit
from commbench.costmodel.forms import FORMS, predictor, usable
from commbench.results import records as res

__all__ = ["accuracy", "form_ceiling", "judge_model", "last_level_cache", "low", "model_markdown",
           "pairs_met", "refit"]
KiB, MiB = 1 << 10, 1 << 20
TARGET = 0.15  # the bound on each pair's median |pred - meas| / meas
# a record's measurement["evaluation"] when its evaluation holds only sizes the fit never saw
# (records without it measured calibration sizes again)
HELD_OUT = "held-out sizes"


def last_level_cache(default: int = 32 * MiB) -> int:
    """Bytes of this machine's largest CPU cache (Linux sysfs), the model's knee."""

    best = 0
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        unit = {"K": KiB, "M": MiB}.get(text[-1:], 1)
        digits = text.rstrip("KM")
        if digits.isdigit():
            best = max(best, int(digits) * unit)
    return best or default


def low(rows: list[dict]) -> list[dict]:
    """The rows with ``time_us`` taken from their lower decile (``p10_us``; stored studies from
    before it was recorded: their best iteration, ``min_us``)."""
    return [dict(r, time_us=r.get("p10_us", r["min_us"])) for r in rows]


def judge_model(cal: list[dict], cal_low: list[dict], ev: list[dict], n: int, knee: float) -> dict:
    """Fit on the calibration rows (median and lower-decile iterations), predict every
    evaluation row, and score both: the study's record fields. The model judged is each
    algorithm's line corrected by its residuals (:mod:`commbench.costmodel.correction`); the
    uncorrected forms (:mod:`commbench.costmodel.forms`) are scored beside it."""
    models = {"median": fit(cal, n, knee=knee, forms=("line",), correct=True),
              "low": fit(cal_low, n, knee=knee, forms=("line",), correct=True)}
    forms = fit(cal, n, knee=knee)
    rows = []
    for r in ev:
        op, algo, size = r["op"], r["algo"], r["size"]
        r = dict(r, pred_us=models["median"].predict_us(op, algo, n, size),
                 class_pred_us=models["median"].predict_us(op, algo, n, size, per_algo=False),
                 forms_pred_us=forms.predict_us(op, algo, n, size),
                 pred_low_us=models["low"].predict_us(op, algo, n, size),
                 class_pred_low_us=models["low"].predict_us(op, algo, n, size, per_algo=False))
        r["meas_over_pred"] = r["time_us"] / r["pred_us"] if r["pred_us"] else None
        rows.append(r)
    lows = [{k: v for k, v in r.items() if k != "forms_pred_us"}
            | {"pred_us": r["pred_low_us"], "class_pred_us": r["class_pred_low_us"]}
            for r in low(rows)]
    stat = "p10" if all("p10_us" in r for r in ev) else "min"
    acc = accuracy(rows, cal)
    curve = forms.curve  # the ping-pong curve of the calibration rows
    for a in acc:
        mine = [r for r in ev if (r["op"], r["algo"]) == (a["op"], a["algo"])]
        a["form_ceiling"] = form_ceiling(mine, n, knee, curve)
        a["form"] = form_name(forms, f"{a['op']}/{a['algo']}")
    return {"model": models["median"].as_dict(), "model_low": models["low"].as_dict(),
            "low_statistic": stat, "rows": rows, "accuracy": acc,
            "accuracy_low": accuracy(lows, cal_low)}


def form_name(model: Fit, key: str) -> str:
    """How ``model`` fits one algorithm: line or curve, split at a size or not."""
    p, hi = (model.algos or {}).get(key), (model.above or {}).get(key)
    if p is None:
        return ""
    kind = "curve" if max(p.scale, hi[1].scale if hi else 0.0) > 0 else "line"
    return f"{kind}, split at {_size(hi[0])}" if hi else kind


def form_ceiling(rows: list[dict], n: int, knee: float, curve: Curve | None) -> float | None:
    """The least median error any of the model's forms reaches when fitted to ``rows``
    themselves (one collective and algorithm's evaluation rows): not a prediction, a bound on
    what the forms can follow. The model's own error far above it is calibration noise; near
    it, the form is what misses. None with too few rows to fit."""

    if len(rows) < 3 + bool(knee):
        return None
    best = None
    for form in usable(FORMS, len(rows), curve):
        pred = predictor(rows, n, knee, curve, form)
        err = statistics.median(_err(pred(r["size"]), r["time_us"]) for r in rows)
        best = err if best is None else min(best, err)
    return best


def refit(record: dict) -> dict:
    """A stored study judged again with the current model: its calibration rows (kept as the
    per-algorithm fits' residuals) and evaluation rows, nothing measured anew."""
    def cal(model: dict) -> list[dict]:
        return [{"op": r["op"], "algo": r["algo"], "size": r["size"], "time_us": r["measured_us"]}
                for r in model["residuals"] if "/" in r["fit"]]

    ev = [{k: v for k, v in r.items() if not k.startswith(("pred", "class_pred", "forms_pred", "meas_over"))}
          for r in record["rows"]]
    out = {k: v for k, v in record.items() if k not in ("model_min", "accuracy_min")}
    lows = cal(record.get("model_low") or record["model_min"])  # model_min: before p10_us
    out.update(judge_model(cal(record["model"]), lows, ev, record["world_size"], last_level_cache()))
    out["refit"] = {"created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                    "commit": res.git_commit()}
    return out


def _err(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas


def accuracy(rows: list[dict], cal: list[dict]) -> list[dict]:
    """Per collective and algorithm: the model's median error on the evaluation sweep (on all
    its sizes, and on those with no calibration row: the new sizes), the uncorrected forms'
    and the textbook class model's, and the noise floor: how far the same size measured twice
    differs (in both sweeps, median |evaluation - calibration| / evaluation; else in several
    passes, median (slowest - fastest pass) / pooled; None when nothing was measured twice)."""
    first = {(r["op"], r["algo"], r["size"]): r["time_us"] for r in cal}
    out = []
    for key in sorted({(r["op"], r["algo"]) for r in rows}):
        mine = [r for r in rows if (r["op"], r["algo"]) == key]
        errs = [_err(r["pred_us"], r["time_us"]) for r in mine]
        new = [_err(r["pred_us"], r["time_us"]) for r in mine
               if (r["op"], r["algo"], r["size"]) not in first]
        cls = [_err(r["class_pred_us"], r["time_us"]) for r in mine]
        again = [_err(first[k], r["time_us"]) for r in mine
                 if (k := (r["op"], r["algo"], r["size"])) in first]
        again = again or [(max(p) - min(p)) / r["time_us"] for r in mine
                          if len(p := r.get("passes_us") or []) > 1 and r["time_us"] > 0]
        out.append({"op": key[0], "algo": key[1], "rows": len(mine),
                    "median_error": statistics.median(errs), "max_error": max(errs),
                    "new_sizes": len(new),
                    "new_median_error": statistics.median(new) if new else None,
                    "class_median_error": statistics.median(cls),
                    "rerun_difference": statistics.median(again) if again else None})
        if all("forms_pred_us" in r for r in mine):
            out[-1]["forms_median_error"] = statistics.median(
                _err(r["forms_pred_us"], r["time_us"]) for r in mine)
    return out


def model_markdown(record: dict) -> str:
    acc = record["accuracy"]
    stat = record.get("low_statistic", "min")
    name = {"p10": "lower decile", "min": "best iteration"}[stat]
    lows = {(x["op"], x["algo"]): x
           for x in record.get("accuracy_low", record.get("accuracy_min", []))}
    met = pairs_met(record)
    classes = record["model"]["classes"]
    fitted = "; ".join(f"{k}: alpha {v['alpha'] * 1e6:.2f} us, beta {v['beta'] * 1e9:.4f} ns/B, "
                       f"gamma {v['gamma'] * 1e9:.4f} ns/B" for k, v in classes.items())

    again = record.get("refit")
    refit = (f"Fitted and judged again from the stored measurements on {again['created']} "
             f"(commit {again['commit']}): `commbench run model --refit`. ") if again else ""
    sweeps = record["measurement"].get("sweeps", "separate")
    held = record["measurement"].get("evaluation") == HELD_OUT
    if sweeps == "interleaved per size":
        sweeps += (": each evaluation row measured right after its case's calibration row of "
                   "the next smaller size" if held else ": each evaluation row measured right "
                   "after the calibration row of its case and size, or between two of them")
    curve = record["model"].get("curve")
    dense = (f"; ping-pong from {curve[0][0]:.0f} B by factor sqrt(2), the point-to-point "
             "curve") if curve else ""
    iters = record["measurement"].get("iters_by_size")
    iters = f" Iterations per row: {iters}." if iters else ""
    passes = record["measurement"].get("passes", 1)
    if passes > 1:
        iters += (f" Each row's iterations were split among {passes} passes over the whole list "
                  "of rows (minutes apart; a row's share rounded up) and pooled, so that slow "
                  "spells of the shared machine fall on every row alike.")

    judged = ("the sizes between the calibration sizes, none measured twice" if held else
              "factor 2: half its sizes new, half calibration sizes measured again")
    floor = ("the same row measured in several passes: median (slowest - fastest pass) / "
             "pooled; blank with one pass" if held else "the same collective, algorithm and "
             "size measured in both sweeps: median |diff|/meas")

    def f(x, key):
        return "" if x is None or x.get(key) is None else f"{x[key]:.3f}"

    stored = Fit.from_dict(record["model"])

    def form(a) -> str:  # records from before the correction: the model's own form
        return a["form"] if "form" in a else form_name(stored, f"{a['op']}/{a['algo']}")

    corrected = bool(record["model"].get("corrections"))
    cells = [[a["op"], a["algo"], a["rows"], f(a, "median_error"), f(a, "new_median_error"),
              f(a, "max_error"), form(a), f(a, "forms_median_error"),
              f(a, "class_median_error"), f(a, "rerun_difference"), f(a, "form_ceiling"),
              f(lows.get((a["op"], a["algo"])), "median_error"),
              f(lows.get((a["op"], a["algo"])), "class_median_error"),
              f(lows.get((a["op"], a["algo"])), "rerun_difference")] for a in acc]
    how = ("The model judged: each algorithm's own alpha-beta-gamma line (alpha per message, "
           "beta per byte sent, gamma per byte reduced, delta per byte for calls from a knee at "
           f"the last-level cache on, {record['model'].get('knee_bytes', 0) / MiB:g} MiB) fitted "
           "to its calibration rows, times its residual ratio (measured / line) interpolated "
           "between the two nearest calibration sizes (log-log): the line gives the shape "
           "between them, the ratios the library's own switches of algorithm or protocol and "
           "cache effects that no line follows. At a calibration size it returns that row's "
           "measurement, " + ("so every evaluation row is a size it predicts. " if held else
           "so evaluation sizes measured in both sweeps are judged against a re-measurement "
           "(their error is the noise floor); 'new sizes' are the evaluation sizes with no "
           "calibration row, where it predicts. ") if corrected else "")
    return res.study_markdown(
        record, ["collective", "algorithm", "sizes", "median |pred-meas|/meas", "new sizes",
                 "max", "uncorrected form", "uncorrected: median", "textbook model",
                 "noise floor", "forms fitted to these rows",
                 f"{name}: median |pred-meas|/meas",
                 f"{name}: textbook", f"{name}: noise floor"], cells,
        f"Calibrated on one sweep (4 KiB..64 MiB, factor 4{dense}), judged on a second sweep "
        f"({judged}; sweeps: {sweeps}). "
        f"{refit}"
        f"Each row's time is the median over iterations (of the per-iteration maximum over "
        f"ranks); the model is also fitted and judged a second time on each row's {name} (the "
        f"last three columns): interference from other tenants of the machine only lengthens "
        f"iterations, so the low end of the distribution is the repeatable part.{iters} Median "
        f"error <= {TARGET} for {met['all'][0]} of {met['all'][1]} collective/algorithm pairs on "
        f"median times ({met['new'][0]} of {met['new'][1]} on new sizes alone), "
        f"{met['low'][0]} of {met['low'][1]} on {name} times. {how}Class fit (median times): {fitted}. "
        "'textbook model' predicts every algorithm from the class constants alone (lib: the "
        "transport's own calls; py: commbench's algorithms from point-to-point). 'uncorrected': "
        "each algorithm's own fit without the ratios, pricing its messages by a straight line "
        "or by ping-pong's measured curve, once or in two regimes split at a size (the 'form' "
        "that predicted its own calibration rows best, each left out in turn). 'noise floor': "
        f"{floor}. "
        "'forms fitted to these rows': the least median error any uncorrected form reaches "
        "fitted to the evaluation rows themselves, a bound on what the forms can follow, not a "
        "prediction.")


def pairs_met(record: dict) -> dict[str, tuple[int, int]]:
    """Pairs within :data:`TARGET`, (met, of): on all evaluation sizes (``all``), on the new
    sizes alone (``new``), on the lower-decile fit (``low``) and, where scored, by the
    uncorrected forms (``forms``)."""
    acc = record["accuracy"]
    lows = record.get("accuracy_low", record.get("accuracy_min", []))

    def count(rows, key):
        mine = [a[key] for a in rows if a.get(key) is not None]
        return sum(e <= TARGET for e in mine), len(mine)

    out = {"all": count(acc, "median_error"), "new": count(acc, "new_median_error"),
           "low": count(lows, "median_error")}
    if all("forms_median_error" in a for a in acc):
        out["forms"] = count(acc, "forms_median_error")
    return out


def _size(b: float) -> str:
    """A break size for the table: the nearest KiB or MiB."""
    return f"{b / MiB:.0f} MiB" if b >= MiB else f"{b / KiB:.0f} KiB"
