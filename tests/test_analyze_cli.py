"""``commbench analyze`` and ``replay`` from the command line: NCCL's model and a committed
sweep beside each call, the topology guessed from the device names, the layout's comparison, a
replay's rows, and bad input (a recording that would hang too) in one line with exit 2."""

from __future__ import annotations

import json
import math
import os

import pytest
from command import commbench
from said import said
from trace_generator import Planned, generate

from commbench.cli.main import main
from commbench.costmodel.nccl import nccl_predict
from commbench.costmodel.topology import load as load_topology

pytestmark = pytest.mark.traces

RESULTS = os.path.join(os.path.dirname(__file__), "..", "results")
BASELINE = os.path.join(RESULTS, "collectives_amd-epyc-2c-gloo-x4.json")
PLAN = [Planned("allreduce", (0, 1, 2, 3), 1 << 20, "BFloat16", 200.0, (0, 30, 5, 12), 80.0),
        Planned("allreduce", (0, 8), 1 << 16, "Float", 40.0),
        Planned("_allgather_base", (0, 1, 2, 3, 4, 5, 6, 7), 4096, "Float", 50.0)]


def _run(tmp_path, *extra) -> tuple[int, dict]:
    generate(16, PLAN, str(tmp_path / "job"))
    out = tmp_path / "a.json"
    code = main(["analyze", str(tmp_path / "job"), "--json", str(out), *extra])
    return code, json.loads(out.read_text())


def test_nccl_s_model_and_the_committed_sweep_sit_beside_each_call(tmp_path, capsys):
    code, rec = _run(tmp_path, "--topology", "dgx-h100", "--nodes", "2", "--baseline", BASELINE)
    assert code == 0
    topo = load_topology("dgx-h100", 2)
    calls = {(c["op"], tuple(c["group"])): c for c in rec["calls"]}
    # 4 ranks on one node, a pair across two nodes (rank 8 is node 1's first), 8 on one node
    for (op, group), part in {("all_reduce", (0, 1, 2, 3)): topo.part(1, 4),
                              ("all_reduce", (0, 8)): topo.part(2, 1),
                              ("all_gather", tuple(range(8))): topo.part(1, 8)}.items():
        c = calls[(op, group)]
        want = nccl_predict(op, c["bytes"], part)
        assert c["model_us"] == pytest.approx(want.time_us)
        assert c["model_pick"] == f"{want.algo}/{want.proto}"
        assert c["efficiency"] == pytest.approx(want.time_us / c["time_us"])
    base = json.load(open(BASELINE))
    native = [r for r in base["rows"] if r["op"] == "all_reduce" and r["algo"] == "native"]
    for c in (calls[("all_reduce", (0, 1, 2, 3))], calls[("all_reduce", (0, 8))]):
        near = min(native, key=lambda r: abs(math.log2(r["size"]) - math.log2(c["bytes"])))
        assert (c["baseline_busbw"], c["baseline_size"]) == (near["busbw"], near["size"])
    text = capsys.readouterr().out
    assert "NCCL's model on dgx-h100 x2 node(s)" in text and "baseline busbw" in text
    assert "model(us)" in text


def test_a_job_without_model_or_baseline_shows_neither_column(capsys):
    dlrm = os.path.join(os.path.dirname(__file__), "data", "traces", "param", "dlrm_kineto")
    assert main(["analyze", dlrm]) == 0  # V100s: no preset, no --topology, no --baseline
    text = capsys.readouterr().out
    assert "# no model" in text and "model(us)" not in text and "baseline busbw" not in text
    assert main(["analyze", dlrm, "--topology", "dgx-a100"]) == 0
    assert "model(us)" in capsys.readouterr().out


def test_the_topology_comes_from_the_device_names_when_not_given(tmp_path, capsys):
    code, rec = _run(tmp_path)  # the generator's devices are H100s; 16 ranks: two nodes of 8
    assert code == 0 and rec["topology"] == "dgx-h100 x2 node(s)"
    assert all("model_us" in c for c in rec["calls"])


def test_the_worst_calls_come_first(tmp_path):
    _, rec = _run(tmp_path)
    exposed = [c["exposed_us"] for c in rec["calls"]]
    assert exposed == sorted(exposed, reverse=True) and exposed[0] == pytest.approx(200 + 30 - 80)


