"""``commbench analyze``: a generated NCCL job's traces read back to the figures put in (bytes,
busbw to the factor, skew to the microsecond, exposed time to the kernel), and each of the
analyzer's rules, broken on purpose, caught by the same judge."""

from __future__ import annotations

import bisect
import gzip
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from said import said
from trace_generator import LAYOUTS, Planned, expected, generate

from commbench.traces import analysis, calls, intervals, kineto, stream
from commbench.traces.analysis import match, per_step
from commbench.traces.calls import TraceError, kernel_choice
from commbench.traces.job import load

pytestmark = pytest.mark.traces

NAMES = {"all_reduce": "allreduce", "all_gather": "_allgather_base",
         "reduce_scatter": "_reduce_scatter_base", "broadcast": "broadcast",
         "all_to_all": "all_to_allv"}


def judge(plan: list[Planned], rows) -> list[str]:
    """Every figure the analyzer read that differs from the one the generator put in."""
    bad = []
    if len(rows) != len(plan):
        return [f"{len(rows)} calls read, {len(plan)} planned"]
    for p, m in zip(plan, sorted(rows, key=lambda m: min(c.ts for c in m.calls)), strict=True):
        want = expected(p)
        got = {"bytes": m.first.size, "time_us": m.time_us, "busbw": m.busbw,
               "skew_us": m.skew_us, "slowest": m.slowest, "exposed_us": m.exposed_us}
        for k, v in want.items():
            if not (got[k] == pytest.approx(v, rel=1e-9, abs=1e-6)):
                bad.append(f"{p.name} on {p.group}: {k} {got[k]} != {v}")
        # what NCCL runs as grouped point-to-point names no algorithm, whatever the kernel says
        algo = ("", "") if p.op in ("send", "recv", "all_to_all", "gather", "scatter") else (
            p.algo.lower(), {"SIMPLE": "Simple"}.get(p.proto, p.proto))
        if (m.first.algo, m.first.proto) != algo:
            bad.append(f"{p.name}: algo/proto {m.first.algo}/{m.first.proto}")
    return bad


@st.composite
def plans(draw):
    world = draw(st.sampled_from([2, 4, 8]))
    out = []
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(sorted(NAMES)))
        n = draw(st.sampled_from([k for k in (2, 4, 8) if k <= world]))
        start = draw(st.integers(0, world - n))
        group = tuple(range(start, start + n))
        elems = draw(st.integers(1, 1 << 20)) * n
        if draw(st.integers(0, 5)) == 0:  # a send between two ranks of the group, either way
            ends = tuple(draw(st.permutations(group))[:2])
            out.append(Planned("send", group, elems, "Float", draw(st.floats(1.0, 500.0)),
                               (draw(st.integers(0, 600)) / 2, draw(st.integers(0, 600)) / 2),
                               ends=ends))
            continue
        dur = draw(st.floats(1.0, 5000.0, allow_nan=False))
        out.append(Planned(NAMES[op], group, elems, draw(st.sampled_from(
            ["Float", "BFloat16", "Half", "Long"])), dur,
            tuple(draw(st.integers(0, 600)) / 2 for _ in group),  # a trace's ts: 1 ns steps
            draw(st.floats(0, dur, allow_nan=False)),
            draw(st.sampled_from(["RING", "TREE", "NVLS", "NVLS_TREE", "COLLNET_DIRECT", "PAT"])),
            draw(st.sampled_from(["LL", "LL128", "SIMPLE"]))))
    return world, out


PROPERTY = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@PROPERTY
@given(case=plans(), old=st.booleans(), link=st.booleans(), gz=st.booleans(),
       layout=st.sampled_from(LAYOUTS))
def test_the_analyzer_reads_back_every_figure_the_generator_put_in(tmp_path_factory, case, old,
                                                                   link, gz, layout):
    world, plan = case
    folder = str(tmp_path_factory.mktemp("job"))
    generate(world, plan, folder, old_names=old, link=link, compress=gz, layout=layout)
    assert judge(plan, match(load([folder]))) == []


PLAN = [Planned("allreduce", (0, 1, 2, 3), 1 << 20, "BFloat16", 200.0, (0, 30, 5, 12), 80.0),
        Planned("_allgather_base", (0, 1), 4096, "Float", 50.0, (10, 0), 0.0, "RING", "SIMPLE"),
        Planned("_reduce_scatter_base", (2, 3), 8192, "Half", 70.0, (3, 9), 70.0, "PAT", "LL128")]


def _broken_time(traces):  # the wait counted as wire time: the first member's start
    rows = match(traces)
    for m in rows:
        m.time_us = max(c.end for c in m.calls) - min(c.ts for c in m.calls)
    return rows


def _broken_skew(traces):  # the skew read off rank 0 alone
    rows = match(traces)
    for m in rows:
        if m.skew_us is not None:
            m.skew_us = m.calls[-1].ts - m.calls[0].ts
    return rows


BROKEN = {
    "time includes the wait": ("match", _broken_time),
    "skew from two members": ("match", _broken_skew),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_rule_of_the_matcher_is_caught(tmp_path, name):
    generate(4, PLAN, str(tmp_path))
    assert judge(PLAN, match(load([str(tmp_path)]))) == []
    assert judge(PLAN, BROKEN[name][1](load([str(tmp_path)]))), name


def test_a_size_read_from_the_wrong_count_is_caught(tmp_path, monkeypatch):
    generate(4, PLAN, str(tmp_path))
    monkeypatch.setattr(calls.Call, "size", property(lambda c: c.in_elems * c.itemsize))
    assert any("bytes" in b for b in judge(PLAN, match(load([str(tmp_path)]))))


def test_an_overlap_that_ignores_the_computation_is_caught(tmp_path, monkeypatch):
    generate(4, PLAN, str(tmp_path))
    monkeypatch.setattr(analysis.Cover, "covered", lambda self, a, b: 0.0)
    assert any("exposed" in b for b in judge(PLAN, match(load([str(tmp_path)]))))


def _last_two_tokens(name: str):  # newer NCCL's spelling only: (algo, proto) at the end
    parts = name.split("(", 1)[0].split("_")
    if not parts[0].startswith("nccl"):
        return None
    return parts[-2].lower(), {"SIMPLE": "Simple"}.get(parts[-1], parts[-1])


def test_an_algorithm_read_from_the_name_s_last_tokens_is_caught_on_older_names(tmp_path,
                                                                                  monkeypatch):
    generate(4, PLAN, str(tmp_path), old_names=True)
    assert judge(PLAN, match(load([str(tmp_path)]))) == []
    monkeypatch.setattr(kineto, "kernel_choice", _last_two_tokens)
    assert any("algo/proto" in b for b in judge(PLAN, match(load([str(tmp_path)]))))


@pytest.mark.parametrize("name, want", [
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", ("ring", "LL")),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
     ("ring", "LL")),
    ("ncclDevKernel_AllGather_RING_LL128(ncclDevKernelArgsStorage<4096ul>)", ("ring", "LL128")),
    ("ncclDevKernel_AllReduce_Sum_f32_NVLS_TREE_SIMPLE(x)", ("nvls_tree", "Simple")),
    ("ncclDevKernel_AllReduce_Sum_f32_NVLS_SIMPLE(x)", ("nvls", "Simple")),
    ("ncclDevKernel_ReduceScatter_Sum_f16_PAT_SIMPLE(x)", ("pat", "Simple")),
    ("ncclDevKernel_AllReduce_Sum_f32_COLLNET_DIRECT_SIMPLE(x)", ("collnet_direct", "Simple")),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", ("", "")),
    ("ampere_sgemm_128x64_nn", None), ("void at::native::vectorized_elementwise_kernel<4>", None),
])
def test_an_nccl_kernel_s_name_gives_its_algorithm_and_protocol(name, want):
    assert kernel_choice(name) == want


