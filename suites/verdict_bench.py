"""The regression verdict's false alarms and its power, on this machine's own noise.

    .venv/bin/python suites/verdict_bench.py [--pairs 5] [--np 4] [-b 64K] [-e 1M]

Per pair: ``commbench run`` twice back to back on the same commit into one folder; the second
run is judged against the first by the sweep itself (regressed rows measured again at once,
only rows slow twice count). Counted per pair: the rows the gate judges (>= 64 KiB), the rows
``commbench compare``'s file rule flags (no second measurement), those the sweep reports after
measuring them again, and, of the second run's table slowed by a planted 1.25x (a 20% busbw
drop; suites/plant_regression.py's arithmetic), the judged rows the file rule flags.

Writes ``results/verdict_<machine class>-x<ranks>-<b>-<e>-repeat<r>.md``. Only sizes the gate
judges are swept (64 KiB up), as the default suite at those sizes (``-b 128K -e 512K``: the
rows of ``make bench`` that the gate judges).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from plant_regression import slowed  # noqa: E402  (suites/, the script's own folder)


def _run(folder: str, a) -> str:
    out = subprocess.run([sys.executable, "-m", "commbench", "run", "--np", str(a.np), "-b", a.b,
                          "-e", a.e, "--repeat", str(a.repeat), "--out", folder, "--label",
                          "verdict"],
                         capture_output=True, text=True, timeout=3600)
    if out.returncode not in (0, 1):
        raise SystemExit(f"commbench run failed ({out.returncode}): {out.stderr[-800:]}")
    return out.stdout


def main() -> None:
    from commbench.results import records as res
    from commbench.results.compare import compare, load

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--np", type=int, default=4)
    p.add_argument("-b", default="64K")
    p.add_argument("-e", default="1M")
    p.add_argument("--factor", type=float, default=1.25)
    p.add_argument("--repeat", type=int, default=1, help="commbench run --repeat: rounds of the "
                   "whole sweep, each row its best round")
    a = p.parse_args()
    lines = []
    t0 = time.monotonic()
    for k in range(a.pairs):
        with tempfile.TemporaryDirectory() as folder:
            _run(folder, a)
            paths = [os.path.join(folder, f) for f in sorted(os.listdir(folder))
                     if f.endswith(".json") and f.startswith("collectives_")]
            firsts = [load(path) for path in paths]  # one per transport
            second = _run(folder, a)
            tables = [load(path) for path in paths]
            said = re.findall(r"# (\d+) rows regressed against .*?, (\d+) regressed again",
                              second)
            flagged = sum(int(f) for f, _ in said)
            confirmed = sum(int(c) for _, c in said)
            rows = [r for t in tables for r in t["rows"]]
            judged = [r for r in rows if r["size"] >= 64 << 10]
            planted = sum(len(compare(old, slowed(t, a.factor))[1])
                          for old, t in zip(firsts, tables, strict=True))
            ratios = sorted(r["new_us"] / r["old_us"] for old, t in zip(firsts, tables, strict=True)
                            for r in compare(old, t)[0] if r["size"] >= 64 << 10)
            spread = tuple(res.percentile(ratios, q) for q in (5, 50, 95))
            lines.append((k + 1, len(rows), len(judged), flagged, confirmed, planted, spread))
            print(lines[-1], flush=True)
    minutes = (time.monotonic() - t0) / 60
    from commbench.results.machine import machine_class

    hw = machine_class("")
    text = [f"# The regression verdict: {a.pairs} back-to-back pairs, {hw}, {a.np} ranks, "
            f"--repeat {a.repeat}",
            "",
            f"`.venv/bin/python suites/verdict_bench.py --pairs {a.pairs} --np {a.np} -b {a.b} "
            f"-e {a.e} --repeat {a.repeat}` ({minutes:.0f} min). Each pair: `commbench run --np "
            f"{a.np} -b {a.b} -e {a.e} --repeat {a.repeat}` twice on one commit into one folder; "
            "the second run judged against the first by the sweep (rows that regress measured "
            "again at once; only rows slow twice count). `file rule`: rows `commbench compare`'s "
            "rule flags between the two tables; "
            "`confirmed`: of those, rows slow again when measured again (what the sweep "
            f"reports); `planted {a.factor}x`: judged rows the file rule flags between the first "
            f"table and the second with its times multiplied by {a.factor} (busbw down "
            f"{1 - 1 / a.factor:.0%}).", "",
            "`second/first`: the judged rows' ratio of medians between the two runs, its 5th, "
            "50th and 95th percentiles: the machine's run-to-run noise.", "",
            "| pair | rows | judged (>= 64 KiB) | file rule | confirmed | planted flagged | "
            "second/first p5 / p50 / p95 |",
            "|---:|---:|---:|---:|---:|---:|---|"]
    text += [f"| {k} | {n} | {j} | {f} | {c} | {pl} of {j} | "
             f"{sp[0]:.2f} / {sp[1]:.2f} / {sp[2]:.2f} |" for k, n, j, f, c, pl, sp in lines]
    name = f"verdict_{hw}-x{a.np}-{a.b}-{a.e}-repeat{a.repeat}.md"
    out = os.path.join(os.path.dirname(HERE), "results", name)
    with open(out, "w") as f:
        f.write("\n".join(text) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
