"""Write a copy of a results file with every time scaled up, to check the regression gate.

    python suites/plant_regression.py results/x.json slow.json 1.25
    commbench compare results/x.json slow.json     # must exit 1 and name the rows

Every time figure of a row (median, best, mean, lower decile, p99, max, and each round's median
with ``--repeat``) is multiplied by the factor and the bandwidths divided by it: a 1.25x slowdown
is a 20% busbw regression. :func:`slowed` is the same arithmetic for the suites that plant one.
"""

from __future__ import annotations

import json
import sys

TIMES = ("time_us", "min_us", "max_us", "p99_us", "p10_us", "avg_us")


def slowed(record: dict, factor: float, algo: str | None = None) -> dict:
    """``record`` with every time figure of its rows (of ``algo``'s alone, given) times
    ``factor`` and their bandwidths divided by it."""
    rows = []
    for r in record["rows"]:
        if algo is None or r["algo"] == algo:
            r = {**r, **{k: r[k] * factor for k in TIMES if k in r},
                 "algbw": r["algbw"] / factor, "busbw": r["busbw"] / factor}
            if "rounds_us" in r:
                r["rounds_us"] = [t * factor for t in r["rounds_us"]]
        rows.append(r)
    return {**record, "rows": rows}


def main(src: str, dst: str, factor: float) -> None:
    with open(src) as f:
        record = json.load(f)
    record = {**slowed(record, factor), "planted_slowdown": factor}
    with open(dst, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: plant_regression.py SRC DST FACTOR")
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
