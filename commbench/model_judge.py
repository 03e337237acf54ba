"""Judging the calibrated model: fit on calibration rows, predict evaluation rows, score both.

Used by the ``commbench run model`` study (:mod:`commbench.model_study`), which measures, and by
``--refit``, which judges a stored study again with the current model.
"""

from __future__ import annotations

import datetime
import statistics

from commbench import results as res
from commbench.costmodel.alphabeta import fit

__all__ = ["accuracy", "judge", "last_level_cache", "model_markdown", "refit"]
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


def judge(cal: list[dict], cal_min: list[dict], ev: list[dict], n: int, knee: float) -> dict:
    """Fit on the calibration rows (median and best iterations), predict every evaluation row,
    and score both: the study's record fields."""
    models = {"median": fit(cal, n, knee=knee), "min": fit(cal_min, n, knee=knee)}
    rows = []
    for r in ev:
        op, algo, size = r["op"], r["algo"], r["size"]
        r = dict(r, pred_us=models["median"].predict_us(op, algo, n, size),
                 class_pred_us=models["median"].predict_us(op, algo, n, size, per_algo=False),
                 pred_min_us=models["min"].predict_us(op, algo, n, size),
                 class_pred_min_us=models["min"].predict_us(op, algo, n, size, per_algo=False))
        r["meas_over_pred"] = r["time_us"] / r["pred_us"] if r["pred_us"] else None
        rows.append(r)
    best = [dict(r, time_us=r["min_us"], pred_us=r["pred_min_us"],
                 class_pred_us=r["class_pred_min_us"]) for r in rows]
    return {"model": models["median"].as_dict(), "model_min": models["min"].as_dict(),
            "rows": rows, "accuracy": accuracy(rows, cal), "accuracy_min": accuracy(best, cal_min)}


def refit(record: dict) -> dict:
    """A stored study judged again with the current model: its calibration rows (kept as the
    per-algorithm fits' residuals) and evaluation rows, nothing measured anew."""
    def cal(model: dict) -> list[dict]:
        return [{"op": r["op"], "algo": r["algo"], "size": r["size"], "time_us": r["measured_us"]}
                for r in model["residuals"] if "/" in r["fit"]]

    ev = [{k: v for k, v in r.items() if not k.startswith(("pred", "class_pred", "meas_over"))}
          for r in record["rows"]]
    out = dict(record)
    out.update(judge(cal(record["model"]), cal(record["model_min"]), ev, record["world_size"],
                     last_level_cache()))
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
    best = {(x["op"], x["algo"]): x for x in record.get("accuracy_min", [])}
    met = sum(a["median_error"] <= 0.15 for a in acc)
    met_best = sum(x["median_error"] <= 0.15 for x in best.values())
    classes = record["model"]["classes"]
    fitted = "; ".join(f"{k}: alpha {v['alpha'] * 1e6:.2f} us, beta {v['beta'] * 1e9:.4f} ns/B, "
                       f"gamma {v['gamma'] * 1e9:.4f} ns/B" for k, v in classes.items())

    again = record.get("refit")
    refit = (f"Fitted and judged again from the stored measurements on {again['created']} "
             f"(commit {again['commit']}): `commbench run model --refit`. ") if again else ""

    def f(x, key):
        return "" if x is None or x.get(key) is None else f"{x[key]:.3f}"

    cells = [[a["op"], a["algo"], a["rows"], f(a, "median_error"), f(a, "max_error"),
              f(a, "class_median_error"), f(a, "rerun_difference"),
              f(best.get((a["op"], a["algo"])), "median_error"),
              f(best.get((a["op"], a["algo"])), "class_median_error"),
              f(best.get((a["op"], a["algo"])), "rerun_difference")] for a in acc]
    return res.study_markdown(
        record, ["collective", "algorithm", "sizes", "median |pred-meas|/meas", "max",
                 "textbook model", "noise floor", "best iteration: median |pred-meas|/meas",
                 "best: textbook", "best: noise floor"], cells,
        f"Calibrated on one sweep (4 KiB..64 MiB, factor 4), judged on a second sweep measured "
        f"afterwards (factor 2; sweeps: {record['measurement'].get('sweeps', 'separate')}). "
        f"{refit}"
        f"Each row's time is the median over iterations (of the "
        f"per-iteration maximum over ranks); the model is also fitted and judged a second time "
        f"on each row's best iteration (the last three columns), which interference from other "
        f"tenants of the machine can only lengthen. Median error <= 0.15 for {met} of "
        f"{len(acc)} collective/algorithm pairs on median times, {met_best} of {len(best)} on "
        f"best times. Class fit (median times): {fitted}. 'textbook model' predicts every "
        "algorithm from the class constants alone (lib: the transport's own calls; py: "
        "commbench's algorithms from point-to-point); each algorithm's own fit adds delta, per "
        f"byte beyond a knee at the last-level cache ({record['model'].get('knee_bytes', 0) / MiB:g}"
        " MiB). 'noise floor': the same collective, algorithm and size measured in both "
        "sweeps: median |diff|/meas.")
