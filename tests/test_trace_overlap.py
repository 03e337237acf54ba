"""The trace of DDP's step shows its bucket all-reduces overlapping backward: each bucket's
slice runs from its post (as soon as backward has its gradients) to the wait at the end, so
a later bucket is posted, backward having gone on, while the earlier is in flight. The naive
variant's per-parameter all-reduces never overlap (the negative)."""

from __future__ import annotations

import pytest

from commbench.patterns.dp.ddp import DDPConfig
from commbench.patterns.run import run_pattern
from commbench.results.trace import chrome_trace

pytestmark = pytest.mark.foundation


def _slices(outs, op="all_reduce"):
    trace = chrome_trace([("s", [o["timeline"] for o in outs], [o["span"] for o in outs])])
    per_rank: dict[int, list[tuple[float, float]]] = {}
    for e in trace["traceEvents"]:
        if e.get("name") == op:
            per_rank.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"]))
    steps = {e["pid"]: (e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
             if e.get("name") == "step"}
    return per_rank, steps


@pytest.mark.world(sizes=[2, 3, 4])
def test_ddp_s_buckets_overlap_backward_in_the_trace_and_the_naive_calls_do_not(world):
    P = world.size
    cfg = DDPConfig(batch=2 * P, seq=4, hidden=16, ffn=32, heads=2, vocab=1, dp=P, tp=1,
                   dtype="float32", bucket_bytes=1024)
    per_rank, steps = _slices(world.run(run_pattern, "ddp", cfg, "ddp", 0, None, 1, 0))
    for rank, slices in per_rank.items():
        slices.sort()
        assert len(slices) >= 3, "buckets of 1 KiB: several per step"
        first, second = slices[0], slices[1]
        assert first[0] < second[0] < first[1], "the first bucket is in flight at the second's post"
        lo, hi = steps[rank]
        assert all(lo <= a and b <= hi + 1 for a, b in slices), "every slice inside the step"
    per_rank, _ = _slices(world.run(run_pattern, "ddp", cfg, "naive", 0, None, 1, 0))
    for slices in per_rank.values():
        slices.sort()
        assert len(slices) >= 3
        assert all(b[0] >= a[1] for a, b in zip(slices, slices[1:])), "sequential: no overlap"
