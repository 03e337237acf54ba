"""`commbench analyze` on real traces from public projects (tests/data/traces/README.md names
each one's source and licence), each call held to figures read here from the raw events by a
reading of their own: the profiler's ops, the runtime's launches and the kernels, matched by
hand rather than by the analyzer's code."""

from __future__ import annotations

import gzip
import json
import math
import os

import pytest
from said import quiet_rank, said

from commbench.cli.main import main
from commbench.traces import kineto
from commbench.traces.analysis import match, misaligned
from commbench.traces.calls import TraceError
from commbench.traces.job import load

pytestmark = pytest.mark.traces

DATA = os.path.join(os.path.dirname(__file__), "data", "traces", "hta")
BYTES = {"float": 4, "long": 8, "long int": 8, "int": 4, "unsigned char": 1, "signed char": 1}
# the nccl:* ops of torch < 2.1, and what the input's dims stand for in nccl-tests' size
OLD = {"nccl:all_reduce": ("all_reduce", 1), "nccl:all_to_all": ("all_to_all", 1),
       "nccl:_all_gather_base": ("all_gather", "world")}


def _events(path: str) -> tuple[dict, list[dict]]:
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    return doc, [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def _old_calls_by_hand(path: str) -> list[tuple[str, int, float]]:
    """(op, bytes in nccl-tests' size, kernel duration) of each NCCL kernel of a torch < 2.1
    trace: kernel -> its launch by correlation -> the nccl:* op around the launch on the
    launching thread -> that op's input dims and type."""
    doc, ev = _events(path)
    world = doc["distributedInfo"]["world_size"]
    launch = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"}
    ops = [e for e in ev if e["name"] in OLD]
    out = []
    for k in (e for e in ev if e.get("cat") == "kernel" and e["name"].startswith("nccl")):
        lc = launch[k["args"]["correlation"]]
        (op,) = [o for o in ops if o["tid"] == lc["tid"] and o["ts"] <= lc["ts"] <= o["ts"] + o["dur"]]
        name, scale = OLD[op["name"]]
        elems = math.prod(op["args"]["Input Dims"][0]) * (world if scale == "world" else 1)
        out.append((name, elems * BYTES[op["args"]["Input type"][0]], float(k["dur"])))
    return sorted(out)


@pytest.mark.parametrize("rank", [0, 1])
def test_torch_before_2_1_every_nccl_kernel_is_its_nccl_op_s_call(rank):
    path = os.path.join(DATA, "sampled", f"sampled_rank-{rank}.json.gz")
    t = kineto.read(path, progress=False)
    want = _old_calls_by_hand(path)
    assert len(want) == 10  # every NCCL kernel of the file, none dropped
    assert sorted((c.op, c.size, c.dur) for c in t.calls) == want
    assert {c.source for c in t.calls} == {"kernel"} and t.world_size == 128
    assert all(c.group == tuple(range(128)) for c in t.calls)  # no group recorded: the world
    # every collective ran as ncclKernel_SendRecv_RING_SIMPLE: the name states no algorithm
    # for an all-reduce or an all-gather, and NCCL runs all-to-all as point-to-point
    assert {(c.op, c.algo, c.proto) for c in t.calls} >= {("all_reduce", "unknown", "unknown")}
    assert all((c.algo, c.proto) == ("", "") for c in t.calls if c.op == "all_to_all")


def test_two_sampled_ranks_of_a_128_rank_job_are_read_and_not_matched_call_by_call():
    traces = load([os.path.join(DATA, "sampled")], progress=False)
    assert [t.rank for t in traces] == [0, 1]
    # their windows hold different calls: matched call by call they would pair an all-to-all
    # of 384 longs with one of 339738624 bytes
    assert "rank 0: all_to_all int64[384]; rank 1: all_to_all uint8[339738624]" in \
        misaligned(traces)
    rows = match(traces)
    assert len(rows) == sum(len(t.calls) for t in traces)
    assert all(len(m.calls) == 1 and m.skew_us is None for m in rows)


def test_torch_2_kernels_take_their_sizes_from_record_param_comms_and_algo_from_the_name():
    path = os.path.join(DATA, "nccl_2ranks_rank0.json.gz")
    _, ev = _events(path)
    ops = {e["args"]["External id"]: e["args"] for e in ev if e["name"] == "record_param_comms"}
    itemsize = {"Float": 4, "Long": 8}
    want = []
    for k in (e for e in ev if e.get("cat") == "kernel" and e["name"].startswith("nccl")):
        a = ops[k["args"]["External id"]]
        words = k["name"].split("(")[0].split("_")  # ncclKernel_AllReduce_RING_LL_Sum_float
        want.append((a["Collective name"], a["In msg nelems"] * itemsize[a["dtype"]],
                     float(k["dur"]), words[2].lower(), words[3]))
    t = kineto.read(path, progress=False)
    names = {"allreduce": "all_reduce", "broadcast": "broadcast"}
    got = sorted((c.op, c.size, c.dur, c.algo, c.proto) for c in t.calls)
    assert got == sorted((names[n], b, d, a, p) for n, b, d, a, p in want) and len(got) >= 5


def test_a_wait_record_is_no_call_and_no_error():
    path = os.path.join(DATA, "wait_ops_rank0.json.gz")
    _, ev = _events(path)
    records = [e["args"] for e in ev if e["name"] == "record_param_comms"]
    waits = [a for a in records if a.get("Collective name") == "wait"]
    assert waits and all("Process Group Ranks" not in a for a in waits)
    t = kineto.read(path, progress=False)
    assert len(t.calls) == len(records) - len(waits)
    assert "wait" not in {c.op for c in t.calls}


def test_calls_timed_by_their_cpu_ops_get_no_bandwidth():
    """No NCCL kernel was captured: the calls are record_param_comms, whose time is the
    enqueue. They get a time and bytes, never a bandwidth (before: GB/s from enqueue times)."""
    traces = load([os.path.join(DATA, "wait_ops_rank0.json.gz")], progress=False)
    rows = match(traces)
    assert rows and {c.source for t in traces for c in t.calls} == {"cpu"}
    assert all(m.busbw is None and m.first.size > 0 for m in rows)


NO_INFO = os.path.join(DATA, "no_distributed_info.json.gz")


def _old_cpu_calls_by_hand(path: str) -> list[tuple[str, str, int]]:
    """(op, C++ type, bytes) of each nccl:* op of a torch < 2.1 trace with no kernels: the
    input's dims times its type's size (an all-to-all's size is its input's)."""
    _, ev = _events(path)
    return sorted((OLD[e["name"]][0], e["args"]["Input type"][0],
                   math.prod(e["args"]["Input Dims"][0]) * BYTES[e["args"]["Input type"][0]])
                  for e in ev if e["name"] in OLD)


def test_a_torch_2_0_trace_without_distributed_info_is_read_on_the_world_it_is_given():
    """HTA's trace without distributedInfo: its calls are on the world, which only the user
    can name (--world); without it the refusal says so."""
    with pytest.raises(TraceError, match=r"give the job's world size \(--world N\)"):
        load([NO_INFO], progress=False)
    (t,) = load([NO_INFO], progress=False, world=8)
    want = _old_cpu_calls_by_hand(NO_INFO)
    assert len(want) == 6 and {op for op, _, _ in want} == {"all_to_all"}
    cpp = {"float": "float32", "int": "int32"}
    assert sorted((c.op, c.dtype, c.size) for c in t.calls) == \
        sorted((op, cpp[ty], size) for op, ty, size in want)
    assert all(c.group == tuple(range(8)) and c.source == "cpu" for c in t.calls)
    assert (t.rank, t.world_size, t.world_stated) == (0, 8, False)
    assert all(m.busbw is None for m in match([t]))  # CPU ops: enqueue times, no bandwidth


def _evenly_replayable(plan: dict) -> bool:
    """Whether every all-to-all of a plan can be re-issued as recorded: its splits held, or its
    elements divide evenly over its group (equal splits then are the job's)."""
    return all(r.in_splits or r.count % len(r.group) == 0
               for recs in plan.values() for r in recs if r.op == "all_to_all")


def test_a_replay_of_one_torch_2_0_rank_on_the_world_it_is_given(capsys):
    """HTA's trace without distributedInfo, replayed on 8 ranks: its all-to-alls whose elements
    do not divide over 8 (the job's own splits, which torch < 2.1 does not record) are left
    out on every rank and named; the rest are each rank's, completed from rank 0's."""
    from commbench.traces.recorded import check, complete, unsplit
    from commbench.traces.sources import load as load_recording

    world, plan = load_recording([NO_INFO], world=8)
    by_hand = _old_cpu_calls_by_hand(NO_INFO)
    uneven = [size for _, ty, size in by_hand if (size // BYTES[ty]) % 8]
    assert world == 8 and len(plan[0]) == 6 and len(uneven) == 3
    assert not _evenly_replayable(plan)  # as read: three would raise on the ranks
    left_out = unsplit(plan)
    assert len(plan[0]) == 3 and _evenly_replayable(plan)
    assert left_out == ["not replayed: 3 all-to-all call(s) whose elements do not divide evenly over "
                    "their group and whose splits the recording does not hold (ranks [0]; the "
                    "job's own splits are unknown)"]
    complete(world, plan)
    check(world, plan)
    assert all(plan[r] == plan[0] for r in range(8))
    for bad, why in (([], "give the job's world size (--world N)"),
                     (["--world", "-1"], "--world -1: must be 1 to 1048576")):
        assert main(["replay", NO_INFO, "--np", "8", "--no-write", *bad]) == 2
        assert why in said(capsys)  # under a launcher, rank 0's to say


def test_a_world_given_beside_the_traces_is_caught_where_it_is_ignored(monkeypatch):
    """The broken variant: the reader drops the world it is given."""
    from commbench.traces import job
    monkeypatch.setattr(job, "read", lambda path, progress, limit, world: kineto.read(
        path, progress, limit))
    with pytest.raises(TraceError):
        test_a_torch_2_0_trace_without_distributed_info_is_read_on_the_world_it_is_given()


def test_analyze_world_from_the_command_line(tmp_path, capsys):
    if quiet_rank():
        pytest.skip("under a launcher rank 0 alone prints and writes (checked on rank 0)")
    out = tmp_path / "a.json"
    assert main(["analyze", NO_INFO, "--world", "8", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ranks 0 of 8 (--world; no world_size in the traces)" in text
    rec = json.loads(out.read_text())
    assert rec["world_given"] and rec["world_size"] == 8 and len(rec["calls"]) == 6
    for bad, why in ((["--world", "-1"], "--world -1: must be 1 to 1048576"),
                     (["--world", "4"], "--world 4: the traces state world_size [2]")):
        path = NO_INFO if bad[1] == "-1" else os.path.join(DATA, "nccl_2ranks_rank0.json.gz")
        assert main(["analyze", path, *bad]) == 2
        err = capsys.readouterr().err
        assert why in err and err.count("\n") == 1, err
    # a torch 2.x trace without world_size: its groups must fit the world given
    doc, _ = _events(os.path.join(DATA, "nccl_2ranks_rank0.json.gz"))
    del doc["distributedInfo"]["world_size"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(doc))
    assert main(["analyze", str(bare), "--world", "1"]) == 2
    assert "world_size 1: the traces' groups name rank 1" in capsys.readouterr().err
    assert main(["analyze", str(bare), "--world", "2"]) == 0
    assert "of 2 (--world; no world_size in the traces)" in capsys.readouterr().out
    assert main(["analyze", str(bare)]) == 0
    assert "of at least 2 (no world_size in the traces)" in capsys.readouterr().out


def test_a_job_smaller_than_a_node_gets_no_guessed_model_and_a_named_one_when_asked():
    """Two A100s of an eight-GPU host: which links they used is not in the trace, so no preset
    is guessed (before: priced as a DGX-A100's NVSwitch, efficiency 0.02); --topology names
    one, and the output says which model was used."""
    from commbench.traces import wire

    traces = load([os.path.join(DATA, "nccl_2ranks_rank0.json.gz")], progress=False)
    said: list[str] = []
    assert wire.topology(traces, None, None, said) is None
    assert said == ["no model: 2 rank(s) fill no whole node of dgx-a100 (its 8 GPUs), whose "
                    "links they would use is not in the trace; give --topology"]
    said.clear()
    topo = wire.topology(traces, "pcie-8gpu", None, said)
    assert topo.name == "pcie-8gpu" and said == []


PARAM = os.path.join(os.path.dirname(__file__), "data", "traces", "param")


def _et_calls_by_hand(path: str) -> list[tuple[str, int]]:
    """(collective, elements) of each record_param_comms node, read from the raw nodes."""
    with gzip.open(path, "rt") as f:
        nodes = sorted(json.load(f)["nodes"], key=lambda n: n["id"])
    out = []
    for n in nodes:
        if n["name"] == "record_param_comms":
            vals = n["inputs"]["values"]
            if "Tensor" not in n["inputs"]["types"][0]:  # no tensor: a Work's wait, no call
                assert vals[3] == "wait"
            elif vals[4] != "init":
                tensors = vals[0] if vals[0] and isinstance(vals[0][0], list) else [vals[0]]
                out.append((vals[4], sum(t[3] for t in tensors)))  # [id, storage, off, numel, ...]
    return out


@pytest.mark.parametrize(("name", "ranks"), [("resnet_2gpu_et_1.1.0.json.gz", 2),
                                              ("resnet_1gpu_et_1.0.3.json.gz", 1)])
def test_param_s_execution_traces_are_read_gzipped_with_the_rank_from_their_content(name, ranks):
    from commbench.traces.sources import load as load_recording

    path = os.path.join(PARAM, name)
    got_world, plan = load_recording([path])
    assert got_world == ranks and list(plan) == [0]  # rank 0: from the trace, not the name
    names = {"broadcast": "broadcast", "allreduce": "all_reduce"}
    assert [(r.op, r.count) for r in plan[0]] == [(names[c], k) for c, k in
                                                  _et_calls_by_hand(path)]
    assert all(r.group == tuple(range(ranks)) for r in plan[0])


def test_one_rank_s_execution_trace_is_completed_for_the_ranks_it_shares_groups_with():
    from commbench.traces.recorded import check, complete
    from commbench.traces.sources import load as load_recording

    world, plan = load_recording([os.path.join(PARAM, "resnet_2gpu_et_1.1.0.json.gz")])
    said = complete(world, plan)
    assert said[0].startswith("ranks [1] have no recording: each replays rank 0's calls")
    assert plan[1] == plan[0]  # every call is on the default group: rank 1's are the same
    check(world, plan)  # lines up: a replay would not hang


@pytest.mark.parametrize("name", ["resnet_2gpu_et_1.1.0.json.gz", "resnet_1gpu_et_1.0.3.json.gz"])
def test_analyze_given_an_execution_trace_names_it_and_the_command_that_reads_it(name, capsys,
                                                                                 monkeypatch):
    path = os.path.join(os.path.dirname(DATA), "param", name)
    decoded = []  # no node is decoded to say so (an execution trace may be GBs)
    real = kineto.stream._Stream.value
    monkeypatch.setattr(kineto.stream._Stream, "value",
                        lambda self: decoded.append(real(self)) or decoded[-1])
    assert main(["analyze", path]) == 2
    assert not any(isinstance(v, list) for v in decoded)
    err = said(capsys)
    assert "an execution trace (schema '1." in err and "commbench replay reads" in err, err
    assert err.count("\n") == 1


def test_an_execution_trace_of_an_unknown_schema_is_refused_in_one_line(tmp_path):
    from commbench.traces.calls import TraceError
    from commbench.traces.et import from_et

    path = tmp_path / "et_rank0.json"
    path.write_text(json.dumps({"schema": "2.0.0-chakra.0.0.9", "nodes": []}))
    with pytest.raises(TraceError, match=r"schema '2.0.0-chakra.0.0.9': read are 1.0.3"):
        from_et([str(path)])


def test_an_execution_trace_without_communication_says_there_is_nothing_to_replay(tmp_path):
    """HTA's benchmark_simple_add_et (schema 1.0.1, one process adding tensors) names no rank
    and makes no call: that is what is said, not that its rank cannot be told."""
    from commbench.traces.calls import TraceError
    from commbench.traces.et import from_et

    path = tmp_path / "simple_add_et.json"
    nodes = [{"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 1,
              "inputs": {"values": [], "shapes": [], "types": []}},
             {"id": 2, "name": "aten::add", "ctrl_deps": 1,
              "inputs": {"values": [[1, 2, 0, 4, 4, "cuda:0"]], "shapes": [[4]],
                         "types": ["Tensor(float)"]}}]
    path.write_text(json.dumps({"schema": "1.0.1", "nodes": nodes}))
    with pytest.raises(TraceError, match="without a communication call .*: nothing to replay"):
        from_et([str(path)])


OLD_ET = os.path.join(os.path.dirname(DATA), "param", "dlrm_et_1.0.1_rank0.json.gz")


def test_torch_2_0_s_execution_trace_is_refused_in_one_line_naming_its_schema(capsys):
    """PARAM's 8-rank DLRM execution traces (schema 1.0.1: each node's inputs a bare list, no
    groups): refused as what they are, where a replay used to end in a TypeError (exit 3)."""
    from commbench.traces.et import from_et

    doc = json.load(gzip.open(OLD_ET, "rt"))
    assert doc["schema"] == "1.0.1" and isinstance(doc["nodes"][1]["inputs"], list)
    assert any(n["name"] == "record_param_comms" for n in doc["nodes"])
    with pytest.raises(TraceError, match=r"schema '1.0.1' \(torch 2.0's: no groups recorded"):
        from_et([OLD_ET])
    assert main(["replay", OLD_ET, "--np", "1", "--no-write"]) == 2
    err = said(capsys)
    assert err.count("\n") == 1 and "schema '1.0.1'" in err and "Traceback" not in err


def test_a_node_laid_out_otherwise_is_one_line_where_its_schema_is_let_through(monkeypatch):
    """The broken variant: the schema check lets 1.0.1 through. Its nodes still end in one
    line naming what cannot be read, never an exception's traceback."""
    import re

    from commbench.traces import et

    monkeypatch.setattr(et, "SCHEMAS", re.compile(r"1\.\d+\.\d+"))
    monkeypatch.setattr(et, "OLD_SCHEMAS", re.compile(r"(?!)"))
    with pytest.raises(TraceError, match="a record_param_comms node cannot be read"):
        et.from_et([OLD_ET])


DLRM = os.path.join(os.path.dirname(__file__), "data", "traces", "param", "dlrm_kineto")


@pytest.mark.parametrize("rank", range(8))
def test_a_whole_8_rank_dlrm_job_every_rank_s_calls_by_hand(rank):
    path = os.path.join(DLRM, f"rank{rank}.pt.trace.json.gz")
    t = kineto.read(path, progress=False)
    want = _old_calls_by_hand(path)
    assert len(want) == 8 and t.rank == rank and t.world_size == 8
    assert sorted((c.op, c.size, c.dur) for c in t.calls) == want


def test_a_whole_8_rank_dlrm_job_lines_up_call_by_call():
    traces = load([DLRM], progress=False)
    assert [t.rank for t in traces] == list(range(8))
    assert not misaligned(traces)
    rows = match(traces)
    assert len(rows) == 8  # 3 all-reduces and 5 all-to-alls, each on all 8 ranks
    for m in rows:
        assert len(m.calls) == 8 and len({(c.op, c.size) for c in m.calls}) == 1
        starts = [c.ts for c in m.calls]
        assert m.skew_us == pytest.approx(max(starts) - min(starts))


ROCM = os.path.join(os.path.dirname(__file__), "data", "traces", "tracelens",
                    "mi300x_resnet_rank0.json.gz")


def _covered(span: tuple[float, float], cover: list[tuple[float, float]]) -> float:
    """How much of ``span`` the union of ``cover`` (sorted, merged) holds."""
    a, b = span
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in cover)


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for x, y in sorted(spans):
        if out and x <= out[-1][1]:
            out[-1][1] = max(out[-1][1], y)
        else:
            out.append([x, y])
    return [(x, y) for x, y in out]


def test_a_rocm_job_s_rccl_kernels_linked_or_launched_before_the_window():
    """Rank 0 of 8 MI300X ranks (RCCL 2.22.3): every collective runs as RCCL's
    ``ncclDevKernel_Generic``, which names neither collective nor algorithm. A kernel whose
    External id is a ``record_param_comms`` is that call (op, bytes from its args); five were
    launched before the profiler's window opened: counted as communication of unknown op and
    size, with their time and exposed time (before: labelled send/recv). Each call sits in the
    step of its CPU op (before: the kernels that carry their call's args were put in the step
    of their GPU start, which on this job is two steps late).
    Source: AMD-AGI/TraceLens, tests/traces/mi300/resnet_act_checkpoint.json.gz (MIT)."""
    _, ev = _events(ROCM)
    ops = {e["args"]["External id"]: e["args"] for e in ev if e["name"] == "record_param_comms"}
    itemsize = {"BFloat16": 2, "Long": 8}
    names = {"allreduce": "all_reduce", "broadcast": "broadcast"}
    nccl = [e for e in ev if e.get("cat") == "kernel" and e["name"].startswith("nccl")]
    want = []
    for k in nccl:
        a = ops.get(k["args"].get("External id"))
        want.append(("unknown", 0, float(k["dur"])) if a is None else
                    (names[a["Collective name"]], a["In msg nelems"] * itemsize[a["dtype"]],
                     float(k["dur"])))
    t = kineto.read(ROCM, progress=False)
    assert (t.rank, t.world_size, t.nccl_version) == (0, 8, "2.22.3")
    assert sorted((c.op, c.size, c.dur) for c in t.calls) == sorted(want) and len(want) == 17
    assert t.unlinked == sum(op == "unknown" for op, _, _ in want) == 5
    assert {(c.algo, c.proto) for c in t.calls} == {("unknown", "unknown")}
    # a third of the rank's communication time is in the kernels launched before the window
    unlinked = sum(d for op, _, d in want if op == "unknown")
    assert 0.3 < unlinked / sum(d for _, _, d in want) < 0.4
    # exposed: each kernel's time that no computation kernel covers, summed
    compute = _merged([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ev
                       if e.get("cat") == "kernel" and not e["name"].startswith("nccl")])
    exposed = sum(float(k["dur"]) - _covered((float(k["ts"]), float(k["ts"]) + float(k["dur"])),
                                             compute) for k in nccl)
    rows = match([t])
    assert len(rows) == 17
    assert sum(m.exposed_us for m in rows) == pytest.approx(exposed)
    # the GPU runs two steps behind: a call's step is the ProfilerStep#N holding its CPU op
    # (the unlinked ones' ops came before the window: no step); by the kernels' own start
    # 8 of the 12 would fall after the last step
    steps = [(int(e["name"].split("#")[1]), e["ts"], e["ts"] + e["dur"]) for e in ev
             if e["name"].startswith("ProfilerStep#") and e.get("cat") == "user_annotation"]
    cpu_ts = {e["args"]["External id"]: e["ts"] for e in ev if e["name"] == "record_param_comms"}

    def step(k: dict) -> int:
        at = cpu_ts.get(k["args"].get("External id"))
        return next((n for n, a, b in steps if at is not None and a <= at < b), 0)

    assert sorted((c.ts, c.step) for c in t.calls) == sorted((float(k["ts"]), step(k))
                                                             for k in nccl)
    assert [sum(step(k) == n for k in nccl) for n in (0, 15, 16, 17)] == [5, 4, 4, 4]
    assert sum(float(k["ts"]) >= max(b for _, _, b in steps) for k in nccl) == 8


def test_a_replay_of_the_rocm_job_says_what_it_leaves_out():
    """The five kernels launched before the window have no call to re-issue: the replay's plan
    holds the twelve linked calls, and says that the five are left out (before: silently)."""
    from commbench.traces.recorded import from_traces

    said: list[str] = []
    world, plan = from_traces([ROCM], said=said)
    assert world == 8 and list(plan) == [0] and len(plan[0]) == 12
    assert said == ["not replayed: 5 NCCL kernel(s) launched before the traces' window "
                    "(ranks [0]), whose calls they do not hold"]


GLOO = os.path.join(DATA, "gloo_cpu_only_rank34.json.gz")


def test_a_gloo_job_whose_calls_are_only_its_profiler_ops_is_read_from_them():
    """Rank 34 of a 300-rank CPU job on gloo: its ten all-reduces are recorded only as
    ``gloo:all_reduce`` ops on gloo's worker threads (this torch's gloo writes no
    ``record_param_comms``), with their input's dims and type. Read as no calls before; now ten
    all-reduces on the world (each group the trace lists is the world), bytes from the ops'
    inputs, time from the ops, and no bandwidth (CPU-timed).
    Source: HolisticTraceAnalysis, tests/data/cpu_only/ (MIT)."""
    doc, ev = _events(GLOO)
    ops = [e for e in ev if e["name"] == "gloo:all_reduce"]
    want = sorted(("all_reduce", math.prod(e["args"]["Input Dims"][0]) * 4, float(e["dur"]))
                  for e in ops)
    t = kineto.read(GLOO, progress=False)
    assert (t.rank, t.world_size, t.backend) == (34, 300, "gloo") and len(want) == 10
    assert sorted((c.op, c.size, c.dur) for c in t.calls) == want
    assert {c.group for c in t.calls} == {tuple(range(300))}
    assert all(g["ranks"] == list(range(300)) for g in doc["distributedInfo"]["pg_config"])
    assert [m.busbw for m in match([t])] == [None] * 10


def test_a_reader_blind_to_profiler_ops_without_record_param_comms_is_caught(monkeypatch):
    monkeypatch.setattr(kineto, "PROFILER", {})
    assert kineto.read(GLOO, progress=False).calls == []


B200 = os.path.join(os.path.dirname(__file__), "data", "traces", "tracelens",
                    "b200_vllm_symm_mem_rank0.json.gz")


def _b200_by_hand() -> tuple[list[dict], list[dict], list[tuple[str, int, float]]]:
    """The trace's events, its multimem kernels, and (op, bytes, device time) of each: bytes
    from the ``symm_mem::multimem_all_reduce_`` op of the kernel's External id (bf16)."""
    _, ev = _events(B200)
    ops = {e["args"]["External id"]: e["args"] for e in ev
           if e["name"] == "symm_mem::multimem_all_reduce_"}
    multimem = [e for e in ev if e.get("cat") == "kernel" and "multimem_all_reduce" in e["name"]]
    return ev, multimem, sorted(
        ("all_reduce", math.prod(ops[k["args"]["External id"]]["Input Dims"][0]) * 2,
         float(k["dur"])) for k in multimem)


def _symm_calls(t) -> list[tuple[str, int, float]]:
    return sorted((c.op, c.size, c.dur) for c in t.calls if c.source == kineto.LIBRARY)


def test_a_vllm_job_s_symmetric_memory_all_reduces_are_communication_sized_by_their_ops():
    """Rank 0 of an 8-GPU B200 vLLM job (NCCL 2.27.5): its tensor-parallel all-reduces run as
    torch SymmetricMemory's ``multimem_all_reduce_kernel`` (NVLink multicast), not NCCL's, and
    were counted as computation: the trace read as one call, its one NCCL all-gather. Each
    kernel is now an all-reduce, with its device time and fully counted exposed time, sized by
    the ``symm_mem::multimem_all_reduce_`` op that launched it (same External id: its input's
    dims and type); no group (the op's group name is not recorded), so no bandwidth.
    Source: AMD-AGI/TraceLens, tests/traces/b200/eager_trace.json.gz (MIT)."""
    ev, multimem, want = _b200_by_hand()
    t = kineto.read(B200, progress=False)
    assert (t.rank, t.world_size, t.nccl_version) == (0, 8, "2.27.5")
    assert t.library == {"torch SymmetricMemory": 73} and len(want) == 73
    assert _symm_calls(t) == want
    assert {c.dtype for c in t.calls if c.source == kineto.LIBRARY} == {"bfloat16"}
    assert [(c.op, c.size) for c in t.calls if c.source != kineto.LIBRARY] == [
        ("all_gather", 201088 * 2)]
    # no computation kernel overlaps them: every microsecond of theirs is exposed
    compute = _merged([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ev
                       if e.get("cat") == "kernel" and e not in multimem and
                       not e["name"].startswith("nccl")])
    rows = {m.first.ts: m for m in match([t])}
    for k in multimem:
        span = (float(k["ts"]), float(k["ts"]) + float(k["dur"]))
        m = rows[span[0]]
        assert m.exposed_us == pytest.approx(float(k["dur"]) - _covered(span, compute))
        assert (m.first.group, m.busbw) == ((), None)
    assert sum(float(k["dur"]) for k in multimem) == pytest.approx(2119.5, abs=0.05)


def test_a_reader_that_leaves_symmetric_memory_unsized_is_caught(monkeypatch):
    """The same trace read with the launching ops ignored: the all-reduces keep their time but
    lose their bytes, which the previous test's figures catch."""
    want = _b200_by_hand()[2]
    monkeypatch.setattr(kineto, "symm_mem_op", lambda name: None)
    t = kineto.read(B200, progress=False)
    assert _symm_calls(t) != want
    assert sorted(d for _, _, d in _symm_calls(t)) == sorted(d for _, _, d in want)


H200 = os.path.join(os.path.dirname(__file__), "data", "traces", "h200")
ITEM = {"torch.float32": 4, "torch.bfloat16": 2, "torch.int64": 8}


def _issued() -> tuple[dict, list[tuple[int, str, int]]]:
    """suites/gpu_trace.py's own list of what it issued: (step, op, bytes) per call; at a world
    of one every op's nccl-tests size is the rank's buffer."""
    with open(os.path.join(H200, "issued.json")) as f:
        meta = json.load(f)
    ops = {"all_to_all_splits": "all_to_all"}
    return meta, [(c["step"], ops.get(c["op"], c["op"]), c["numel"] * ITEM[c["dtype"]])
                  for c in meta["calls"]]


def test_a_one_rank_nccl_job_s_calls_without_kernels_are_counted_untimed():
    """torch 2.11 and NCCL 2.28.9 on an H200, a world of one: NCCL runs 15 of the 18 calls as a
    device copy or not at all, so only the split all-to-alls have a kernel. Every call is still
    there, in the step its op is in; a call without a kernel has no time and no bandwidth."""
    meta, want = _issued()
    path = os.path.join(H200, "kineto_world1_rank0.json.gz")
    doc, ev = _events(path)
    assert doc["distributedInfo"]["nccl_version"] == meta["nccl"] == "2.28.9"
    kernel_ids = {e["args"]["External id"] for e in ev
                  if e.get("cat") == "kernel" and e["name"].startswith("nccl")}
    ops = [e for e in ev if e["name"] == "record_param_comms"]
    bare = sum(e["args"]["External id"] not in kernel_ids for e in ops)
    assert (len(ops), bare) == (18, 15)  # by hand: ops whose External id no NCCL kernel has
    t = kineto.read(path, progress=False)
    assert sorted((c.step, c.op, c.size) for c in t.calls) == sorted(want)
    assert t.no_kernel == bare and sum(c.source == kineto.NO_KERNEL for c in t.calls) == bare
    rows = match([t])
    untimed = [m for m in rows if not m.timed]
    assert len(untimed) == bare and all(m.busbw is None and m.time_us == 0 for m in untimed)
    timed = [m for m in rows if m.timed]
    assert {m.first.name for m in timed} == {"all_to_allv"} and all(m.time_us > 0 for m in timed)
    assert all(m.busbw == 0 for m in timed)  # one rank: nothing crosses a link


@pytest.mark.parametrize("name", ["et_world1_rank0.json.gz", "kineto_world1_rank0.json.gz"])
def test_torch_2_11_s_traces_replay_the_calls_the_job_issued(name):
    """Both traces of the H200 run replay every call it issued, the 15 without a kernel among
    them (from the Kineto trace before: the 3 split all-to-alls alone)."""
    from commbench.traces.sources import load as load_recording

    _, want = _issued()
    world, plan = load_recording([os.path.join(H200, name)])
    assert world == 1 and list(plan) == [0]
    size = {"float32": 4, "bfloat16": 2, "int64": 8}
    assert [(r.op, r.count * size[r.dtype]) for r in plan[0]] == [(op, b) for _, op, b in want]


def test_a_trace_recorded_without_shapes_has_its_calls_and_times_and_no_sizes():
    """HTA's df_index_resolver trace (torch < 2.1, cut): recorded without record_shapes, neither
    record_param_comms nor the nccl:* ops hold a size. Every NCCL kernel is still its op's call
    with its time (kernel -> launch by correlation -> the nccl:* op around it, by hand); no
    bytes and no bandwidth are made up, and the output says why (before: exit 2)."""
    from commbench.traces.report import markdown, record

    path = os.path.join(DATA, "unshaped_rank1.json.gz")
    doc, ev = _events(path)
    launch = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"}
    ops = [e for e in ev if e["name"] in OLD]
    assert all("Input Dims" not in o["args"] for o in ops)  # no shapes recorded
    want = []
    for k in (e for e in ev if e.get("cat") == "kernel" and e["name"].startswith("nccl")):
        lc = launch[k["args"]["correlation"]]
        (op,) = [o for o in ops if o["tid"] == lc["tid"] and o["ts"] <= lc["ts"] <= o["ts"] + o["dur"]]
        want.append((OLD[op["name"]][0], float(k["dur"])))
    t = kineto.read(path, progress=False)
    assert len(want) == 49 and sorted((c.op, c.dur) for c in t.calls) == sorted(want)
    assert (t.rank, t.world_size, t.unsized) == (1, 2, 49)
    rows = match([t])
    assert all(m.busbw is None and m.time_us > 0 for m in rows)
    rec = record([t], rows, {})
    assert all(c["bytes"] is None for c in rec["calls"])
    assert "49 call(s) without sizes: the trace was recorded without shapes" in markdown(rec)


def test_a_replay_of_a_trace_without_sizes_is_refused_saying_why(capsys):
    from said import said

    from commbench.cli.main import main

    path = os.path.join(DATA, "unshaped_rank1.json.gz")
    assert main(["replay", path, "--no-write", "--np", "2"]) == 2
    err = said(capsys).strip().splitlines()
    assert len(err) == 1 and "no call to re-issue (not replayed: 49 call(s) whose sizes" in err[0]


def test_one_rank_s_trace_replayed_on_512_ranks_names_the_others_as_a_range(tmp_path):
    """A 512-rank job of which rank 0's trace alone is kept: the replay's plan says the 511
    ranks without a recording as one range and their count, not as 511 numbers."""
    from trace_generator import Planned, generate

    from commbench.traces.recorded import complete, from_traces

    generate(512, [Planned("allreduce", tuple(range(512)), 1 << 10)], str(tmp_path / "one"),
             ranks=[0])
    world, plan = from_traces([str(tmp_path / "one")])
    said = complete(world, plan)
    assert world == 512 and len(plan) == 512
    assert said[0].startswith("ranks [1-511] (511 ranks) have no recording: each replays rank 0's")
