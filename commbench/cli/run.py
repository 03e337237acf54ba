"""``commbench run``: a sweep of collectives and algorithms, a study of its own (``STUDIES``:
overhead, versus, model), or the study of patterns (``commbench run ulysses``, ``run tp``).

Results go to ``<out>/<suite>_<hardware>-<transport>-x<ranks>.{json,md,png}``; the JSON is
rewritten after every row (atomically), the markdown and the plot when a transport's sweep ends.
"""

from __future__ import annotations

import os

from commbench.cli.checks import PG_GRACE_S, refused_together
from commbench.cli.common import UsageError
from commbench.cli.run_args import add_parser, check_run_args

__all__ = ["STUDIES", "add_parser", "command", "run"]


def _world(a):
    from commbench.runtime.launch import detect

    info = detect()
    if info.launched:
        from commbench.world.context import Context
        from commbench.world.spmd import LauncherWorld

        ctx = Context.from_launcher(timeout_s=a.timeout + PG_GRACE_S)
        return LauncherWorld(ctx, timeout_s=a.timeout), info.rank == 0
    from commbench.world.local import LocalWorld

    return LocalWorld(a.np, launch=a.launch, timeout_s=a.timeout), True


def _check_algos(wanted: list[str], ops: list[str]) -> None:
    from commbench.collectives import ALGORITHMS

    known = {alg for o, alg in ALGORITHMS if o in ops}
    bad = [w for w in wanted if w not in known]
    if bad:
        raise UsageError(f"--algo {','.join(bad)}: not built for {', '.join(ops)}; known: "
                         f"{', '.join(sorted(known))}")


def command(a) -> int:
    """Check, lock the results folder, run. Under a launcher a refusal that one rank makes alone
    (this host's memory, rank 0's results folder) is agreed first: every rank starts the world,
    all learn every rank's refusal over the harness's own channel, rank 0 prints the first and
    all exit 2 (one rank quitting alone would leave the others waiting in the rendezvous)."""
    from contextlib import ExitStack

    from commbench.results.lock import FolderBusy, folder_lock
    from commbench.runtime.launch import detect

    info = detect()
    together = info.launched and info.size > 1
    ops, sizes = check_run_args(a)  # host refusals under a launcher: kept in a.host_refusal
    refusal = getattr(a, "host_refusal", "")
    writes = not a.no_write and info.rank == 0 and not (a.targets == ["model"] and a.refit)
    with ExitStack() as stack:
        try:
            if writes and not refusal:
                stack.enter_context(folder_lock(a.out))
        except FolderBusy as exc:
            if not together:
                raise UsageError(str(exc)) from None
            refusal = str(exc)
        if not together:
            return run(a, ops, sizes)
        world, printer = _world(a)
        try:
            if refused_together(world, refusal, printer):
                return 2
            return run(a, ops, sizes, (world, printer))
        finally:
            world.close()


def run(a, ops: list[str], sizes: list[int], made=None) -> int:
    """Run the checked command; ``made``: the (world, printer) already started, or None."""
    from commbench.cli.sweep import sweep

    wanted = [w for w in a.algo.split(",") if w]
    _check_algos(wanted, ops)
    if a.targets == ["model"] and a.refit:  # stored measurements only: no ranks needed
        from commbench.studies.model import refit_stored

        return refit_stored(a, print)
    world, printer = made or _world(a)
    emit = print if printer else (lambda s: None)
    try:
        world.start()
        transports = [t for t in a.transport.split(",") if t] or list(world.transports)
        bad = [t for t in transports if t not in world.transports]
        if bad:
            raise ValueError(f"--transport {','.join(bad)}: this world has "
                             f"{', '.join(world.transports)}")
        launch = f"local-{world.launch}" if world.launch in ("mpi", "plain") else world.launch
        if a.patterns:
            return _patterns(a, world, launch, printer, emit)
        study = STUDIES.get(a.targets[0]) if len(a.targets) == 1 else None
        if study is not None:
            return study(a, world, transports, sizes, launch, printer, emit)
        return sweep(a, world, ops, sizes, transports, wanted, launch, printer, emit)
    finally:
        if made is None:
            world.close()


