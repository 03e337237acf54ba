"""``commbench run``'s arguments: nccl-tests' flags, and every check made before a rank starts."""

from __future__ import annotations

import difflib

from commbench.cli import checks
from commbench.cli.common import UsageError
from commbench.costmodel.topology import load
from commbench.names import (
    COLLECTIVES,
    DTYPE_NAMES,
    ITEMSIZE,
    MPI_CANNOT_REDUCE,
    REDOPS,
    ROOTED,
    SUITE,
    canonical,
    parse_size,
    sizes_between,
)
from commbench.ops import OPS
from commbench.patterns.registry import PATTERNS, select
from commbench.runtime.launch import detect
from commbench.studies.settings import StudySettings, SweepSettings
from commbench.world.local.spawn import mpi_usable

__all__ = ["SUITES", "add_parser", "check_run_args"]

SUITES = {"collectives": SUITE, "overhead": ("all_reduce",), "model": (),
          "versus": ("all_reduce",), "numerics": ()}
# suites that are studies of their own, run alone
STUDY_TARGETS = ("overhead", "model", "versus", "numerics")


def add_parser(sub) -> None:
    r = sub.add_parser("run", help="time collectives (nccl-tests flags) or study patterns",
                       description="Examples: commbench run all_reduce -b 8 -e 64M -f 2; "
                       "commbench run ulysses --np 4; commbench run model --np 4 --resume")
    r.add_argument("targets", nargs="*", help=f"suites ({', '.join(SUITES)}), collectives "
                   f"({', '.join(COLLECTIVES)}; nccl-tests' and OSU's names too: all_reduce_perf, "
                   "osu_allreduce), or patterns and markers (commbench list); default: collectives")
    r.add_argument("-b", "--minbytes", default="8", help="smallest size (K, M, G: powers of 2)")
    r.add_argument("-e", "--maxbytes", default="1M", help="largest size")
    r.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplier between rows")
    r.add_argument("-n", "--iters", type=int, default=None, help="timed iterations per row "
                   "(default 20; the model study: 10)")
    r.add_argument("-w", "--warmup-iters", type=int, default=None, help="untimed iterations "
                   "first (default 5; the model study: 2)")
    r.add_argument("-d", "--datatype", default="float32", help=", ".join(DTYPE_NAMES))
    r.add_argument("-o", "--op", default="sum", help=", ".join(REDOPS))
    r.add_argument("-r", "--root", type=int, default=0, help="root rank of rooted collectives")
    r.add_argument("-c", "--check", type=int, default=1, choices=(0, 1),
                   help="check every result element (#wrong)")
    r.add_argument("-J", "--json", default="", metavar="FILE", help="also write the rows to FILE "
                   "(nccl-tests' -J); the results folder's files are written as well")
    r.add_argument("--csv", default="", metavar="FILE", help="also write the rows to FILE as CSV")
    r.add_argument("--trace", default="", metavar="FILE", help="every rank's booked calls of "
                   "one warm call of each row (sweeps) or step of each run (pattern studies), "
                   "after the timed ones, as a Chrome trace (Perfetto)")
    r.add_argument("--transport", default="", help="comma-separated; default: every one")
    checks.world_options(r, np=4, timeout=120.0)
    r.add_argument("--algo", default="", help="comma-separated algorithms (native, ring, ...); "
                   "default: native and every algorithm built for each collective")
    r.add_argument("--rounds", type=int, default=None, help="interleaved rounds (overhead and "
                   "versus studies; default 6); model study: passes over its whole job list, "
                   "each row's iterations split among them and pooled (default 1)")
    r.add_argument("--topology", default="", help="also give each row NCCL's model time for the "
                   "same collective on this many GPUs of a preset or topology file")
    r.add_argument("--repeat", type=int, default=1, help="run the whole sweep this many times; "
                   "each row keeps the best round's median (the gate's noise rule)")
    r.add_argument("--batch", type=int, default=1, help="calls timed back to back per sample "
                   "(nccl-tests' cadence); 1: a barrier before every call")
    r.add_argument("--separate-sweeps", action="store_true", help="model study: the whole "
                   "calibration sweep before the whole evaluation sweep (default: per case and "
                   "size, one right after the other)")
    r.add_argument("--cal-samples", type=int, default=1, help="model study: calibration rows "
                   "take this many times the evaluation rows' iterations")
    r.add_argument("--refit", action="store_true", help="model study: judge the stored "
                   "results/model_* again with the current model, measuring nothing")
    r.add_argument("--resume", action="store_true",
                   help="continue an interrupted run: keep the rows its results file holds (a "
                   "model, versus or pattern study: the pieces in its .partial.jsonl)")


