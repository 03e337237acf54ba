"""A failed job's own log (commbench/traces/joblog.py): real excerpts of torch's NCCL watchdog
lines, NCCL's warnings and torchrun's failure report as public issues quote them
(tests/data/joblogs/README.md), each call checked against the lines read here apart, by plain
string splitting; and logs written here for what no public excerpt shows (a rank behind, a
desync, an NCCL error, one log a rank)."""

from __future__ import annotations

import gzip
import json
import os
import re

import pytest
from said import said

from commbench.cli.main import main
from commbench.traces import joblog, joblog_findings
from commbench.traces.calls import TraceError

pytestmark = pytest.mark.traces

DATA = os.path.join(os.path.dirname(__file__), "data", "joblogs")
LOGS = sorted(f for f in os.listdir(DATA) if f.endswith(".log"))


def _path(name: str) -> str:
    return os.path.join(DATA, name)


def _apart(path: str) -> dict[tuple, dict]:
    """Every distinct timeout of the log, read by splitting strings: (job rank or None, group
    rank, SeqNum, OpType) -> its fields."""
    out = {}
    with open(path, encoding="utf-8") as f:  # a line wrapped after "timeout: " joined back
        for line in f.read().replace("operation timeout: \n", "operation timeout: ").splitlines():
            if "Watchdog caught collective operation timeout" not in line:
                continue
            head, _, work = line.partition("WorkNCCL(")
            fields = dict(kv.split("=", 1) for kv in work.split(") ran for")[0].split(", "))
            job = int(head.split("[rank")[1].split("]")[0]) if "[rank" in head else None
            group_rank = int(head.rsplit("[Rank ", 1)[1].split("]")[0])
            out[(job, group_rank, int(fields["SeqNum"]), fields["OpType"])] = fields
    return out


def _record(path: str, tmp_path, capsys, *extra: str) -> tuple[int, dict, str]:
    out = tmp_path / "log.json"
    code = main(["analyze", path, "--json", str(out), *extra])
    return code, json.loads(out.read_text()), capsys.readouterr().out


def _check(name: str, tmp_path, capsys) -> dict:
    """The log's record against its lines read apart: every timeout is in one call row, with
    its place, collective, sizes and timeout, under the job's rank where the line says it."""
    code, rec, _ = _record(_path(name), tmp_path, capsys)
    apart = _apart(_path(name))
    assert code == (1 if apart or rec["findings"] else 0)
    got = {}
    for row in rec["calls"]:
        for r in row["timed_out"]:
            got.setdefault((r, row["seq"]), row)
    for (job, group_rank, seq, op), fields in apart.items():
        row = got[(job if job is not None else group_rank, seq)]
        assert row["job_ranks"] == (job is not None)
        assert op in row["op"].split("/")
        assert row["timeout_s"] == int(fields["Timeout(ms)"]) / 1000
        if "NumelIn" in fields:
            assert int(fields["NumelIn"]) in row["numel_in"]
            assert int(fields["NumelOut"]) in row["numel_out"]
    assert sum(len(r["timed_out"]) for r in rec["calls"]) == len(apart)
    return rec


@pytest.mark.parametrize("name", LOGS)
def test_every_public_excerpt_reads_with_each_timeout_as_its_line_says(name, tmp_path, capsys):
    _check(name, tmp_path, capsys)


@pytest.mark.parametrize("broken", ["_RANK", "_TIMEOUT"])
def test_the_check_catches_a_reader_that_loses_the_rank_or_the_timeout(broken, tmp_path, capsys,
                                                                       monkeypatch):
    """The check above, against a reader that reads no job rank, or no timeout line: caught."""
    monkeypatch.setattr(joblog, broken, re.compile(r"(?!x)x"))
    with pytest.raises((AssertionError, KeyError)):
        _check("llamafactory_6269_reduce_scatter_timeout_excerpt.log", tmp_path, capsys)


def test_a_message_a_logger_wrapped_onto_two_lines_is_read_whole(tmp_path, capsys):
    """mila-iqia/milabench#269: a logger's host prefix, and each timeout line wrapped after
    "timeout: ", the progress line after "detected": REDUCE #2070 timed out on ranks 11, 12, 14
    and 15 of the default group (rank 12's progress line names it), as one line each would say.
    Read line by line without joining, none of the five messages is found."""
    code, rec, _ = _record(_path("milabench_269_wrapped_excerpt.log"), tmp_path, capsys)
    (row,) = rec["calls"]
    assert (row["group"], row["seq"], row["op"], row["ranks"]) == ("0", 2070, "REDUCE",
                                                                   [11, 12, 14, 15])
    assert (row["enqueued"], row["completed"]) == ([2070, 2070], [2069, 2069]) and code == 1


def test_a_paste_wrapped_after_its_prefix_and_inside_its_message_is_read_whole(tmp_path,
                                                                            capsys, monkeypatch):
    """A note's paste: the prefix alone on a line, the message over three more. Joined, it is
    rank 1's timeout; a reader that does not join reads nothing; a fifth line is past what is
    joined, and a rank's own line after a cut message is not taken into it."""
    lines = ["[rank1]:[E1114 09:50:59.789610635 ProcessGroupNCCL.cpp:683] ",
             "[Rank 1] Watchdog caught collective operation timeout: ",
             "WorkNCCL(SeqNum=1, OpType=ALLGATHER, NumelIn=1, NumelOut=2, Timeout(ms)=600000) ",
             "ran for 600067 milliseconds before timing out."]
    log = tmp_path / "note.log"
    log.write_text("\n".join(lines) + "\n")
    got = joblog.read([str(log)], 1 << 20)
    assert [(t.rank, t.seq, t.op) for t in got.timeouts] == [(1, 1, "ALLGATHER")]
    wide = tmp_path / "wide.log"  # the same over five lines: more than is joined
    wide.write_text("\n".join([*lines[:3], "ran for 600067", "milliseconds before timing out."])
                    + "\n")
    assert _timeouts_of(wide) == []
    cut = tmp_path / "cut.log"  # a cut message, then a rank's whole line: that line stands
    cut.write_text(lines[1] + "\n[rank2]:[E1114 09:50:59.7 ProcessGroupNCCL.cpp:607] [Rank 2] "
                   "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, "
                   "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600001 milliseconds before "
                   "timing out.\n")
    assert [(t.rank, t.seq) for t in _timeouts_of(cut)] == [(2, 3)]
    monkeypatch.setattr(joblog, "_wrapped", lambda line: False)
    with pytest.raises(TraceError):
        joblog.read([str(log)], 1 << 20)


