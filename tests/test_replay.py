"""``commbench replay`` and the audit's Kineto-shaped traces: every example's audit, written as
one trace per rank, reads back as the booked calls, and its replay books exactly the recorded
calls (from the audit's own record and from the traces), at every world size; each declared
broken replay is caught by the same check."""

from __future__ import annotations

import json
import os

import pytest
from command import commbench

from commbench.cli.replay import rows_of
from commbench.studies.audit import run_script
from commbench.traces.job import load
from commbench.traces.recorded import Rec, check, from_audit, from_traces, scale
from commbench.traces.replay import BROKEN, replay_rank
from commbench.traces.write import kineto_traces
from commbench.wire.ledger import Entry

pytestmark = pytest.mark.traces

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")
SCRIPTS = ["torch_tp_sp.py", "megatron_sp.py", "fsdp2.py", "ddp.py", "torch_pipelining.py",
           "dtensor.py"]


def _audit(ctx, name, args=()):
    return run_script(ctx, os.path.join(EXAMPLES, name), list(args))


def _write(per_rank, folder) -> str:
    os.makedirs(folder, exist_ok=True)
    for r, doc in enumerate(kineto_traces(per_rank)):
        with open(os.path.join(folder, f"rank{r}.pt.trace.json"), "w") as f:
            json.dump(doc, f)
    return str(folder)


def _key(e: Entry) -> tuple:
    op = {"isend": "send", "irecv": "recv"}.get(e.op, e.op)
    return (op, e.group, e.dtype, e.count, e.peer, tuple(map(tuple, e.splits)))


def _need_two(world):
    if world.size < 2:
        pytest.skip("a recorded job of one rank has no collectives to replay")


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("name", SCRIPTS)
def test_each_example_s_trace_reads_back_as_its_booked_calls(world, name, tmp_path):
    per_rank = world.run(_audit, name)
    traces = load([_write(per_rank, tmp_path / "job")])
    for t, entries in zip(traces, per_rank, strict=True):
        want = [_key(Entry._make(e)) for e in entries]
        got = [(c.op, c.group, c.dtype, c.in_elems, c.peer,
                (c.in_splits, c.out_splits) if c.in_splits else ()) for c in t.calls]
        assert got == want, name


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("name", SCRIPTS)
def test_a_replay_of_each_example_books_exactly_the_recorded_calls(world, name, tmp_path):
    per_rank = world.run(_audit, name)
    record = {"suite": "audit", "calls": [[Entry._make(e).as_dict() for e in es]
                                           for es in per_rank]}
    for size, plan in (from_audit("audit.json", record), from_traces([_write(per_rank,
                                                                            tmp_path / "job")])):
        assert size == world.size
        check(size, plan)
        rows, bad = rows_of(world.run(replay_rank, plan, 1, 0))
        assert bad == [], name
        assert sum(len(p) for p in plan.values()) == sum(len(es) for es in per_rank)
        assert all(r["n_samples"] == 1 and r["time_us"] > 0 for r in rows)


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_each_broken_replay_is_caught_by_the_ledger_check(world, broken):
    _need_two(world)
    n = world.size
    plan = {r: [Rec("all_gather", tuple(range(n)), "bfloat16", 6), Rec("all_reduce",
                tuple(range(n)), "int32", 4 * n)] for r in range(n)}
    assert rows_of(world.run(replay_rank, plan, 1, 0))[1] == []
    bad = rows_of(world.run(replay_rank, plan, 1, 0, broken))[1]
    assert len(bad) >= n, broken  # every rank says so


@pytest.mark.world(sizes=[2, 4])
def test_a_scaled_replay_keeps_rank_0_s_groups_on_fewer_ranks(world):
    _need_two(world)
    n = world.size
    big = 2 * n  # a job of 2n ranks: tp groups of n, dp pairs (r, r + n)
    plan = {}
    for r in range(big):  # each record carries its rank as its step, to tell whose it is
        tp = tuple(range(r - r % n, r - r % n + n))
        dp = (r % n, r % n + n)
        plan[r] = [Rec("all_gather", tp, "float32", 8, step=r),
                   Rec("all_reduce", dp, "float32", 64, step=r)]
    check(big, plan)
    small = scale(big, plan, n)
    assert [(r.group, r.step) for r in small[0]] == [(tuple(range(n)), 0), ((0, 1), 0)]
    # member i of rank 0's tp group is rank i; member 1 of its dp pair is rank n
    assert [(r.group, r.step) for r in small[1]] == [(tuple(range(n)), 1), ((0, 1), n)]
    assert all([r.step for r in small[i]] == [i] for i in range(2, n))
    check(n, small)
    rows, bad = rows_of(world.run(replay_rank, small, 1, 0))
    assert bad == [] and len(rows) == 2