def _unknown(target: str) -> str:
    """What a target that names nothing gets told: the nearest known names first, then every
    suite, collective and pattern."""

    markers = {m for p in PATTERNS.values() for m in p.markers}
    known = [*SUITES, *COLLECTIVES, *PATTERNS, *sorted(markers - set(PATTERNS))]
    near = difflib.get_close_matches(target, known, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(near)}? " if near else ""
    return (f"unknown suite, collective or pattern {target!r}; {hint}suites and studies: "
            f"{', '.join(SUITES)}; collectives: {', '.join(COLLECTIVES)}; patterns: "
            f"{', '.join(PATTERNS)} (and their markers)")


def _patterns(targets: list[str]) -> list[str]:
    """The patterns ``targets`` name (pattern names or markers); [] for collective targets."""

    found = {t: select(t) for t in targets}
    if not any(found.values()):
        return []
    other = [t for t, names in found.items() if not names]
    if other:
        raise UsageError(f"{', '.join(other)}: not a pattern or a marker of one; patterns run "
                         f"apart from collectives (known: {', '.join(PATTERNS)})")
    return list(dict.fromkeys(n for names in found.values() for n in names))


# flags of the collective sweeps, with their defaults: a pattern study sweeps its own configs
_SWEEP_ONLY = {"-b": ("minbytes", "8"), "-e": ("maxbytes", "1M"), "-f": ("stepfactor", 4),
               "-d": ("datatype", "float32"), "-o": ("op", "sum"), "-r": ("root", 0),
               "-c": ("check", 1), "--algo": ("algo", ""), "--transport": ("transport", ""),
               "--batch": ("batch", 1), "--repeat": ("repeat", 1), "--topology": ("topology", ""),
               "--rounds": ("rounds", None),
               "-J": ("json", ""), "--csv": ("csv", "")}


# the model study's iterations and warm-up (its validated settings, docs/costmodel.md), and
# every other target's
_COUNTS = {"model": (10, 2)}
_COUNTS_DEFAULT = (20, 5)


def _common(a) -> None:
    """The checks of every target: counts, the timeout, the label, the world, the output."""
    iters, warmup = _COUNTS.get(a.targets[0] if len(a.targets) == 1 else "", _COUNTS_DEFAULT)
    a.iters = iters if a.iters is None else a.iters
    a.warmup_iters = warmup if a.warmup_iters is None else a.warmup_iters
    for name, v, lo in (("-n", a.iters, 1), ("-w", a.warmup_iters, 0)):
        if not lo <= v <= checks.MAX_COUNT:
            raise UsageError(f"{name} {v}: must be {lo} to {checks.MAX_COUNT}")
    checks.check_world(a)
    for flag, path in (("-J", a.json), ("--csv", a.csv), ("--trace", a.trace)):
        if path:
            checks.on_host(a, checks.check_file, path, flag)


def _check_pattern_args(a) -> None:
    given = [flag for flag, (attr, default) in _SWEEP_ONLY.items() if getattr(a, attr) != default]
    if a.targets == ["numerics"] and a.resume:
        given.append("--resume")
    if given:
        raise UsageError(f"{' '.join(given)}: flags of the collective sweeps; " + (
            "the numerics study runs its own grid (algorithms x float32, bfloat16, float16 x "
            "data shapes) on gloo" if a.targets == ["numerics"] else
            "a pattern study runs each variant of the configs its pattern declares "
            "(bench_configs), in float32 on the world's first transport"))
    _common(a)


