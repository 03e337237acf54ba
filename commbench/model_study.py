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

import os

from commbench import results as res
from commbench.bench import Case, cadence
from commbench.model_judge import KiB, MiB, judge, last_level_cache, model_markdown, refit
from commbench.runner import hardware, merge_rounds, run_series, sizes_between

__all__ = ["model_study", "run_model", "refit_stored", "stored_fit"]


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
    jobs = [(c, sizes, check) for c in cases
            for sizes, check in ((cal_sizes, False), (eval_sizes, True))]
    if separate:  # every calibration job, then every evaluation job
        groups = [[k for k, j in enumerate(jobs) if not j[2]], [k for k, j in enumerate(jobs) if j[2]]]
    else:
        groups = [list(range(len(jobs)))]
    rounds: list[list[list[dict]]] = [[] for _ in jobs]
    for group in groups:
        for _ in range(repeat):
            for k in group:
                case, sizes, check = jobs[k]
                rounds[k].append(_series(world, transport, case, iters, warmup, sizes, check, batch))
    merged = [merge_rounds(r, world.size) if repeat > 1 else r[0] for r in rounds]
    cal = [r for (_, _, check), rows in zip(jobs, merged) if not check for r in rows]
    ev = [r for (_, _, check), rows in zip(jobs, merged) if check for r in rows]
    return cal, ev


def _as(rows: list[dict], stat: str) -> list[dict]:
    """The rows with ``time_us`` taken from ``stat``: "median" (as measured) or "min"."""
    return rows if stat == "median" else [dict(r, time_us=r["min_us"]) for r in rows]


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


def _stem(out_dir: str, transport: str, n: int) -> str:
    return os.path.join(out_dir, f"model_{hardware()}-{transport}-x{n}")


def _report(record: dict, stem: str | None, emit, prefix: str = "") -> None:
    """Each pair's error on median and best iterations; the record written to ``stem``.*."""
    for acc, bst in zip(record["accuracy"], record["accuracy_min"], strict=True):
        emit(f"# {prefix}{acc['op']}/{acc['algo']}: median error {acc['median_error']:.3f} "
             f"(textbook class model {acc['class_median_error']:.3f}; on best iterations "
             f"{bst['median_error']:.3f})")
    if stem:
        res.write_json(stem + ".json", record)
        res.write_atomic(stem + ".md", model_markdown(record))
        emit(f"# wrote {stem}.json and {stem}.md")


def run_model(a, world, transports: list[str], launch: str, printer: bool, emit) -> int:
    """The ``commbench run model`` study, per transport; writes results/model_*."""
    from commbench.collectives import ALGORITHMS
    from commbench.runner import parse_size

    n = world.size
    ops = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
           "gather", "scatter", "sendrecv"] + (["pingpong"] if n >= 2 else [])
    cases = [(op, algo) for op in ops for algo in ["native"] + [g for o, g in ALGORITHMS if o == op]
             if not (algo == "hierarchical" and n % 2)]
    lo = parse_size(a.minbytes) if a.minbytes != "8" else 4 * KiB
    hi = parse_size(a.maxbytes) if a.maxbytes != "1M" else 64 * MiB
    for transport in transports:
        emit(f"# commbench run model: {n} ranks ({launch}), transport {transport}, "
             f"{lo}..{hi} bytes")
        record = res.header("model", n, launch, hardware(),
                            dict(cadence(a.batch), iters=a.iters, warmup=a.warmup_iters))
        sweeps = "separate" if a.separate_sweeps else "interleaved per case"
        record["measurement"].update(repeat=a.repeat, sweeps=sweeps)
        record.update(model_study(world, transport, cases, a.iters, a.warmup_iters, emit, lo, hi,
                                  a.repeat, a.separate_sweeps, a.batch))
        _report(record, None if a.no_write or not printer else _stem(a.out, transport, n), emit)
    return 0


def refit_stored(a, emit) -> int:
    """``commbench run model --refit``: each stored study of this world size judged again."""
    import json

    found = 0
    for transport in [t for t in a.transport.split(",") if t] or ["gloo", "mpi"]:
        stem = _stem(a.out, transport, a.np)
        if not os.path.exists(stem + ".json"):
            emit(f"# {stem}.json: none stored")
            continue
        with open(stem + ".json") as f:
            record = refit(json.load(f))
        found += 1
        _report(record, None if a.no_write else stem, emit, f"{transport} ")
    return 0 if found else 1


def stored_fit(out_dir: str, transport: str, n: int):
    """The fit a ``commbench run model`` left in ``out_dir`` for this transport and world size."""
    import json

    from commbench.costmodel.alphabeta import Fit

    path = _stem(out_dir, transport, n) + ".json"
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
