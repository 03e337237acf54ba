"""Timing helpers of the MoE benchmark, the family not yet on the pattern interface."""

from __future__ import annotations

import statistics

from commbench.results import records as res

__all__ = ["per_iteration", "timing"]


def per_iteration(outs: list[dict], key: str = "times") -> list[float]:
    """Per iteration, the seconds of the slowest rank (the iteration ends with it)."""
    return [max(ts) for ts in zip(*(o[key] for o in outs), strict=True)]


def timing(outs: list[dict]) -> tuple[float, float, int]:
    """(median us, p99 us) of the per-iteration maximum over ranks, and the bytes the busiest
    rank's ledger counted."""
    per_iter = per_iteration(outs)
    return (statistics.median(per_iter) * 1e6, res.percentile(per_iter, 99) * 1e6,
            max(sum(e[4] for e in o["ledger"]) for o in outs))
