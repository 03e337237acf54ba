"""``commbench run model``: calibrate the alpha-beta-gamma model on this machine and transport,
then measure how well it predicts, on sizes it was not fitted to.

The study measures the rows that inform the fit and the judgement, and no others: every
calibration size, and as evaluation only sizes the fit never saw (:func:`held_out`); each row
once (``-n 10 -w 2``, more iterations below 4 MiB, :func:`iters_for`). A calibration size
measured again would judge the fit on its own points, at the price of the big rows (32 and
64 MiB), which dominate the study's time.

``--rounds P`` splits each row's iterations among P passes over the whole list of rows, minutes
apart, and pools them (:func:`commbench.studies.sweep.pool_passes`): a slow spell of the shared
machine then falls on a share of every row rather than on all of a few, and the passes' spread is
the noise floor each error is reported beside. With ``--repeat R`` instead each sweep runs R
times over and every row keeps its best round (the machine's steady state;
:func:`commbench.studies.sweep.merge_rounds`). ``--cal-samples K`` gives the calibration rows K
times the evaluation rows' iterations (a less noisy fit, at that cost).

1. Calibration sweep: every collective and algorithm at 4 KiB, 16 KiB, ... 64 MiB (factor 4);
   ping-pong densely, from 256 B by factor sqrt(2) (the point-to-point curve).
   Fitted from it: one (alpha, beta, gamma) per cost class from ping-pong, the transport's
   all-reduce, commbench's sendrecv and ring all-reduce (the textbook model); and each
   algorithm's own constants, its messages priced by a straight line (beta) or by ping-pong's
   curve, whichever predicts its held-out calibration rows better
   (:func:`commbench.costmodel.fitting.fit`).
2. Evaluation sweep: every collective and algorithm at the factor-2 sizes between its
   calibration sizes (8 KiB, 32 KiB, ... 32 MiB); ping-pong a quarter-octave off its curve's
   points. Each row gets both predictions; the table gives, per collective and algorithm, the
   median of |predicted - measured| / measured.

By default each evaluation row follows its case's calibration row of the next smaller size at
once (a shared machine drifts: the same point measured minutes apart differs by tens of
percent, more than the model's error); ``--separate-sweeps`` runs the whole calibration sweep
first, as a stale calibration would be.
Everything is fitted and judged twice: on each row's median iteration and on its lower decile
(rows below 4 MiB get up to 4x the iterations, :func:`iters_for`, so that it has samples).

Writes ``results/model_<hw>-<transport>-x<ranks>.json`` (the fit, its residuals, the evaluation
rows) and ``.md``; later ``commbench run`` sweeps read the fit and add ``pred_us`` to each row.
"""

from __future__ import annotations

import os

from commbench.collectives import ALGORITHMS, algorithms_of
from commbench.collectives.compiled.waiting import recorded
from commbench.collectives.measure import Case, cadence, placement
from commbench.costmodel.alphabeta import Fit, terms
from commbench.costmodel.nccl import OPS as MODELLED
from commbench.costmodel.nccl import nccl_predict
from commbench.names import COLLECTIVES, sizes_between
from commbench.ops import OPS
from commbench.results import records as res
from commbench.results.files import RESULTS_LIMIT, read_json
from commbench.results.pieces import or_none, study_pieces
from commbench.studies.model_judge import (
    HELD_OUT,
    TARGET,
    KiB,
    MiB,
    judge_model,
    last_level_cache,
    low,
    model_markdown,
    pairs_met,
    refit,
)
from commbench.studies.settings import StudySettings
from commbench.studies.sweep import merge_rounds, pool_passes, run_series

__all__ = ["model_study", "run_model", "refit_stored", "stored_fit"]


SMALL = 4 * MiB  # rows below it get more iterations (see iters_for)


SMALL_FACTOR = 4  # the model study's rows below SMALL: at most this many times the iterations


