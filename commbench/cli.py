"""``commbench``: info, run.

    commbench info                      launcher, world, transports, versions, devices
    commbench run                       the default suite: every collective, local 4-rank world
    commbench run all_reduce -b 8 -e 64M -f 2 --transport mpi

Every argument is checked before any rank starts; a bad one ends with a one-line error and exit
code 2. Under a launcher (mpirun, srun, torchrun) the ranks are the launcher's and rank 0 prints.
"""

from __future__ import annotations

import argparse
import os
import sys

from commbench.bench import COLLECTIVES, DTYPES

SUITES = {"collectives": COLLECTIVES}


class UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="commbench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="launcher, world, transports, versions, devices")
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
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "info":
            from commbench.info import info

            return info()
        return _run(args)
    except UsageError as exc:
        print(f"commbench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("commbench: interrupted; finished rows are saved", file=sys.stderr)
        return 130


def _check_run_args(a) -> tuple[list[str], list[int]]:
    from commbench.runner import parse_size, sizes_between

    ops: list[str] = []
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
    for name, v, lo in (("-n", a.iters, 1), ("-w", a.warmup_iters, 0), ("--np", a.np, 1)):
        if v < lo:
            raise UsageError(f"{name} {v}: must be >= {lo}")
    if a.root < 0:
        raise UsageError(f"-r {a.root}: must be >= 0")
    if a.timeout <= 0:
        raise UsageError(f"--timeout {a.timeout}: must be > 0")
    return ops, sizes


def _world(a):
    from commbench.launch import detect

    info = detect()
    if info.launched:
        from commbench.context import Context
        from commbench.spmd import LauncherWorld

        if a.np != 4 and a.np != info.size:
            raise UsageError(f"--np {a.np}: the launcher ({info.launcher}) started {info.size} "
                             "ranks; drop --np or launch that many")
        return LauncherWorld(Context.from_launcher(), timeout_s=a.timeout), info.rank == 0
    from commbench.local import LocalWorld

    return LocalWorld(a.np, launch=a.launch, timeout_s=a.timeout), True


def _run(a) -> int:
    from commbench import results as res
    from commbench.bench import Case
    from commbench.runner import HEADER, hardware, run_series

    ops, sizes = _check_run_args(a)
    world, printer = _world(a)
    emit = print if printer else (lambda s: None)
    wrong = 0
    try:
        world.start()
        transports = [t for t in a.transport.split(",") if t] or list(world.transports)
        bad = [t for t in transports if t not in world.transports]
        if bad:
            raise UsageError(f"--transport {','.join(bad)}: this world has "
                             f"{', '.join(world.transports)}")
        launch = f"local-{world.launch}" if hasattr(world, "launch") and \
            world.launch in ("mpi", "plain") else world.launch
        measurement = {"cadence": "isolated (transport barrier before each iteration, untimed)",
                       "rank_aggregation": "per-iteration max over ranks",
                       "statistic": "median", "iters": a.iters, "warmup": a.warmup_iters}
        emit(f"# commbench run {' '.join(ops)}: {world.size} ranks ({launch}), "
             f"transports {' '.join(transports)}, dtype {a.datatype}, op {a.op}")
        emit(f"# {', '.join(f'{k}: {v}' for k, v in measurement.items())}")
        for transport in transports:
            record = res.header("collectives", world.size, launch, hardware(), measurement)
            stem = os.path.join(a.out, f"collectives_{hardware()}-{transport}-x{world.size}")
            path = None if a.no_write or not printer else stem + ".json"
            emit("#\n" + HEADER)
            for op in ops:
                case = Case(op, transport, "native", a.datatype, a.op, a.root, a.iters,
                            a.warmup_iters, bool(a.check))
                rows = run_series(world, case, sizes, record, path, emit)
                wrong += sum(r["wrong"] for r in rows)
            if path:
                res.write_atomic(stem + ".md", res.markdown(record))
                emit(f"# wrote {path} and {stem}.md")
        emit(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    finally:
        world.close()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
