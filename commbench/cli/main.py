"""``commbench``: info, list, run, compare, claims, predict.

    commbench info                      launcher, world, transports, versions, devices
    commbench list                      every pattern (markers, variants, groups) and algorithm
    commbench gpu-check                 every pattern at a world of one on CUDA over NCCL
    commbench run                       the default suite: every collective and algorithm, 4 ranks
    commbench run ulysses --np 4        a pattern's study (any pattern, or every one of a marker)
    commbench run all_reduce -b 8 -e 64M -f 2 --transport mpi --algo native,ring
    commbench run overhead --np 2       commbench's timing of MPI all-reduce against raw mpi4py
    commbench run versus --np 2         the transport's own all-reduce against ours, side by side
    commbench compare OLD.json NEW.json per-row ratios; exit 1 on a regression

Every argument is checked before any rank starts; a bad one ends with a one-line error and exit
code 2. Under a launcher (mpirun, srun, torchrun) the ranks are the launcher's and rank 0 prints.
"""

from __future__ import annotations

import argparse
import os
import sys

from commbench.timing.measure import COLLECTIVES
from commbench.wire.dtypes import DTYPES

SUITES = {"collectives": COLLECTIVES, "overhead": ("all_reduce",), "model": (),
          "versus": ("all_reduce",)}