def _overhead(a, world, transports, sizes, launch, printer, emit) -> int:
    from commbench.collectives.measure import MEASUREMENT
    from commbench.results import records as res
    from commbench.studies.overhead import overhead
    from commbench.studies.sweep import hardware

    measurement = dict(MEASUREMENT, iters=a.iters, warmup=a.warmup_iters, rounds=a.rounds,
                       order="ABBA: raw then commbench, then commbench then raw, ...")
    emit(f"# commbench run overhead: MPI all-reduce, {world.size} ranks ({launch}); commbench's "
         "reported time against a bare mpi4py loop of the same call, interleaved")
    rows = overhead(world, sizes, a.iters, a.warmup_iters, a.rounds, emit)
    worst = max(r["ratio"] for r in rows)
    emit(f"# worst ratio {worst:.3f} (target <= 1.10)")
    if not a.no_write and printer:
        record = res.header("overhead", world.size, launch, hardware(a.label), measurement)
        record["rows"] = rows
        stem = os.path.join(a.out, f"overhead_{hardware(a.label)}-mpi-x{world.size}")
        res.write_json(stem + ".json", record)
        res.write_atomic(stem + ".md", res.overhead_markdown(record))
        emit(f"# wrote {stem}.json and {stem}.md")
    return 0


def _patterns(a, world, launch, printer, emit) -> int:
    from commbench.collectives.measure import MEASUREMENT
    from commbench.studies.patterns import pattern_markdown, pattern_study

    measurement = dict(MEASUREMENT, iters=a.iters, warmup=a.warmup_iters)
    emit(f"# commbench run {' '.join(a.targets)}: {', '.join(a.patterns)}; {world.size} ranks "
         f"({launch}), transport {world.transports[0]}")
    timeline: list | None = [] if a.trace else None
    from commbench.results.pieces import study_pieces
    from commbench.studies.sweep import hardware

    pieces = study_pieces(a, world, printer, f"patterns_{hardware(a.label)}-"
                          f"{world.transports[0]}-x{world.size}", emit, patterns=a.patterns,
                          iters=a.iters, warmup=a.warmup_iters)
    rows = pattern_study(world, a.patterns, a.iters, a.warmup_iters, emit, timeline=timeline,
                         pieces=pieces)
    if a.trace and printer:
        from commbench.results import records as res
        from commbench.results.trace import chrome_trace

        res.write_json(a.trace, chrome_trace(timeline))
        emit(f"# wrote {a.trace}")
    bad = [r for r in rows if not r["calls_match"]]
    emit(f"# calls booked = predicted in {len(rows) - len(bad)} of {len(rows)} rows")
    for name in a.patterns:
        _write_study(a, printer, world, launch, name, measurement,
                     [r for r in rows if r["pattern"] == name], pattern_markdown, emit)
    pieces.finish()
    return 1 if bad else 0


def _write_study(a, printer, world, launch, suite, measurement, rows, to_markdown, emit,
                 plot=None) -> None:
    """results/<suite>_<hw>-<transport>-x<ranks>.{json,md} of a study (and .png, given ``plot``,
    which returns the path it wrote or None without matplotlib)."""
    from commbench.results import records as res
    from commbench.studies.sweep import hardware

    if a.no_write or not printer:
        return
    record = res.header(suite, world.size, launch, hardware(a.label), measurement)
    record["rows"] = rows
    stem = os.path.join(a.out, f"{suite}_{hardware(a.label)}-{world.transports[0]}-x{world.size}")
    res.write_json(stem + ".json", record)
    res.write_atomic(stem + ".md", to_markdown(record))
    emit(f"# wrote {stem}.json and {stem}.md")
    if plot is not None:
        png = plot(record, stem + ".png")
        emit(f"# wrote {png}" if png else "# no matplotlib: no plot")


def _versus(a, world, transports, sizes, launch, printer, emit) -> int:
    from commbench.studies.versus import run_versus

    return run_versus(a, world, transports, sizes, launch, printer, emit)


def _model(a, world, transports, sizes, launch, printer, emit) -> int:
    from commbench.studies.model import run_model

    return run_model(a, world, transports, launch, printer, emit)


def _numerics(a, world, transports, sizes, launch, printer, emit) -> int:
    from commbench.studies.numerics import numerics_markdown, numerics_plot, run_numerics

    emit(f"# commbench run numerics: {world.size} ranks ({launch}), gloo; error against the "
         "exact sum in eps x sum|x| units, the bound from each algorithm's summation depth")
    rows = run_numerics(world, emit)
    over = [r for r in rows if r["max_err"] > r["bound"]]
    emit(f"# within the bound: {len(rows) - len(over)} of {len(rows)} rows")
    _write_study(a, printer, world, launch, "numerics", {"what": "rounding error, not time"},
                 rows, numerics_markdown, emit, numerics_plot)
    return 1 if over else 0


# the studies of their own: target -> (args, world, transports, sizes, launch, printer, emit)
STUDIES = {"overhead": _overhead, "versus": _versus, "model": _model, "numerics": _numerics}