def test_per_step_communication_exposed_part_and_overlap(tmp_path):
    plan = [Planned("allreduce", (0, 1), 1000, dur_us=100.0, skew_us=(0.0, 40.0), covered_us=60.0),
            Planned("allreduce", (0, 1), 1000, dur_us=50.0, covered_us=0.0, step=2)]
    generate(2, plan, str(tmp_path))
    rows = {(r["rank"], r["step"]): r for r in per_step(load([str(tmp_path)]))}
    # rank 0 waits 40 us for rank 1, then 100 us of wire of which 60 are covered
    assert rows[(0, 1)]["comm_us"] == pytest.approx(140.0)
    assert rows[(0, 1)]["exposed_us"] == pytest.approx(80.0)
    assert rows[(0, 1)]["overlap"] == pytest.approx(60 / 140)
    assert rows[(1, 1)]["exposed_us"] == pytest.approx(40.0)
    assert rows[(1, 2)] == {"rank": 1, "step": 2, "calls": 1, "comm_us": pytest.approx(50.0),
                            "exposed_us": pytest.approx(50.0), "overlap": pytest.approx(0.0)}


# rank 0 sends to 1 twice and to 2 once; 2 sends to 0; on one group of 4, each with its own
# sizes, durations and skews
P2P_PLAN = [Planned("send", (0, 1, 2, 3), 500, "Float", 20.0, (0, 7), ends=(0, 1)),
            Planned("send", (0, 1, 2, 3), 64, "Float", 30.0, (4, 0), ends=(0, 2)),
            Planned("send", (0, 1, 2, 3), 8, "Half", 12.0, (2.5, 0), ends=(0, 1)),
            Planned("send", (0, 1, 2, 3), 1000, "Float", 40.0, (0, 11), ends=(2, 0))]


def test_a_send_and_its_receive_are_one_call_with_its_skew_and_slowest_rank(tmp_path):
    generate(4, P2P_PLAN, str(tmp_path))
    rows = match(load([str(tmp_path)]))
    assert judge(P2P_PLAN, rows) == []
    assert [(m.first.op, m.first.rank, m.first.peer, [c.rank for c in m.calls]) for m in rows] == [
        ("send", 0, 1, [0, 1]), ("send", 0, 2, [0, 2]), ("send", 0, 1, [0, 1]),
        ("send", 2, 0, [2, 0])]
    assert rows[0].busbw == pytest.approx(2000 / 20 / 1e3)


def _p2p_alone(traces):  # every send and receive its own row, as if never matched
    rows = []
    for m in match(traces):
        rows += [analysis.Matched([c], c.dur, None, -1, m.exposed_us, m.algbw, m.busbw)
                 for c in m.calls] if m.first.op == "send" else [m]
    return rows


def _p2p_by_place(monkeypatch):  # the k-th point-to-point call of a rank, whatever its peer
    def keys(traces):
        out = {}
        for t in traces:
            for k, c in enumerate(c for c in t.calls if c.op in ("send", "recv")):
                out[id(c)] = (c.group, "p2p", min(c.rank, c.peer), max(c.rank, c.peer), k)
        return out
    monkeypatch.setattr(analysis, "_p2p_keys", keys)
    return match


@pytest.mark.parametrize("broken", ["alone", "by place"])
def test_each_broken_pairing_of_sends_and_receives_is_caught(tmp_path, monkeypatch, broken):
    generate(4, P2P_PLAN, str(tmp_path))
    run = _p2p_alone if broken == "alone" else _p2p_by_place(monkeypatch)
    assert judge(P2P_PLAN, run(load([str(tmp_path)]))), broken


def test_one_rank_s_sends_and_receives_alone_keep_their_own_durations(tmp_path):
    paths = generate(4, P2P_PLAN, str(tmp_path))
    rows = match(load([paths[0]]))
    assert [(m.first.op, m.first.peer, m.skew_us, m.slowest) for m in rows] == [
        ("send", 1, None, -1), ("send", 2, None, -1), ("send", 1, None, -1), ("recv", 2, None, -1)]
    assert rows[0].time_us == pytest.approx(20.0 + 7)  # its own kernel, the wait for 1 in it
    assert rows[1].time_us == pytest.approx(30.0)  # 2 started first: no wait on 0


def test_one_rank_s_file_alone_has_every_figure_but_the_cross_rank_ones(tmp_path):
    paths = generate(4, PLAN, str(tmp_path))
    rows = match(load([paths[2]]))
    assert [(m.first.op, m.skew_us, m.slowest) for m in rows] == [
        ("all_reduce", None, -1), ("reduce_scatter", None, -1)]
    assert rows[0].time_us == pytest.approx(200.0 + 30 - 5)  # its own kernel, wait included


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("chunk", [7, 300])
def test_reading_in_small_chunks_gives_the_same_calls(tmp_path, monkeypatch, layout, chunk):
    paths = generate(4, PLAN, str(tmp_path), layout=layout)
    whole = [(c.op, c.ts, c.dur, c.in_elems, c.host_ts) for c in kineto.read(paths[0]).calls]
    # numbers and strings cut at every chunk's end; events cut across chunks
    monkeypatch.setattr(stream, "CHUNK", chunk)
    assert [(c.op, c.ts, c.dur, c.in_elems, c.host_ts)
            for c in kineto.read(paths[0]).calls] == whole


def test_top_level_keys_after_the_events_are_read_too(tmp_path):
    doc = json.loads(open(generate(2, PLAN[1:2], str(tmp_path))[0]).read())
    info = doc.pop("distributedInfo")
    path = tmp_path / "late.json"
    path.write_text(json.dumps({"traceEvents": doc["traceEvents"], "distributedInfo": info}))
    t = kineto.read(str(path))
    assert (t.rank, t.world_size, len(t.calls)) == (0, 2, 1)


def test_a_big_trace_says_how_far_it_got(tmp_path, monkeypatch, capsys):
    paths = generate(4, PLAN, str(tmp_path))
    monkeypatch.setattr(stream, "PROGRESS_BYTES", 1000)
    monkeypatch.setattr(stream, "CHUNK", 1000)
    kineto.read(paths[0])
    assert "MB read" in capsys.readouterr().err


