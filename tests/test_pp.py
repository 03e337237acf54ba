"""Pipeline schedules beyond the contract (tests/test_patterns.py): every pass runs once in a
valid order, activation memory with and without checkpointing, and configs refused before any
collective. (The bubble is timed in the study, `commbench run pp`, not here.)"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commbench.patterns.pp.configs import PPConfig
from commbench.patterns.pp.schedule import SCHEDULES, schedule
from commbench.patterns.run import run_pattern
from commbench.runtime.errors import SPMDError

pytestmark = pytest.mark.pp


@given(name=st.sampled_from(SCHEDULES), p=st.integers(1, 6), k=st.integers(1, 4),
       v=st.integers(2, 3))
def test_schedules_run_every_pass_once_in_a_valid_order(name, p, k, v):
    v = v if name == "interleaved" else 1
    m = p * k if name == "interleaved" else k
    for r in range(p):
        acts = schedule(name, p, r, m, v)
        chunks = range(r, p * v, p)
        assert sorted(acts) == sorted((a, c, j) for a in "FB" for c in chunks for j in range(m))
        assert all(acts.index(("F", c, j)) < acts.index(("B", c, j))
                   for c in chunks for j in range(m))
        alive = peak = 0
        for a, _, _ in acts:
            alive += 1 if a == "F" else -1
            peak = max(peak, alive)
        if name == "gpipe":
            assert peak == m
        elif name == "1f1b":  # the point of 1F1B: at most p - r micro-batches in flight
            assert peak == min(p - r, m)


@pytest.mark.world(sizes=[2, 4])
def test_activation_memory_gpipe_1f1b_and_checkpointing(world):
    p = world.size
    peaks = {}
    for name in ("gpipe", "1f1b"):
        for ckpt in (False, True):
            cfg = PPConfig(stages=p, layers=2 * p, hidden=8, batch=16, micro=8, checkpoint=ckpt)
            out = world.run(run_pattern, "pp", cfg, name, 0)[0]
            peaks[name, ckpt] = out["outputs"]["stats"]["peak_activation_bytes"]
    assert peaks["1f1b", False] < peaks["gpipe", False]  # rank 0: p of 8 micro-batches alive
    assert peaks["gpipe", True] < peaks["gpipe", False]  # inputs only, plus one re-materialised
    assert peaks["1f1b", True] <= peaks["1f1b", False]


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("variant", ["gpipe", "1f1b", "interleaved"])
def test_checkpointing_runs_every_forward_again_in_backward(world, variant):
    """The memory test counts what autograd saves, which a checkpointed forward bypasses; this
    counts the layer forwards: each rank runs its layers once per micro-batch, and twice with
    checkpointing (the backward re-materialises every chunk)."""
    p = world.size
    runs = {}
    for ckpt in (False, True):
        cfg = PPConfig(stages=p, layers=4 * p, hidden=8, batch=8, micro=4, checkpoint=ckpt,
                       virtual=2 if variant == "interleaved" else 1)
        outs = world.run(run_pattern, "pp", cfg, variant, 0)
        runs[ckpt] = [o["outputs"]["stats"]["layer_forwards"] for o in outs]
    assert runs[False] == [4 * 4] * p  # 4p layers over p ranks, 4 micro-batches
    assert runs[True] == [2 * f for f in runs[False]]


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize(("bad", "variant", "rule"), [
    (dict(layers=3), "1f1b", "layers=3"), (dict(batch=3), "1f1b", "batch=3"),
    (dict(), "zigzag", "zigzag"), (dict(virtual=2, layers=2), "interleaved", "layers=2"),
    (dict(virtual=2, micro=3, batch=3), "interleaved", "micro=3"),
    (dict(stages=3, layers=6), "1f1b", "stages=3"), (dict(compute_s=-1.0), "gpipe", "compute_s")])
def test_bad_configs_are_refused(world, bad, variant, rule):
    cfg = PPConfig(**{**dict(stages=world.size, layers=2 * world.size, batch=4, micro=2), **bad})
    with pytest.raises(SPMDError, match=rule):
        world.run(run_pattern, "pp", cfg, variant, 0)


@pytest.mark.world(sizes=[2, 4])
def test_the_pipeline_trace_shows_each_rank_s_calls_in_order(world):
    """`commbench run pp --trace`: every rank's booked sends and receives of one 1F1B step as
    Chrome trace events, placed where they started (a non-blocking send is booked when it is
    waited for, the trace puts it at its post); the last stage's first receive ends after the
    first stage's first send began: the pipeline's fill."""
    from commbench.results.trace import chrome_trace

    p = world.size
    cfg = PPConfig(stages=p, layers=2 * p, hidden=8, batch=8, micro=4)
    outs = world.run(run_pattern, "pp", cfg, "1f1b", 0)
    events = [e for e in chrome_trace([("pp", [o["timeline"] for o in outs])])["traceEvents"]
              if e["ph"] == "X"]
    for r, o in enumerate(outs):
        mine = [e for e in events if e["pid"] == r]
        assert sorted(e["name"] for e in mine) == sorted(t[0] for t in o["timeline"])
        assert all(e["args"]["axis"] == "pp" and e["dur"] >= 0 for e in mine)
    first_send = min(e["ts"] for e in events if e["pid"] == 0 and e["name"] in ("send", "isend"))
    first_recv_end = min(e["ts"] + e["dur"] for e in events if e["pid"] == 1
                         and e["name"] in ("recv", "irecv"))
    assert first_recv_end >= first_send


def _blocking_over_compute(o: dict, nonblocking: tuple[str, ...]) -> list:
    """A rank's blocking calls that overlap one of its computations: (call, start, end)."""
    from commbench.wire.ledger import Entry

    calls = [Entry(*t) for t in o["timeline"]]
    return [(e.op, e.start, e.start + e.seconds) for e in calls if e.op not in nonblocking
            for a, b in o["span_stats"]["compute_spans"]
            if min(e.start + e.seconds, b) - max(e.start, a) > 1e-6]


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("variant", ["gpipe", "1f1b", "interleaved"])
def test_the_trace_shows_the_bubble_the_pipeline_measures(world, variant):
    """A step's bubble two ways: from the trace (blocking receives and the wait for the
    slowest rank, over the slowest rank's step) and from the pipeline's own clock around its
    computation (1 - busy / step). The trace books no computation as idle: on every rank no
    blocking call overlaps a computation and all of them lie in the step, so the trace's bubble
    is at most the pipeline's, rank by rank; the rest of the difference is the step's Python
    overhead, whose share depends on the machine's load and is not held here. How near either
    lies to the schedule's (p-1)/(vm+p-1) the studies report (results/pp_*); the arithmetic is
    held exactly by the tests beside this one."""
    from commbench.patterns.pp.pp import trace_bubble
    from commbench.results.trace import NONBLOCKING, chrome_trace, idle_fraction

    P = world.size
    cfg = PPConfig(stages=P, layers=2 * P, hidden=8, batch=2 * P, micro=P, virtual=2,
                   compute_s=0.01)
    outs = world.run(run_pattern, "pp", cfg, variant, 0, None, 1, 0)  # the trace's: a warm step
    wall = max(o["span"][1] - o["span"][0] for o in outs)
    for o in outs:
        lo, hi = o["span"]
        assert all(lo <= a <= b <= hi for a, b in o["span_stats"]["compute_spans"])
        assert _blocking_over_compute(o, NONBLOCKING) == []
    own = sum(1 - o["span_stats"]["busy_s"] / wall for o in outs) / P
    seen = trace_bubble(outs)
    assert 0 < seen <= own + 1e-9
    # negative: booked as blocking, the sends (posted after a computation, waited at the end
    # of the step) overlap the computations that follow them, and the bubble grows by them
    assert NONBLOCKING == ("isend", "irecv")
    assert any(_blocking_over_compute(o, ()) for o in outs)
    t = chrome_trace([("s", [o["timeline"] for o in outs], [o["span"] for o in outs])])
    for e in t["traceEvents"]:
        if e.get("name") == "isend":
            e["name"] = "send"  # booked as blocking
    assert idle_fraction(t, "s") > seen


