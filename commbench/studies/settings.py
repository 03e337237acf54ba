"""What a study of ``commbench run`` is given: one frozen record, built once by its command
(:func:`commbench.cli.run_args.study_settings`), so that no study reads the command line; a
sweep of collectives gets :class:`SweepSettings` around it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

from commbench.results import records as res
from commbench.results.machine import machine_class


@dataclass(frozen=True)
class StudySettings:
    """iters, warmup: timed and untimed iterations per row (``-n``, ``-w``); rounds: passes or
    interleaved rounds (``--rounds``; None: the study's own); repeat: whole sweeps (``--repeat``);
    batch: calls per sample (``--batch``); lo, hi: the sizes asked for in bytes (None: the
    study's own range); separate_sweeps, cal_samples: the model study's; transports: those
    asked for (empty: every one the world has); out: the results folder; label: the machine
    class by hand ('' detects it); write: tables are written (not ``--no-write``); resume:
    finished pieces are taken back; trace: a Chrome trace's path ('' none)."""

    iters: int = 20
    warmup: int = 5
    rounds: int | None = None
    repeat: int = 1
    batch: int = 1
    lo: int | None = None
    hi: int | None = None
    separate_sweeps: bool = False
    cal_samples: int = 1
    transports: tuple[str, ...] = ()
    out: str = "results"
    label: str = ""
    write: bool = True
    resume: bool = False
    trace: str = ""

    @cached_property  # asked for each table's name and header; found once
    def machine(self) -> str:
        """The machine class the tables are named by (:mod:`commbench.results.machine`)."""

        return machine_class(self.label)

    def stem(self, suite: str, transport: str, ranks: int) -> str:
        """``<out>/<suite>_<machine>-<transport>-x<ranks>``: a table's path without its suffix."""
        return os.path.join(self.out, f"{suite}_{self.machine}-{transport}-x{ranks}")


@dataclass(frozen=True)
class SweepSettings:
    """What a sweep of collectives is given (:mod:`commbench.studies.collectives`; built by
    :func:`commbench.cli.run_args.sweep_settings`). study: the settings every study takes
    (iterations, repeats, batch, results folder, machine label, writing, resuming, a trace's
    path); targets: what the command named (empty: the default suite), as typed; dtype, redop,
    root: ``-d``, ``-o``, ``-r``; check: ``-c`` (0 or 1, as recorded in the tables' settings);
    algos: ``--algo`` (empty: every one); topology: ``--topology`` for the model column ('' none);
    json, csv: ``-J`` and ``--csv`` ('' none)."""

    study: StudySettings
    targets: tuple[str, ...] = ()
    dtype: str = "float32"
    redop: str = "sum"
    root: int = 0
    check: int = 1
    algos: tuple[str, ...] = ()
    topology: str = ""
    json: str = ""
    csv: str = ""

    def suite(self, ops: list[str]) -> str:
        """The tables' name: ``collectives`` for the default suite, else the collectives joined."""
        return "collectives" if self.targets in ((), ("collectives",)) else "_".join(ops)


def write_study(s: StudySettings, prints, world, launch, suite, measurement, rows, to_markdown,
                emit, plot=None, transport: str = "") -> None:
    """A study's table, written by the printing rank unless ``--no-write``."""

    if not (s.write and prints):
        return
    record = res.header(suite, world.size, launch, s.machine, measurement)
    record["rows"] = rows
    res.write_study(s.stem(suite, transport or world.transports[0], world.size), record,
                    to_markdown, emit, plot)