def _write(path, text, gz=False):
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, says", [
    ("[1, 2]", "not a Kineto trace"), ('{"a": 1}', "no traceEvents"), ("{", "not a Kineto"),
    ('{"traceEvents": [{"ph": "X"', "not valid JSON"), ("not json", "not a Kineto trace"),
])
def test_a_file_that_is_not_a_kineto_trace_is_named_in_one_line(tmp_path, text, says):
    with pytest.raises(TraceError, match=says) as info:
        kineto.read(_write(tmp_path / "x.json", text))
    assert "x.json" in str(info.value) and "\n" not in str(info.value)


def _one(args: dict, name="record_param_comms", cat="cpu_op") -> str:
    return json.dumps({"distributedInfo": {"rank": 0, "world_size": 2},
                       "traceEvents": [{"ph": "X", "cat": cat, "name": name, "ts": 1, "dur": 2,
                                        "args": args}]})


GOOD = {"Collective name": "allreduce", "In msg nelems": 4, "Out msg nelems": 4,
        "dtype": "Float", "Process Group Name": "0", "Process Group Ranks": "[0, 1]"}


@pytest.mark.parametrize("change, says", [
    ({"In msg nelems": None}, "sizes cannot be read"), ({"Out msg nelems": "x"}, "sizes"),
    ({"dtype": "Quad"}, "dtype 'Quad' unknown"), ({"Process Group Ranks": "[0, a]"}, "Ranks"),
    ({"In split size": "[1, x]"}, "split sizes"),
])
def test_a_call_whose_fields_cannot_be_read_is_named(tmp_path, change, says):
    with pytest.raises(TraceError, match=says):
        kineto.read(_write(tmp_path / "x.json", _one({**GOOD, **change})))


# calls alike but for one argument each (the reader works out each set of arguments once)
ALIKE = [{}, {"dtype": "BFloat16"}, {"Process Group Description": "dp"}, {"In msg nelems": 8},
         {"Collective name": "all_to_allv", "In split size": "[1, 3]", "Out split size": "[2, 2]"},
         {"Collective name": "all_to_allv", "In split size": "[3, 1]", "Out split size": "[2, 2]"},
         {"Collective name": "all_to_allv", "In split size": [3, 1], "Out split size": [1, 3]},
         {"Collective name": "send", "Rank": 1}, {"Collective name": "send", "Rank": 0},
         {"Collective name": 1}, {"Collective name": True}, {"Process Group Ranks": "[1, 0]"}, {}]


def _alike(path) -> list[tuple]:
    events = [{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 10 * i, "dur": 2,
               "args": {**GOOD, **change}} for i, change in enumerate(ALIKE)]
    text = json.dumps({"distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": events})
    got = kineto.read(_write(path, text))
    return [(c.name, c.op, c.group, c.dtype, c.group_desc, c.in_elems, c.in_splits,
             c.out_splits, c.peer) for c in got.calls]


def test_calls_alike_but_for_one_argument_each_keep_their_own(tmp_path):
    assert _alike(tmp_path / "x.json") == [
        ("allreduce", "all_reduce", (0, 1), "float32", "", 4, (), (), -1),
        ("allreduce", "all_reduce", (0, 1), "bfloat16", "", 4, (), (), -1),
        ("allreduce", "all_reduce", (0, 1), "float32", "dp", 4, (), (), -1),
        ("allreduce", "all_reduce", (0, 1), "float32", "", 8, (), (), -1),
        ("all_to_allv", "all_to_all", (0, 1), "float32", "", 4, (1, 3), (2, 2), -1),
        ("all_to_allv", "all_to_all", (0, 1), "float32", "", 4, (3, 1), (2, 2), -1),
        ("all_to_allv", "all_to_all", (0, 1), "float32", "", 4, (3, 1), (1, 3), -1),
        ("send", "send", (0, 1), "float32", "", 4, (), (), 1),
        ("send", "send", (0, 1), "float32", "", 4, (), (), 0),
        ("1", "1", (0, 1), "float32", "", 4, (), (), -1),
        ("True", "true", (0, 1), "float32", "", 4, (), (), -1),
        ("allreduce", "all_reduce", (1, 0), "float32", "", 4, (), (), -1),
        ("allreduce", "all_reduce", (0, 1), "float32", "", 4, (), (), -1)]


@pytest.mark.parametrize("left_out", ["dtype", "In split size", "Rank"])
def test_arguments_worked_out_once_under_too_short_a_key_are_caught(tmp_path, monkeypatch,
                                                                     left_out):
    want = _alike(tmp_path / "x.json")
    monkeypatch.setattr(kineto, "_STATIC_ARGS",
                        tuple(k for k in kineto._STATIC_ARGS if k != left_out))
    assert _alike(tmp_path / "y.json") != want


def test_a_sample_of_a_job_is_read_and_a_rank_twice_or_a_disagreeing_group_refused(tmp_path):
    paths = generate(4, PLAN, str(tmp_path / "job"))
    import os

    os.remove(paths[3])  # three ranks of four: a sample, read as such
    sample = load([str(tmp_path / "job")])
    assert [t.rank for t in sample] == [0, 1, 2] and {t.world_size for t in sample} == {4}
    a = _write(tmp_path / "a.json", _one(GOOD))
    b = _write(tmp_path / "b.json.gz", _one(GOOD), gz=True)
    with pytest.raises(TraceError, match="are both rank 0"):
        load([a, b])
    other = json.loads(_one({**GOOD, "Process Group Ranks": "[1, 0]"}))
    other["distributedInfo"]["rank"] = 1
    c = _write(tmp_path / "c.json", json.dumps(other))
    with pytest.raises(TraceError, match="group '0': ranks"):
        load([a, c])


def test_a_trace_is_read_within_bounds_each_refusal_one_line(tmp_path):
    """A gzip bomb is refused once it outgrows any real trace's compression, a value nested
    past Python's parser is refused (before: RecursionError, exit 3), and a file past the size
    given is refused naming the flag that raises it."""
    from commbench.traces import stream

    bomb = tmp_path / "bomb.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        f.write(b'{"traceEvents": [')
        for _ in range((stream.BOMB_CHARS >> 20) + 8):
            f.write(b" " * (1 << 20))
        f.write(b"]}")
    with pytest.raises(TraceError, match="decompresses to more than 1000 times"):
        kineto.read(str(bomb), progress=False)
    deep = tmp_path / "deep.json"
    deep.write_text('{"traceEvents": [' + "[" * 100_000 + "]" * 100_000 + "]}")
    with pytest.raises(TraceError, match="nested deeper than"):
        kineto.read(str(deep), progress=False)
    small = _write(tmp_path / "ok.json", _one(GOOD))
    assert kineto.read(small, progress=False).calls  # within the bound: read
    with pytest.raises(TraceError, match="give --max-size GB"):
        kineto.read(small, progress=False, limit=16)