def test_a_recording_that_would_hang_is_refused_before_any_rank_starts():
    from commbench.traces.calls import TraceError

    g = (0, 1)
    with pytest.raises(TraceError, match=r"group \[0, 1\]: rank 0 and rank 1 recorded different"):
        check(2, {0: [Rec("all_reduce", g, "float32", 4)], 1: []})
    with pytest.raises(TraceError, match="rank 0 -> rank 1: 1 sends and 0 receives"):
        check(2, {0: [Rec("send", g, "float32", 4, peer=1)], 1: []})
    with pytest.raises(TraceError, match="group \\[0, 5\\] is not a group of this rank"):
        check(2, {0: [Rec("all_reduce", (0, 5), "float32", 4)], 1: []})
    with pytest.raises(TraceError, match="ranks \\[1\\] have no recorded calls"):
        check(2, {0: []})
    with pytest.raises(TraceError, match="dtype 'complex64' cannot be replayed"):
        check(2, {r: [Rec("all_reduce", g, "complex64", 4)] for r in g})


LAYOUT = ("grad-norm=0,tp={P},sp,bias,layers=2,hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,micro-batches=1,"
          "loss=none,act-bytes=4,grad-bytes=4")


@pytest.mark.world(sizes=[2, 4])
def test_the_trace_of_megatron_s_sp_layer_makes_the_layout_s_calls_and_flags_an_extra_one(
        world, tmp_path):
    from commbench.studies.audit_layout import compare, parse_layout
    from commbench.traces.wire import as_entries

    _need_two(world)
    lay = parse_layout(LAYOUT.format(P=world.size), world.size)
    for args, want in (([], []), (["--extra-gather"], ["extra all_gather", "extra reduce_scatter"])):
        per_rank = world.run(_audit, "megatron_sp.py", args)
        zero = load([_write(per_rank, tmp_path / f"job{len(args)}")])[0]
        fields = lambda e: (e.op, e.group, e.dtype, e.count, e.sent, e.recv)  # noqa: E731
        assert [fields(Entry._make(e)) for e in as_entries(zero)] == \
            [fields(Entry._make(e)) for e in per_rank[0]]
        assert [f.split(":")[0] for f in compare(lay, as_entries(zero))["flags"]] == want


DRIVER = """
import json, os, runpy, sys
import torch.distributed as dist
from torch.profiler import ExecutionTraceObserver
from commbench.studies.audit import audit
from commbench.wire.ledger import Entry

dist.init_process_group("gloo")
rank, out = dist.get_rank(), sys.argv[1]
sys.path.insert(0, %r)  # as python does for a script: the examples import examples/layers.py
for name in sys.argv[2:]:
    path = os.path.join(out, name, f"et_rank{rank}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    et = ExecutionTraceObserver()
    et.register_callback(path)
    et.start()
    sys.argv = [name]
    booked = audit(runpy.run_path, os.path.join(sys.path[0], name), run_name="__main__")
    et.stop()
    et.unregister_callback()
    with open(path + ".booked", "w") as f:
        json.dump([e.as_dict() for e in booked], f)
dist.destroy_process_group()
"""


@pytest.mark.launcher
@pytest.mark.local
def test_torch_s_execution_trace_of_an_example_gives_the_audit_s_calls(tmp_path):
    """Under torchrun (a fresh job: its process-group list is the example's own), torch's
    ExecutionTraceObserver records each example while the watcher books it."""
    import subprocess
    import sys

    from commbench.traces.et import from_et

    names = ["ddp.py", "torch_pipelining.py"]
    (tmp_path / "driver.py").write_text(DRIVER % os.path.abspath(EXAMPLES))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2",
                          str(tmp_path / "driver.py"), str(tmp_path), *names],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    for name in names:
        paths = [str(tmp_path / name / f"et_rank{r}.json") for r in range(2)]
        size, plan = from_et(paths)
        assert size == 2
        for r, path in enumerate(paths):
            booked = [Entry(**{**e, "group": tuple(e["group"]),
                               "splits": tuple(map(tuple, e["splits"]))})
                      for e in json.load(open(path + ".booked"))]
            assert [(x.op, x.group, x.dtype, x.count, x.peer) for x in plan[r]] == \
                [_key(e)[:5] for e in booked], name
        check(size, plan)


