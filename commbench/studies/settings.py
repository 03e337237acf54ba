"""What a study of ``commbench run`` is given: one frozen record, built once by its command
(:func:`commbench.cli.run_args.study_settings`), so that no study reads the command line."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property


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
        from commbench.results.machine import machine_class

        return machine_class(self.label)

    def stem(self, suite: str, transport: str, ranks: int) -> str:
        """``<out>/<suite>_<machine>-<transport>-x<ranks>``: a table's path without its suffix."""
        return os.path.join(self.out, f"{suite}_{self.machine}-{transport}-x{ranks}")