def test_a_world_past_any_job_s_is_refused_in_one_line_before_it_is_listed(tmp_path):
    """A world is listed rank by rank (a torch < 2.1 call's group, a replay's ranks): a trace
    that states, names or is given more than MAX_WORLD ranks (a typo's 10^11 would take all of
    a machine's memory) is refused. One past the bound is asked here, small enough to list:
    a regression fails on the missing refusal, not out of memory."""
    from commbench.traces.calls import MAX_WORLD
    from commbench.traces.et import from_et
    from commbench.traces.job import load

    big = MAX_WORLD + 1
    old = {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "ts": 1, "dur": 2,
           "args": {"Input Dims": [[4]], "Input type": ["float"]}}
    bare = {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 1, "dur": 2,
            "args": {}}
    for info, world, why in (({"rank": 0, "world_size": big}, 0, f"world_size {big}"),
                             ({"rank": big}, 0, f"rank {big}"),
                             ({"rank": 0}, big, f"--world {big}")):
        path = _write(tmp_path / "t.json", json.dumps({"distributedInfo": info,
                                                        "traceEvents": [bare, old]}))
        with pytest.raises(TraceError, match=f"{why}.*at most {MAX_WORLD} ranks"):
            kineto.read(path, progress=False, world=world)
    assert kineto.read(path, progress=False, world=MAX_WORLD).world_size == MAX_WORLD
    named = dict(GOOD, **{"Process Group Ranks": f"[0, {MAX_WORLD}]", "Group size": 2})
    path = _write(tmp_path / "named.json", json.dumps({
        "distributedInfo": {"rank": 0}, "traceEvents": [{
            "ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 1, "dur": 2,
            "args": named}]}))
    with pytest.raises(TraceError, match=f"world_size {big}: a job of at most"):
        load([path], progress=False)
    pgs = json.dumps([{"pg_name": "0", "pg_desc": "default_pg", "group_size": big}])
    et = _write(tmp_path / "et_rank0.json", json.dumps({"schema": "1.1.0-chakra.0.0.4", "nodes": [
        {"id": 2, "name": "## process_group:init ##", "ctrl_deps": 1,
         "inputs": {"values": [pgs], "shapes": [[]], "types": ["String"]}}]}))
    with pytest.raises(TraceError, match=f"group '0' of {big} ranks: a job of at most"):
        from_et([et])


def test_a_kernel_belongs_to_the_step_of_its_cpu_op_when_the_gpu_runs_behind(tmp_path):
    """The all-reduce is enqueued in step 1 and runs on the GPU during step 2's CPU span: it is
    step 1's (before: step 2's, by the kernel's start)."""
    op = {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 10, "dur": 2,
          "args": {**GOOD, "External id": 7}}
    kernel = {"ph": "X", "cat": "kernel", "ts": 150, "dur": 30, "tid": 7,
              "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
              "args": {"External id": 7}}
    steps = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": t,
              "dur": 100} for n, t in ((1, 0), (2, 100))]
    doc = {"distributedInfo": {"rank": 0, "world_size": 2},
           "traceEvents": [*steps, op, kernel]}
    (c,) = kineto.read(_write(tmp_path / "behind.json", json.dumps(doc)), progress=False).calls
    assert (c.source, c.ts, c.step) == ("kernel", 150.0, 1)


def test_an_nccl_kernel_launched_before_the_trace_counts_as_communication(tmp_path):
    """A kernel with neither an op of its External id nor a launch in the trace (the profiler's
    window opened after its launch) is the rank's communication: its time counts, exposed where
    nothing covers it; its size and group are unknown, and the output says how many (before:
    dropped without a word)."""
    from commbench.traces.report import markdown, record

    op = {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 100, "dur": 2,
          "args": {**GOOD, "External id": 7}}
    linked = {"ph": "X", "cat": "kernel", "ts": 110, "dur": 20, "tid": 7, "args": {
        "External id": 7}, "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgs)"}
    early = {**linked, "ts": 10, "dur": 50, "args": {"External id": 3, "correlation": 3}}
    doc = {"distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": [op, linked, early]}
    path = _write(tmp_path / "early.json", json.dumps(doc))
    t = kineto.read(path, progress=False)
    assert t.unlinked == 1
    assert sorted((c.op, c.source, c.size, c.dur) for c in t.calls) == [
        ("all_reduce", "kernel", 16, 20.0), ("all_reduce", "kernel-unlinked", 0, 50.0)]
    rows = match([t])
    assert sum(m.exposed_us for m in rows) == pytest.approx(70.0)
    rec = record([t], rows, {})
    assert "1 NCCL kernel(s) launched before the trace's window" in markdown(rec)
    # its bytes unknown, not 0 (they were written as 0)
    assert [(c["source"], c["bytes"]) for c in rec["calls"]] == [("kernel-unlinked", None),
                                                                 ("kernel", 16)]


