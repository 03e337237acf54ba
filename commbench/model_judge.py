"""Judging the calibrated model: fit on calibration rows, predict evaluation rows, score both.

Used by the ``commbench run model`` study (:mod:`commbench.model_study`), which measures, and by
``--refit``, which judges a stored study again with the current model.
"""

from __future__ import annotations

import datetime
import statistics

from commbench import results as res
from commbench.costmodel.alphabeta import Curve, fit

__all__ = ["accuracy", "form_ceiling", "judge", "last_level_cache", "low", "model_markdown", "refit"]
KiB, MiB = 1 << 10, 1 << 20


def last_level_cache(default: int = 32 * MiB) -> int:
    """Bytes of this machine's largest CPU cache (Linux sysfs), the model's knee."""
    import glob

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


def judge(cal: list[dict], cal_low: list[dict], ev: list[dict], n: int, knee: float) -> dict:
    """Fit on the calibration rows (median and lower-decile iterations), predict every
    evaluation row, and score both: the study's record fields."""
    models = {"median": fit(cal, n, knee=knee), "low": fit(cal_low, n, knee=knee)}
    rows = []
    for r in ev:
        op, algo, size = r["op"], r["algo"], r["size"]
        r = dict(r, pred_us=models["median"].predict_us(op, algo, n, size),
                 class_pred_us=models["median"].predict_us(op, algo, n, size, per_algo=False),
                 pred_low_us=models["low"].predict_us(op, algo, n, size),
                 class_pred_low_us=models["low"].predict_us(op, algo, n, size, per_algo=False))
        r["meas_over_pred"] = r["time_us"] / r["pred_us"] if r["pred_us"] else None
        rows.append(r)
    lows = [dict(r, pred_us=r["pred_low_us"], class_pred_us=r["class_pred_low_us"])
            for r in low(rows)]
    stat = "p10" if all("p10_us" in r for r in ev) else "min"
    acc = accuracy(rows, cal)
    curve = models["median"].curve  # the ping-pong curve of the calibration rows
    for a in acc:
        mine = [r for r in ev if (r["op"], r["algo"]) == (a["op"], a["algo"])]
        a["form_ceiling"] = form_ceiling(mine, n, knee, curve)
    return {"model": models["median"].as_dict(), "model_low": models["low"].as_dict(),
            "low_statistic": stat, "rows": rows, "accuracy": acc,
            "accuracy_low": accuracy(lows, cal_low)}


