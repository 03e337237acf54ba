"""The versus study of two checkouts, run alternately on one machine: did a change move it?

    .venv/bin/python suites/side_by_side.py OLD_CHECKOUT NEW_CHECKOUT [--pairs 2] [--np 4]
        [--transport mpi] [-e 128K] [--rounds 8]

Runs ``commbench run versus`` from OLD, NEW, NEW, OLD, ... (ABBA, so a slow spell of the
machine falls on both), each into a folder of its own, and writes
``results/side_by_side_<machine>-<transport>-x<ranks>.md``: per size, the median over the runs
of each checkout of the best algorithm's time and of the transport's own, and new/old.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _run(checkout: str, folder: str, a) -> dict:
    cmd = [sys.executable, "-m", "commbench", "run", "versus", "--np", str(a.np), "--transport",
           a.transport, "-b", "8", "-e", a.e, "-f", "4", "--rounds", str(a.rounds), "--out",
           folder, "--label", "side"]
    out = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"{checkout}: exit {out.returncode}: {out.stderr[-600:]}")
    (name,) = [f for f in os.listdir(folder) if f.endswith(".json")]
    with open(os.path.join(folder, name)) as f:
        return {r["size"]: r for r in json.load(f)["rows"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--transport", default="mpi")
    p.add_argument("-e", default="128K")
    p.add_argument("--rounds", type=int, default=8)
    a = p.parse_args()
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    order = [k for _ in range(a.pairs) for k in ("old", "new", "new", "old")][: 2 * a.pairs]
    for k in order:
        with tempfile.TemporaryDirectory() as folder:
            runs[k].append(_run(getattr(a, k), folder, a))
            print(k, "done", flush=True)
    sizes = sorted(runs["old"][0])

    def med(k: str, size: int, key: str) -> float:
        return statistics.median(r[size][key] for r in runs[k])

    sys.path.insert(0, ROOT)
    from commbench.results.machine import machine_class

    hw = machine_class("")
    lines = [f"# The versus study side by side: two checkouts, {hw}, {a.transport}, {a.np} ranks",
             "", f"`suites/side_by_side.py OLD NEW --pairs {a.pairs} --np {a.np} --transport "
             f"{a.transport} -e {a.e} --rounds {a.rounds}`: `commbench run versus` from each "
             f"checkout in the order {' '.join(order)}; per size the median over each checkout's "
             "runs.", "",
             "| size (B) | best old (us) | best new (us) | new/old | native old (us) | "
             "native new (us) | new/old |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for s in sizes:
        bo, bn = med("old", s, "best_us"), med("new", s, "best_us")
        no, nn = med("old", s, "native_us"), med("new", s, "native_us")
        lines.append(f"| {s} | {bo:.1f} | {bn:.1f} | {bn / bo:.2f} | {no:.1f} | {nn:.1f} | "
                     f"{nn / no:.2f} |")
    path = os.path.join(ROOT, "results", f"side_by_side_{hw}-{a.transport}-x{a.np}.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