def _graphed_job(path) -> str:
    """A step of a job that replays a CUDA graph: the graph's launch (cudaGraphLaunch,
    correlation 42) in ProfilerStep#5, and the kernels the replay runs, the GPU behind: a GEMM and
    an NCCL all-reduce under it, each with the launch's correlation and no op's External id (as
    a ROCm vLLM trace in TraceLens' test data lays out hipGraphLaunch's 421 kernels); a kernel
    launched before the window beside them."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#5", "ts": 0,
               "dur": 100},
              {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#6", "ts": 100,
               "dur": 100},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 40, "dur": 5,
               "args": {"correlation": 42}},
              {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32", "ts": 150,
               "dur": 30, "tid": 7, "args": {"correlation": 42}},
              {"ph": "X", "cat": "kernel", "ts": 160, "dur": 40, "tid": 9,
               "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
               "args": {"correlation": 42}},
              {"ph": "X", "cat": "kernel", "ts": 5, "dur": 10, "tid": 9,
               "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
               "args": {"correlation": 3}}]
    return _write(path, json.dumps({"distributedInfo": {"rank": 0, "world_size": 8},
                                    "traceEvents": events}))


def test_nccl_kernels_replayed_from_a_cuda_graph_are_said_so_in_their_launch_s_step(tmp_path,
                                                                                     capsys):
    """A CUDA graph's replay runs kernels whose ops ran at its capture: an NCCL kernel in it has
    no op of its own in the trace, as one launched before the window, and was said to be one,
    in no step. It carries its graph launch's correlation: it is said replayed from a graph,
    counted as communication in the step of the launch (the GPU behind), 20 us of its 40
    exposed; the kernel launched before the window stays so."""
    from commbench.cli.main import main
    from commbench.traces.recorded import from_traces

    path = _graphed_job(tmp_path / "rank0.json")
    t = kineto.read(path, progress=False)
    assert (t.graphed, t.unlinked) == (1, 1)
    assert sorted((c.source, c.op, c.dur, c.step) for c in t.calls) == [
        ("kernel-graph", "all_reduce", 40.0, 5), ("kernel-unlinked", "all_reduce", 10.0, 0)]
    assert sum(s["exposed_us"] for s in per_step([t]) if s["step"] == 5) == 20.0
    assert main(["analyze", path]) == 0
    assert "# 1 NCCL kernel(s) replayed from a CUDA graph (their calls ran at its capture" in \
        capsys.readouterr().out
    said: list[str] = []
    from_traces([path], said=said)
    assert "not replayed: 1 NCCL kernel(s) replayed from a CUDA graph (ranks [0])" in said[1]


def test_a_reader_blind_to_graph_launches_is_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(kineto, "_GRAPH_LAUNCH", ("no such launch",))
    t = kineto.read(_graphed_job(tmp_path / "rank0.json"), progress=False)
    assert (t.graphed, t.unlinked) == (0, 2)  # the previous test's figures fail


def _deepep_job(path) -> str:
    """One step of a DeepEP job's rank: a GEMM, then DeepEP's dispatch under it, its count
    exchange alone, its layout kernel (computation), and a combine of DeepSeek's own build of it
    (dpsk::ep, the namespace of its published profiles) half under that layout kernel."""
    def kernel(name, ts, dur, tid=7):
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": tid, "ts": ts,
                "dur": dur, "args": {"correlation": ts}}
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 1000},
        kernel("void cutlass::device_kernel<gemm::GemmKernel>(gemm::Params)", 100, 200),
        kernel("void deep_ep::internode::dispatch<false, 8, true, 8>(int4*, float*, long*)",
               200, 200, 27),
        kernel("void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int)", 500, 10, 27),
        kernel("void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*)", 600,
               100),
        kernel("void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*)",
               650, 100, 27)]
    doc = {"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 64},
           "traceEvents": events}
    return _write(path, json.dumps(doc))


def _deepep_figures(path) -> tuple:
    t = kineto.read(path, progress=False)
    steps = per_step([t])
    return (sorted((c.op, c.name, c.source, c.dur) for c in t.calls), list(t.compute_ts),
            list(t.compute_end), sum(s["comm_us"] for s in steps),
            sum(s["exposed_us"] for s in steps), t.library)


def test_deepep_s_kernels_are_communication_not_computation(tmp_path, capsys):
    """A MoE job's all-to-all run by DeepEP is kernels of its own, no NCCL's: they were counted
    as computation, hiding the communication they are (DeepSeek's published training profile:
    113 ms of DeepEP kernels, read as no calls). Its dispatch and combine are all-to-alls, its
    count exchange a call of no known op; each with its device time, none with sizes; its layout
    kernel stays computation."""
    from commbench.cli.main import main

    path = _deepep_job(tmp_path / "rank0.json")
    calls, lo, hi, comm, exposed, library = _deepep_figures(path)
    assert calls == [("all_to_all", "DeepEP combine", "library-kernel", 100.0),
                     ("all_to_all", "DeepEP dispatch", "library-kernel", 200.0),
                     ("unknown", "DeepEP notify_dispatch", "library-kernel", 10.0)]
    assert (lo, hi) == ([100.0, 600.0], [300.0, 700.0])  # the GEMM and the layout kernel
    assert (comm, exposed, library) == (310.0, 160.0, {"DeepEP": 3})  # 200-100 + 10 + 100-50
    assert main(["analyze", path]) == 0
    assert "# 3 kernel(s) of DeepEP (its own all-to-all for MoE dispatch and combine" in \
        capsys.readouterr().out
    assert main(["replay", path, "--np", "2", "--scale"]) == 2
    assert "no call to re-issue (not replayed: 3 kernel(s) of DeepEP" in said(capsys)


def test_a_custom_all_reduce_is_an_all_reduce_of_its_library(tmp_path, capsys):
    """vLLM's and SGLang's custom all-reduce stands in for NCCL's on small tensors: a decode
    step's profile spends a sixth to a third of its kernel time in it (reports quoted in the
    next test's names), all of which was read as computation."""
    from commbench.cli.main import main

    events = [{"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "ts": 0, "dur": 40,
               "name": "void at::native::vectorized_elementwise_kernel<4>(int)"},
              {"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "ts": 50, "dur": 12,
               "name": "void vllm::cross_device_reduce_1stage<c10::BFloat16, 2>(vllm::RankData*, "
                       "vllm::RankSignals, vllm::Signal*, c10::BFloat16*, int, int)"}]
    path = _write(tmp_path / "rank0.json", json.dumps(
        {"distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": events}))
    t = kineto.read(path, progress=False)
    assert [(c.op, c.name, c.dur) for c in t.calls] == [
        ("all_reduce", "vLLM cross_device_reduce_1stage", 12.0)]
    assert (list(t.compute_ts), list(t.compute_end)) == ([0.0], [40.0])
    assert main(["analyze", path]) == 0
    assert "# 1 kernel(s) of vLLM (its custom all-reduce over NVLink peer memory; not NCCL's)" \
        in capsys.readouterr().out


@pytest.mark.parametrize("name, want", [
    # as profilers print them (DeepSeek's published training profile; SGLang and vLLM profiles
    # quoted in public reports; TensorRT-LLM's and DeepEP's kernels by their source)
    ("void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*, int, int)",
     ("DeepEP", "cached_notify")),
    ("void deep_ep::internode_ll::dispatch<false, 8, 7168>(void*, float*, int*)",
     ("DeepEP", "dispatch")),
    ("void sglang::cross_device_reduce_2stage<__half, 8>(sglang::RankData*, sglang::RankSignals, "
     "sglang::Signal*, __half*, int, int)", ("SGLang", "cross_device_reduce_2stage")),
    ("void vllm::cross_device_reduce_1stage<__hip_bfloat16>", ("vLLM", "cross_device_reduce_1stage")),
    ("void tensorrt_llm::kernels::twoShotAllReduceKernel<__nv_bfloat16, 8>(tensorrt_llm::kernels::"
     "AllReduceParams)", ("TensorRT-LLM", "twoShotAllReduceKernel")),
    ("quickreduce::allreduce_prototype_twoshot<AllReduceTwoshot<__half, CodecQ4<__half,4>, true>, "
     "__half>", ("QuickReduce", "allreduce_prototype_twoshot")),
    ("aiter::cross_device_reduce_2stage", ("AITER", "cross_device_reduce_2stage")),
    # torch's SymmetricMemory: as a B200 profile prints it (TraceLens' test data), as other
    # demanglers print an anonymous namespace, and its two-shot kernel
    ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, "
     "unsigned long, unsigned int**, unsigned long, unsigned long)",
     ("torch SymmetricMemory", "multimem_all_reduce_kernel")),
    ("void <unnamed>::two_shot_all_reduce_kernel_inplace<float, 16, 8>(float**, unsigned long)",
     ("torch SymmetricMemory", "two_shot_all_reduce_kernel_inplace")),
    ("void (anonymous namespace)::two_shot_all_reduce_kernel<c10::BFloat16, 16, 8, true, false>"
     "(c10::BFloat16**)", ("torch SymmetricMemory", "two_shot_all_reduce_kernel")),
    # their computation kernels, and names that only mention them
    ("void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*)", None),
    ("void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(int const*)", None),
    ("void vllm::rms_norm_kernel<c10::BFloat16>(c10::BFloat16*, c10::BFloat16 const*)", None),
    ("void cutlass::Kernel<deep_ep::internode::SourceMeta>(int)", None),
    ("void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*)", None),
    ("void (anonymous namespace)::groupnorm_kernel_dispatch_up<__hip_bfloat16, 1024u>(int)", None),
    ("void (anonymous namespace)::multimem_all_reduce_kernel_like<float>(float*)", None),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", None),
])
def test_other_libraries_communication_kernels_are_told_by_their_namespace(name, want):
    assert calls.library_kernel(name) == want