def test_a_layout_that_the_trace_does_not_follow_exits_1_with_its_differences(tmp_path, capsys):
    generate(2, [Planned("allreduce", (0, 1), 64, "Float", 10.0)], str(tmp_path / "job"))
    code = main(["analyze", str(tmp_path / "job"), "--layout",
                 "tp=2,sp,layers=1,hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,loss=none,"
                 "act-bytes=4,grad-bytes=4"])
    out = capsys.readouterr().out
    assert code == 1 and "difference(s) from the layout" in out and "missing" in out


@pytest.mark.parametrize("argv, says", [
    (["analyze", "nowhere.json"], "nowhere.json: no such file or folder"),
    (["analyze", "{job}", "--top", "-1"], "--top -1: must be >= 0"),
    (["analyze", "{job}", "--step", "1"], "--step 1: selects the steps --layout compares"),
    (["analyze", "{job}", "--layout", "tp=3"], "tp=3"),
    (["analyze", "{job}", "--topology", "nope"], "topology 'nope': no such preset"),
    (["analyze", "{job}", "--baseline", "{job}/rank0.pt.trace.json"], "not a commbench results"),
    (["analyze", "{job}", "--layout", "tp=2", "--step", "7"], "ProfilerStep# [1]"),
    (["analyze", "{job}", "--topology", "dgx-h100", "--nodes", "99999999999"],
     "--nodes 99999999999: a job of 2 rank(s) runs on 2 node(s) at most"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, says):
    generate(2, [Planned("allreduce", (0, 1), 64, "Float", 10.0)], str(tmp_path / "job"))
    argv = [a.replace("{job}", str(tmp_path / "job")) for a in argv]
    assert main(argv) == 2
    err = said(capsys)
    assert says in err and err.count("\n") == 1, err


@pytest.mark.parametrize("nodes, says", [
    ("1", "--nodes 1: 16 ranks do not fit on 1 node(s) of dgx-h100 (8 GPUs each)"),
    ("17", "--nodes 17: a job of 16 rank(s) runs on 16 node(s) at most"), ("2", ""), ("16", "")])
def test_nodes_the_ranks_cannot_fill_are_refused_before_a_model_is_priced(tmp_path, capsys,
                                                                          nodes, says):
    """Each side of both bounds: a job's 16 ranks on fewer GPUs than they are, and on more nodes
    than ranks (--nodes 99999999999 was priced as a topology of that many nodes)."""
    if says:
        generate(16, PLAN, str(tmp_path / "job"))
        assert main(["analyze", str(tmp_path / "job"), "--topology", "dgx-h100", "--nodes",
                     nodes]) == 2
        err = said(capsys)
        assert says in err and err.count("\n") == 1, err
    else:
        code, rec = _run(tmp_path, "--topology", "dgx-h100", "--nodes", nodes)
        assert code == 0 and rec["topology"] == f"dgx-h100 x{nodes} node(s)"


def test_steps_past_those_marked_are_refused_without_listing_them(tmp_path, capsys, monkeypatch):
    """--steps 99999999999 listed every step it names (out of memory) to find one unmarked; now
    more steps than the trace marks are refused as they are. The range built is watched: one
    longer than the marks (the old check) fails here, and never for lack of memory."""
    import builtins

    from commbench.cli import analyze

    made = []

    def watched(*args):
        made.append(len(builtins.range(*args)))
        if made[-1] > 100:
            raise AssertionError(f"a range of {made[-1]} steps listed")
        return builtins.range(*args)

    monkeypatch.setattr(analyze, "range", watched, raising=False)
    generate(2, [Planned("allreduce", (0, 1), 64, "Float", 10.0)], str(tmp_path / "job"))
    assert main(["analyze", str(tmp_path / "job"), "--layout", "tp=2", "--step", "1",
                 "--steps", "99999999999"]) == 2
    err = said(capsys)
    assert "--steps 99999999999: rank 0's trace has ProfilerStep# [1]" in err, err


@pytest.mark.local
def test_replay_from_the_command_line_writes_its_rows_and_exits_0(tmp_path):
    import subprocess

    generate(2, [Planned("allreduce", (0, 1), 256, "Float"),
                 Planned("send", (0, 1), 9, "Int")], str(tmp_path / "job"))
    out = subprocess.run(commbench("replay", str(tmp_path / "job"), "--np", "2", "--out",
                                   str(tmp_path), "--label", "t", "--iters", "2"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "every call booked as recorded" in out.stdout
    rec = json.loads((tmp_path / "replay_t-x2.json").read_text())
    assert [(r["op"], r["size"], r["n_samples"]) for r in rec["rows"]] == [
        ("all_reduce", 1024, 2), ("send->1", 36, 2), ("recv<-0", 36, 2)]
    assert rec["mismatches"] == []


@pytest.mark.local
def test_a_scaled_replay_from_the_command_line_plays_rank_0_s_small_groups(tmp_path):
    """An 8-rank job on 2 ranks: rank 0's pair's calls are played, its groups of 4 and 8 and the
    pair it is not in are not."""
    import subprocess

    generate(8, [Planned("allreduce", (0, 1), 256, "Float"),
                 Planned("_allgather_base", (0, 2, 4, 6), 64, "Float"),
                 Planned("allreduce", tuple(range(8)), 32, "Float"),
                 Planned("_reduce_scatter_base", (2, 3), 16, "Float"),
                 Planned("_reduce_scatter_base", (0, 1), 512, "Half")], str(tmp_path / "job"))
    argv = commbench("replay", str(tmp_path / "job"), "--np", "2",
                     "--out", str(tmp_path), "--label", "t", "--iters", "2")
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "--np 2: the recording has 8 ranks" in refused.stderr
    out = subprocess.run(argv + ["--scale"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rec = json.loads((tmp_path / "replay_t-x2.json").read_text())
    assert rec["scaled"] is True and rec["mismatches"] == []
    assert [(r["op"], r["size"]) for r in rec["rows"]] == [("all_reduce", 1024),
                                                           ("reduce_scatter", 1024)]


def _hanging(folder) -> str:
    generate(2, [Planned("allreduce", (0, 1), 256, "Float")], str(folder))
    doc = json.loads((folder / "rank1.pt.trace.json").read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("kernel", "cpu_op")]
    (folder / "rank1.pt.trace.json").write_text(json.dumps(doc))  # rank 1 never joins
    return str(folder)


@pytest.mark.parametrize("argv, says", [
    (["replay", "{job}", "--np", "3"], "--np 3: the recording has 2 ranks"),
    (["replay", "{job}", "--iters", "0"], "--iters 0 --warmup 1: must be 1 to 1048576"),
    (["replay", "{job}", "--iters", "99999999999"], "--iters 99999999999 --warmup 1: must be"),
    (["replay", "{hang}"], "rank 0 and rank 1 recorded different collectives"),
    (["replay", "{job}", "--np", "1", "--scale"], "--scale --np 1: keeps no call"),
])
def test_a_replay_that_cannot_run_is_refused_in_one_line_before_any_rank_starts(
        tmp_path, capsys, argv, says):
    generate(2, [Planned("allreduce", (0, 1), 256, "Float")], str(tmp_path / "job"))
    hang = _hanging(tmp_path / "hang")
    argv = [a.replace("{job}", str(tmp_path / "job")).replace("{hang}", hang) for a in argv]
    assert main(argv) == 2
    err = said(capsys)
    assert says in err and err.count("\n") == 1, err


def test_a_calibrated_topology_priced_at_other_node_counts_is_said_to_be(tmp_path, capsys):
    """A topology calibrated on 2-node logs (results/calibrated_hgx-h100-ndr.json) beside a
    job priced at 2 nodes says nothing more; at 4 it warns that its fitted figures are off
    there (docs/nccl-tests.md), in the record and on the screen."""
    calibrated = os.path.join(RESULTS, "calibrated_hgx-h100-ndr.json")
    assert json.load(open(calibrated))["calibration"]["nodes"] == [2]
    for nodes, warned in (("2", False), ("4", True)):
        code, rec = _run(tmp_path, "--topology", calibrated, "--nodes", nodes)
        assert code == 0
        note = rec.get("model_note", "")
        assert (f"was calibrated on runs of 2 node(s) and is priced here at {nodes}" in note) \
            is warned, note
        assert (f"priced here at {nodes}" in capsys.readouterr().out) is warned


def test_a_job_of_512_ranks_prints_what_a_reader_can_scan(tmp_path, capsys):
    """512 ranks, tensor-parallel groups of 8 and data-parallel ones of every 8th rank, three
    steps; rank 300 a straggler (its tensor-parallel calls start 40 us late). The ranks are one
    range, a strided group ``a-b:8``; the per-rank-step table, 1536 pairs, is summed up per step
    (median and worst rank) with the worst pairs after it, rank 300's first, while the JSON keeps
    every pair."""
    from commbench.rankset import ranks_text

    w = 512
    tp = [tuple(range(i, i + 8)) for i in range(0, w, 8)]
    dp = [tuple(range(j, w, 8)) for j in range(8)]
    plan = []
    for step in (1, 2, 3):
        for g in tp:
            skew = tuple(40.0 if r == 300 else 0.0 for r in g)
            plan.append(Planned("allreduce", g, 1 << 20, step=step, skew_us=skew))
        plan += [Planned("_reduce_scatter_base", g, 1 << 22, step=step) for g in dp]
    generate(w, plan, str(tmp_path / "job"))
    assert main(["analyze", str(tmp_path / "job"), "--json", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# commbench analyze: 512 trace(s), ranks 0-511 of 512,")
    assert "| 0-504:8 " in out and "| 296-303 " in out
    assert "1536 (rank, step) pairs (every one in the JSON): per step across its ranks" in out
    summary = out.split("per step across its ranks")[1].split("and the 20 pairs")[0]
    assert summary.count("(rank ") == 9  # three steps, three worst-rank columns each
    # rank 300 starts last: its seven peers wait for it, their kernels 40 us longer
    waiting = {296, 297, 298, 299, 301, 302, 303}
    table = out.split("and the 20 pairs of most exposed time:")[1].splitlines()[4:24]
    assert {int(line.split("|")[1]) for line in table} <= waiting and len(table) == 20
    most = [int(x.split(")")[0]) for x in summary.split("(rank ")[1:]]
    assert set(most[1::3]) <= waiting  # each step's most exposed rank
    rec = json.loads((tmp_path / "a.json").read_text())
    assert len(rec["steps"]) == 1536
    assert {s["rank"] for s in rec["steps"] if s["exposed_us"] > min(
        x["exposed_us"] for x in rec["steps"])} == waiting
    assert ranks_text([0, 2, 4]) == "0,2,4" and ranks_text(range(3, 64, 4)) == "3-63:4"
    assert ranks_text([0, 1, 2, 3, 8, 9, 10, 11]) == "0-3,8-11"
    assert ranks_text([r for r in range(5, 512, 8) if r != 301]) == "5-509:8 less 301"
    assert ranks_text([r for r in range(0, 64, 8) if r not in (8, 16, 24)]) == "0,32,40,48,56"


@pytest.mark.parametrize("command, path, reader", [
    ("analyze", "nccl_tests/cscs_gh200_2x1_all_reduce.log", "commbench import reads it"),
    ("import", "flight/hang/nccl_trace_rank_0", "flight recorder dump: commbench analyze"),
    ("import", "flight/desync/nccl_trace_rank_0.json", "flight recorder dump: commbench analyze"),
    ("import", "traces/hta/gloo_cpu_only_rank34.json.gz", "profiler (Kineto) trace: commbench "
     "analyze"),
    ("import", "traces/param/resnet_2gpu_et_1.1.0.json.gz", "execution trace: commbench replay"),
    ("import", "joblogs/nccl_1405_ib_completion_warn_excerpt.log", "job's log (torch's NCCL "
     "watchdog, NCCL's warnings): commbench analyze"),
    ("calibrate", "joblogs/ofa_271_v100_old_format_excerpt.log", "commbench analyze reads it")])
def test_a_file_given_to_the_wrong_command_is_refused_with_the_one_that_reads_it(
        tmp_path, capsys, command, path, reader):
    """Real files of each kind given to a command that does not read them: refused in one line
    (exit 2) that names the command that does."""
    data = os.path.join(os.path.dirname(__file__), "data", path)
    args = [command, data] + (["--out", str(tmp_path)] if command == "import" else []) + \
        (["--topology", "dgx-h100", "--json", str(tmp_path / "c.json")]
         if command == "calibrate" else [])
    assert main(args) == 2
    assert reader in said(capsys)


def test_a_file_of_no_kind_commbench_reads_gets_no_hint(tmp_path):
    from commbench.cli.sniff import hint, reader_of

    readme = os.path.join(os.path.dirname(__file__), "..", "README.md")
    assert reader_of(readme) == ("", "") and hint([readme], "commbench import") == ""
    (tmp_path / "x.json").write_text('{"rows": []}')
    assert reader_of(str(tmp_path / "x.json")) == ("", "")
