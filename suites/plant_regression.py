"""Write a copy of a results file with every time scaled up, to check the regression gate.

    python suites/plant_regression.py results/x.json slow.json 1.25
    commbench compare results/x.json slow.json     # must exit 1 and name the rows

Times (median, min, max, p99) are multiplied by the factor and bandwidths divided by it: a 1.25x
slowdown is a 20% busbw regression.
"""

from __future__ import annotations

import json
import sys


def main(src: str, dst: str, factor: float) -> None:
    with open(src) as f:
        record = json.load(f)
    for row in record["rows"]:
        for key in ("time_us", "min_us", "max_us", "p99_us"):
            row[key] *= factor
        for key in ("algbw", "busbw"):
            row[key] /= factor
    record["planted_slowdown"] = factor
    with open(dst, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: plant_regression.py SRC DST FACTOR")
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