@pytest.mark.parametrize("name, want", [
    ("symm_mem::multimem_all_reduce_", ("all_reduce", True)),
    ("symm_mem::two_shot_all_reduce_out", ("all_reduce", True)),
    ("symm_mem::one_shot_all_reduce_copy_out", ("all_reduce", True)),
    ("symm_mem::multimem_one_shot_reduce_out", ("reduce", True)),
    # their input is one rank's part or the whole: sized only with the group's size
    ("symm_mem::multimem_all_gather_out", ("all_gather", False)),
    ("symm_mem::reduce_scatter_out", ("reduce_scatter", False)),
    ("symm_mem::stream_write_value32_", None)])  # no collective
def test_a_symmetric_memory_op_sizes_its_kernel_only_where_its_input_is_the_call(name, want):
    assert calls.symm_mem_op(name) == want
    assert (calls.library_op(calls.SYMM_MEM, "two_shot_all_reduce_kernel"),
            calls.library_op(calls.SYMM_MEM, "multimem_one_shot_reduce_kernel")) == \
        ("unknown", "unknown")  # either op, by its launch: not by name


def test_profiler_ops_alone_are_on_no_group_where_the_trace_lists_smaller_groups(tmp_path):
    """A trace whose calls are only its process groups' profiler ops (no record_param_comms):
    where the trace lists a group of fewer ranks than the world, an op's group is unknown, not
    the world; the call keeps its op and time, and its bytes only where they need no group's
    size (an all-reduce's, not an all-gather's). The GPU's span of such an op (Kineto's
    gpu_user_annotation of the same name) is no second call."""
    def doc(groups):
        events = [{"ph": "X", "cat": "user_annotation", "name": name, "tid": 5, "ts": ts,
                   "dur": 10, "args": {"Input Dims": [[1000]], "Input type": ["float"]}}
                  for name, ts in (("gloo:all_reduce", 0), ("gloo:all_gather", 20))]
        events.append({"ph": "X", "cat": "user_annotation", "name": "gloo:barrier", "tid": 5,
                       "ts": 40, "dur": 3, "args": {}})  # no input: nothing to size, none missing
        # the GPU's span of an op of the same name (Kineto's gpu_user_annotation): no call
        events.append({"ph": "X", "cat": "gpu_user_annotation", "name": "gloo:all_reduce",
                       "pid": 0, "tid": 7, "ts": 2, "dur": 6, "args": {"External id": 9}})
        info = {"backend": "gloo", "rank": 0, "world_size": 4,
                "pg_config": [{"pg_name": str(k), "ranks": g} for k, g in enumerate(groups)]}
        return json.dumps({"distributedInfo": info, "traceEvents": events})

    whole = kineto.read(_write(tmp_path / "a.json", doc([[0, 1, 2, 3]])), progress=False)
    assert [(c.op, c.group, c.size) for c in whole.calls] == [
        ("all_reduce", (0, 1, 2, 3), 4000), ("all_gather", (0, 1, 2, 3), 16000),
        ("barrier", (0, 1, 2, 3), 0)]
    assert whole.unsized == 0
    part = kineto.read(_write(tmp_path / "b.json", doc([[0, 1, 2, 3], [0, 1]])), progress=False)
    assert [(c.op, c.group, c.size, c.dur) for c in part.calls] == [
        ("all_reduce", (), 4000, 10.0), ("all_gather", (), 0, 10.0), ("barrier", (), 0, 3.0)]
    assert part.unsized == 0  # recorded with shapes: its group, not its shape, is unknown


def test_a_symmetric_memory_kernel_takes_the_op_of_its_launch(tmp_path):
    """torch SymmetricMemory's two-shot kernel runs its all-reduce and its reduce-scatter alike:
    by name it is unknown; launched by symm_mem::reduce_scatter_out it is a reduce-scatter,
    unsized (its input's size is the group's times the output's, and the group is not in the
    trace); launched by symm_mem::two_shot_all_reduce_ an all-reduce of its input's size."""
    kernel = ("void (anonymous namespace)::two_shot_all_reduce_kernel<c10::BFloat16, 16, 8, "
              "{}>(c10::BFloat16**)")
    events = []
    for k, (op, flags) in enumerate((("symm_mem::reduce_scatter_out", "true, false"),
                                     ("symm_mem::two_shot_all_reduce_", "false, false"))):
        events += [{"ph": "X", "cat": "cpu_op", "name": op, "ts": 100 * k, "dur": 5,
                    "args": {"External id": k + 1, "Input Dims": [[4096], [], []],
                             "Input type": ["c10::BFloat16", "", ""]}},
                   {"ph": "X", "cat": "kernel", "name": kernel.format(flags), "ts": 100 * k + 10,
                    "dur": 20, "tid": 7, "args": {"External id": k + 1}},
                   # the GPU's span of the op, its External id and no dims: not the op
                   {"ph": "X", "cat": "gpu_user_annotation", "name": op, "ts": 100 * k + 10,
                    "dur": 20, "pid": 0, "tid": 7, "args": {"External id": k + 1}}]
    path = _write(tmp_path / "rank0.json", json.dumps(
        {"distributedInfo": {"rank": 0, "world_size": 8}, "traceEvents": events}))
    t = kineto.read(path, progress=False)
    assert [(c.op, c.size, c.dur) for c in t.calls] == [("reduce_scatter", 0, 20.0),
                                                       ("all_reduce", 8192, 20.0)]
    assert [c.sized for c in t.calls] == [False, True]


def _symm_recorded(path, with_nccl: bool) -> str:
    """A rank of a torch whose SymmetricMemory ops record their call (RECORD_PARAM_COMMS in
    CUDASymmetricMemoryOps.cu: Collective name symm_mem::two_shot_all_reduce, the input's and
    output's elements, the group), the kernel under it with its External id; beside it, or not,
    an NCCL all-reduce of its own."""
    ranks = "[0, 1, 2, 3, 4, 5, 6, 7]"
    events = [{"ph": "X", "cat": "cpu_op", "name": "symm_mem::two_shot_all_reduce_", "ts": 10,
               "dur": 30, "args": {"External id": 4, "Input Dims": [[4096], [], []],
                                   "Input type": ["c10::BFloat16", "", ""]}},
              {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 12, "dur": 20,
               "args": {"External id": 5, "Collective name": "symm_mem::two_shot_all_reduce",
                        "In msg nelems": 4096, "Out msg nelems": 4096, "dtype": "BFloat16",
                        "Group size": 8, "Process Group Name": "3",
                        "Process Group Ranks": ranks}},
              {"ph": "X", "cat": "kernel", "ts": 50, "dur": 16, "tid": 7, "args": {"External id": 5},
               "name": "void (anonymous namespace)::two_shot_all_reduce_kernel_inplace"
                       "<c10::BFloat16, 16, 8>(c10::BFloat16**, unsigned long)"}]
    if with_nccl:
        events += [{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 100,
                    "dur": 5, "args": {**GOOD, "Process Group Ranks": ranks, "External id": 9}},
                   {"ph": "X", "cat": "kernel", "ts": 120, "dur": 10, "tid": 7,
                    "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgs)",
                    "args": {"External id": 9}}]
    return _write(path, json.dumps({"distributedInfo": {"rank": 0, "world_size": 8},
                                    "traceEvents": events}))