def _timeouts_of(path) -> list:
    try:
        return joblog.read([str(path)], 1 << 20).timeouts
    except TraceError:  # no line it reads
        return []


def test_a_call_every_reporter_issued_names_the_members_that_said_nothing(tmp_path, capsys):
    """LlamaFactory#6269: ranks 0, 2, 3, 4 and 6 of group 1 report _REDUCE_SCATTER_BASE #7753,
    issued (last enqueued 7755) and not completed (7752). The group's 8 members are its input
    over its output (544997376 / 68124672); ranks 1, 5 and 7 said nothing in the excerpt."""
    code, rec, out = _record(_path("llamafactory_6269_reduce_scatter_timeout_excerpt.log"),
                             tmp_path, capsys)
    assert code == 1
    (row,) = rec["calls"]
    assert (row["group"], row["seq"], row["op"], row["group_size"]) == \
        ("1", 7753, "_REDUCE_SCATTER_BASE", 544997376 // 68124672)
    assert row["ranks"] == [0, 2, 3, 4, 6] and row["job_ranks"]
    assert (row["enqueued"], row["completed"]) == ([7755, 7755], [7752, 7752])
    assert rec["findings"] == ["group 1: _REDUCE_SCATTER_BASE #7753 timed out after 600 s on "
                               "ranks [0, 2, 3, 4, 6]"]
    assert any("of its 8 members, group rank(s) 1,5,7 said nothing here" in n
               for n in rec["notes"])
    assert "1 timeout line(s) of ranks that printed no line naming their group" in out  # rank 3


def test_two_groups_of_one_id_are_told_apart_by_their_guid(tmp_path, capsys):
    """NVIDIA/nccl#1610: ranks 13 and 15 both say PG ID 11, of groups GUID 119 and 112. Rank
    15's timeout line says group rank 1 and its progress line group rank 0: not joined."""
    code, rec, _ = _record(_path("nccl_1610_alltoall_two_groups_excerpt.log"), tmp_path, capsys)
    rows = {(r["group"], r["seq"]): r for r in rec["calls"]}
    assert set(rows) == {("119", 216), ("112", 57), ("?", 57)}
    assert rows[("119", 216)]["op"] == "ALLTOALL_BASE" and rows[("119", 216)]["ranks"] == [13]
    assert rows[("112", 57)]["op"] == "?" and rows[("112", 57)]["timed_out"] == []
    assert rows[("?", 57)]["op"] == "ALLREDUCE" and rows[("?", 57)]["ranks"] == [15]
    assert code == 1


def test_sizes_that_differ_in_a_coalesced_call_are_a_note(tmp_path, capsys):
    """modelscope/DiffSynth-Studio#458: COALESCED #610 with NumelIn 56320 on rank 4 and 76800
    on rank 6 (a coalesced batch may differ by rank): a note, not a desync."""
    _, rec, _ = _record(_path("diffsynth_458_coalesced_excerpt.log"), tmp_path, capsys)
    (row,) = rec["calls"]
    assert row["numel_in"] == [56320, 76800] and row["group"] == "9"
    assert not any("different sizes" in f for f in rec["findings"])
    assert any("sizes differ by rank" in n and "COALESCED" in n for n in rec["notes"])


def test_old_lines_name_no_group_and_their_calls_are_not_set_against_each_other(tmp_path,
                                                                                  capsys):
    """pytorch/pytorch#118369 (an older torch): rank 0 times out at three places, one line
    twice, rank 7 at a fourth; no line names a group."""
    _, rec, _ = _record(_path("pytorch_118369_old_format_groups_excerpt.log"), tmp_path, capsys)
    assert sorted((r["seq"], tuple(r["ranks"])) for r in rec["calls"]) == \
        [(64088, (7,)), (96117, (0,)), (96120, (0,)), (96125, (0,))]
    assert all(r["group"] == "?" and not r["job_ranks"] for r in rec["calls"])
    assert not any("different numbers" in f for f in rec["findings"])
    assert any("may be different groups' calls" in n for n in rec["notes"])


def test_a_stuck_watchdog_nccl_warnings_and_torchrun_s_root_cause(tmp_path, capsys):
    """snowflakedb/ArcticTraining#219: rank 7's watchdog stuck 480 s; NVIDIA/nccl#1405: three
    IB completion errors on one host; NVIDIA/nccl#1439: torchrun's root cause, rank 1 SIGABRT
    (no finding: the first rank to exit is not the one to blame)."""
    _, rec, _ = _record(_path("arctictraining_219_watchdog_stuck_excerpt.log"), tmp_path, capsys)
    assert any(f.startswith("group 0: the watchdog of rank 7 got stuck for 480 s")
               for f in rec["findings"])
    code, rec, _ = _record(_path("nccl_1405_ib_completion_warn_excerpt.log"), tmp_path, capsys)
    assert code == 1 and len(rec["nccl_warnings"]) == 2  # opcode 0, and 32616 twice (peers aside)
    assert all(h == ["kp-ddp-worker-0"] and "status=12" in m and "10.216" not in m
               for m, h in rec["nccl_warnings"].items())
    code, rec, _ = _record(_path("nccl_1439_torchrun_root_cause_excerpt.log"), tmp_path, capsys)
    assert code == 0 and rec["findings"] == []
    assert rec["root_cause"]["rank"] == "1 (local_rank: 1)"
    assert rec["root_cause"]["exitcode"] == "-6 (pid: 886322)"


def _line(rank: int, seq: int, op: str = "ALLREDUCE", n: int = 1024, group: str = "0",
          enq: int | None = None, done: int | None = None, out: int | None = None) -> str:
    """A timeout and its progress line as torch 2.6 prints them (ProcessGroupNCCL.cpp)."""
    enq, done, out = seq if enq is None else enq, seq - 1 if done is None else done, \
        n if out is None else out
    stamp = f"[rank{rank}]:[E1205 07:20:28.123456789 ProcessGroupNCCL.cpp:632]"
    return (f"{stamp} [Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL("
            f"SeqNum={seq}, OpType={op}, NumelIn={n}, NumelOut={out}, Timeout(ms)=600000) ran for "
            f"600012 milliseconds before timing out.\n"
            f"{stamp} [PG ID 0 PG GUID {group}(default_pg) Rank {rank}] Exception (either an error"
            f" or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {enq}, "
            f"last completed NCCL work: {done}.\n")


def _write(tmp_path, text: str, name: str = "job.log") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_a_rank_whose_last_enqueued_is_before_the_call_never_issued_it(tmp_path, capsys):
    """Ranks 0, 1 and 3 wait in #12; rank 2 timed out in #11 and had enqueued nothing after."""
    log = _write(tmp_path, "".join(_line(r, 12) for r in (0, 1, 3)) + _line(2, 11))
    code, rec, _ = _record(log, tmp_path, capsys)
    assert code == 1
    assert "group 0 (default_pg): rank 2 last issued #11; ranks [0, 1, 3] failed in #12: never " \
        "issued it" in rec["findings"]


def test_different_collectives_or_sizes_at_one_place_of_a_named_group_are_a_desync(tmp_path,
                                                                                   capsys):
    log = _write(tmp_path, _line(0, 5) + _line(1, 5, op="BROADCAST"))
    _, rec, _ = _record(log, tmp_path, capsys)
    assert any("the ranks issued different collectives at the same place (a desync): rank 0: "
               "ALLREDUCE; rank 1: BROADCAST" in f for f in rec["findings"])
    log = _write(tmp_path, _line(0, 5) + _line(1, 5, n=2048), "sizes.log")
    _, rec, _ = _record(log, tmp_path, capsys)
    assert any("the ranks give ALLREDUCE different sizes: rank 0: NumelIn=1024 NumelOut=1024; "
               "rank 1: NumelIn=2048 NumelOut=2048" in f for f in rec["findings"])


def test_one_log_a_rank_gzipped_or_not_and_the_world_names_the_silent_ranks(tmp_path, capsys):
    """srun --output=%t: a folder of one log a rank; ranks 0-2 of 8 report; --world 8 names
    ranks 3-7 of the default group as silent."""
    folder = tmp_path / "logs"
    folder.mkdir()
    for r in range(3):
        data = _line(r, 40, enq=41).encode()
        if r == 1:
            (folder / f"{r}.log.gz").write_bytes(gzip.compress(data))
        else:
            (folder / f"{r}.log").write_bytes(data)
    code, rec, _ = _record(str(folder), tmp_path, capsys, "--world", "8")
    assert code == 1 and rec["calls"][0]["ranks"] == [0, 1, 2]
    assert any("of its 8 members, group rank(s) 3-7 said nothing here" in n for n in rec["notes"])


def test_an_nccl_error_and_a_blocking_wait_line_are_read(tmp_path, capsys):
    log = _write(tmp_path, (
        "[rank1]:[E1205 07:20:28.1 ProcessGroupNCCL.cpp:756] [Rank 1] Work WorkNCCL(SeqNum=3, "
        "OpType=ALLGATHER, NumelIn=8, NumelOut=16, Timeout(ms)=60000) timed out in blocking "
        "wait.\n"
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:317, remote process exited or there was a network error, NCCL version "
        "2.21.5\n"))
    code, rec, _ = _record(log, tmp_path, capsys)
    assert code == 1
    assert rec["calls"][0]["seq"] == 3 and rec["calls"][0]["group_size"] == 2
    assert "NCCL error (1 line(s)): remote process exited or there was a network error" in \
        rec["findings"]


def test_a_text_with_no_such_line_and_flags_of_traces_are_refused(tmp_path, capsys):
    text = _write(tmp_path, "epoch 1 loss 2.3\nepoch 2 loss 2.1\n")
    assert main(["analyze", text]) == 2
    assert "no line of torch's NCCL watchdog" in said(capsys)
    log = _write(tmp_path, _line(0, 1), "ok.log")
    assert main(["analyze", log, "--layout", "dp=2"]) == 2
    assert "--layout: a job's log holds what failed" in said(capsys)


def test_a_json_array_and_a_benchmark_s_log_are_not_taken_for_a_job_s_log(tmp_path):
    assert not joblog.is_job_log(_write(tmp_path, '[{"a": 1}]', "a.json"))
    assert joblog.is_job_log(_write(tmp_path, _line(0, 1), "b.log"))
    assert joblog.is_job_log(_write(tmp_path, "\n" * (joblog.SNIFF + 5) + _line(0, 1), "c.log"))
    assert not joblog.is_job_log(_write(tmp_path, "", "empty.log"))
    bench = os.path.join(os.path.dirname(__file__), "data", "nccl_tests",
                         "cscs_gh200_2x4_all_reduce.log")
    assert joblog.is_job_log(bench)  # text; analyze leaves it to import (sniff.reader_of)


def test_every_optype_the_installed_torch_names_is_on_a_collective_s_record():
    """The records' ``work`` names against torch's own OpType enum: all but the ones no single
    collective is (a coalesced batch of any, a sparse all-reduce, unknown)."""
    OpType = pytest.importorskip("torch._C._distributed_c10d").OpType
    names = {n for n in OpType.__members__}
    assert set(joblog_findings.WORK) == names - {"COALESCED", "_ALLREDUCE_SPARSE", "UNKNOWN"}
    assert "ALLTOALL_BASE" not in joblog_findings.SAME_SIZE and "GATHER" not in joblog_findings.SAME_SIZE


def test_a_repeat_without_the_job_s_rank_counts_once(tmp_path, capsys):
    """The watchdog's exception, printed again by ``terminate ... what():`` without the job's
    rank (as sgl-project/sglang#1693 quotes it), is the prefixed line's event, not a second."""
    line = _line(5, 9141, op="_ALLGATHER_BASE", n=19008, out=152064, group="3")
    what = ("  what():  [PG 3 Rank 5] Process group watchdog thread terminated with exception: "
            + line.split("] ", 1)[1].split("\n")[0] + "\n")
    code, rec, out = _record(_write(tmp_path, line + what), tmp_path, capsys)
    assert "2 watchdog timeout line(s)" in out
    (row,) = rec["calls"]
    assert row["timed_out"] == [5] and row["job_ranks"] and row["group_size"] == 8
    assert code == 1 and not any("inferred" in n or "put in" in n for n in rec["notes"])


def test_a_send_and_its_receive_at_one_place_are_no_desync_and_not_set_against_collectives(
        tmp_path, capsys):
    """A pipeline's hang: rank 0 in SEND, rank 1 in RECV of one group; torch numbers
    point-to-point calls apart from collectives, so rank 2's ALLREDUCE #40 of the same group is
    not read as the others being behind."""
    log = _write(tmp_path, _line(0, 7, op="SEND", enq=7) + _line(1, 7, op="RECV", enq=7)
                 + _line(2, 40, enq=40))
    _, rec, _ = _record(log, tmp_path, capsys)
    assert not any("desync" in f or "never issued" in f or "different calls" in f
                   for f in rec["findings"])
    assert any("point-to-point calls (a send meets its receive), not a desync" in n
               for n in rec["notes"])
    assert any("point-to-point calls (#7) are numbered apart" in n for n in rec["notes"])


def test_a_512_rank_job_s_log_reads_in_lines_a_reader_can_scan(tmp_path, capsys):
    """64 nodes x 8: eight data-parallel groups of 64 (every 8th rank) time out in one
    reduce-scatter; rank 301 (group dp5's rank 37) said nothing; 300 IB errors from 64 hosts,
    each with its own peer, port and GIDs, are one kind of warning."""
    text = []
    for r in range(512):
        if r != 301:
            text.append(_line(r, 500, op="_REDUCE_SCATTER_BASE", n=64 * 4096, out=4096,
                              group=f"dp{r % 8}").replace(f"[Rank {r}]", f"[Rank {r // 8}]")
                        .replace(f" Rank {r}]", f" Rank {r // 8}]"))
    for i in range(300):
        text.append(f"gpu{i % 64:02d}:1234:5678 [{i % 8}] transport/net_ib.cc:1696 NCCL WARN "
                    f"NET/IB : Got completion from peer 10.0.{i % 64}.{i % 8}<{40000 + i}> with "
                    "status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0."
                    f"{i % 200} remoteGids::ffff:10.0.1.{i % 100}\n")
    code, rec, out = _record(_write(tmp_path, "".join(text)), tmp_path, capsys)
    assert code == 1 and len(rec["calls"]) == 8 and len(out.splitlines()) < 40
    assert re.search(r"\|\s*5-509:8 less 301\s*\|", out)
    assert len(rec["nccl_warnings"]) == 1 and len(next(iter(rec["nccl_warnings"].values()))) == 64
    assert any(n.startswith("group dp5 ") and "of its 64 members, group rank(s) 37 said nothing"
               in n for n in rec["notes"])


@pytest.mark.parametrize("name, code, result", [
    ("nccl_1405_ib_completion_warn_excerpt.log", 6, "ncclRemoteError"),
    ("nccl_1610_alltoall_two_groups_excerpt.log", 3, "ncclInternalError")])
def test_nccl_s_error_path_is_named_by_its_code(name, code, result, tmp_path, capsys):
    """NCCL prints 'file:line -> code' in each function an error passes through (its
    ncclResult_t: 6 a remote error, 3 an internal one); counted here by string splitting."""
    with open(_path(name), encoding="utf-8") as f:
        lines = [x for x in f if " NCCL INFO " in x and " -> " in x
                 and x.split(" -> ")[1].split()[0] == str(code)]  # "[Progress Thread]" may follow
    first = lines[0].split(" NCCL INFO ")[1].split(" -> ")[0]
    _, rec, _ = _record(_path(name), tmp_path, capsys)
    (path,) = rec["nccl_error_path"]
    assert (path["code"], path["lines"], path["first"]) == (code, len(lines), first)
    assert any(f"{result} ({code}) on {path['host']} from {first}" in n for n in rec["notes"])


def _signals_apart(path: str) -> set[tuple]:
    """(job rank, source or None, enqueued, completed) of each dump-signal line, by splitting."""
    out = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            if "Received a dump signal" not in line:
                continue
            rank = int(line.split("[rank")[1].split("]")[0])
            src = line.split(" from ", 1)[1].split(" and we ")[0].strip()
            enq = int(line.split("Last enqueued NCCL work: ")[1].split(",")[0])
            done = int(line.split("last completed NCCL work: ")[1].split(".")[0])
            out.add((rank, None if src == "this local rank" else int(src.split()[1]), enq, done))
    return out


@pytest.mark.parametrize("name", ["simple_grpo_46_dump_signal_excerpt.log",
                                  "openrlhf_1126_dump_signal_excerpt.log",
                                  "ms_swift_6301_dump_signal_local_excerpt.log",
                                  "vllm_omni_2928_dump_signal_other_group_excerpt.log"])
def test_the_ranks_told_of_a_timeout_read_as_their_lines_say(name, tmp_path, capsys):
    code, rec, _ = _record(_path(name), tmp_path, capsys)
    apart = _signals_apart(_path(name))
    assert {(s["rank"], s["source"], s["enqueued"], s["completed"])
            for s in rec["signals"]} == apart
    assert code == 1
    timed = {r for row in rec["calls"] for r in row["timed_out"]}
    for detector in {rank if src is None else src for rank, src, _, _ in apart} - timed:
        assert any(f.startswith(f"a collective timed out on rank {detector} (torch's dump signal")
                   for f in rec["findings"])


def test_what_the_told_ranks_had_in_flight_places_the_timeout(tmp_path, capsys):
    """simple_GRPO#46: rank 5, told by rank 2, had completed all it issued (#136);
    vllm-omni#2928: rank 1 detected a timeout with nothing of group 0 in flight, so the call
    was another group's; OpenRLHF#1126: newer torch's progress line ('failure detected by
    watchdog at work sequence id'), and rank 2 in the same call; ms-swift#6301: 13 calls in
    flight on the detecting rank."""
    _, rec, _ = _record(_path("simple_grpo_46_dump_signal_excerpt.log"), tmp_path, capsys)
    assert any("rank 5 had no call of this group in flight (last #136 completed) when rank 2 "
               "signalled its timeout" in n for n in rec["notes"])
    _, rec, _ = _record(_path("vllm_omni_2928_dump_signal_other_group_excerpt.log"), tmp_path,
                        capsys)
    assert any("rank 1 detected a timeout itself" in n and "another group's" in n
               for n in rec["notes"])
    assert any("rank 0 had no call of this group in flight either" in n for n in rec["notes"])
    _, rec, _ = _record(_path("openrlhf_1126_dump_signal_excerpt.log"), tmp_path, capsys)
    (row,) = rec["calls"]
    assert (row["seq"], row["enqueued"], row["completed"]) == (460631, [460631] * 2, [460630] * 2)
    assert any("rank 2 had #460631 in flight when rank 6 signalled" in n for n in rec["notes"])
    _, rec, _ = _record(_path("ms_swift_6301_dump_signal_local_excerpt.log"), tmp_path, capsys)
    assert any("rank 2 had #79197-#79209 in flight when it detected the timeout" in n
               for n in rec["notes"])


def test_a_told_rank_with_nothing_in_flight_before_the_failed_call_never_issued_it(tmp_path,
                                                                                  capsys):
    signal = ("[rank5]:[E723 01:58:45.6 ProcessGroupNCCL.cpp:1743] [PG ID 0 PG GUID 0(default_pg) "
              "Rank 5] Received a dump signal due to a collective timeout from  rank 2 and we will "
              "try our best to dump the debug info. Last enqueued NCCL work: 136, last completed "
              "NCCL work: 136.\n")
    _, rec, _ = _record(_write(tmp_path, _line(2, 137) + signal), tmp_path, capsys)
    assert "group 0 (default_pg): rank 5 last issued #136 and completed it; rank 2 failed in " \
        "#137: rank 5 never issued it" in rec["findings"]


def _prints_apart(path: str) -> list[list[tuple]]:
    """Each fingerprint mismatch line's two (group rank, OpType, TensorShape or None), by
    splitting."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if "Detected mismatch between collectives" not in line:
                continue
            pair = []
            for part in line.split(" is running ")[1:]:
                rank = int(line.split(" is running ")[0 if not pair else 1].rsplit("Rank ", 1)[1])
                fp = part.split("CollectiveFingerPrint(", 1)[1]
                op = fp.split("OpType=")[1].split(",")[0].split(")")[0]
                shape = fp.split("TensorShape=[")[1].split("]")[0] if "TensorShape=" in fp \
                    else None
                pair.append((rank, op, shape))
            out.append(pair)
    return out


@pytest.mark.parametrize("name", ["speechbrain_2401_fingerprint_mismatch_excerpt.log",
                                  "ms_swift_9443_fingerprint_sizes_excerpt.log",
                                  "simpletuner_2712_fingerprint_short_excerpt.log"])
def test_torch_s_own_collective_check_is_a_desync_as_its_line_says(name, tmp_path, capsys):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL's report of two ranks' fingerprints: speechbrain#2401 an
    all-reduce against a broadcast at one place, ms-swift#9443 one all-reduce of two sizes,
    SimpleTuner#2712 a rank's short fingerprint (no place to trust: no "different places")."""
    code, rec, _ = _record(_path(name), tmp_path, capsys)
    apart = _prints_apart(_path(name))
    assert code == 1 and len(apart) == len(rec["mismatches"]) == 1
    got = [(c["group_rank"], c["op"], c["shape"]) for c in rec["mismatches"][0]]
    assert got == apart[0]
    (finding,) = rec["findings"]
    assert finding.startswith("torch's collective check (TORCH_DISTRIBUTED_DEBUG=DETAIL) found a "
                              f"desync: group rank {got[0][0]} issued {got[0][1]}")
    assert ("different places" in finding) is False


def test_two_whole_fingerprints_at_different_places_say_so(tmp_path, capsys):
    fp = ("CollectiveFingerPrint(SequenceNumber={}, OpType=ALLREDUCE, TensorShape=[8], "
          "TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), "
          "device=cuda))")
    line = ("[rank3]: RuntimeError: Detected mismatch between collectives on ranks. Rank 3 is "
            f"running collective: {fp.format(41)}, but Rank 0 is running collective: "
            f"{fp.format(40)}.\n")
    _, rec, _ = _record(_write(tmp_path, line * 2), tmp_path, capsys)
    assert rec["findings"] == [
        "torch's collective check (TORCH_DISTRIBUTED_DEBUG=DETAIL) found a desync: group rank 3 "
        "issued ALLREDUCE #41 [8] Float where group rank 0 issued ALLREDUCE #40 [8] Float "
        "(different places: they issued different numbers of the group's collectives)"]


def test_markdown_keeps_the_report_of_a_log_and_of_dumps_as_printed(tmp_path, capsys):
    """--markdown FILE writes what was printed (it had been left unwritten for logs and dumps)."""
    for source in (_path("basicsr_737_default_pg_excerpt.log"),
                   os.path.join(os.path.dirname(__file__), "data", "flight", "hang")):
        md = tmp_path / "r.md"
        main(["analyze", source, "--markdown", str(md)])
        printed = [x for x in capsys.readouterr().out.splitlines() if not x.startswith("# wrote")]
        assert md.read_text().splitlines() == printed and len(printed) > 3
    assert main(["analyze", _path("basicsr_737_default_pg_excerpt.log"), "--markdown",
                 str(tmp_path)]) == 2  # a folder: refused before anything is read
    err = said(capsys)
    assert "--markdown" in err and "is a folder" in err


@pytest.mark.parametrize("name", ["ms_swift_6301_dump_signal_local_excerpt.log",
                                  "openrlhf_1126_dump_signal_excerpt.log"])
def test_ranks_that_began_a_flight_recorder_dump_point_to_the_dumps(name, tmp_path, capsys):
    with open(_path(name), encoding="utf-8") as f:
        apart = sorted({int(x.split("[rank")[1].split("]")[0]) for x in f
                        if "preparing to dump debug info" in x})
    _, rec, out = _record(_path(name), tmp_path, capsys)
    assert rec["dumping"] == apart and apart
    assert f"{len(apart)} flight recorder dump(s) begun" in out
    assert any(("set out to dump their flight recorder buffers" if len(apart) > 1 else
                "set out to dump its flight recorder buffers") in n and "commbench analyze" in n
               for n in rec["notes"])


def test_a_torchrun_log_dir_reads_its_last_attempt_and_says_which_it_left(tmp_path, capsys):
    """torchrun --log-dir: <run>/attempt_<n>/<local rank>/stderr.log (empty stdout.log and an
    error.json beside); a restarted job's earlier attempt is left out and named."""
    run = tmp_path / "logs" / "job_abc"
    for attempt, ranks in ((0, (0, 1)), (1, (0, 1, 2))):
        for r in ranks:
            d = run / f"attempt_{attempt}" / str(r)
            d.mkdir(parents=True)
            (d / "stderr.log").write_text(_line(r, 5 + attempt * 100))
            (d / "stdout.log").write_text("")
    (run / "attempt_1" / "0" / "error.json").write_text('{"message": "x"}')
    code, rec, out = _record(str(tmp_path / "logs"), tmp_path, capsys)
    assert code == 1 and [(r["seq"], r["ranks"]) for r in rec["calls"]] == [(105, [0, 1, 2])]
    assert "1 earlier attempt(s) left out (attempt_0)" in out
    assert "(0/stderr.log, 1/stderr.log, 2/stderr.log; 6 lines)" in out.splitlines()[0]
    trace = tmp_path / "mixed"
    trace.mkdir()
    (trace / "a.log").write_text(_line(0, 1))
    (trace / "rank0.json").write_text('{"traceEvents": []}')
    assert joblog.files_of([str(trace)]) is None  # a folder holding a trace is no folder of logs


@pytest.mark.launcher
@pytest.mark.local
def test_the_installed_torchrun_s_log_dir_is_read(tmp_path):
    """A real torchrun --log-dir tree, each rank writing a line of the watchdog's form to its
    stderr (gloo has no watchdog: the lines are the script's, the tree is torchrun's)."""
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(
        "import os, sys\n"
        "r = int(os.environ['RANK'])\n"
        "print(f'[rank{r}]:[E1205 07:20:28.1 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog "
        "caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=4, "
        "NumelOut=4, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.', "
        "file=sys.stderr)\n")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    subprocess.run([torchrun, "--nproc-per-node", "2", "--log-dir", str(tmp_path / "logs"),
                    "-r", "3", str(script)], check=True, timeout=120, capture_output=True)
    out = tmp_path / "a.json"
    assert main(["analyze", str(tmp_path / "logs"), "--json", str(out)]) == 1
    (row,) = json.loads(out.read_text())["calls"]
    assert (row["seq"], row["ranks"], row["op"]) == (9, [0, 1], "ALLREDUCE")


def test_nccl_s_init_lines_place_the_ranks_the_findings_name(tmp_path, capsys):
    """NVIDIA/nccl#1814: NCCL's Init COMPLETE lines place ranks 32, 34-36 of a 64-rank
    communicator on one host (read apart by splitting); with a rank behind, the host and GPU of
    that rank are named."""
    with open(_path("nccl_1814_init_complete_excerpt.log"), encoding="utf-8") as f:
        apart = {int(x.split(" rank ")[1].split()[0]): (x.split(":")[0],
                                                         int(x.split(" cudaDev ")[1].split()[0]))
                 for x in f if "Init COMPLETE" in x}
    log = joblog.read([_path("nccl_1814_init_complete_excerpt.log")], 1 << 30)
    assert log.hosts() == apart and sorted(apart) == [32, 34, 35, 36]
    code, rec, _ = _record(_path("nccl_1814_init_complete_excerpt.log"), tmp_path, capsys)
    assert code == 0 and "NCCL placed ranks 32,34-36 on hostname-test (of its 64-rank " \
        "communicator)" in rec["notes"]
    place = "".join(f"gpu0{r // 2}:100{r}:200{r} [{r % 2}] NCCL INFO comm 0x55{r} rank {r} nranks 4 "
                    f"cudaDev {r % 2} nvmlDev {r % 2} busId 1000 commId 0xabc - Init COMPLETE\n"
                    for r in range(4))
    log_text = place + "".join(_line(r, 12) for r in (0, 1, 3)) + _line(2, 11)
    _, rec, _ = _record(_write(tmp_path, log_text), tmp_path, capsys)
    assert any("never issued it" in f for f in rec["findings"])
    assert "where the ranks these findings name run (NCCL's Init COMPLETE lines): gpu01: rank(s) " \
        "2 (GPU 0)" in rec["notes"]


def test_a_real_desync_whose_group_one_side_leaves_unnamed_is_said_as_one(tmp_path, capsys):
    """pytorch/pytorch#20630: ranks 1 and 2 in ALLREDUCE #4084 (no line naming their group),
    rank 3 of group 0 in BROADCAST #4084: not joined (the lines do not say they are one
    group's), and said as the desync they would be."""
    apart = _apart(_path("pytorch_20630_allreduce_against_broadcast_excerpt.log"))
    assert {(k[0], k[3]) for k in apart} == {(1, "ALLREDUCE"), (2, "ALLREDUCE"), (3, "BROADCAST")}
    _, rec, _ = _record(_path("pytorch_20630_allreduce_against_broadcast_excerpt.log"), tmp_path,
                        capsys)
    assert {(r["group"], r["op"], tuple(r["ranks"])) for r in rec["calls"]} == \
        {("0", "BROADCAST", (3,)), ("?", "ALLREDUCE", (1, 2))}
    assert "ranks [1, 2] (no line naming their group) failed in ALLREDUCE #4084 where rank 3 of " \
        "group 0 failed in BROADCAST #4084: were theirs group 0's call too, the ranks issued " \
        "different collectives at one place (a desync)" in rec["notes"]


def test_nccl_s_abort_line_places_its_rank_too(tmp_path, capsys):
    """pytorch/pytorch#20630's `comm ... rank 3 nranks 4 cudaDev 3 busId 70 - Abort COMPLETE`."""
    _, rec, _ = _record(_path("pytorch_20630_allreduce_against_broadcast_excerpt.log"), tmp_path,
                        capsys)
    assert "NCCL placed rank 3 on dlciwpwqw7kd1h3y-master-0 (of its 4-rank communicator)" in \
        rec["notes"]


def test_a_line_longer_than_a_read_is_read_in_pieces_and_counted_once(tmp_path, capsys):
    """A log whose first line runs for 3 MiB (a dump of a tensor, a line of '='): read a piece
    at a time (joblog.LINE_CHARS), the watchdog lines after it as they are."""
    excerpt = _path("basicsr_737_default_pg_excerpt.log")
    with open(excerpt, encoding="utf-8") as f:
        text = f.read()
    long = _write(tmp_path, "=" * (3 * joblog.LINE_CHARS) + "\n" + text, "long.log")
    _, rec, out = _record(long, tmp_path, capsys)
    _, plain, _ = _record(excerpt, tmp_path, capsys)
    assert rec["findings"] == plain["findings"] and rec["calls"] == plain["calls"]
    assert rec["lines"] == text.count("\n") + 1


def test_a_gzipped_log_that_decompresses_past_any_log_s_ratio_is_refused(tmp_path, capsys):
    """A gzip bomb given as a job's log: refused once it outgrows any real log's compression
    (commbench.traces.stream's ratio and floor), in one line, exit 2."""
    from commbench.traces import stream

    bomb = tmp_path / "bomb.log.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        f.write(_line(0, 1).encode())
        for _ in range((stream.BOMB_CHARS >> 20) + 8):
            f.write(b" " * (1 << 20))
    assert main(["analyze", str(bomb)]) == 2
    assert "decompresses to more than 1000 times" in said(capsys)


def test_many_groups_failed_alike_are_told_in_one_line_and_the_odd_one_apart(tmp_path, capsys):
    """64 tensor-parallel groups of 8 (tp0..tp63, the job's ranks 8g..8g+7) hung in one
    all-reduce #1200: one finding for them all, one note for the 63 whose every member reported,
    and the group with a silent member (rank 300, tp37's rank 4) told apart. The sizes name the
    groups' members: an all-gather's output over its input."""
    text = []
    for r in range(512):
        if r != 300:
            text.append(_line(r, 1200, op="_ALLGATHER_BASE", n=1024, out=8192,
                              group=f"tp{r // 8}").replace(f"[Rank {r}]", f"[Rank {r % 8}]")
                        .replace(f" Rank {r}]", f" Rank {r % 8}]"))
    code, rec, out = _record(_write(tmp_path, "".join(text)), tmp_path, capsys)
    assert code == 1 and len(rec["calls"]) == 64
    assert rec["findings"] == ["64 groups (tp0, tp1, tp2, ..., tp63): _ALLGATHER_BASE #1200 timed "
                               "out after 600 s on ranks [0-299,301-511] (511 ranks)"]
    merged = [n for n in rec["notes"] if n.startswith("63 groups (")]
    assert len(merged) == 1 and "every rank that reported issued #1200" in merged[0]
    assert any(n.startswith("group tp37 ") and "group rank(s) 4 said nothing here" in n
               for n in rec["notes"])
    assert len(out.splitlines()) < 80


def _barrier_apart(path: str) -> set[tuple[int, int, tuple[int, ...]]]:
    out = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            if "failed to pass monitoredBarrier" in line:
                waiter = int(line.split("[Rank ")[1].split("]")[0])
                absent = line.split("]: Rank")[1].split(" failed")[0].lstrip("s ")
                ms = int(line.split(" in ")[-1].split()[0])
                out.add((waiter, ms, tuple(int(x) for x in absent.replace(",", " ").split())))
    return out


def test_torch_s_monitored_barrier_names_the_ranks_that_never_came(tmp_path, capsys):
    """torch 2.13's own lines (gloo_monitored_barrier_rank0.log): rank 2 of 3 never reached the
    barrier rank 0 waited 2 s at; read apart by splitting."""
    name = "gloo_monitored_barrier_rank0.log"
    apart = _barrier_apart(_path(name))
    assert apart == {(0, 2000, (2,))}
    code, rec, _ = _record(_path(name), tmp_path, capsys)
    assert code == 1 and rec["barriers"] == [{"waiter": 0, "timeout_ms": 2000, "absent": [2]}]
    assert rec["findings"] == ["torch's monitored barrier: rank 2 never reached it (rank 0 waited "
                               "2 s; gloo group ranks)"]


def _written_again(tmp_path, script: str) -> None:
    """This folder's ``script`` run with the installed torch, writing its logs in ``tmp_path``."""
    import shutil
    import subprocess
    import sys

    shutil.copy(_path(script), tmp_path / script)
    subprocess.run([sys.executable, str(tmp_path / script)], check=True, timeout=300,
                   capture_output=True)


@pytest.mark.launcher
@pytest.mark.local
def test_the_installed_torch_s_monitored_barrier_lines_read_to_the_same_finding(tmp_path):
    _written_again(tmp_path, "make_monitored_barrier.py")
    fresh = str(tmp_path / "gloo_monitored_barrier_rank0.log")
    assert _barrier_apart(fresh) == _barrier_apart(_path("gloo_monitored_barrier_rank0.log"))
    assert main(["analyze", fresh, "--json", str(tmp_path / "a.json")]) == 1


GLOO = ["gloo_timeout_torchrun.log", "gloo_peer_closed_torchrun.log"]


def _gloo_apart(path: str) -> list[tuple]:
    """Each gloo error of the log, read by splitting strings: (job rank, recv/send/closed,
    timeout in ms or None, the call its rank's traceback was in)."""
    out, call = [], {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            rank = int(line.split("[rank", 1)[1].split("]", 1)[0]) if line.startswith("[rank") \
                else None
            if 'distributed_c10d.py", line ' in line:
                call[rank] = line.rsplit(" in ", 1)[1].strip()
            elif "Timed out waiting " in line:
                ms, _, rest = line.split("Timed out waiting ", 1)[1].partition("ms for ")
                out.append((rank, rest.split()[0], int(ms), call.get(rank, "")))
            elif "Connection closed by peer" in line:
                out.append((rank, "closed", None, call.get(rank, "")))
    return out


def _gloo_read(path: str) -> list[tuple]:
    return [(g.rank, g.kind, g.timeout_ms, g.call) for g in joblog.read([path], 1 << 30).gloo]


@pytest.mark.parametrize("name", GLOO)
def test_gloo_s_errors_are_read_with_their_rank_and_the_call_they_waited_in(name, tmp_path,
                                                                            capsys):
    """torch 2.13 under torchrun, gloo (make_gloo_errors.py): rank 2 of 3 skips an all-reduce
    and sleeps (ranks 0 and 1 time out, one sending, one receiving) or exits (their peer's
    connection closes). Each error with its rank and the call its traceback names; with the
    world given, rank 2 is named as the one that printed none."""
    want = _gloo_apart(_path(name))
    assert len(want) == 2 and {w[0] for w in want} == {0, 1} and {w[3] for w in want} == \
        {"all_reduce"}
    assert sorted(_gloo_read(_path(name))) == sorted(want)
    again = tmp_path / "again.log"  # the messages printed twice (a wrapper's exception): once
    text = open(_path(name), encoding="utf-8").read()
    again.write_text(text + "".join(x + "\n" for x in text.splitlines() if "RuntimeError" in x))
    assert sorted(_gloo_read(str(again))) == sorted(want)
    code, rec, out = _record(_path(name), tmp_path, capsys, "--world", "3")
    assert code == 1 and len(rec["gloo"]) == 2
    assert any(f.startswith("gloo: ") and "all_reduce" in f and "ranks [0, 1]" in f
               for f in rec["findings"])
    assert any("rank 2 of the world's 3 printed no gloo error" in f for f in rec["findings"])
    code, rec, _ = _record(_path(name), tmp_path, capsys)
    assert not any("printed no gloo error" in f for f in rec["findings"])  # no world: no guess
    code, rec, _ = _record(_path("llamafactory_6269_reduce_scatter_timeout_excerpt.log"),
                           tmp_path, capsys, "--world", "64")
    assert rec["gloo"] == [] and not any(f.startswith("gloo") for f in rec["findings"])


def test_gloo_errors_whose_lines_name_no_rank_are_counted_not_guessed(tmp_path, capsys):
    """Lines without torchrun's ``[rankN]:`` prefix: the errors are counted, no rank named,
    and no rank called silent, whatever the world."""
    text = "".join(line.split(": ", 1)[1] if line.startswith("[rank") else line
                   for line in open(_path(GLOO[0]), encoding="utf-8"))
    path = tmp_path / "bare.log"
    path.write_text(text)
    code, rec, _ = _record(str(path), tmp_path, capsys, "--world", "3")
    (line,) = [f for f in rec["findings"] if f.startswith("gloo")]
    assert line == ("gloo: all_reduce timed out after 3 s on 2 rank(s) the lines do not name: a "
                    "peer never came to it") and code == 1


@pytest.mark.parametrize("broken", ["_C10D_FRAME", "_GLOO_WAIT", "_GLOO_CLOSED"])
def test_the_gloo_check_catches_a_reader_that_loses_the_call_or_the_error(broken, monkeypatch):
    monkeypatch.setattr(joblog, broken, re.compile(r"(?!x)x"))
    with pytest.raises((AssertionError, TraceError)):
        for name in GLOO:
            assert sorted(_gloo_read(_path(name))) == sorted(_gloo_apart(_path(name)))


@pytest.mark.launcher
@pytest.mark.local
def test_the_installed_torch_s_gloo_errors_read_as_the_committed_ones(tmp_path):
    _written_again(tmp_path, "make_gloo_errors.py")
    for name in GLOO:
        fresh = str(tmp_path / name)
        assert sorted(_gloo_read(fresh)) == sorted(_gloo_apart(fresh)) == \
            sorted(_gloo_apart(_path(name)))
