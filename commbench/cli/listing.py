"""``commbench list``: every registered pattern and every collective algorithm."""

from __future__ import annotations

__all__ = ["listing"]


def listing(emit=print) -> int:
    from tabulate import tabulate

    from commbench.collectives import ALGORITHMS
    from commbench.patterns.registry import PATTERNS

    rows = [[p.name, " ".join(p.markers), ", ".join(p.variants), p.optimized,
             " ".join(p.axes), ", ".join(b.name for b in p.broken)] for p in PATTERNS.values()]
    emit(tabulate(rows, headers=["pattern", "markers", "variants", "optimized", "groups",
                                 "broken variants (the contract must catch them)"],
                  tablefmt="github"))
    emit("")
    algos: dict[str, list[str]] = {}
    for op, name in ALGORITHMS:
        algos.setdefault(op, []).append(name)
    emit(tabulate([[op, ", ".join(names)] for op, names in algos.items()],
                  headers=["collective", "algorithms (native: the transport's own)"],
                  tablefmt="github"))
    return 0


def add_parser(sub) -> None:
    sub.add_parser("list", help="every registered pattern and collective algorithm")


def command(a) -> int:
    return listing()
