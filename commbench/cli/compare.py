"""``commbench compare OLD.json NEW.json``: per-row ratios; exit 1 on a regression (results/compare.py)."""

from __future__ import annotations

from commbench.cli.common import UsageError

__all__ = ["add_parser", "command"]


def add_parser(sub) -> None:
    c = sub.add_parser("compare", help="per-row ratios of two results files; a regression gate")
    c.add_argument("old")
    c.add_argument("new")
    c.add_argument("--threshold", type=float, default=0.10, help="busbw drop that counts (0.10)")
    c.add_argument("--min-size", default="64K", help="smallest size the gate judges (64K)")


def command(a) -> int:
    from commbench.results.compare import CompareError, compare, load, report
    from commbench.studies.sweep import parse_size

    try:
        min_size = parse_size(a.min_size)
        rows, bad = compare(load(a.old), load(a.new), a.threshold, min_size)
    except (CompareError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if not rows:
        raise UsageError(f"{a.old} and {a.new} have no rows in common")
    print(report(rows, bad, a.threshold, min_size))
    return 1 if bad else 0
