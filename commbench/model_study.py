"""``commbench run model``: calibrate the alpha-beta-gamma model on this machine and transport,
then measure how well it predicts, on a separate sweep it was not fitted to.

With ``--repeat R`` each sweep runs R times over and every row keeps its best round (the
machine's steady state; :func:`commbench.runner.merge_rounds`).

1. Calibration sweep: every collective and algorithm at 4 KiB, 16 KiB, ... 64 MiB (factor 4).
   Fitted from it: one (alpha, beta, gamma) per cost class from ping-pong, the transport's
   all-reduce, commbench's sendrecv and ring all-reduce (the textbook model); and each
   algorithm's own three (its formula's shape, its own constants).
2. Evaluation sweep, measured afterwards: every collective and algorithm at 4 KiB ... 64 MiB
   (factor 2: half of the sizes are new, the others are measured again). Each row gets both
   predictions; the table gives, per collective and algorithm, the median of
   |predicted - measured| / measured.

By default each case's evaluation follows its own calibration at once (a shared machine drifts:
the same point measured minutes apart differs by tens of percent, more than the model's error);
``--separate-sweeps`` runs the whole calibration sweep first, as a stale calibration would be.
Everything is fitted and judged twice: on each row's median iteration and on its best one.

Writes ``results/model_<hw>-<transport>-x<ranks>.json`` (the fit, its residuals, the evaluation
rows) and ``.md``; later ``commbench run`` sweeps read the fit and add ``pred_us`` to each row.
"""

from __future__ import annotations

import statistics

from commbench import results as res
from commbench.bench import Case
from commbench.costmodel.alphabeta import fit
from commbench.runner import merge_rounds, run_series, sizes_between

__all__ = ["model_markdown", "model_study"]
KiB, MiB = 1 << 10, 1 << 20


def _series(world, transport, case, iters, warmup, sizes, check: bool, batch: int) -> list[dict]:
    op, algo = case
    return run_series(world, Case(op, transport, algo, "float32", "sum", 0, iters, warmup, check,
                                  batch=batch), sizes, None, None, lambda s: None)


def _sweeps(world, transport, cases, iters, warmup, lo: int, hi: int, repeat: int,
            separate: bool, batch: int = 1) -> tuple[list[dict], list[dict]]:
    """(calibration rows, evaluation rows); ``repeat`` rounds, best round per row.

    Interleaved (default): each case's calibration sizes, then at once its evaluation sizes,
    round after round, so a case is judged in the machine state it was calibrated in. Separate:
    the whole calibration sweep, then the whole evaluation sweep (minutes apart on a long list).
    """
    cal_sizes, eval_sizes = sizes_between(lo, hi, 4), sizes_between(lo, hi, 2)
    if separate:
        jobs = [[(c, cal_sizes, False) for c in cases], [(c, eval_sizes, True) for c in cases]]
    else:
        jobs = [[job for c in cases for job in ((c, cal_sizes, False), (c, eval_sizes, True))]]
    done: dict[int, list[list[dict]]] = {}
    order = [job for group in jobs for job in group]
    for group in jobs:
        for _ in range(repeat):
            for job in group:
                done.setdefault(order.index(job), []).append(
                    _series(world, transport, job[0], iters, warmup, job[1], job[2], batch))
    merged = [merge_rounds(done[k], world.size) if repeat > 1 else done[k][0]
              for k in range(len(order))]
    cal = [r for k, job in enumerate(order) if not job[2] for r in merged[k]]
    ev = [r for k, job in enumerate(order) if job[2] for r in merged[k]]
    return cal, ev


def _as(rows: list[dict], stat: str) -> list[dict]:
    """The rows with ``time_us`` taken from ``stat``: "median" (as measured) or "min"."""
    return rows if stat == "median" else [dict(r, time_us=r["min_us"]) for r in rows]


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


def model_study(world, transport: str, cases: list[tuple[str, str]], iters: int, warmup: int,
                emit=print, lo: int = 4 * KiB, hi: int = 64 * MiB, repeat: int = 1,
                separate: bool = False, batch: int = 1) -> dict:
    """Both sweeps, and the model fitted and judged twice from them: on each row's median
    iteration (``model``, ``accuracy``) and on its best (``model_min``, ``accuracy_min``)."""
    n = world.size
    emit(f"# calibration (factor 4) and evaluation (factor 2) sweeps ({transport}, {n} ranks): "
         f"{len(cases)} cases, {repeat} round(s), {'separate' if separate else 'interleaved'}")
    cal, ev = _sweeps(world, transport, cases, iters, warmup, lo, hi, repeat, separate, batch)
    out = judge(cal, _as(cal, "min"), ev, n, last_level_cache())
    for cls, p in out["model"]["classes"].items():
        emit(f"# {cls}: alpha {p['alpha'] * 1e6:.2f} us, beta {p['beta'] * 1e9:.4f} ns/B, gamma "
             f"{p['gamma'] * 1e9:.4f} ns/B")
    emit(f"# evaluation\n#{'op/algo':>28} {'size':>10} {'meas(us)':>10} "
         f"{'pred(us)':>10} {'meas/pred':>9} {'best(us)':>10} {'pred best':>10}")
    for r in out["rows"]:
        emit(f" {r['op'] + '/' + r['algo']:>28} {r['size']:>10} {r['time_us']:>10.1f} "
             f"{r['pred_us']:>10.1f} {r['meas_over_pred'] or 0:>9.2f} "
             f"{r['min_us']:>10.1f} {r['pred_min_us']:>10.1f}")
    return out


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
    import datetime

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


