"""The memory pre-check's arithmetic against the peaks the algorithms really reach.

results/memory_<machine>-x4.json is measured by suites/memory_bench.py: per collective x
algorithm x transport, at two sizes, the largest rank's peak resident bytes above what it held
before the series. The check must charge at least that for every row, so that a run it admits
does not reach the OOM killer.
"""

from __future__ import annotations

import glob
import json
import os

import pytest

from commbench.cli import checks

pytestmark = pytest.mark.foundation
RESULTS = os.path.join(os.path.dirname(__file__), "..", "results")


def _tables() -> list[dict]:
    paths = sorted(glob.glob(os.path.join(RESULTS, "memory_*.json")))
    assert paths, "no committed memory table (suites/memory_bench.py writes it)"
    out = []
    for p in paths:
        with open(p) as f:
            out.append(json.load(f))
    return out


def _short(rows) -> list[str]:
    """The rows whose peak the check's arithmetic (float32, results checked) does not cover."""
    return [f"{r['op']}/{r['algo']}/{r['transport']} at {r['size']} B: peak {r['peak_bytes']}, "
            f"charged {checks.memory_need(r['size'], 4, True)}"
            for r in rows if checks.memory_need(r["size"], 4, True) < r["peak_bytes"]]


def test_the_check_charges_at_least_every_measured_peak_at_two_sizes():
    for table in _tables():
        per_case: dict[tuple, set] = {}
        for r in table["rows"]:
            per_case.setdefault((r["op"], r["algo"], r["transport"]), set()).add(r["size"])
        assert len(per_case) >= 20 and all(len(s) >= 2 for s in per_case.values()), per_case
        assert not _short(table["rows"]), _short(table["rows"])


def test_the_buffers_alone_would_undercharge_a_measured_peak(monkeypatch):
    """The working term is needed: without it the check admits runs the table says overflow
    (the 4 buffers and temporaries alone charged 12 x size; all_reduce/hierarchical peaked at
    24.7 x size at 16 MiB)."""
    monkeypatch.setattr(checks, "WORKING_BYTES", 0)
    assert any(_short(t["rows"]) for t in _tables())