def check_run_args(a) -> tuple[list[str], list[int]]:
    """(collectives, sizes) of a sweep ([] and [] for a pattern study); ``a`` gains
    ``patterns``, ``world_size``, ``ranks_here``. Every refusal is a :class:`UsageError`."""

    a.targets = [canonical(t) for t in a.targets]
    ops: list[str] = []
    a.patterns = _patterns(a.targets)
    if a.trace and set(a.targets) & {"overhead", "versus", "model", "numerics"}:
        raise UsageError("--trace: a timeline of collective sweeps, pattern studies and "
                         "commbench audit; not of the overhead, versus, model and numerics "
                         "studies")
    if a.patterns or a.targets == ["numerics"]:  # studies of their own grid of configs
        _check_pattern_args(a)
        return ops, []
    for study in STUDY_TARGETS:
        if study in a.targets and len(a.targets) > 1:
            raise UsageError(f"{study} is a study of its own; run it alone")
    if not 1 <= a.cal_samples <= checks.MAX_COUNT:
        raise UsageError(f"--cal-samples {a.cal_samples}: must be 1 to {checks.MAX_COUNT}")
    for flag, on in (("--refit", a.refit), ("--separate-sweeps", a.separate_sweeps),
                     ("--cal-samples", a.cal_samples != 1)):
        if on and a.targets != ["model"]:
            raise UsageError(f"{flag}: an option of the model study (commbench run model)")
    if a.topology:
        try:
            load(a.topology)
        except ValueError as exc:
            raise UsageError(f"--topology: {exc}") from None
    for t in a.targets or ["collectives"]:
        if t in SUITES:
            ops += [o for o in SUITES[t] if o not in ops]
        elif t in COLLECTIVES:
            ops.append(t) if t not in ops else None
        else:
            raise UsageError(_unknown(t))
    try:
        sizes = sizes_between(parse_size(a.minbytes), parse_size(a.maxbytes), a.stepfactor)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if a.datatype not in DTYPE_NAMES:
        raise UsageError(f"-d {a.datatype}: unknown dtype; known: {', '.join(DTYPE_NAMES)}")
    if a.op not in REDOPS:
        raise UsageError(f"-o {a.op}: must be sum, prod, min, max or avg")
    if a.op == "avg" and not a.datatype.startswith(("float", "bfloat")):
        raise UsageError(f"-o avg -d {a.datatype}: avg needs a floating dtype")
    if a.rounds is None:
        a.rounds = 1 if a.targets == ["model"] else 6
    if a.targets == ["model"] and a.repeat > 1 and a.rounds > 1:
        raise UsageError(f"--repeat {a.repeat} --rounds {a.rounds}: the model study takes one "
                         "(best round, or passes pooled)")
    if a.repeat > 1 and a.resume:
        raise UsageError("--resume works with --repeat 1 only (repeated rounds are kept whole)")
    for name, v, lo in (("--repeat", a.repeat, 1), ("--batch", a.batch, 1),
                        ("--rounds", a.rounds, 1)):
        if not lo <= v <= checks.MAX_COUNT:
            raise UsageError(f"{name} {v}: must be {lo} to {checks.MAX_COUNT}")
    _common(a)
    if a.iters * a.batch > checks.MAX_COUNT:  # every timed call's time is kept, and booked
        raise UsageError(f"-n {a.iters} --batch {a.batch}: at most {checks.MAX_COUNT} timed "
                         "calls a row (each call's time is kept)")
    rooted = [op for op in ops if op in ROOTED]
    if rooted and not 0 <= a.root < a.world_size:
        raise UsageError(f"-r {a.root}: the root of {', '.join(rooted)} must be a rank of the "
                         f"world, 0..{a.world_size - 1}")
    if not rooted and a.root != 0:
        raise UsageError(f"-r {a.root}: none of {', '.join(ops) or a.targets[0]} has a root")
    checks.on_host(a, checks.check_memory, sizes[-1], ITEMSIZE[a.datatype], a.ranks_here,
                   a.world_size, bool(a.check), f"-e {a.maxbytes}")
    _check_transports(a, ops)
    return ops, sizes


def _check_transports(a, ops: list[str]) -> None:
    """--transport names transports this world will have; no dtype/op pair one cannot do."""

    if a.launcher:  # what Context.from_launcher will make: the torch backend, MPI if launched so
        # lazy: imports torch
        from commbench.world.context import default_backend

        torch_side = default_backend()
        have = list(dict.fromkeys([torch_side, *(["mpi"] if detect().is_mpi else [])]))
    else:
        have = ["gloo", *(["mpi"] if a.launch != "plain" and mpi_usable() else [])]
    wanted = [t for t in a.transport.split(",") if t] or have
    bad = [t for t in wanted if t not in have]
    if bad:
        raise UsageError(f"--transport {','.join(bad)}: this world will have {', '.join(have)}")

    reducing = [op for op in ops if OPS[op].reduces]
    why = MPI_CANNOT_REDUCE.get(a.datatype)  # by name: torch is not imported before ranks start
    if "mpi" in wanted and reducing and why:
        raise UsageError(f"-d {a.datatype} -o {a.op} over mpi ({', '.join(reducing)}): "
                         f"{why}; choose another dtype or --transport")
    if "nccl" in wanted and reducing:
        # lazy: imports torch
        from commbench.wire.dtypes import DTYPES

        # lazy: imports torch
        from commbench.wire.transport.torch_backend import TorchBackend

        why = TorchBackend("nccl").unsupported(a.op, DTYPES[a.datatype])
        if why:
            raise UsageError(f"-d {a.datatype} -o {a.op} over nccl ({', '.join(reducing)}): "
                             f"{why}; choose another dtype")


def sweep_settings(a, wanted: list[str]) -> SweepSettings:
    """The settings of a sweep of collectives, once :func:`check_run_args` has checked ``a``."""
    return SweepSettings(study_settings(a), tuple(a.targets or ()), a.datatype, a.op, a.root,
                         a.check, tuple(wanted), a.topology or "", a.json, a.csv)


def study_settings(a) -> StudySettings:
    """The settings a study is given, once :func:`check_run_args` has checked ``a``; a size
    left at its default is None (the study's own range)."""
    return StudySettings(
        iters=a.iters, warmup=a.warmup_iters, rounds=a.rounds, repeat=a.repeat, batch=a.batch,
        lo=None if a.minbytes == "8" else parse_size(a.minbytes),
        hi=None if a.maxbytes == "1M" else parse_size(a.maxbytes),
        separate_sweeps=a.separate_sweeps, cal_samples=a.cal_samples,
        transports=tuple(t for t in a.transport.split(",") if t), out=a.out, label=a.label,
        write=not a.no_write, resume=a.resume, trace=a.trace)