# suites that are studies of their own, run alone
STUDIES = ("overhead", "model", "versus")


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line like every other error of commbench."""

    def error(self, message: str):
        print(f"commbench: error: {message} ({self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="commbench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    sub.add_parser("info", help="launcher, world, transports, versions, devices")
    sub.add_parser("list", help="every registered pattern and collective algorithm")
    sub.add_parser("gpu-check", help="every pattern on one GPU over NCCL; exit 3 without CUDA")
    r = sub.add_parser("run", help="time collectives (nccl-tests flags)")
    r.add_argument("targets", nargs="*", help=f"suites ({', '.join(SUITES)}) or collectives "
                   f"({', '.join(COLLECTIVES)}); default: collectives")
    r.add_argument("-b", "--minbytes", default="8")
    r.add_argument("-e", "--maxbytes", default="1M")
    r.add_argument("-f", "--stepfactor", type=int, default=4)
    r.add_argument("-n", "--iters", type=int, default=20)
    r.add_argument("-w", "--warmup-iters", type=int, default=5)
    r.add_argument("-d", "--datatype", default="float32", help=", ".join(DTYPES))
    r.add_argument("-o", "--op", default="sum", help="sum, prod, min, max, avg")
    r.add_argument("-r", "--root", type=int, default=0)
    r.add_argument("-c", "--check", type=int, default=1, choices=(0, 1))
    r.add_argument("--np", type=int, default=4, help="ranks of the local world (no launcher)")
    r.add_argument("--transport", default="", help="comma-separated; default: every one")
    r.add_argument("--launch", default="auto", choices=("auto", "mpi", "plain"))
    r.add_argument("--timeout", type=float, default=120.0, help="seconds per size before a hang")
    r.add_argument("--out", default="results", help="folder for the JSON and markdown tables")
    r.add_argument("--no-write", action="store_true")
    r.add_argument("--algo", default="", help="comma-separated algorithms (native, ring, ...); "
                   "default: native and every algorithm built for each collective")
    r.add_argument("--rounds", type=int, default=None, help="interleaved rounds (overhead and "
                   "versus studies; default 6); model study: passes over its whole job list, "
                   "each row's iterations split among them and pooled (default 3; 1 with --repeat)")
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
                   "take this many times the evaluation rows' iterations (default 1)")
    r.add_argument("--refit", action="store_true", help="model study: judge the stored "
                   "results/model_* again with the current model, measuring nothing")
    r.add_argument("--resume", action="store_true",
                   help="continue an interrupted run: keep the rows its results file holds")
    k = sub.add_parser("claims", help="measure the notes' claims; write the claims table")
    k.add_argument("--np", type=int, default=4)
    k.add_argument("--launch", default="auto", choices=("auto", "mpi", "plain"))
    k.add_argument("--out", default="results")
    k.add_argument("--no-write", action="store_true")
    c = sub.add_parser("compare", help="per-row ratios of two results files; a regression gate")
    c.add_argument("old")
    c.add_argument("new")
    c.add_argument("--threshold", type=float, default=0.10, help="busbw drop that counts (0.10)")
    c.add_argument("--min-size", default="64K", help="smallest size the gate judges (64K)")
    from commbench.cli.predict import add_parser

    add_parser(sub)
    return p


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM ends a run like Ctrl-C: the world closes, rows stay saved


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import signal

    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _terminate)
    try:
        if args.cmd == "info":
            from commbench.cli.info import info

            return info()
        if args.cmd == "gpu-check":
            from commbench.cli.gpu_check import gpu_check

            return gpu_check()
        if args.cmd == "list":
            from commbench.cli.listing import listing

            return listing()
        if args.cmd == "compare":
            return _compare(args)
        if args.cmd == "claims":
            return _claims(args)
        if args.cmd == "predict":
            from commbench.cli.predict import predict

            return predict(args)
        from commbench.cli.run import run

        return run(args, *_check_run_args(args))
    except UsageError as exc:
        print(f"commbench: error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # a bad value found once the world is up (--transport, --algo)
        print(f"commbench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("commbench: interrupted; finished rows are saved", file=sys.stderr)
        return 130


def _claims(a) -> int:
    from commbench.results import records as res
    from commbench.runtime.local import LocalWorld
    from commbench.studies.claims import claims_markdown, measure_claim
    from commbench.studies.claims_list import CLAIMS
    from commbench.studies.sweep import hardware

    if a.np < 2:
        raise UsageError(f"--np {a.np}: the claims need at least 2 ranks")
    with LocalWorld(a.np, launch=a.launch) as world:
        rows = [measure_claim(world, c) for c in CLAIMS if a.np >= c.min_ranks]
        launch = f"local-{world.launch}"
    record = res.header("claims", a.np, launch, hardware(), {"what": "ledger bytes, not time"})
    record["rows"] = rows
    text = claims_markdown(record)
    print(text)
    if not a.no_write:
        stem = os.path.join(a.out, f"claims_{hardware()}-x{a.np}")
        res.write_json(stem + ".json", record)
        res.write_atomic(stem + ".md", text)
        print(f"# wrote {stem}.json and {stem}.md")
    bad = [r["claim"] for r in rows if not r["ledger_matches_prediction"]]
    for claim in bad:
        print(f"# ledger != prediction in the runs of: {claim}", file=sys.stderr)
    return 1 if bad else 0


def _compare(a) -> int:
    from commbench.results.compare import CompareError, compare, load, report
    from commbench.studies.sweep import parse_size

    try:
        min_size = parse_size(a.min_size)
        rows, bad = compare(load(a.old), load(a.new), a.threshold, min_size)
    except (CompareError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if not rows:
        raise UsageError(f"{a.old} and {a.new} have no rows in common")
    print(report(rows, bad, a.threshold, min_size))
    return 1 if bad else 0


def _patterns(targets: list[str]) -> list[str]:
    """The patterns ``targets`` name (pattern names or markers); [] for collective targets."""
    from commbench.patterns.registry import PATTERNS, select

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
               "--algo": ("algo", ""), "--transport": ("transport", ""),
               "--batch": ("batch", 1), "--repeat": ("repeat", 1), "--topology": ("topology", ""),
               "--resume": ("resume", False), "--rounds": ("rounds", None)}


def _check_pattern_args(a) -> None:
    given = [flag for flag, (attr, default) in _SWEEP_ONLY.items() if getattr(a, attr) != default]
    if given:
        raise UsageError(f"{' '.join(given)}: flags of the collective sweeps; a pattern study "
                         "runs each variant of the configs its pattern declares (bench_configs), "
                         "on the world's first transport")
    for name, v, lo in (("-n", a.iters, 1), ("-w", a.warmup_iters, 0), ("--np", a.np, 1)):
        if v < lo:
            raise UsageError(f"{name} {v}: must be >= {lo}")
    if a.timeout <= 0:
        raise UsageError(f"--timeout {a.timeout}: must be > 0")


def _check_run_args(a) -> tuple[list[str], list[int]]:
    from commbench.studies.sweep import parse_size, sizes_between

    ops: list[str] = []
    a.patterns = _patterns(a.targets)
    if a.patterns:
        _check_pattern_args(a)
        return ops, []
    for study in STUDIES:
        if study in a.targets and len(a.targets) > 1:
            raise UsageError(f"{study} is a study of its own; run it alone")
    if a.cal_samples < 1:
        raise UsageError(f"--cal-samples {a.cal_samples}: must be >= 1")
    for flag, on in (("--refit", a.refit), ("--separate-sweeps", a.separate_sweeps),
                     ("--cal-samples", a.cal_samples != 1)):
        if on and a.targets != ["model"]:
            raise UsageError(f"{flag}: an option of the model study (commbench run model)")
    if a.topology:
        from commbench.costmodel.topology import load

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
            raise UsageError(f"unknown suite or collective {t!r}; known: "
                             f"{', '.join([*SUITES, *COLLECTIVES])}")
    try:
        sizes = sizes_between(parse_size(a.minbytes), parse_size(a.maxbytes), a.stepfactor)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if a.datatype not in DTYPES:
        raise UsageError(f"-d {a.datatype}: unknown dtype; known: {', '.join(DTYPES)}")
    if a.op not in ("sum", "prod", "min", "max", "avg"):
        raise UsageError(f"-o {a.op}: must be sum, prod, min, max or avg")
    if a.op == "avg" and not DTYPES[a.datatype].is_floating_point:
        raise UsageError(f"-o avg -d {a.datatype}: avg needs a floating dtype")
    if a.rounds is None:
        a.rounds = (1 if a.repeat > 1 else 3) if a.targets == ["model"] else 6
    if a.targets == ["model"] and a.repeat > 1 and a.rounds > 1:
        raise UsageError(f"--repeat {a.repeat} --rounds {a.rounds}: the model study takes one "
                         "(best round, or passes pooled)")
    if a.repeat > 1 and a.resume:
        raise UsageError("--resume works with --repeat 1 only (repeated rounds are kept whole)")
    for name, v, lo in (("-n", a.iters, 1), ("-w", a.warmup_iters, 0), ("--np", a.np, 1),
                        ("--repeat", a.repeat, 1), ("--batch", a.batch, 1),
                        ("--rounds", a.rounds, 1)):
        if v < lo:
            raise UsageError(f"{name} {v}: must be >= {lo}")
    if a.root < 0:
        raise UsageError(f"-r {a.root}: must be >= 0")
    if a.timeout <= 0:
        raise UsageError(f"--timeout {a.timeout}: must be > 0")
    return ops, sizes


if __name__ == "__main__":
    sys.exit(main())