@pytest.mark.parametrize("with_nccl", [False, True])
def test_a_symmetric_memory_call_torch_recorded_is_one_call_with_its_group(tmp_path, with_nccl):
    """Newer torch records each SymmetricMemory collective with record_param_comms, under which
    its kernel runs: the kernel is that call, with its op, bytes and group, so it has a
    bandwidth; the record is no second call (a call without a kernel, or a CPU-timed one)."""
    t = kineto.read(_symm_recorded(tmp_path / "rank0.json", with_nccl), progress=False)
    mine = [(c.op, c.group, c.size, c.dur, c.source) for c in t.calls if c.ts == 50]
    assert mine == [("all_reduce", tuple(range(8)), 8192, 16.0, "library-kernel")]
    assert len(t.calls) == (2 if with_nccl else 1) and t.no_kernel == 0
    (m,) = [m for m in match([t]) if m.first.ts == 50]
    assert m.busbw == pytest.approx(8192 / 16.0 / 1e3 * 2 * 7 / 8)
    # a replay re-issues it as the all-reduce of its group it is, and says nothing left out
    from commbench.traces.recorded import from_traces

    said: list[str] = []
    _, plan = from_traces([str(tmp_path / "rank0.json")], said=said)
    assert [(r.op, r.count) for r in plan[0]][0] == ("all_reduce", 4096)
    assert not any("SymmetricMemory" in line for line in said)


def test_a_recorded_symmetric_memory_call_read_twice_is_caught(tmp_path, monkeypatch):
    """The broken reader: the kernel not linked to the record that holds its call (the record
    then a call without a kernel, the kernel an unsized call of no group) fails the figures."""
    monkeypatch.setattr(kineto, "SYMM_MEM", "no such library")
    t = kineto.read(_symm_recorded(tmp_path / "rank0.json", True), progress=False)
    assert t.no_kernel == 1 and len(t.calls) == 3


def test_a_reader_blind_to_deepep_s_kernels_is_caught(tmp_path, monkeypatch):
    path = _deepep_job(tmp_path / "rank0.json")
    want = _deepep_figures(path)
    monkeypatch.setattr(kineto, "library_kernel", lambda name: None)
    assert _deepep_figures(path)[1:] != want[1:] and _deepep_figures(path)[0] == []


def test_a_call_whose_kernel_one_rank_lacks_is_timed_by_the_others(tmp_path):
    """Two ranks' second all-reduce: rank 1's kernel ran after its profiler's window closed, so
    its trace has the op and no kernel. The call is timed by rank 0's kernel alone (no skew: a
    member's start is unknown), rank 1's op is counted with no time, and the output says so.
    Timed by rank 1's enqueue instead, the call would run from 350 us, after rank 0's kernel
    ended."""
    from commbench.traces.report import markdown, record

    def rank(r: int, second_kernel: bool) -> str:
        events = []
        for k, (t, kt) in enumerate(((100, 110), (300 + 50 * r, 320))):
            ext = 10 * r + k
            events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": t,
                           "dur": 2, "args": {**GOOD, "External id": ext, "Seq": k}})
            if k == 0 or second_kernel:
                events.append({"ph": "X", "cat": "kernel", "ts": kt + r, "dur": 20, "tid": 7,
                               "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(Args)",
                               "args": {"External id": ext}})
        doc = {"distributedInfo": {"rank": r, "world_size": 2}, "traceEvents": events}
        return _write(tmp_path / f"rank{r}.json", json.dumps(doc))

    traces = [kineto.read(rank(0, True), progress=False), kineto.read(rank(1, False), progress=False)]
    assert [t.no_kernel for t in traces] == [0, 1]
    first, second = match(traces)
    assert (first.time_us, first.skew_us) == (pytest.approx(20.0), pytest.approx(1.0))
    assert second.timed and len(second.calls) == 2
    assert (second.time_us, second.skew_us, second.busbw) == (20.0, None, pytest.approx(16 / 20e3))
    assert second.exposed_us == 20.0
    rec = record(traces, [first, second], {})
    assert [c["time_us"] for c in rec["calls"]] == [20.0, pytest.approx(20.0)]
    assert "1 call(s) made no NCCL kernel in the trace" in markdown(rec)


READ_BOTH_WAYS = """
import os, sys
from commbench.traces import job
from commbench.traces.calls import TraceError

real = job.read

def read(path, progress, limit, world):  # which process read it
    t = real(path, progress, limit, world)
    t.path = f"{t.path}@{os.getpid()}"
    return t

job.read = read
paths = sys.argv[1:-1]
alone = job.read_all(paths, progress=False, workers=1)
forked = job.read_all(paths, progress=False, workers=2)
assert {t.path.rsplit("@", 1)[1] for t in alone} == {str(os.getpid())}
pids = {t.path.rsplit("@", 1)[1] for t in forked}
assert len(pids) == 2 and str(os.getpid()) not in pids, pids
for a, b in zip(alone, forked, strict=True):
    assert a.path.rsplit("@", 1)[0] == b.path.rsplit("@", 1)[0]
    assert (a.rank, a.world_size, a.unlinked, a.steps) == (b.rank, b.world_size, b.unlinked, b.steps)
    assert a.calls == b.calls  # every field of every call through the worker's pickle
    assert (a.compute_ts, a.compute_end) == (b.compute_ts, b.compute_end)
try:
    job.read_all([paths[0], sys.argv[-1]], progress=False, workers=2)
except TraceError as exc:
    print("error:", exc)
print("same", [t.rank for t in forked])

MAIN = os.getpid()

def dies(path, progress, limit, world):  # a worker killed (out of memory, say) mid-job
    if path.endswith("rank3.pt.trace.json.gz") and os.getpid() != MAIN:
        os.kill(os.getpid(), 9)
    return real(path, progress, limit, world)

import time  # the last pool's threads end a little after it returns, and no fork is made
for _ in range(1000):  # while any runs: wait for this process to be alone again
    if job._alone():
        break
    time.sleep(0.01)
job.read = dies
try:
    job.read_all(paths, progress=False, workers=2)
except TraceError as exc:
    print("broken:", exc)
"""