@pytest.mark.world(sizes=[2, 4])
def test_a_replay_of_a_generated_nccl_job_books_exactly_its_calls(world, tmp_path):
    from trace_generator import Planned, generate

    _need_two(world)
    n = world.size
    plan = [Planned("allreduce", tuple(range(n)), 96, "BFloat16"),
            Planned("_allgather_base", (0, 1), 10, "Float"),
            Planned("_reduce_scatter_base", tuple(range(n)), 8 * n, "Half"),
            Planned("send", (n - 1, 0), 7, "Long"), Planned("broadcast", tuple(range(n)), 3, "Int")]
    generate(n, plan, str(tmp_path / "job"))
    size, recs = from_traces([str(tmp_path / "job")])
    assert size == n and sum(map(len, recs.values())) == 3 * n + 4  # members of each call
    check(size, recs)
    rows, bad = rows_of(world.run(replay_rank, recs, 1, 0))
    assert bad == []
    assert [(r["op"], r["size"]) for r in rows if r["ranks"] == list(range(n))] == [
        ("all_reduce", 192), *[("all_gather", 80)] * (n == 2), ("reduce_scatter", 16 * n),
        ("broadcast", 12)]


@pytest.mark.local
def test_the_audit_writes_kineto_traces_that_analyze_reads(tmp_path):
    import subprocess

    script = os.path.join(EXAMPLES, "torch_tp_sp.py")
    out = subprocess.run(commbench("audit", script, "--np", "2", "--no-write", "--kineto",
                                   str(tmp_path / "k")), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert sorted(os.listdir(tmp_path / "k")) == ["rank0.pt.trace.json", "rank1.pt.trace.json"]
    from commbench.cli.main import main

    assert main(["analyze", str(tmp_path / "k"), "--json", str(tmp_path / "a.json")]) == 0
    rec = json.loads((tmp_path / "a.json").read_text())
    assert rec["backend"] == "gloo" and rec["source"] == ["cpu"] and len(rec["calls"]) == 8
    assert all(c["skew_us"] is not None for c in rec["calls"])


def test_a_scale_that_keeps_no_call_is_refused_in_one_line():
    """--scale --np 2 of a job whose rank 0 has only groups of 4: nothing would be replayed
    (before: 0 calls and exit 0)."""
    from commbench.traces.calls import TraceError

    plan = {r: [Rec("all_reduce", (0, 1, 2, 3), "float32", 8)] for r in range(4)}
    assert scale(4, plan, 4)[0]  # at the group's own size it keeps the call
    with pytest.raises(TraceError, match=r"--scale --np 2: keeps no call: rank 0's collectives "
                                         r"are on groups of 4 ranks"):
        scale(4, plan, 2)


@pytest.mark.world(sizes=[2])
def test_one_rank_s_kineto_traces_replay_on_the_whole_world(world, tmp_path):
    """Rank 0's file alone of a two-rank job: rank 1 re-issues the collectives they share, and
    the replay books every call as recorded (before: refused, 'ranks [1] have no recorded
    calls')."""
    from trace_generator import Planned, generate

    from commbench.traces.recorded import complete

    generate(2, [Planned("allreduce", (0, 1), 256, "Float"),
                 Planned("_allgather_base", (0, 1), 64, "Float")], str(tmp_path / "job"))
    n, plan = from_traces([str(tmp_path / "job" / "rank0.pt.trace.json")])
    assert n == 2 and list(plan) == [0]
    said = complete(n, plan)
    assert "ranks [1] have no recording" in said[0] and plan[1] == plan[0]
    check(n, plan)
    rows, bad = rows_of(world.run(replay_rank, plan, 1, 0))
    assert bad == [] and len(rows) == 2
