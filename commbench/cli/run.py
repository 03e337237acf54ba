"""``commbench run``: a sweep of collectives and algorithms, a study of its own (``STUDIES``:
overhead, versus, model), or the study of patterns (``commbench run ulysses``, ``run tp``).

Results go to ``<out>/<suite>_<hardware>-<transport>-x<ranks>.{json,md,png}``; the JSON is
rewritten after every row (atomically), the markdown and the plot when a transport's sweep ends.
"""

from __future__ import annotations

import importlib
from contextlib import ExitStack

from commbench.cli.checks import open_world, refused_together, start_world
from commbench.cli.common import UsageError
from commbench.cli.run_args import add_parser, check_run_args, study_settings, sweep_settings
from commbench.collectives import ALGORITHMS
from commbench.results.lock import FolderBusy, folder_lock
from commbench.runtime.launch import detect

__all__ = ["STUDIES", "add_parser", "command", "run"]


def _check_algos(wanted: list[str], ops: list[str]) -> None:
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

    ops, sizes = check_run_args(a)  # host refusals under a launcher: kept in a.host_refusal
    info = detect()  # readable: check_run_args refused a launcher whose world is not
    together = info.launched and info.size > 1
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
        world, prints = open_world(a)
        try:
            if refused_together(world, refusal, prints):
                return 2
            return run(a, ops, sizes, (world, prints))
        finally:
            world.close()


def run(a, ops: list[str], sizes: list[int], made=None) -> int:
    """Run the checked command; ``made``: the (world, prints) already started, or None."""
    wanted = [w for w in a.algo.split(",") if w]
    _check_algos(wanted, ops)
    if a.targets == ["model"] and a.refit:  # stored measurements only: no ranks needed
        # lazy: imports numpy, torch
        from commbench.studies.model import refit_stored

        return refit_stored(study_settings(a), a.np, print)
    world, prints = made or open_world(a)
    emit = print if prints else (lambda s: None)
    try:
        start_world(world, prints)
        transports = [t for t in a.transport.split(",") if t] or list(world.transports)
        bad = [t for t in transports if t not in world.transports]
        if bad:
            raise ValueError(f"--transport {','.join(bad)}: this world has "
                             f"{', '.join(world.transports)}")
        launch = f"local-{world.launch}" if world.launch in ("mpi", "plain") else world.launch
        if a.patterns:
            # lazy: imports torch
            from commbench.studies.patterns import run_patterns

            return run_patterns(study_settings(a), a.targets, a.patterns, world, launch, prints,
                                emit)
        study = STUDIES.get(a.targets[0]) if len(a.targets) == 1 else None
        if study is not None:
            return study(study_settings(a), world, transports, sizes, launch, prints, emit)
        # lazy: imports numpy, torch
        from commbench.studies.collectives import sweep  # once the ranks are up (start_world)

        return sweep(sweep_settings(a, wanted), world, ops, sizes, transports, launch, prints,
                     emit)
    finally:
        if made is None:
            world.close()


def _study(module: str, name: str):
    """A study's function, imported when it runs (the command line stays torch-free)."""
    def run(*args) -> int:
        return getattr(importlib.import_module(module), name)(*args)
    return run


# the studies of their own: target -> (settings, world, transports, sizes, launch, prints, emit)
STUDIES = {"overhead": _study("commbench.studies.overhead", "run_overhead"),
           "versus": _study("commbench.studies.versus", "run_versus"),
           "model": _study("commbench.studies.model", "run_model"),
           "numerics": _study("commbench.studies.numerics", "run_numerics_study")}