def test_a_job_s_files_read_by_forked_workers_are_the_ones_read_in_turn(tmp_path):
    """Ranks read in parallel (forked workers, one file each at a time) give the traces read
    one after another, in the files' order; a worker's error is the caller's one line, and a
    worker killed mid-job ends the read with one (no wait for a file never read). In a
    process of one thread, as the command line's is: a fresh interpreter."""
    import os
    import subprocess
    import sys

    dlrm = os.path.join(os.path.dirname(__file__), "data", "traces", "param", "dlrm_kineto")
    paths = sorted(os.path.join(dlrm, f) for f in os.listdir(dlrm))
    bad = _write(tmp_path / "bad.json", '{"traceEvents": [')
    out = subprocess.run([sys.executable, "-c", READ_BOTH_WAYS, *paths, bad],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "bad.json: traceEvents ends before its ']'" in out.stdout
    assert "same [0, 1, 2, 3, 4, 5, 6, 7]" in out.stdout
    assert "broken: a worker reading 8 trace files ended without a result" in out.stdout


def test_a_process_with_threads_reads_its_files_itself():
    """Negative of the above: where another thread runs, no fork (a lock that thread held
    would stay held in the child: a test session's process hung there); the files are read
    here, in order."""
    import os
    import threading

    from commbench.traces import job

    dlrm = os.path.join(os.path.dirname(__file__), "data", "traces", "param", "dlrm_kineto")
    paths = sorted(os.path.join(dlrm, f) for f in os.listdir(dlrm))[:2]
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not job._alone()
        got = job.read_all(paths, progress=False, workers=2)
    finally:
        stop.set()
        other.join()
    assert [t.rank for t in got] == [0, 1]


def test_a_rank_s_computation_is_kept_as_the_union_of_its_kernels(tmp_path):
    """The reader leaves a rank's computation kernels as their union, sorted and merged (what
    the overlap figures are taken against): overlapping and touching kernels on any stream are
    one interval, apart ones stay apart, in time order whatever the file's order; an NCCL
    kernel is not computation."""
    def kernel(name, ts, dur, tid=7):
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": tid, "ts": ts,
                "dur": dur, "args": {}}
    events = [kernel("gemm", 30.0, 10.0), kernel("gemm", 0.0, 10.0), kernel("relu", 5.0, 15.0, 9),
              kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 45.0, 100.0),
              kernel("gemm", 40.0, 2.0), kernel("gemm", 50.0, 1.0)]
    path = _write(tmp_path / "r.json", json.dumps({"traceEvents": events}))
    t = kineto.read(path, progress=False)
    assert list(zip(t.compute_ts, t.compute_end, strict=True)) == [(0.0, 20.0), (30.0, 42.0),
                                                                   (50.0, 51.0)]
    assert analysis.Cover(t).covered(0.0, 60.0) == 33.0


INTERVALS = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 20)).map(
    lambda p: (float(p[0]), float(p[0] + p[1]))), max_size=30)


def _online(spans, union_cls=None) -> list[tuple[float, float]]:
    u = (union_cls or intervals.OnlineUnion)()
    for a, b in spans:
        u.add(a, b)
    lo, hi = u.spans()
    return list(zip(lo, hi, strict=True))


@given(spans=INTERVALS, ordered=st.booleans())
def test_kernels_merged_as_they_come_are_the_union_of_them_all(spans, ordered):
    """The reader merges computation intervals as it reads them (in order: only the union is
    kept; out of order: merged in at the end): the same union as sorting them all."""
    if ordered:
        spans = sorted(spans)
    assert _online(spans) == intervals.union(spans)


def test_an_interval_merged_in_out_of_order_only_at_its_place_is_caught():
    class Broken(intervals.OnlineUnion):  # an early interval appended as if in order
        def add(self, a, b):
            if self.lo and a < self.lo[-1]:
                self.lo.append(a)
                self.hi.append(b)
                return
            super().add(a, b)

    spans = [(10.0, 20.0), (0.0, 5.0), (4.0, 12.0)]
    assert _online(spans) == intervals.union(spans) == [(0.0, 20.0)]
    assert _online(spans, Broken) != intervals.union(spans)


class _Rank:  # what Cover reads of a rank's trace
    def __init__(self, spans) -> None:
        self.compute_ts = [a for a, _ in spans]
        self.compute_end = [b for _, b in spans]


def _covered_by_hand(spans, a: float, b: float) -> float:
    return sum(max(0.0, min(b, e) - max(a, s)) for s, e in spans)


@given(spans=INTERVALS, a=st.integers(-5, 85), length=st.integers(-3, 40))
def test_the_time_a_union_covers_of_a_span_is_its_intervals_overlaps_summed(spans, a, length):
    """A call's covered time (its exposed time is the rest): the overlaps of [a, b) with each
    merged interval, summed; nothing where b <= a."""
    merged = intervals.union(spans)
    got = analysis.Cover(_Rank(merged)).covered(float(a), float(a + length))
    assert got == _covered_by_hand(merged, float(a), float(a + length))


def test_a_covered_time_searched_from_the_intervals_starts_is_caught():
    """The broken rule: the search for the first interval made on the starts, so that the
    interval holding ``a`` is missed."""
    class Broken(analysis.Cover):
        def covered(self, a, b):
            i = bisect.bisect_right(self.lo, a)
            return sum(max(0.0, min(b, self.hi[j]) - max(a, self.lo[j]))
                       for j in range(i, len(self.lo)) if self.lo[j] < b)

    merged = [(0.0, 10.0), (20.0, 30.0)]
    assert analysis.Cover(_Rank(merged)).covered(5.0, 25.0) == 10.0 == \
        _covered_by_hand(merged, 5.0, 25.0)
    assert Broken(_Rank(merged)).covered(5.0, 25.0) != _covered_by_hand(merged, 5.0, 25.0)


def test_analyze_runs_without_the_cycle_collector_and_leaves_it_as_it_found_it(
        tmp_path, capsys, monkeypatch):
    """``analyze`` runs with Python's cycle collector off (its objects hold no cycles) and
    leaves it as it was, on or off, also when it fails."""
    import gc
    import os

    from commbench.cli import analyze
    from commbench.cli.main import main

    seen = []
    real = analyze.match_job
    monkeypatch.setattr(analyze, "match_job",
                        lambda *a: (seen.append(gc.isenabled()), real(*a))[1])
    dlrm = os.path.join(os.path.dirname(__file__), "data", "traces", "param", "dlrm_kineto")
    assert gc.isenabled()
    assert main(["analyze", dlrm]) == 0
    assert seen == [False] and gc.isenabled()
    assert main(["analyze", str(tmp_path)]) == 2  # a folder without traces: one line, exit 2
    assert gc.isenabled()
    gc.disable()
    try:
        assert main(["analyze", dlrm]) == 0
        assert not gc.isenabled()
    finally:
        gc.enable()
    capsys.readouterr()


def test_a_rank_s_trace_without_a_world_size_is_read_as_part_of_a_world_at_least_that_big(tmp_path):
    """distributedInfo with a rank and no world_size (HTA's trace_compare and trace_file_list
    traces are rank 1 so): the world holds at least the file's rank and its groups' ranks, and
    the output says it was not stated (before: 'ranks [1]: outside world_size 1', exit 2)."""
    from commbench.traces.report import markdown, record

    op = {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 10, "dur": 2,
          "args": {**GOOD, "Process Group Ranks": "[0, 1, 2]", "External id": 7}}
    doc = {"distributedInfo": {"rank": 1}, "traceEvents": [op]}
    (t,) = load([_write(tmp_path / "rank1.json", json.dumps(doc))], progress=False)
    assert (t.rank, t.world_size, t.world_stated) == (1, 3, False)
    text = markdown(record([t], match([t]), {}))
    assert "ranks 1 of at least 3 (no world_size in the traces)" in text
    doc["distributedInfo"]["world_size"] = 1  # a world that is stated is held to
    with pytest.raises(TraceError, match=r"ranks \[1\]: outside world_size 1"):
        load([_write(tmp_path / "stated_rank1.json", json.dumps(doc))], progress=False)