def iters_for(size: int, iters: int, most: int = 10) -> int:
    """Iterations of a row: ``iters`` from 4 MiB up, ``iters * min(most, 4 MiB / size)`` below
    (OSU's practice of more iterations for small messages; the versus study takes up to 10x,
    the model study 4x): the lower decile, which the model's second fit uses, needs samples,
    and small rows are cheap."""
    return iters * max(1, min(most, SMALL // max(size, 1)))


def held_out(cal: list[int], grid: list[int]) -> list[int]:
    """A case's evaluation sizes: the sizes of ``grid`` it was not calibrated at, and for each
    one it was, the middle (geometric, 64-byte multiple) of that calibration size and the next
    one up, unless that too is a calibration size. So every evaluation row is a size the fit
    never saw (a factor-4 calibration gives the factor-2 sizes between its own; ping-pong's
    sqrt(2) curve, sizes a quarter-octave off its points); the largest calibration size has
    no interval above it and no row."""
    known, out = set(cal), set()
    for s in grid:
        if s not in known:
            out.add(s)
            continue
        above = [c for c in sorted(known) if c > s]
        if above and (mid := max(64, round((s * above[0]) ** 0.5 / 64) * 64)) not in known:
            out.add(mid)
    return sorted(out)


def curve_sizes(lo: int, hi: int) -> list[int]:
    """Ping-pong's calibration sizes, the point-to-point curve's points: factor sqrt(2) from
    lo / 16 to hi (64-byte multiples), so the curve follows protocol switches between the
    factor-4 sizes of the other cases' calibration."""
    out, k = [], 0
    while (s := round(lo / 16 * 2 ** (k / 2) / 64) * 64) <= hi:
        out.append(max(s, 64))
        k += 1
    return sorted(set(out))


def _row(world, transport, case, iters, warmup, size: int, check: bool, batch: int,
         passes: int = 1) -> list[dict]:
    """One case at one size, with :func:`iters_for`'s iterations, or a ``passes``-th of them
    (rounded up) with their samples kept for pooling (a one-row series)."""
    op, algo = case
    n_iters = -(-iters_for(size, iters, SMALL_FACTOR) // passes)
    c = Case(op, transport, algo, "float32", "sum", 0, n_iters, warmup, check, batch=batch)
    return run_series(world, c, [size], None, None, lambda s: None, samples=passes > 1)


def _sweeps(world, transport, cases, iters, warmup, lo: int, hi: int, repeat: int,
            separate: bool, batch: int = 1, passes: int = 1, cal_samples: int = 1,
            pieces=None, emit=print) -> tuple[list[dict], list[dict]]:
    """(calibration rows, evaluation rows); ``repeat`` rounds, best round per row; or
    ``passes`` over the whole job list, each row's iterations split among them and pooled
    (:func:`commbench.studies.sweep.pool_passes`). Calibration rows take ``cal_samples`` times the
    iterations of evaluation rows (a less noisy fit, at that cost).

    Interleaved (default): per case and size, the calibration row (at the sizes that have one)
    and at once the evaluation row, so the model is judged in the machine state it was
    calibrated in: on this shared machine a series' times shift by tens of percent from one
    minute, or one series, to the next. Separate: the whole calibration sweep, then the whole
    evaluation sweep (minutes apart on a long list).
    """
    grid, pieces = sizes_between(lo, hi, 2), or_none(pieces)

    def cal_sizes(case) -> list[int]:
        return curve_sizes(lo, hi) if case[0] == "pingpong" else sizes_between(lo, hi, 4)

    def eval_sizes(case) -> list[int]:
        return held_out(cal_sizes(case), grid)

    if separate:  # every calibration row, then every evaluation row
        jobs = ([(c, s, False) for c in cases for s in cal_sizes(c)]
                + [(c, s, True) for c in cases for s in eval_sizes(c)])
        groups = [[k for k, j in enumerate(jobs) if not j[2]], [k for k, j in enumerate(jobs) if j[2]]]
    else:
        jobs = []
        for c in cases:
            cal, ev = set(cal_sizes(c)), set(eval_sizes(c))
            for s in sorted(cal | ev):
                jobs += [(c, s, False)] * (s in cal) + [(c, s, True)] * (s in ev)
        groups = [list(range(len(jobs)))]
    if cal_samples < 1:
        raise ValueError(f"cal_samples={cal_samples}: must be >= 1")
    if repeat > 1 and passes > 1:
        raise ValueError(f"repeat={repeat}, passes={passes}: choose one (best round or pooled "
                         "passes)")
    rounds: list[list[list[dict]]] = [[] for _ in jobs]
    total, finished = len(jobs) * max(repeat, passes), 0
    for group in groups:
        for p in range(max(repeat, passes)):
            for k in group:
                case, size, check = jobs[k]
                key = f"{case[0]}/{case[1]}/{size}/{'eval' if check else 'cal'}/{p}"
                rows = pieces.get(key)
                if rows is None:
                    first = len(rounds[k]) == 0  # results checked once (#wrong), not every pass
                    n_it = iters if check else iters * cal_samples
                    rows = _row(world, transport, case, n_it, warmup, size,
                                check and (first or repeat > 1), batch, passes)
                    pieces.put(key, rows)
                rounds[k].append(rows)
                finished += 1
                what = (f"# [{finished}/{total}] {case[0]}/{case[1]} {size} B "
                        f"{'evaluation' if check else 'calibration'}, pass {p + 1}")
                emit(f"{what}: {rows[0]['time_us']:.1f} us" if rows else what)
    if passes > 1:
        merged = [[pool_passes(list(p), world.size) for p in zip(*r, strict=True)]
                  for r in rounds]
    else:
        merged = [merge_rounds(r, world.size) if repeat > 1 else r[0] for r in rounds]
    cal = [r for (_, _, check), rows in zip(jobs, merged) if not check for r in rows]
    ev = [r for (_, _, check), rows in zip(jobs, merged) if check for r in rows]
    return cal, ev


def model_study(world, transport: str, cases: list[tuple[str, str]], iters: int, warmup: int,
                emit=print, lo: int = 4 * KiB, hi: int = 64 * MiB, repeat: int = 1,
                separate: bool = False, batch: int = 1, passes: int = 1,
                cal_samples: int = 1, pieces=None) -> dict:
    """Both sweeps, and the model fitted and judged twice from them: on each row's median
    iteration (``model``, ``accuracy``) and on its lower decile (``model_low``,
    ``accuracy_low``)."""
    n = world.size
    emit(f"# calibration (factor 4) and evaluation (held-out sizes) ({transport}, {n} ranks): "
         f"{len(cases)} cases, {repeat} round(s), {passes} pass(es), "
         f"{'separate' if separate else 'interleaved'}")
    cal, ev = _sweeps(world, transport, cases, iters, warmup, lo, hi, repeat, separate, batch,
                      passes, cal_samples, pieces, emit)
    out = judge_model(cal, low(cal), ev, n, last_level_cache())
    for cls, p in out["model"]["classes"].items():
        emit(f"# {cls}: alpha {p['alpha'] * 1e6:.2f} us, beta {p['beta'] * 1e9:.4f} ns/B, gamma "
             f"{p['gamma'] * 1e9:.4f} ns/B")
    emit(f"# evaluation\n#{'op/algo':>28} {'size':>10} {'meas(us)':>10} "
         f"{'pred(us)':>10} {'meas/pred':>9} {'p10(us)':>10} {'pred p10':>10}")
    for r in out["rows"]:
        emit(f" {r['op'] + '/' + r['algo']:>28} {r['size']:>10} {r['time_us']:>10.1f} "
             f"{r['pred_us']:>10.1f} {r['meas_over_pred'] or 0:>9.2f} "
             f"{r.get('p10_us', r['min_us']):>10.1f} {r['pred_low_us']:>10.1f}")
    return out


def _report(record: dict, stem: str | None, emit, prefix: str = "") -> None:
    """Each pair's error on median and best iterations; the record written to ``stem``.*."""
    for acc, lo in zip(record["accuracy"], record["accuracy_low"], strict=True):
        emit(f"# {prefix}{acc['op']}/{acc['algo']}: median error {acc['median_error']:.3f} "
             f"(textbook class model {acc['class_median_error']:.3f}; on "
             f"{record['low_statistic']} times {lo['median_error']:.3f})")
    met = pairs_met(record)
    emit(f"# {prefix}pairs within {TARGET}: " + "; ".join(
        f"{label} {met[k][0]} of {met[k][1]}" for k, label in
        (("all", "all sizes"), ("new", "new sizes alone"),
         ("low", f"{record['low_statistic']} times"), ("forms", "uncorrected forms"))
        if k in met))
    if stem:
        res.write_study(stem, record, model_markdown, emit)


def run_model(s: StudySettings, world, transports: list[str], sizes: list[int], launch: str,
              prints: bool, emit) -> int:
    """The ``commbench run model`` study, per transport; writes results/model_*. ``sizes``: the
    sweep's, unused: the study calibrates on its own range, ``s.lo``..``s.hi`` or 4 KiB..64 MiB."""

    n = world.size
    # every benchmarked collective with alpha-beta terms that a world of n runs
    ops = [op for op in COLLECTIVES if OPS[op].terms is not None and not OPS[op].needs(n)]
    cases = [(op, algo) for op in ops for algo in algorithms_of(op)
             if not ALGORITHMS[(op, algo)].needs(n)]
    lo = s.lo if s.lo is not None else 4 * KiB
    hi = s.hi if s.hi is not None else 64 * MiB
    for transport in transports:
        emit(f"# commbench run model: {n} ranks ({launch}), transport {transport}, "
             f"{lo}..{hi} bytes")
        record = res.header("model", n, launch, s.machine,
                            dict(cadence(s.batch), iters=s.iters, warmup=s.warmup))
        sweeps = "separate" if s.separate_sweeps else "interleaved per size"
        record["measurement"].update(
            repeat=s.repeat, passes=s.rounds, sweeps=sweeps, calibration_samples=s.cal_samples,
            evaluation=HELD_OUT,
            iters_by_size=f"{s.iters} from {SMALL // MiB} MiB up, {s.iters} * "
                          f"min({SMALL_FACTOR}, {SMALL // MiB} MiB / size) below")
        if transport == "mpi":
            record["measurement"].update(compiled_wait=recorded(world), binding=placement(world))
        stem = s.stem("model", transport, n)
        pieces = study_pieces(world, stem, emit, write=s.write, resume=s.resume, prints=prints,
                              lo=lo, hi=hi, cases=[list(c) for c in cases],
                              **record["measurement"])
        record.update(model_study(world, transport, cases, s.iters, s.warmup, emit, lo, hi,
                                  s.repeat, s.separate_sweeps, s.batch, s.rounds, s.cal_samples,
                                  pieces))
        _report(record, stem if s.write and prints else None, emit)
        pieces.finish()
    return 0


def refit_stored(s: StudySettings, ranks: int, emit) -> int:
    """``commbench run model --refit``: each stored study of this world size judged again."""

    found = 0
    for transport in s.transports or ("gloo", "mpi"):
        stem = s.stem("model", transport, ranks)
        if not os.path.exists(stem + ".json"):
            emit(f"# {stem}.json: none stored")
            continue
        record = refit(read_json(stem + ".json", "results", RESULTS_LIMIT))
        found += 1
        _report(record, stem if s.write else None, emit, f"{transport} ")
    return 0 if found else 1


def stored_fit(out_dir: str, transport: str, n: int, label: str = ""):
    """The fit a ``commbench run model`` left in ``out_dir`` for this transport, world size and
    machine class."""

    path = StudySettings(out=out_dir, label=label).stem("model", transport, n) + ".json"
    if not os.path.exists(path):
        return None, path
    return Fit.from_dict(read_json(path, "results", RESULTS_LIMIT)["model"]), path


def annotate(rows: list[dict], model, n: int, topo=None, version: str = "2.30.7") -> None:
    """Add the calibrated model's time (``pred_us``, ``meas_over_pred``) and, with a topology,
    NCCL's model of the same collective and size on n GPUs of that machine (``nccl_pred_us``)."""

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
        if sub is not None and r["op"] in MODELLED:
            r["nccl_pred_us"] = nccl_predict(r["op"], r["size"], sub, version).time_us
