"""The collectives study, ``commbench run``'s sweep: every case (collective x algorithm x
transport) at every size, each row printed and written as it finishes; resumed from an
interrupted table (``--resume``); compared at the end with the table it replaces (the regression
gate, with its second look), which a run with other settings must not write over.

It is given one frozen :class:`~commbench.studies.settings.SweepSettings`, built once by the command line
(:func:`commbench.cli.run_args.sweep_settings`); nothing here reads the command line.
"""

from __future__ import annotations

import os
import statistics

from commbench.collectives import ALGORITHMS, algorithms_of
from commbench.collectives.measure import WITNESS, WITNESS_ADD, Case, cadence, placement
from commbench.costmodel import topology
from commbench.results import records as res
from commbench.results.compare import KEY, CompareError, compare, load, report, run_shift, shifted
from commbench.results.trace import chrome_trace
from commbench.studies.model import annotate, stored_fit
from commbench.studies.overhead import memcpy_bandwidth
from commbench.studies.settings import SweepSettings
from commbench.studies.sweep import HEADER, merge_rounds, run_series

__all__ = ["sweep"]


def _algorithms(op: str, wanted: list[str], world, emit) -> list[str]:
    out = []
    ctx = getattr(world, "ctx", None)  # a launched world's: its nodes (a local world: one host)
    for algo in algorithms_of(op):
        record = ALGORITHMS[(op, algo)]
        why = record.needs(world.size, **record.node_kw(ctx))
        if wanted and algo not in wanted:
            continue
        if why:
            emit(f"# {op}/{algo} skipped: it {why}")
            continue
        out.append(algo)
    return out


