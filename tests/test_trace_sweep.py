"""``commbench run <collective> --trace``: one warm call of each row, after the timed loop,
every rank's messages as slices (an algorithm built here: its isends and irecvs, 2(n-1) of each
for the ring) or one slice for the transport's own call, and a step slice around them."""

from __future__ import annotations

from collections import Counter

import pytest

from commbench.collectives.measure import Case
from commbench.results.trace import chrome_trace
from commbench.studies.sweep import run_series

pytestmark = pytest.mark.foundation


@pytest.mark.world(sizes=[2, 4])
def test_each_row_s_traced_call_is_its_messages(world):
    n, timeline = world.size, []
    for algo in ("ring", "native"):
        case = Case("all_reduce", world.transports[0], algo, iters=2, warmup=1, trace=True)
        run_series(world, case, [4096], emit=lambda s: None, timeline=timeline)
    assert [label for label, *_ in timeline] == [f"all_reduce/ring {world.transports[0]} 4096 B",
                                                 f"all_reduce/native {world.transports[0]} 4096 B"]
    trace = chrome_trace(timeline)
    slices = Counter((e["args"]["run"].split()[0], e["pid"], e["name"])
                     for e in trace["traceEvents"] if e.get("ph") == "X")
    for r in range(n):
        assert slices[("all_reduce/ring", r, "isend")] == 2 * (n - 1)
        assert slices[("all_reduce/ring", r, "irecv")] == 2 * (n - 1)
        assert slices[("all_reduce/native", r, "all_reduce")] == 1
        assert slices[("all_reduce/ring", r, "step")] == slices[("all_reduce/native", r, "step")] == 1
    # without trace=True the rows carry no timeline (the timed loop is never traced)
    quiet: list = []
    run_series(world, Case("all_reduce", world.transports[0], "ring", iters=1, warmup=0), [64],
               emit=lambda s: None, timeline=quiet)
    assert quiet == []
