"""``commbench``: info, list, run, compare, claims, predict, gpu-check.

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

import importlib
import sys

from commbench.cli.common import Parser, UsageError

__all__ = ["COMMANDS", "main"]

# command -> module; each module has add_parser(sub) and command(args) -> exit code
COMMANDS = {"info": "info", "list": "listing", "run": "run", "compare": "compare",
            "claims": "claims", "predict": "predict", "gpu-check": "gpu_check"}


def _module(cmd: str):
    return importlib.import_module(f"commbench.cli.{COMMANDS[cmd]}")


def _parser() -> Parser:
    p = Parser(prog="commbench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    for cmd in COMMANDS:
        _module(cmd).add_parser(sub)
    return p


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM ends a run like Ctrl-C: the world closes, rows stay saved


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import signal

    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _terminate)
    try:
        return _module(args.cmd).command(args)
    except UsageError as exc:
        print(f"commbench: error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # a bad value found once the world is up (--transport, --algo)
        print(f"commbench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("commbench: interrupted; finished rows are saved", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
