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


def _sweep(world, transport, cases, iters, warmup, sizes, repeat: int, check: bool) -> list:
    """Every case at every size, ``repeat`` rounds of the whole sweep, best round per row."""
    quiet = lambda s: None  # noqa: E731
    rounds = [[run_series(world, Case(op, transport, algo, "float32", "sum", 0, iters, warmup,
                                      check), sizes, None, None, quiet) for op, algo in cases]
              for _ in range(repeat)]
    out = []
    for series in zip(*rounds, strict=True):
        out += merge_rounds(list(series), world.size) if repeat > 1 else series[0]
    return out


def model_study(world, transport: str, cases: list[tuple[str, str]], iters: int, warmup: int,
                emit=print, lo: int = 4 * KiB, hi: int = 64 * MiB, repeat: int = 1) -> dict:
    n = world.size
    emit(f"# calibration sweep ({transport}, {n} ranks): {len(cases)} cases, factor 4, "
         f"{repeat} round(s)")
    cal = _sweep(world, transport, cases, iters, warmup, sizes_between(lo, hi, 4), repeat, False)
    model = fit(cal, n)
    for cls, p in model.classes.items():
        emit(f"# {cls}: alpha {p.alpha * 1e6:.2f} us, beta {p.beta * 1e9:.4f} ns/B "
             f"({1 / p.beta / 1e9 if p.beta else float('inf'):.2f} GB/s), gamma "
             f"{p.gamma * 1e9:.4f} ns/B")
    emit(f"# evaluation sweep, factor 2\n#{'op/algo':>28} {'size':>10} {'meas(us)':>10} "
         f"{'pred(us)':>10} {'meas/pred':>9} {'class pred':>10}")
    rows = []
    for r in _sweep(world, transport, cases, iters, warmup, sizes_between(lo, hi, 2), repeat, True):
        op, algo = r["op"], r["algo"]
        r["pred_us"] = model.predict_us(op, algo, n, r["size"])
        r["class_pred_us"] = model.predict_us(op, algo, n, r["size"], per_algo=False)
        r["meas_over_pred"] = r["time_us"] / r["pred_us"] if r["pred_us"] else None
        rows.append(r)
        emit(f" {op + '/' + algo:>28} {r['size']:>10} {r['time_us']:>10.1f} "
             f"{r['pred_us']:>10.1f} {r['meas_over_pred'] or 0:>9.2f} "
             f"{r['class_pred_us']:>10.1f}")
    return {"model": model.as_dict(), "rows": rows, "accuracy": accuracy(rows, cal)}


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
    met = sum(a["median_error"] <= 0.15 for a in acc)
    classes = record["model"]["classes"]
    fitted = "; ".join(f"{k}: alpha {v['alpha'] * 1e6:.2f} us, beta {v['beta'] * 1e9:.4f} ns/B, "
                       f"gamma {v['gamma'] * 1e9:.4f} ns/B" for k, v in classes.items())
    return res.study_markdown(
        record, ["collective", "algorithm", "sizes", "median |pred-meas|/meas",
                 "max", "textbook model (one alpha/beta/gamma per class)",
                 "same size, two sweeps: median |diff|/meas"],
        [[a["op"], a["algo"], a["rows"], f"{a['median_error']:.3f}", f"{a['max_error']:.3f}",
          f"{a['class_median_error']:.3f}",
          f"{a['rerun_difference']:.3f}" if a.get("rerun_difference") is not None else ""]
         for a in acc],
        f"Calibrated on one sweep (4 KiB..64 MiB, factor 4), judged on a second sweep measured "
        f"afterwards (factor 2). Median error <= 0.15 for {met} of {len(acc)} collective/"
        f"algorithm pairs. Class fit: {fitted}. The last column predicts every algorithm from "
        "the class constants alone (lib: the transport's own calls; py: commbench's algorithms "
        "from point-to-point). The last column is the noise floor: the same collective, "
        "algorithm and size measured in both sweeps, minutes apart.")


def run_model(a, world, transports: list[str], launch: str, printer: bool, emit) -> int:
    """The ``commbench run model`` study, per transport; writes results/model_*."""
    import os

    from commbench.collectives import ALGORITHMS
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
                            {"cadence": "isolated (barrier before each iteration)",
                             "rank_aggregation": "per-iteration max over ranks",
                             "statistic": "median", "iters": a.iters, "warmup": a.warmup_iters})
        record["measurement"].update(repeat=a.repeat)
        record.update(model_study(world, transport, cases, a.iters, a.warmup_iters, emit, lo, hi,
                                  a.repeat))
        for acc in record["accuracy"]:
            emit(f"# {acc['op']}/{acc['algo']}: median error {acc['median_error']:.3f} "
                 f"(textbook class model {acc['class_median_error']:.3f})")
            worst = max(worst, acc["median_error"])
        if not a.no_write and printer:
            stem = os.path.join(a.out, f"model_{hardware()}-{transport}-x{n}")
            res.write_json(stem + ".json", record)
            res.write_atomic(stem + ".md", model_markdown(record))
            emit(f"# wrote {stem}.json and {stem}.md")
    return 0


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