def form_ceiling(rows: list[dict], n: int, knee: float, curve: Curve | None) -> float | None:
    """The least median error any of the model's forms reaches when fitted to ``rows``
    themselves (one collective and algorithm's evaluation rows): not a prediction, a bound on
    what the forms can follow. The model's own error far above it is calibration noise; near
    it, the form is what misses. None with too few rows to fit."""
    from commbench.costmodel.forms import FORMS, predictor, usable

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

    ev = [{k: v for k, v in r.items() if not k.startswith(("pred", "class_pred", "meas_over"))}
          for r in record["rows"]]
    out = {k: v for k, v in record.items() if k not in ("model_min", "accuracy_min")}
    lows = cal(record.get("model_low") or record["model_min"])  # model_min: before p10_us
    out.update(judge(cal(record["model"]), lows, ev, record["world_size"], last_level_cache()))
    out["refit"] = {"created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                    "commit": res.git_commit()}
    return out


def _err(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas


def accuracy(rows: list[dict], cal: list[dict]) -> list[dict]:
    """Per collective and algorithm: the model's median error on the evaluation sweep, the
    textbook class model's, and the noise floor: how far the same size measured in the two
    sweeps differs (median |evaluation - calibration| / evaluation)."""
    first = {(r["op"], r["algo"], r["size"]): r["time_us"] for r in cal}
    out = []
    for key in sorted({(r["op"], r["algo"]) for r in rows}):
        mine = [r for r in rows if (r["op"], r["algo"]) == key]
        errs = [_err(r["pred_us"], r["time_us"]) for r in mine]
        cls = [_err(r["class_pred_us"], r["time_us"]) for r in mine]
        again = [_err(first[k], r["time_us"]) for r in mine
                 if (k := (r["op"], r["algo"], r["size"])) in first]
        out.append({"op": key[0], "algo": key[1], "rows": len(mine),
                    "median_error": statistics.median(errs), "max_error": max(errs),
                    "class_median_error": statistics.median(cls),
                    "rerun_difference": statistics.median(again) if again else None})
    return out


def model_markdown(record: dict) -> str:
    acc = record["accuracy"]
    stat = record.get("low_statistic", "min")
    name = {"p10": "lower decile", "min": "best iteration"}[stat]
    lows = {(x["op"], x["algo"]): x
           for x in record.get("accuracy_low", record.get("accuracy_min", []))}
    met = sum(a["median_error"] <= 0.15 for a in acc)
    met_low = sum(x["median_error"] <= 0.15 for x in lows.values())
    classes = record["model"]["classes"]
    fitted = "; ".join(f"{k}: alpha {v['alpha'] * 1e6:.2f} us, beta {v['beta'] * 1e9:.4f} ns/B, "
                       f"gamma {v['gamma'] * 1e9:.4f} ns/B" for k, v in classes.items())

    again = record.get("refit")
    refit = (f"Fitted and judged again from the stored measurements on {again['created']} "
             f"(commit {again['commit']}): `commbench run model --refit`. ") if again else ""
    sweeps = record["measurement"].get("sweeps", "separate")
    if sweeps == "interleaved per size":
        sweeps += ": each evaluation row measured right after the calibration row of its case "
        sweeps += "and size, or between two of them"
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

    def f(x, key):
        return "" if x is None or x.get(key) is None else f"{x[key]:.3f}"

    own = record["model"].get("algorithms", {})
    above = record["model"].get("above", {})

    def form(a) -> str:
        key = f"{a['op']}/{a['algo']}"
        p, hi = own.get(key), above.get(key)
        if p is None:
            return ""
        kind = "curve" if max(p.get("scale", 0), (hi or {}).get("scale", 0)) > 0 else "line"
        return f"{kind}, split at {_size(hi['from_bytes'])}" if hi else kind

    cells = [[a["op"], a["algo"], form(a), a["rows"], f(a, "median_error"), f(a, "max_error"),
              f(a, "class_median_error"), f(a, "rerun_difference"), f(a, "form_ceiling"),
              f(lows.get((a["op"], a["algo"])), "median_error"),
              f(lows.get((a["op"], a["algo"])), "class_median_error"),
              f(lows.get((a["op"], a["algo"])), "rerun_difference")] for a in acc]
    return res.study_markdown(
        record, ["collective", "algorithm", "form", "sizes", "median |pred-meas|/meas", "max",
                 "textbook model", "noise floor", "forms fitted to these rows",
                 f"{name}: median |pred-meas|/meas",
                 f"{name}: textbook", f"{name}: noise floor"], cells,
        f"Calibrated on one sweep (4 KiB..64 MiB, factor 4{dense}), judged on a second sweep "
        f"(factor 2; sweeps: {sweeps}). "
        f"{refit}"
        f"Each row's time is the median over iterations (of the per-iteration maximum over "
        f"ranks); the model is also fitted and judged a second time on each row's {name} (the "
        f"last three columns): interference from other tenants of the machine only lengthens "
        f"iterations, so the low end of the distribution is the repeatable part.{iters} Median "
        f"error <= 0.15 for {met} of {len(acc)} collective/algorithm pairs on median times, "
        f"{met_low} of {len(lows)} on {name} times. Class fit (median times): {fitted}. "
        "'textbook model' predicts every algorithm from the class constants alone (lib: the "
        "transport's own calls; py: commbench's algorithms from point-to-point); each "
        "algorithm's own fit prices its messages by a straight line or by ping-pong's measured "
        "curve, once or in two regimes split at a size ('form': whichever predicted its own "
        "calibration rows best, each left out in turn) and adds delta per byte for calls from "
        "a knee at the last-level cache on "
        f"({record['model'].get('knee_bytes', 0) / MiB:g} MiB). 'noise floor': the same "
        "collective, algorithm and size measured in both sweeps: median |diff|/meas. 'forms "
        "fitted to these rows': the least median error any form reaches fitted to the "
        "evaluation rows themselves, a bound on what the forms can follow, not a prediction.")


def _size(b: float) -> str:
    """A break size for the table: the nearest KiB or MiB."""
    return f"{b / MiB:.0f} MiB" if b >= MiB else f"{b / KiB:.0f} KiB"