def sweep(w: SweepSettings, world, ops, sizes, transports, launch, prints, emit) -> int:
    """The sweep of ``ops`` at ``sizes`` on each of ``transports``; exit code 1 on a wrong
    element, else 0."""

    s, n = w.study, world.size
    measurement = dict(cadence(s.batch), iters=s.iters, warmup=s.warmup)
    if s.repeat > 1:  # rows keep their best round (studies.sweep.merge_rounds)
        measurement.update(repeat=s.repeat, rounds="whole sweep repeated; each row its best round")
    if "mpi" in transports:
        measurement["binding"] = placement(world)
    measurement["witness"] = WITNESS
    measurement["witness_add"] = WITNESS_ADD
    topo = topology.load(w.topology) if w.topology else None
    memcpy = statistics.median(world.run(memcpy_bandwidth))
    emit(f"# commbench run {' '.join(w.targets or ['collectives'])}: {n} ranks ({launch}), "
         f"transports {' '.join(transports)}, dtype {w.dtype}, op {w.redop}")
    emit(f"# {', '.join(f'{k}: {v}' for k, v in measurement.items())}")
    emit(f"# memory-copy bandwidth (64 MiB copy_, median over ranks): {memcpy / 1e9:.2f} GB/s")
    settings = {"ops": ops, "algos": sorted(w.algos), "sizes": sizes, "dtype": w.dtype,
                "op": w.redop, "root": w.root, "check": w.check, "iters": s.iters,
                "warmup": s.warmup, "batch": s.batch, "repeat": s.repeat}
    # float32 and sum keep the plain name; another dtype or reduction is a table of its own
    kind = "" if (w.dtype, w.redop) == ("float32", "sum") else f"-{w.dtype}-{w.redop}"
    suite = w.suite(ops)
    stems = {t: s.stem(suite, t, n) + kind for t in transports}
    previous = {} if s.resume or not s.write else \
        {t: _previous(stem + ".json", settings) for t, stem in stems.items()}
    records: list[dict] = []  # every transport's record, for -J and --csv
    timeline: list | None = [] if s.trace else None  # each row's traced call, for --trace
    try:
        wrong = _transports(w, world, transports, stems, previous, settings, measurement, topo,
                            memcpy, suite, launch, prints, emit, records, sizes, ops, timeline)
    finally:
        every = [r for record in records for r in record["rows"]]
        if prints:
            _extra_files(w, suite, every, n, launch, measurement, settings, emit)
            if timeline:
                res.write_json(s.trace, chrome_trace(timeline))
                emit(f"# wrote {s.trace}")
    if every:
        emit(f"# Avg bus bandwidth    : {statistics.fmean(r['busbw'] for r in every):.3f} GB/s "
             f"(mean over {len(every)} rows, as nccl-tests prints it)")
    emit(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    return 1 if wrong else 0


def _transports(w: SweepSettings, world, transports, stems, previous, settings, measurement,
                topo, memcpy, suite, launch, prints, emit, records, sizes, ops,
                timeline: list | None = None) -> int:
    """Each transport's sweep, its record appended to ``records``; the count of wrong elements."""

    s, n, wrong = w.study, world.size, 0
    for transport in transports:
        stem = stems[transport]
        path = None if not s.write or not prints else stem + ".json"
        record = _resumed(stem + ".json", n, measurement, settings, emit) if s.resume else None
        if record is None:
            record = res.header(suite, n, launch, s.machine, measurement)
        record["settings"] = settings
        records.append(record)
        record["memcpy_GBps"] = memcpy / 1e9
        model, where = stored_fit(s.out, transport, n, s.label)
        emit(f"# model: {where}" if model else f"# model: none (commbench run model --np {n} "
             f"writes {where})")
        emit("#\n" + HEADER)
        cases = [Case(op, transport, algo, w.dtype, w.redop, w.root, s.iters, s.warmup,
                      bool(w.check), batch=s.batch, trace=bool(s.trace), witness=True)
                 for op in ops for algo in _algorithms(op, list(w.algos), world, emit)]
        rounds = []
        for k in range(s.repeat):  # the whole sweep again: a slow spell hits one round
            if s.repeat > 1:
                emit(f"# round {k + 1} of {s.repeat}")
            rounds.append([run_series(world, case, sizes, record if s.repeat == 1 else None,
                                      path, emit, timeline=timeline if k == 0 else None)
                           for case in cases])
        for series in zip(*rounds, strict=True):
            rows = merge_rounds(list(series), n) if s.repeat > 1 else series[0]
            if s.repeat > 1:
                record["rows"] += rows
            annotate(rows, model, n, topo)
            for r in rows:
                if r["size"] >= 16 << 20:
                    r["memcpy_frac"] = r["busbw"] * 1e9 / memcpy
            wrong += sum(r["wrong"] for r in rows)
        record["best_vs_native"] = _best_vs_native(record["rows"])
        for line in _best_lines(record["best_vs_native"], transport):
            emit(line)
        if previous.get(transport):
            by_series = {(c.op, c.algo, c.transport): c for c in cases}  # one dtype, op, root
            _against(previous[transport], record, stem + ".json", emit,
                     lambda key, sizes, by=by_series: run_series(world, by[key[:3]], sizes, None,
                                                                 None, lambda line: None))
        elif prints and s.write and not s.resume:
            emit(f"# no baseline: {stem}.json holds no earlier run of these settings on "
                 f"{s.machine}; this run's table is the first one")
        if path:
            res.write_json(path, record)
            res.write_atomic(stem + ".md", res.markdown(record))
            png = res.plot(record, stem + ".png")
            emit(f"# wrote {path}, {stem}.md" + (f", {png}" if png else f" ({res.no_plot(record)})"))
    return wrong


def _extra_files(w: SweepSettings, suite, rows, n, launch, measurement, settings, emit) -> None:
    """-J FILE (a results record of every row, all transports) and --csv FILE."""
    if w.json:
        record = res.header(suite, n, launch, w.study.machine, measurement)
        record.update(settings=settings, rows=rows)
        res.write_json(w.json, record)
        emit(f"# wrote {w.json}")
    if w.csv:
        res.write_atomic(w.csv, res.csv_text(rows))
        emit(f"# wrote {w.csv}")


def _load(path: str, why: str) -> dict | None:
    """The results file at ``path``, None when there is none; an unreadable one is an error."""
    if not os.path.exists(path):
        return None
    try:
        return load(path)
    except CompareError as exc:
        raise ValueError(f"{why}{exc}; remove it or give --out another folder") from None


def _previous(path: str, settings: dict) -> dict | None:
    """The table this run would replace: compared with afterwards when it was measured with the
    same settings; a run with other settings must not write over it."""
    record = _load(path, "")
    if record is not None and record.get("settings") != settings:
        old = record.get("settings")
        diff = ", ".join(k for k in settings if not old or old.get(k) != settings[k])
        raise ValueError(f"{path} holds a run with other settings ({diff if old else 'not recorded'})"
                         "; give --out another folder or --label another name")
    return record


def _against(old: dict, new: dict, path: str, emit, again=None) -> None:
    """The regression gate's report of this run against the table it replaces. Rows that
    regress are measured once more at once (``again(series key, sizes)`` -> rows), and only
    those that regress in both measurements are reported: a slow spell of a shared machine
    slows every size of a series measured in it, a regression of the code slows it again."""

    shift = run_shift(old, new)  # the whole run's: its second look is judged at it too
    rows, bad = compare(old, new, shift=shift)
    if not rows:
        return
    if bad and again is not None:
        asked = {tuple(r[k] for k in KEY): r["requested"] for r in new["rows"]}
        flagged: dict[tuple, list[int]] = {}
        for r in bad:  # measured again at the sizes it asked for (a size may round down)
            key = tuple(r[k] for k in KEY)
            flagged.setdefault(key[:-1], []).append(asked[key])
        second = [row for key, sizes in flagged.items() for row in again(key, sizes)]
        # at the whole run's shift, not at that of the few series measured again
        _, bad_again = compare(old, {**new, "rows": second}, shift=shift)
        confirmed = {tuple(r[k] for k in KEY) for r in bad_again}
        emit(f"# {len(bad)} rows regressed against {path}; measured again at once, "
             f"{len(confirmed)} regressed again (only those count)")
        for r in rows:
            r["regressed"] = r["regressed"] and tuple(r[k] for k in KEY) in confirmed
        bad = [r for r in rows if r["regressed"]]
    emit(f"# against the table it replaces ({path}, commit {old.get('commit')}; "
         f"commbench compare's rule):")
    for line in report(bad, bad, 0.10, 64 << 10).splitlines() if bad else []:
        if not line.startswith("#"):  # the regressed rows' table
            emit(f"# {line}")
    for line in report(rows, bad, 0.10, 64 << 10).splitlines():
        if line.startswith("#"):  # the verdict, and what was not judged
            emit(line)
    whole = shifted(rows, 0.10, 64 << 10)
    if whole:
        emit(whole)


def _resumed(path: str, n: int, measurement: dict, settings: dict, emit) -> dict | None:
    """The record of an interrupted run at ``path``, if it is one this run can continue: same
    ranks, measurement and settings (sizes may grow); refused in one line naming what differs."""
    record = _load(path, "--resume: ")
    if record is None:
        emit(f"# --resume: nothing to resume at {path} (no interrupted table there): measuring "
             "every row")
        return None
    old = {"ranks": record["world_size"], **(record.get("measurement") or {}),
           **{k: v for k, v in (record.get("settings") or {}).items() if k != "sizes"}}
    new = {"ranks": n, **measurement, **{k: v for k, v in settings.items() if k != "sizes"}}
    diff = [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k) and k != "binding"]
    if diff:
        raise ValueError(f"--resume: {path} was measured otherwise: {'; '.join(diff)}")
    emit(f"# resuming {path}: {len(record['rows'])} rows kept")
    return record


