"""``commbench compare OLD.json NEW.json``: per-row ratios; exit 1 on a regression (results/compare.py)."""

from __future__ import annotations

import sys

from commbench.cli.common import UsageError
from commbench.names import parse_size
from commbench.results.compare import CompareError, compare, load, report, shifted

__all__ = ["add_parser", "command"]


def add_parser(sub) -> None:
    c = sub.add_parser(
        "compare", help="per-row ratios of two results files; a regression gate",
        description="Each row's range of typical times is its rounds' medians (--repeat), else "
        "its iterations' lower decile to median. A row regresses when the new range lies above "
        "the old one by more than 1/(1-threshold) (busbw down by more than --threshold), at sizes "
        ">= --min-size, at 3 consecutive sizes of its series (a shorter series: at every size); "
        "a slower median within the runs' own spread, or at fewer sizes, is listed as not judged, "
        "as is a size faster than the rest of its series (one or two sizes: the old run's slow "
        "spell, behind which a slowdown would hide). "
        "Exit 0: no regression; 1: a regression; 2: a file unreadable or unsound (a size not a "
        "whole number, a time not finite and > 0, a busbw not finite and >= 0), or no rows in "
        "common. Example: commbench compare results/collectives_a-gloo-x4.json "
        "new/collectives_a-gloo-x4.json --threshold 0.1")
    c.add_argument("old", help="the baseline results file (JSON)")
    c.add_argument("new", help="the results file to judge")
    c.add_argument("--threshold", type=float, default=0.10,
                   help="busbw drop that counts, a fraction (0.1: 10%%)")
    c.add_argument("--min-size", default="64K",
                   help="smallest size the gate judges, bytes (K, M, G: powers of 2)")


def command(a) -> int:
    try:
        min_size = parse_size(a.min_size)
        old, new = load(a.old), load(a.new)
        rows, bad = compare(old, new, a.threshold, min_size)
    except (CompareError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if not rows:
        raise UsageError(f"{a.old} and {a.new} have no rows in common")
    print(report(rows, bad, a.threshold, min_size))
    whole = shifted(rows, a.threshold, min_size)
    if whole:
        print(whole)
    if old.get("hardware") != new.get("hardware"):
        print(f"# the machine classes differ ({old.get('hardware')} against "
              f"{new.get('hardware')}): the ratios measure the machines as much as the code")
    if bad:
        print(f"commbench compare: {len(bad)} of {len(rows)} rows regressed ({a.new} against "
              f"{a.old})", file=sys.stderr)
    return 1 if bad else 0
