"""How long each of the README's commands takes on this machine, at its default settings.

    .venv/bin/python suites/durations.py [--only run,ulysses,...]

Each command runs once, one after another, writing into a temporary folder (``--out``), and is
timed from start to exit. Writes ``results/durations_<machine class>.md``: the command, its wall
time, its exit code. One run each: a shared machine's load moves these by a tenth or more.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

PATTERNS = ("tp_mlp", "tp_layer", "vocab", "ddp", "zero", "ulysses", "ulysses_zero3",
            "ring_attention", "pp", "moe_gating", "moe")
COMMANDS = {  # name -> the README's command, without the folder it writes to
    "run": ["run", "--np", "4"],
    **{p: ["run", p, "--np", "4"] for p in PATTERNS},
    "claims": ["claims", "--np", "4"],
    "versus": ["run", "versus", "--np", "4"],
    "numerics": ["run", "numerics", "--np", "8"],
    "audit torch_tp_sp": ["audit", "examples/torch_tp_sp.py", "--np", "2"],
    "audit fsdp2": ["audit", "examples/fsdp2.py", "--np", "4"],
    "model": ["run", "model", "--np", "4"],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="comma-separated names of COMMANDS; default all")
    a = p.parse_args()
    names = a.only.split(",") if a.only else list(COMMANDS)
    unknown = [n for n in names if n not in COMMANDS]
    if unknown:
        raise SystemExit(f"--only {','.join(unknown)}: not one of {', '.join(COMMANDS)}")
    from commbench.results.records import git_commit

    commit = git_commit(ROOT)  # before the runs: what was measured, not what the tree became
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    for name in names:
        argv = COMMANDS[name]
        with tempfile.TemporaryDirectory() as folder:
            t0 = time.monotonic()
            out = subprocess.run([sys.executable, "-m", "commbench", *argv, "--out", folder,
                                  "--label", "durations"], cwd=ROOT, capture_output=True,
                                 text=True, timeout=4 * 3600)
            seconds = time.monotonic() - t0
        rows.append((" ".join(["commbench", *argv]), seconds, out.returncode))
        print(f"{rows[-1][0]}: {seconds:.0f} s, exit {out.returncode}", flush=True)
    from commbench.results.machine import machine_class

    hw = machine_class("")
    text = [f"# How long the README's commands take: {hw}", "",
            "`.venv/bin/python suites/durations.py`: each command once at its default settings, "
            "one after another, into a temporary folder; wall time from start to exit, ranks' "
            f"start-up included. One run each on a shared machine. Started {started} at commit "
            f"`{commit or 'unknown'}`.", "",
            "| command | wall time | exit |", "|---|---:|---:|"]
    text += [f"| `{cmd}` | {_human(s)} | {rc} |" for cmd, s, rc in rows]
    path = os.path.join(ROOT, "results", f"durations_{hw}.md")
    with open(path, "w") as f:
        f.write("\n".join(text) + "\n")
    print(f"wrote {path}")


def _human(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


if __name__ == "__main__":
    main()