def run_model(a, world, transports: list[str], launch: str, printer: bool, emit) -> int:
    """The ``commbench run model`` study, per transport; writes results/model_*."""
    import os

    from commbench.collectives import ALGORITHMS
    from commbench.run_cmd import cadence
    from commbench.runner import hardware, parse_size

    n = world.size
    ops = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
           "gather", "scatter", "sendrecv"] + (["pingpong"] if n >= 2 else [])
    cases = [(op, algo) for op in ops for algo in ["native"] + [g for o, g in ALGORITHMS if o == op]
             if not (algo == "hierarchical" and n % 2)]
    lo = parse_size(a.minbytes) if a.minbytes != "8" else 4 * KiB
    hi = parse_size(a.maxbytes) if a.maxbytes != "1M" else 64 * MiB
    worst = 0.0
    for transport in transports:
        emit(f"# commbench run model: {n} ranks ({launch}), transport {transport}, "
             f"{lo}..{hi} bytes")
        record = res.header("model", n, launch, hardware(),
                            dict(cadence(a.batch), iters=a.iters, warmup=a.warmup_iters))
        sweeps = "separate" if a.separate_sweeps else "interleaved per case"
        record["measurement"].update(repeat=a.repeat, sweeps=sweeps)
        record.update(model_study(world, transport, cases, a.iters, a.warmup_iters, emit, lo, hi,
                                  a.repeat, a.separate_sweeps, a.batch))
        for acc, bst in zip(record["accuracy"], record["accuracy_min"], strict=True):
            emit(f"# {acc['op']}/{acc['algo']}: median error {acc['median_error']:.3f} "
                 f"(textbook class model {acc['class_median_error']:.3f}; on best iterations "
                 f"{bst['median_error']:.3f})")
            worst = max(worst, acc["median_error"])
        if not a.no_write and printer:
            stem = os.path.join(a.out, f"model_{hardware()}-{transport}-x{n}")
            res.write_json(stem + ".json", record)
            res.write_atomic(stem + ".md", model_markdown(record))
            emit(f"# wrote {stem}.json and {stem}.md")
    return 0


def refit_stored(a, emit) -> int:
    """``commbench run model --refit``: each stored study of this world size judged again."""
    import json
    import os

    from commbench.runner import hardware

    transports = [t for t in a.transport.split(",") if t] or ["gloo", "mpi"]
    found = 0
    for transport in transports:
        stem = os.path.join(a.out, f"model_{hardware()}-{transport}-x{a.np}")
        if not os.path.exists(stem + ".json"):
            emit(f"# {stem}.json: none stored")
            continue
        with open(stem + ".json") as f:
            record = refit(json.load(f))
        found += 1
        for acc, bst in zip(record["accuracy"], record["accuracy_min"], strict=True):
            emit(f"# {transport} {acc['op']}/{acc['algo']}: median error "
                 f"{acc['median_error']:.3f} (on best iterations {bst['median_error']:.3f})")
        if not a.no_write:
            res.write_json(stem + ".json", record)
            res.write_atomic(stem + ".md", model_markdown(record))
            emit(f"# wrote {stem}.json and {stem}.md")
    return 0 if found else 1


def stored_fit(out_dir: str, transport: str, n: int):
    """The fit a ``commbench run model`` left in ``out_dir`` for this transport and world size."""
    import json
    import os

    from commbench.costmodel.alphabeta import Fit
    from commbench.runner import hardware

    path = os.path.join(out_dir, f"model_{hardware()}-{transport}-x{n}.json")
    if not os.path.exists(path):
        return None, path
    with open(path) as f:
        return Fit.from_dict(json.load(f)["model"]), path


def annotate(rows: list[dict], model, n: int, topo=None, version: str = "2.30.7") -> None:
    """Add the calibrated model's time (``pred_us``, ``meas_over_pred``) and, with a topology,
    NCCL's model of the same collective and size on n GPUs of that machine (``nccl_pred_us``)."""
    from commbench.costmodel.alphabeta import terms
    from commbench.costmodel.nccl import OPS, nccl_predict

    sub = None
    if topo is not None:
        here = min(n, topo.gpus_per_node)
        sub = topo.part(-(-n // here), here)
    for r in rows:
        if model is not None:
            try:
                terms(r["op"], r["algo"], n, r["size"])
            except ValueError:
                continue
            r["pred_us"] = model.predict_us(r["op"], r["algo"], n, r["size"])
            r["meas_over_pred"] = r["time_us"] / r["pred_us"] if r["pred_us"] else None
        if sub is not None and r["op"] in OPS:
            r["nccl_pred_us"] = nccl_predict(r["op"], r["size"], sub, version).time_us
