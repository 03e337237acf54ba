"""Regression rules tried on the same back-to-back runs, and each row's run-to-run noise.

    for k in 01 02 ... 12; do commbench run --np 4 -b 128K -e 512K --out runs/r$k --label v; done
    .venv/bin/python suites/verdict_rules.py runs

Runs are taken three at a time (A, B, C): B is judged against A and C stands for the sweep's
second look at once, so a rule's false flags are the rows it flags in both B and C; its power is
the same with B and C slowed 1.25x (a 20% busbw drop). Rules: the file rule of
``commbench compare`` per row, and a series' geometric mean of the time ratios over its judged
sizes (median; median and best; p10; median and p10) beyond the same 10% busbw drop.
Prints the rules' counts per triplet and the per-row spread (standard deviation of the log of
a statistic across all runs).
"""

from __future__ import annotations

import glob
import math
import os
import statistics
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from plant_regression import slowed  # noqa: E402  (suites/, the script's own folder)

from commbench.results.compare import KEY, compare, load  # noqa: E402

LIMIT = 1 / 0.9
JUDGED = 64 << 10


def _runs(folder: str) -> list[dict]:
    out = []
    for d in sorted(glob.glob(os.path.join(folder, "*", ""))):
        tables = {}
        for path in sorted(glob.glob(os.path.join(d, "collectives_*.json"))):
            t = load(path)
            tables[t["rows"][0]["transport"]] = t
        if tables:
            out.append(tables)
    return [t for t in out if set(t) == set(out[0])]


def _judged(record: dict) -> dict:
    return {tuple(r[k] for k in KEY): r for r in record["rows"] if r["size"] >= JUDGED}


def by_row(old: dict, new: dict) -> set:
    return {tuple(r[k] for k in KEY) for r in compare(old, new)[1]}


def by_series(*stats: str):
    def rule(old: dict, new: dict) -> set:
        o, n = _judged(old), _judged(new)
        series = defaultdict(list)
        for k in n:
            if k in o:
                series[k[:-1]].append(k)
        flagged = set()
        for keys in series.values():
            if all(math.exp(statistics.mean(math.log(n[k][s] / o[k][s]) for k in keys)) > LIMIT
                   for s in stats):
                flagged |= set(keys)
        return flagged
    return rule


RULES = {"file rule (median and best, 3 sizes)": by_row,
         "series: median": by_series("time_us"), "series: median and best":
         by_series("time_us", "min_us"), "series: p10": by_series("p10_us"),
         "series: median and p10": by_series("time_us", "p10_us")}


def main(folder: str) -> None:
    runs = _runs(folder)
    triplets = [runs[i:i + 3] for i in range(0, len(runs) - 2, 3)]
    print(f"{len(runs)} runs, {len(triplets)} triplets")
    for name, rule in RULES.items():
        false, power = [], []
        for a, b, c in triplets:
            f = p = judged = 0
            for tr in a:
                judged += len(_judged(b[tr]))
                f += len(rule(a[tr], b[tr]) & rule(a[tr], c[tr]))
                p += len(rule(a[tr], slowed(b[tr], 1.25)) & rule(a[tr], slowed(c[tr], 1.25)))
            false.append(f)
            power.append(f"{p}/{judged}")
        print(f"{name:38} false flags {false}  planted 1.25x flagged {power}")
    rows = [{k: r for t in run.values() for k, r in _judged(t).items()} for run in runs]
    keys = [k for k in rows[0] if all(k in r for r in rows)]
    for stat in ("time_us", "min_us", "p10_us"):
        sd = sorted(statistics.pstdev([math.log(r[k][stat]) for r in rows]) for k in keys)
        p10, p50, p90 = (sd[min(len(sd) - 1, int(f * len(sd)))] for f in (0.1, 0.5, 0.9))
        print(f"{stat}: sd of log across runs, p10 {p10:.2f} p50 {p50:.2f} p90 {p90:.2f} "
              f"max {sd[-1]:.2f} ({len(keys)} rows)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.split("\n\n")[1])
    main(sys.argv[1])
