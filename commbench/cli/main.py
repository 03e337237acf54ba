"""``commbench``: info, list, run, compare, claims, predict, audit, analyze, replay, import,
calibrate, gpu-check.

    commbench info                      launcher, world, transports, versions, devices
    commbench list                      every pattern (markers, variants, groups) and algorithm
    commbench gpu-check                 every pattern at a world of one on CUDA over NCCL
    commbench run                       the default suite: every collective and algorithm, 4 ranks
    commbench run ulysses --np 4        a pattern's study (any pattern, or every one of a marker)
    commbench run all_reduce -b 8 -e 64M -f 2 --transport mpi --algo native,ring
    commbench run overhead --np 2       commbench's timing of MPI all-reduce against raw mpi4py
    commbench run versus --np 2         the transport's own all-reduce against ours, side by side
    commbench compare OLD.json NEW.json per-row ratios; exit 1 on a regression
    commbench audit train.py --np 2     every collective your own script issues, per group/module
    commbench analyze traces/           a job's profiler traces: each call against the wire
    commbench replay traces/ --np 4     a recorded job's calls re-issued and timed, no model
    commbench import all_reduce.log     nccl-tests / rccl-tests logs as results, beside the model
    commbench calibrate *.log --topology cluster-h100-ndr --json mine.json   the model fitted

Exit codes: 0 all good; 1 wrong results (#wrong > 0, booked != predicted calls, a failed claim,
a regression); 2 bad input (arguments, files, configs), found before any rank starts wherever it
can be; 3 a run that failed (a dead rank, a timeout, a world that cannot start, an allocation or
a write that fails); 130 interrupted (143: SIGTERM), finished rows saved. Every non-zero exit
prints one line; the traceback goes to the private log file that line names (mode 0600 under
~/.local/state/commbench/logs, commbench.runtime.crashlog; --debug, or COMMBENCH_DEBUG=1, prints
it too). Under a launcher (mpirun, srun, torchrun) the ranks are the launcher's and rank 0
prints.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import traceback

from commbench.cli.common import Parser, UsageError
from commbench.rankset import rank_list
from commbench.runtime import crashlog, supervise
from commbench.runtime.errors import CallTimeout, RankDied, SPMDError, WorldError
from commbench.runtime.launch import LaunchError, detect
from commbench.version import __version__
from commbench.world.local import spawn, zygote

__all__ = ["COMMANDS", "main"]

# command -> module; each module has add_parser(sub) and command(args) -> exit code, and imports
# nothing heavy (torch) at its top, so that --help answers at once
COMMANDS = {"info": "info", "list": "listing", "run": "run", "compare": "compare",
            "claims": "claims", "predict": "predict", "audit": "audit", "analyze": "analyze",
            "replay": "replay", "import": "importing", "calibrate": "calibrate",
            "gpu-check": "gpu_check"}


# commands that read files and start no ranks: under a launcher rank 0 alone runs them
OFFLINE = ("list", "compare", "predict", "analyze", "import", "calibrate")


class Terminated(KeyboardInterrupt):
    """SIGTERM: ends a run like Ctrl-C (the world closes, rows stay saved), exit code 143."""


def _module(cmd: str):
    return importlib.import_module(f"commbench.cli.{COMMANDS[cmd]}")


def _parser(only: str | None = None) -> Parser:
    """The command line's parser: every command's, or ``only``'s (a command's own imports are
    then the only ones: ``commbench analyze`` does not import the run's argument checks)."""

    p = Parser(prog="commbench", description=__doc__.split("\n\n", 1)[1])
    p.add_argument("--version", action="version", version=f"commbench {__version__}")
    p.add_argument("--debug", action="store_true", help="print the traceback of a failure "
                   "(also COMMBENCH_DEBUG=1); may be given anywhere on the line")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    for cmd in COMMANDS:
        if only is None or cmd == only:
            _module(cmd).add_parser(sub)
    return p