def _best_vs_native(rows: list[dict]) -> list[dict]:
    """Per all-reduce size: the transport's own time, the fastest algorithm built here, the ratio."""
    by_size: dict[int, dict[str, float]] = {}
    for r in rows:
        if r["op"] == "all_reduce":
            by_size.setdefault(r["size"], {})[r["algo"]] = r["time_us"]
    out = []
    for size, times in sorted(by_size.items()):
        algos = {k: v for k, v in times.items() if k != "native"}
        if "native" not in times or not algos:
            continue
        best = min(algos, key=algos.get)
        out.append({"size": size, "native_us": times["native"], "best_algo": best,
                    "best_us": algos[best], "native_over_best": times["native"] / algos[best]})
    return out


def _best_lines(summary: list[dict], transport: str) -> list[str]:
    if not summary:
        return []
    lines = [f"# all_reduce on {transport}: the transport's own against the fastest algorithm "
             "built here (native/best > 1: the algorithm is faster)",
             f"#{'size':>11} {'native(us)':>11} {'best':>27} {'best(us)':>10} {'native/best':>12}"]
    lines += [f"#{s['size']:>11} {s['native_us']:>11.1f} {s['best_algo']:>27} {s['best_us']:>10.1f} "
              f"{s['native_over_best']:>12.2f}" for s in summary]  # '#': one data table per output
    return lines


