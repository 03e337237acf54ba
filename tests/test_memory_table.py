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
import sys

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


def test_on_a_gpu_nccl_s_own_buffers_are_charged_beside_the_sweep_s(monkeypatch):
    """A size whose buffers alone fit the GPU's free memory but not with NCCL's buffers (about
    4.3 GiB a rank: NVIDIA/nccl#864, #1685) is refused before any rank starts, naming them; a
    world of one connects no peer and is not charged them."""
    free = 8 << 30
    monkeypatch.setattr(checks, "device_free_bytes", lambda: free)
    largest = 384 << 20  # x 12 (float32, checked) = 4.5 GiB of buffers
    assert largest * checks.memory_factor(4, True) < free
    with pytest.raises(checks.HostRefusal, match=r"-e: 402653184 B x 12 .* \+ 4\.1 GiB NCCL's buffers = "
                                          r"8\.6 GiB; this rank's GPU has 8\.0 GiB free"):
        checks.check_memory(largest, 4, 1, 8, True)
    checks.check_memory(largest, 4, 1, 1, True)  # one rank: no peers, no NCCL buffers
    monkeypatch.setattr(checks, "NCCL_COLLECTIVE_BYTES", 0)
    monkeypatch.setattr(checks, "NCCL_P2P_BYTES", 0)
    checks.check_memory(largest, 4, 1, 8, True)  # the buffers alone would have been let through


def test_a_host_without_a_gpu_driver_is_known_without_torch(tmp_path, monkeypatch):
    """Where no driver node a GPU needs exists, the memory check before the ranks start reads
    the host's memory without asking torch; where one exists, torch decides."""
    monkeypatch.setattr(sys, "platform", "linux")
    absent, present = str(tmp_path / "nvidiactl"), str(tmp_path)
    assert checks.no_gpu_driver((absent,)) and not checks.no_gpu_driver((absent, present))
    monkeypatch.setattr(sys, "platform", "darwin")
    assert checks.no_gpu_driver((present,))
    monkeypatch.setattr(sys, "platform", "win32")  # no such nodes to read: torch decides
    assert not checks.no_gpu_driver((absent,))
