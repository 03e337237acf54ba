"""``commbench run``: a sweep of collectives and algorithms, a study of its own (``STUDIES``:
overhead, versus, model), or the study of patterns (``commbench run ulysses``, ``run tp``).

Results go to ``<out>/<suite>_<hardware>-<transport>-x<ranks>.{json,md,png}``; the JSON is
rewritten after every row (atomically), the markdown and the plot when a transport's sweep ends.
"""

from __future__ import annotations

from commbench.cli.checks import PG_GRACE_S, refused_together
from commbench.cli.common import UsageError
from commbench.cli.run_args import add_parser, check_run_args, study_settings
from commbench.studies.settings import StudySettings

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
        world, prints = _world(a)
        try:
            if refused_together(world, refusal, prints):
                return 2
            return run(a, ops, sizes, (world, prints))
        finally:
            world.close()


def run(a, ops: list[str], sizes: list[int], made=None) -> int:
    """Run the checked command; ``made``: the (world, prints) already started, or None."""
    from commbench.cli.sweep import sweep

    wanted = [w for w in a.algo.split(",") if w]
    _check_algos(wanted, ops)
    if a.targets == ["model"] and a.refit:  # stored measurements only: no ranks needed
        from commbench.studies.model import refit_stored

        return refit_stored(study_settings(a), a.np, print)
    world, prints = made or _world(a)
    emit = print if prints else (lambda s: None)
    try:
        world.start()
        transports = [t for t in a.transport.split(",") if t] or list(world.transports)
        bad = [t for t in transports if t not in world.transports]
        if bad:
            raise ValueError(f"--transport {','.join(bad)}: this world has "
                             f"{', '.join(world.transports)}")
        launch = f"local-{world.launch}" if world.launch in ("mpi", "plain") else world.launch
        if a.patterns:
            return _patterns(study_settings(a), a.targets, a.patterns, world, launch, prints,
                             emit)
        study = STUDIES.get(a.targets[0]) if len(a.targets) == 1 else None
        if study is not None:
            return study(study_settings(a), world, transports, sizes, launch, prints, emit)
        return sweep(a, world, ops, sizes, transports, wanted, launch, prints, emit)
    finally:
        if made is None:
            world.close()


def _overhead(s: StudySettings, world, transports, sizes, launch, prints, emit) -> int:
    from commbench.collectives.measure import MEASUREMENT
    from commbench.results.records import overhead_markdown
    from commbench.studies.overhead import overhead

    measurement = dict(MEASUREMENT, iters=s.iters, warmup=s.warmup, rounds=s.rounds,
                       order="ABBA: raw then commbench, then commbench then raw, ...")
    emit(f"# commbench run overhead: MPI all-reduce, {world.size} ranks ({launch}); commbench's "
         "reported time against a bare mpi4py loop of the same call, interleaved")
    rows = overhead(world, sizes, s.iters, s.warmup, s.rounds, emit)
    worst = max(r["ratio"] for r in rows)
    emit(f"# worst ratio {worst:.3f} (target <= 1.10)")
    _write_study(s, prints, world, launch, "overhead", measurement, rows,
                 overhead_markdown, emit, transport="mpi")
    return 0


def _patterns(s: StudySettings, targets, patterns, world, launch, prints, emit) -> int:
    from commbench.collectives.measure import MEASUREMENT
    from commbench.results.pieces import study_pieces
    from commbench.studies.patterns import pattern_markdown, pattern_study

    measurement = dict(MEASUREMENT, iters=s.iters, warmup=s.warmup)
    transport = world.transports[0]
    emit(f"# commbench run {' '.join(targets)}: {', '.join(patterns)}; {world.size} ranks "
         f"({launch}), transport {transport}")
    timeline: list | None = [] if s.trace else None
    pieces = study_pieces(world, s.stem("patterns", transport, world.size), emit, write=s.write,
                          resume=s.resume, prints=prints, patterns=patterns, iters=s.iters,
                          warmup=s.warmup)
    rows = pattern_study(world, patterns, s.iters, s.warmup, emit, timeline=timeline,
                         pieces=pieces)
    if s.trace and prints:
        from commbench.results import records as res
        from commbench.results.trace import chrome_trace

        res.write_json(s.trace, chrome_trace(timeline))
        emit(f"# wrote {s.trace}")
    bad = [r for r in rows if not r["calls_match"]]
    emit(f"# calls booked = predicted in {len(rows) - len(bad)} of {len(rows)} rows")
    for name in patterns:
        _write_study(s, prints, world, launch, name, measurement,
                     [r for r in rows if r["pattern"] == name], pattern_markdown, emit)
    pieces.finish()
    return 1 if bad else 0


def _write_study(s: StudySettings, prints, world, launch, suite, measurement, rows, to_markdown,
                 emit, plot=None, transport: str = "") -> None:
    """A study's table, written by the printing rank unless ``--no-write``."""
    from commbench.results import records as res

    if not (s.write and prints):
        return
    record = res.header(suite, world.size, launch, s.machine, measurement)
    record["rows"] = rows
    res.write_study(s.stem(suite, transport or world.transports[0], world.size), record,
                    to_markdown, emit, plot)


def _study(module: str, name: str):
    """A study's function, imported when it runs (the command line stays torch-free)."""
    def run(*args) -> int:
        import importlib

        return getattr(importlib.import_module(module), name)(*args)
    return run


def _numerics(s: StudySettings, world, transports, sizes, launch, prints, emit) -> int:
    from commbench.studies.numerics import numerics_markdown, numerics_plot, run_numerics

    emit(f"# commbench run numerics: {world.size} ranks ({launch}), gloo; error against the "
         "exact sum in eps x sum|x| units, the bound from each algorithm's summation depth")
    rows = run_numerics(world, emit)
    over = [r for r in rows if r["max_err"] > r["bound"]]
    emit(f"# within the bound: {len(rows) - len(over)} of {len(rows)} rows")
    _write_study(s, prints, world, launch, "numerics", {"what": "rounding error, not time"},
                 rows, numerics_markdown, emit, numerics_plot)
    return 1 if over else 0


# the studies of their own: target -> (settings, world, transports, sizes, launch, prints, emit)
STUDIES = {"overhead": _overhead, "versus": _study("commbench.studies.versus", "run_versus"),
           "model": _study("commbench.studies.model", "run_model"), "numerics": _numerics}