def test_pipeline_schedules_in_their_exact_order():
    """1F1B without v (its default, 1), and Megatron's interleaved order on 2 ranks, 2 virtual
    stages, 4 micro-batches, by hand: rank 0 warms up with (p-r-1)*2 + (v-1)*p = 4 forwards,
    rank 1 with 2; forwards take chunks in turn p micro-batches at a time, backwards the chunks
    in reverse."""
    assert schedule("interleaved", 2, 0, 2) == schedule("interleaved", 2, 0, 2, 1)  # v = 1
    assert schedule("1f1b", 3, 0, 4) == [("F", 0, 0), ("F", 0, 1), ("F", 0, 2), ("B", 0, 0),
                                         ("F", 0, 3), ("B", 0, 1), ("B", 0, 2), ("B", 0, 3)]

    def seq(text):
        return [(t[0], int(t[1]), int(t[3])) for t in text.split()]

    assert schedule("interleaved", 2, 0, 4, 2) == seq(
        "F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1 B2.2 B2.3 B0.2 B0.3")
    assert schedule("interleaved", 2, 1, 4, 2) == seq(
        "F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 F1.3 B1.1 F3.2 B3.2 F3.3 B3.3 B1.2 B1.3")


def test_bubble_fractions():
    from commbench.patterns.pp.schedule import bubble_fraction

    assert bubble_fraction("gpipe", 4, 8) == 3 / 11 == bubble_fraction("1f1b", 4, 8)
    assert bubble_fraction("interleaved", 4, 8, 2) == 3 / 19
    assert bubble_fraction("1f1b", 1, 8) == 0.0
    assert bubble_fraction("interleaved", 4, 8) == 3 / 11  # one virtual stage by default


def _slice(rank: int, name: str, ts: float, dur: float) -> dict:
    return {"name": name, "ph": "X", "pid": rank, "ts": ts, "dur": dur,
            "cat": "step" if name == "step" else "call", "args": {"run": "s"}}


def test_the_trace_bubble_is_blocking_time_and_the_wait_for_the_slowest_over_its_step():
    """Hand-computed: steps of 10 and 8 (wall 10); rank 0 blocks 2 in a recv (its isend of 3
    overlaps computation), rank 1 blocks 1 and waits 2 for rank 0: (2 + 0 + 1 + 2) / 20."""
    from commbench.results.trace import idle_fraction

    events = [_slice(0, "step", 0, 10), _slice(0, "recv", 1, 2), _slice(0, "isend", 4, 3),
              _slice(1, "step", 0, 8), _slice(1, "recv", 0, 1), _slice(1, "irecv", 2, 1)]
    assert idle_fraction({"traceEvents": events}, "s") == pytest.approx(0.25)
    with pytest.raises(ValueError, match="no step slices"):
        idle_fraction({"traceEvents": events[1:3]}, "s")