def _terminate(signum, frame) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    if argv is None and supervise.wanted(sys.argv[1:]):
        # the command line under a launcher: the work in a child, so a dead rank says so
        return supervise.supervise(sys.argv[1:])
    cli = argv is None  # the command line, not main() called from Python (a test)
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if argv[:1] == ["audit"] and "--" in argv:  # the audited script's own arguments
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1:]
    debug = "--debug" in argv or os.environ.get("COMMBENCH_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    first = next((a for a in argv if not a.startswith("-")), None)  # the top level takes no values
    args = _parser(first if first in COMMANDS else None).parse_args(argv)
    if script_args:
        args.args = [*args.args, *script_args]
    _warm_ranks(args)
    if cli and args.cmd in OFFLINE:
        size = _elsewhere()
        if size < 0:
            return 0  # rank 0 does the work; 511 more copies would read and write it all again
        if size > 1:
            print(f"# {args.cmd} starts no ranks: rank 0 of the launcher's {size} runs it, the "
                  "others exit at once", file=sys.stderr)

    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _terminate)
    try:
        return _module(args.cmd).command(args)
    except UsageError as exc:
        _refuse(f"commbench: error: {exc}")
        return 2
    except ValueError as exc:  # a bad value found by a library check (a config, a topology)
        _refuse(f"commbench: error: {_one_line(exc)}")
        return 2
    except Terminated:
        print("commbench: terminated (SIGTERM); finished rows are saved", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("commbench: interrupted; finished rows are saved", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (commbench list | head): nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:  # noqa: BLE001 - every failure of a run ends in one line
        return _failed(exc, args.cmd, debug)


def _warm_ranks(args) -> None:
    """A command that may start local ranks (it takes ``--np``, and no launcher started this
    one) starts their zygote now, which imports torch while this process checks the command
    and, once the ranks' processes exist, imports it too (:mod:`commbench.world.local.zygote`,
    :func:`commbench.cli.checks.start_world`); a command refused or done without ranks ends it."""
    if not isinstance(getattr(args, "np", None), int) or args.np < 1:
        return

    if detect().launched or os.environ.get("COMMBENCH_WORKER"):
        return

    env = spawn.worker_env(b"")
    if zygote.supported() and not zygote.compatible(os.environ.get(zygote.ENV), env):
        zygote.own(env)


def _elsewhere(env=None) -> int:
    """Under a launcher, the launcher's world size on rank 0 and -1 on any other rank (which
    leaves a command of files to rank 0); 0 with no launcher."""
    try:
        info = detect(env)
    except LaunchError:
        return 0  # the command reads files: a launcher's bad variables are not its business
    if not info.launched or os.environ.get("COMMBENCH_WORKER"):
        return 0
    return info.size if info.rank == 0 else -1


def _refuse(line: str) -> None:
    """A refusal's one line, from rank 0 alone under a launcher: every rank makes the same one
    (refusals one rank alone could make are agreed first, commbench.cli.run.command)."""

    try:
        quiet = detect().launched and detect().rank != 0 and not os.environ.get("COMMBENCH_WORKER")
    except LaunchError:
        quiet = False
    if not quiet:
        print(line, file=sys.stderr)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, SPMDError):
        first = exc.failures[0]
        ranks = rank_list(f.rank for f in exc.failures)
        return (f"{exc.task}: rank(s) {ranks} raised; first: rank {first.rank} "
                f"{first.type_name}: {first.message.splitlines()[0] if first.message else ''}")
    lines = [s.strip() for s in str(exc).splitlines() if s.strip()]
    return " | ".join(lines) or type(exc).__name__


# what an allocator says when memory runs out (torch's CPU and CUDA allocators, the OS): not a
# word that merely appears in a traceback (megatron-core's _allocate_buffers_for_parameters)
OUT_OF_MEMORY = ("out of memory", "can't allocate memory", "cannot allocate memory",
                 "tried to allocate")


def _what_to_do(exc: BaseException, cmd: str = "") -> str:
    text = str(exc).lower()
    if isinstance(exc, MemoryError) or any(words in text for words in OUT_OF_MEMORY):
        if cmd in ("audit", "replay"):
            return "it ran out of memory: a smaller model, fewer ranks per host, or more memory"
        return "lower -e or the number of ranks"
    if isinstance(exc, CallTimeout):
        return "a rank is stuck or slow: look at the ranks named, or raise --timeout"
    if isinstance(exc, RankDied):
        return "a rank's process ended: see the log for its last output"
    if isinstance(exc, SPMDError):
        return "a rank raised: the log holds every rank's traceback"
    if isinstance(exc, WorldError):
        return "the world could not start or run: see the log"
    if isinstance(exc, OSError):
        return "check the path and the free space"
    return "see the log; report it with the log if it is commbench's fault"


def _failed(exc: BaseException, cmd: str, debug: bool) -> int:
    """One line naming what failed and where its traceback is kept; exit code 3."""

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        log = crashlog.write_log(f"commbench {' '.join(sys.argv[1:])}\n{text}")
    except OSError as err:
        log = f"(no log: {crashlog.log_dir()}: {err.strerror or err})"
    if debug:
        print(text, file=sys.stderr, end="")
    print(f"commbench: {cmd} failed: {type(exc).__name__}: {_one_line(exc)}; "
          f"{_what_to_do(exc, cmd)}; traceback in {log}", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
