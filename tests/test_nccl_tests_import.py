"""``commbench import``: real nccl-tests and rccl-tests logs (tests/data/nccl_tests, sources in its
README) read number for number, pasting damage undone, the exit codes, the model beside each row,
and the regression gate on imported files."""

from __future__ import annotations

import json
import os
import re

import pytest
from said import quiet_rank, said

from commbench.cli.main import main
from commbench.costmodel.calibrate import topology_for
from commbench.costmodel.nccl import nccl_predict
from commbench.costmodel.topology import load as load_topology
from commbench.results.nccl_tests import LogError, Run, parse
from commbench.results.nccl_tests_record import check_printed
from commbench.results.osu import parse as osu_parse

pytestmark = pytest.mark.nccltests

DATA = os.path.join(os.path.dirname(__file__), "data", "nccl_tests")
EXPECTED = {  # file: [(op, ranks, hosts, per node, rows, first (size, us), last (size, us, busbw), avg)]
    "cscs_gh200_2x4_all_reduce.log": [("all_reduce", 8, 2, 4, 25, (8, 17.93),
                                       (134217728, 1916.4, 122.57), 19.7866)],
    "cscs_gh200_2x4_all_reduce_nocxi.log": [("all_reduce", 8, 2, 4, 25, (8, 85.47),
                                             (134217728, 43293, 5.43), 1.58767)],
    "cscs_gh200_2x1_all_reduce.log": [("all_reduce", 2, 2, 1, 8, (1048576, 339.61),
                                       (134217728, 5871.07, 22.86), 14.9966)],
    "nccl_tests_309_h100_2x8_1m_all_reduce.log": [("all_reduce", 16, 2, 8, 14, (1048576, 93.25),
                                                   (8589934592, 34508, 466.73), 276.999)],
    "nccl_tests_309_h100_8x8_all_reduce.log": [("all_reduce", 64, 8, 8, 14, (1048576, 117.0),
                                                (8589934592, 52733, 320.70), 183.055)],
    "nccl_tests_309_h100_2x8_all_reduce.log": [("all_reduce", 16, 2, 8, 32, (8, 68.52),
                                                (17179869184, 68652, 469.21), 139.56)],
    "nccl_tests_290_h100_2x8_srun_all_reduce.log": [("all_reduce", 16, 2, 8, 11, (8388608, 215.3),
                                                     (8589934592, 103530, 155.57), 142.735)],
    # an excerpt: the device line of rank 71 only (hosts and GPUs per node as listed, unknown)
    "coreweave_gb200_nvl72_excerpt_all_reduce.log": [("all_reduce", 72, 1, 1, 5,
                                                      (536870912, 1806.7),
                                                      (8589934592, 20299, 834.57), 745.53)],
    "rccl_mi300x_g8_all_reduce.log": [("all_reduce", 8, 1, 8, 25, (8, 45.92),
                                       (134217728, 801.4, 293.07), 54.8575)],
    "nccl_osx_gtx1080_g2_five_ops.log": [
        (op, 2, 1, 2, 6, (8, us), (134217728, last, bus), avg) for op, us, last, bus, avg in (
            ("all_reduce", 25.34, 154639, 0.87, 0.414483), ("all_gather", 21.03, 87825, 0.76, 0.347488),
            ("broadcast", 21.42, 91250, 1.47, 0.698235), ("reduce", 24.91, 87680, 1.53, 0.716373),
            ("reduce_scatter", 20.91, 168931, 0.40, 0.328477))]}


def _text(name: str) -> str:
    with open(os.path.join(DATA, name)) as f:
        return f.read()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_log_reads_to_its_published_figures(name):
    runs = parse(_text(name), name)
    assert [(r.op, r.ranks, len(r.hosts), r.gpus_per_node, len(r.rows),
             (r.rows[0].size, r.rows[0].out.time_us),
             (r.rows[-1].size, r.rows[-1].out.time_us, r.rows[-1].out.busbw), r.avg_busbw)
            for r in runs] == EXPECTED[name]
    assert all(r.closed and not r.truncated and not r.failure and not r.cut_rows for r in runs)


def _raw_rows(text: str) -> dict[int, tuple[list[str], int]]:
    """line number -> (tokens, index of the time column under the last column header) of each
    line that begins with a whole number, read without the parser."""
    out, col = {}, -1
    for k, line in enumerate(text.splitlines(), 1):
        line = re.sub(r"^\s*\d+: ", "", line)  # srun --label's task prefix
        if re.search(r"#\s+size\s+count", line):
            col = line.split()[1:].index("time")
        elif re.match(r"^\s*\d+\s+\d+\s", line):
            out[k] = (line.split(), col)
    return out


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_imported_rows_equal_the_logs_rows_number_for_number(name, tmp_path, capsys):
    text = _text(name)
    assert main(["import", os.path.join(DATA, name), "--out", str(tmp_path)]) == 0
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == len(EXPECTED[name])
    raw = _raw_rows(text)
    rows = [row for f in files for row in json.loads(f.read_text())["rows"]]
    assert sorted(row["line"] for row in rows) == sorted(raw)
    for row in rows:
        toks, col = raw[row["line"]]
        assert (row["size"], row["count"]) == (int(toks[0]), int(toks[1]))
        assert row["time_us"] == float(toks[col]) and row["min_us"] == row["time_us"]
        assert row["log_busbw"] == float(toks[col + 2])
        assert row["inplace_us"] == float(toks[col + 4])
        assert row["wrong"] == 0 and row["spread"] is False
        assert row.get("checked", True) is ("N/A" not in toks)  # not checked: said so


def test_results_not_checked_are_written_and_printed_as_such(tmp_path, capsys):
    """nccl-tests run with -c 0 prints N/A for #wrong: the rows carry checked false and the
    table prints N/A, never a count of 0 wrong elements that nobody counted."""
    name = "nccl_tests_290_h100_2x8_srun_all_reduce.log"
    assert main(["import", os.path.join(DATA, name), "--out", str(tmp_path)]) == 0
    printed = [line.split() for line in capsys.readouterr().out.splitlines()
               if re.match(r"^\s*\d+\s", line)]
    assert len(printed) == 11 and all(toks[6] == "N/A" for toks in printed)
    rows = json.loads(next(tmp_path.glob("*.json")).read_text())["rows"]
    assert all(r["checked"] is False and r["wrong"] == 0 for r in rows)


def test_the_header_gives_versions_devices_and_the_tool():
    new = parse(_text("cscs_gh200_2x1_all_reduce.log"))[0]
    assert (new.tool, new.tests_version, new.library) == ("nccl-tests", "2.18.2", "2.30.7")
    assert new.hosts == ["nid007106", "nid007109"] and new.gpu == "NVIDIA GH200 120GB"
    assert new.params["iters"] == 20 and new.params["warmup_iters"] == 1
    rccl = parse(_text("rccl_mi300x_g8_all_reduce.log"))[0]
    assert (rccl.tool, rccl.op_from, rccl.processes, rccl.params["nGpus"]) == \
        ("rccl-tests", "columns", 1, 8)
    # Open MPI's warnings before the header and its aggregated help lines among the devices
    h100 = parse(_text("nccl_tests_309_h100_2x8_all_reduce.log"))[0]
    assert (h100.library, h100.op_from, h100.gpu) == ("2.26.2+cuda12.8", "columns",
                                                      "NVIDIA H100 80GB HBM3")
    assert h100.hosts == ["bm-h100-01", "bm-h100-02"] and h100.gpus_per_node == 8
    # srun --label's task prefix on every line; results not checked (validation: 0, N/A)
    srun = parse(_text("nccl_tests_290_h100_2x8_srun_all_reduce.log"))[0]
    assert srun.hosts == ["node005", "node007"] and srun.params["validation"] == 0
    assert not any(r.checked for r in srun.rows) and all(r.checked for r in h100.rows)
    old = parse(_text("nccl_osx_gtx1080_g2_five_ops.log"))
    assert [r.elided for r in old] == [1] * 5 and old[0].rows[0].out.error == 0.0
    assert old[1].rows[0].redop == "none" and old[2].rows[0].root == 0


def _damaged(text: str, how: str) -> str:
    lines = text.splitlines()
    if how == "srun":
        return "\n".join(f"{k % 8}: {line}" for k, line in enumerate(lines))
    if how == "openmpi":
        return "\n".join(f"[1,0]<stdout>:{line}" for line in lines)
    if how == "spaces":
        return "\n".join(" ".join(line.split()) for line in lines)
    if how == "info":
        out = []
        for line in lines:
            out.append(line)
            if re.match(r"^\s*\d+\s", line):
                out.append("nid005471:204199:204210 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P")
        return "\n".join(out)
    if how == "cut":  # every row broken in two by an INFO line
        out = []
        for line in lines:
            if re.match(r"^\s*\d+\s", line):
                toks = line.split()
                out += [" ".join(toks[:7]), "host:1:2 [0] NCCL INFO comm 0x1 rank 0", " ".join(toks[7:])]
            else:
                out.append(line)
        return "\n".join(out)
    if how == "markdown":  # pasted outside a code block: each '# ' line lost its '#'
        return "\n".join(re.sub(r"^(\s*)#\s?", r"\1", line) for line in lines)
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["srun", "openmpi", "spaces", "info", "cut", "markdown"])
def test_pasting_damage_reads_the_same(how):
    text = _text("cscs_gh200_2x4_all_reduce.log")
    clean, damaged = parse(text)[0], parse(_damaged(text, how))[0]
    key = [(r.size, r.count, r.out, r.inplace) for r in clean.rows]
    assert [(r.size, r.count, r.out, r.inplace) for r in damaged.rows] == key
    assert (damaged.op, damaged.ranks, damaged.hosts) == (clean.op, clean.ranks, clean.hosts)


def test_a_header_that_lost_its_hashes_read_as_one_is_caught(monkeypatch):
    """The broken rule: only lines that start with '#' are header lines. A log whose '#' the
    paste took off is then no log at all."""
    from commbench.results import nccl_tests

    monkeypatch.setattr(nccl_tests, "_HASHLESS", re.compile(r"(?!)"))
    with pytest.raises(LogError):
        parse(_damaged(_text("cscs_gh200_2x4_all_reduce.log"), "markdown"))


def test_a_header_without_its_table_is_left_out_and_alone_refused(tmp_path, capsys):
    """nccl/issues/583 quotes a 2021 header whose '#' markdown ate, up to the column header and
    no row: read as the 8-rank A100 all-reduce it is, it has nothing to import (it was written
    as a results file without rows); beside a run with rows it is left out, and said so."""
    name = "nccl_583_a100_g8_header_without_hashes.log"
    (run,) = parse(_text(name), name)
    assert (run.op, run.ranks, run.hosts, run.gpu, run.rows) == (
        "all_reduce", 8, ["AI-A100-Beethoven01"], "NVIDIA A100-SXM4-40GB", [])
    assert main(["import", os.path.join(DATA, name), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "line 2: the all_reduce run has no rows; left out" in err  # every rank says so
    assert ("no run with rows: nothing to import" in err) != quiet_rank()  # rank 0 refuses
    both = tmp_path / "both.log"
    both.write_text(_text(name) + "\n" + _text("cscs_gh200_2x4_all_reduce.log"))
    assert main(["import", str(both), "--out", str(tmp_path / "out")]) == 0
    assert "line 2: the all_reduce run has no rows; left out" in capsys.readouterr().err
    assert len(list((tmp_path / "out").glob("*.json"))) == 1


def test_copies_of_a_one_rank_job_in_one_log_are_refused_naming_them(tmp_path, capsys):
    """nccl-tests/issues/107: nccl-tests built without MPI and started by mpirun -np 2 runs two
    copies of a one-rank job, each printing its header (both 'Rank 0', on two hosts) and its
    table into one log. Read as one run, it was '1 ranks on 2 node(s)', its rows mixed; it is
    refused in one line that names the two processes and the cause."""
    name = "nccl_tests_107_v100_2x1_two_copies_header.log"
    with pytest.raises(LogError, match=r"line 1: rank 0 is listed by 2 processes \(pid 1320 on "
                       r"ip-172-31-20-228, pid 2066 on ip-172-31-22-230\): 2 copies of a job"):
        parse(_text(name), name)
    assert main(["import", os.path.join(DATA, name), "--out", str(tmp_path)]) == 2
    assert ("rebuild it with MPI=1" in capsys.readouterr().err) != quiet_rank()


def test_copies_read_as_one_run_are_caught(monkeypatch):
    """The broken reader: without the check, the two copies are one run of one rank on two
    hosts, which the previous test's refusal catches."""
    from commbench.results import nccl_tests

    monkeypatch.setattr(nccl_tests, "_one_job", lambda run, name: None)
    (run,) = parse(_text("nccl_tests_107_v100_2x1_two_copies_header.log"), "t107")
    assert (run.ranks, len(run.hosts)) == (1, 2)


def test_nccl_tests_2_20_s_header_is_read():
    """A DGX Spark pair (dgx-spark-playbooks#103): nccl-tests 2.20.0's version line with the
    library's code, its 'Collective test starting' line naming the op, 'unalign' among the
    parameters; an excerpt of four rows, so truncated."""
    name = "dgx_spark_103_gb10_2x1_excerpt_all_reduce.log"
    (run,) = parse(_text(name), name)
    assert (run.tool, run.tests_version, run.library, run.op, run.op_from) == (
        "nccl-tests", "2.20.0", "2.31.2", "all_reduce", "header")
    assert (run.ranks, run.hosts, run.gpu, run.params["unalign"]) == (
        2, ["spark-d708", "spark-dbf4"], "NVIDIA GB10", 0)
    assert [(r.size, r.out.time_us, r.inplace.time_us) for r in run.rows] == [
        (8192, 35.15, 30.33), (16384, 31.67, 30.75), (32768, 39.56, 37.44), (65536, 67.93, 64.71)]
    assert run.truncated


def test_a_table_under_its_launch_line_takes_its_op_from_it(tmp_path, capsys):
    """nccl-tests/issues/232: the mpirun line names all_reduce_perf, the table has no device
    line: the op from the command, the world (2) from busbw / algbw."""
    path = os.path.join(DATA, "nccl_tests_232_h100_2x1_table_all_reduce.log")
    (run,) = parse(_text(os.path.basename(path)), "t232")
    assert (run.op, run.op_from, run.ranks, len(run.rows)) == ("all_reduce", "command line", 0, 5)
    assert main(["import", path, "--out", str(tmp_path)]) == 0
    assert "2 ranks (read off busbw / algbw, the all_reduce factor" in capsys.readouterr().out


def test_a_truncated_log_keeps_its_rows_and_says_so(tmp_path, capsys):
    text = _text("cscs_gh200_2x4_all_reduce.log")
    cut = "\n".join(text.splitlines()[:30])  # the header and 13 rows, no closing lines
    log = tmp_path / "all_reduce.log"
    log.write_text(cut)
    assert main(["import", str(log), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "truncated: 13 complete rows kept" in err
    rec = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    assert len(rec["rows"]) == 13 and rec["measurement"]["truncated"] is True


def test_wrong_results_are_written_flagged_and_exit_1(tmp_path, capsys):
    text = _text("cscs_gh200_2x1_all_reduce.log").replace(
        "22.50       0  2983.25   22.50   22.50       0", "22.50       3  2983.25   22.50   22.50       0")
    log = tmp_path / "wrong.log"
    log.write_text(text)
    assert main(["import", str(log), "--out", str(tmp_path / "out")]) == 1
    rows = json.loads(next((tmp_path / "out").glob("*.json")).read_text())["rows"]
    assert [r["wrong"] for r in rows].count(3) == 1 and sum(r["wrong"] for r in rows) == 3
    assert "#wrong 3" in {r.get("flag") for r in rows}
    assert "report #wrong > 0" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["", "hello\nworld\n", "# nThread 1 nGpus 1\n8 2 float sum\n"])
def test_a_file_that_is_no_log_is_one_line_and_exit_2(text, tmp_path, capsys):
    log = tmp_path / "x.log"
    log.write_text(text)
    assert main(["import", str(log), "--out", str(tmp_path)]) == 2
    err = said(capsys).strip().splitlines()
    assert len(err) == 1 and "not such a log" in err[0]
    assert not list(tmp_path.glob("*.json"))
    with pytest.raises(LogError):
        parse(text)


def test_a_run_whose_columns_fit_no_op_alone_needs_op(tmp_path, capsys):
    # the rccl log's busbw / algbw is 2*7/8 (all-reduce at 8 ranks); with 4 device lines left,
    # no collective at 4 ranks has that factor, so the importer cannot name one
    text = "\n".join(line for line in _text("rccl_mi300x_g8_all_reduce.log").splitlines()
                     if not re.search(r"Rank  [4-7] ", line))
    assert parse(text)[0].op == ""
    log = tmp_path / "four.log"
    log.write_text(text)
    assert main(["import", str(log), "--out", str(tmp_path)]) == 2
    assert "give --op" in said(capsys)
    assert main(["import", str(log), "--out", str(tmp_path), "--op", "all_reduce"]) == 0


def test_a_wrong_op_shows_in_the_printed_busbw():
    run = parse(_text("cscs_gh200_2x4_all_reduce.log"))[0]
    assert check_printed(run) == []
    run.op = "all_gather"  # a factor 7/8 where the log printed 2*7/8
    flagged = check_printed(run)
    assert len(flagged) >= 10 and "busbw 122.57 printed, 61.28" in flagged[-1]


def test_rows_sit_beside_nccl_s_model_on_the_headers_machine(tmp_path, capsys):
    name = "cscs_gh200_2x4_all_reduce.log"
    assert main(["import", os.path.join(DATA, name), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "the header names no interconnect: assumed alps-gh200" in out
    rec = json.loads(next(tmp_path.glob("*.json")).read_text())
    topo = load_topology("alps-gh200").part(2, 4)
    big = rec["rows"][-1]
    c = nccl_predict("all_reduce", big["size"], topo)
    assert big["nccl_model_algo"] == f"{c.algo}/{c.proto}"
    assert big["nccl_model_busbw"] == pytest.approx(big["size"] / c.time_us / 1e3 * 1.75)
    assert big["meas_over_model"] == pytest.approx(big["busbw"] / big["nccl_model_busbw"])


NVL72 = os.path.join(DATA, "coreweave_gb200_nvl72_excerpt_all_reduce.log")


def test_an_excerpt_from_inside_the_device_lines_is_a_run_of_the_ranks_they_imply(tmp_path,
                                                                                 capsys):
    """A GB200 NVL72 rack's all-reduce pasted from its last device line (rank 71): a run of 72
    ranks, whose busbw / algbw (2 x 71/72) names the all-reduce; its nodes are unknown, said
    so, and no model or fit assumes them."""
    (run,) = parse(_text(os.path.basename(NVL72)), "nvl72")
    assert (run.ranks, run.listed, run.op, run.op_from) == (72, False, "all_reduce", "columns")
    assert check_printed(run) == []  # every printed busbw is size / time x 2 x 71/72
    assert main(["import", NVL72, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "72 ranks (1 device line(s) only: nodes unknown) of NVIDIA Graphics Device" in out
    assert "its nodes and GPUs per node are unknown; no model beside it" in out
    (rec,) = [json.loads(f.read_text()) for f in tmp_path.glob("*.json")]
    assert rec["world_size"] == 72 and rec["measurement"]["nodes"] is None
    assert main(["calibrate", NVL72, "--topology", "dgx-b200", "--json",
                 str(tmp_path / "c.json")]) == 2
    assert "the device lines of 1 of its 72 ranks only" in said(capsys)


def test_an_excerpt_s_ranks_counted_by_its_lines_are_caught(monkeypatch):
    """The broken rule: a run's ranks are its device lines (1 here), and no op fits."""
    from commbench.results import nccl_tests

    monkeypatch.setattr(nccl_tests.Run, "ranks", property(lambda self: len(self.devices)))
    (run,) = parse(_text(os.path.basename(NVL72)), "nvl72")
    assert run.ranks == 1 and run.op == ""


PAIR = os.path.join(DATA, "nccl_1161_h100_pcie_pair_table_all_reduce.log")
H20 = os.path.join(DATA, "nccl_1244_h20_2x8_table_all_reduce.log")


def test_a_table_pasted_without_its_header_gets_its_op_and_world_from_its_bus_factor(
        tmp_path, capsys):
    """Most logs pasted into issues are their table alone. nccl-tests worked busbw out from the
    world, so busbw / algbw gives it back: 1.00 is an all-reduce's factor at 2 ranks and no
    other op's at any (nccl/issues/1161, two H100 PCIe). Said, in the output and the record; no
    device, nodes or model are assumed. Before, such a table was refused ("line 0: ...")."""
    (run,) = parse(_text(os.path.basename(PAIR)), "pair")
    assert (run.op, run.op_from, run.ranks, run.listed, len(run.rows)) == (
        "all_reduce", "columns", 2, False, 2)
    assert main(["import", PAIR, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "2 ranks (read off busbw / algbw, the all_reduce factor; no device lines" in out
    (rec,) = [json.loads(f.read_text()) for f in tmp_path.glob("*.json")]
    assert rec["world_size"] == 2 and rec["measurement"]["nodes"] is None
    assert [r["size"] for r in rec["rows"]] == [1073741824, 2147483648]
    # a world given that the bus factor denies is refused; one it allows is the same
    assert main(["import", PAIR, "--out", str(tmp_path / "b"), "--ranks", "4"]) == 2
    assert "--ranks 4: " in (err := said(capsys)) and "all_reduce factor at 2 ranks" in err
    assert main(["import", PAIR, "--out", str(tmp_path / "c"), "--ranks", "2"]) == 0


def test_a_table_whose_rows_print_no_bandwidth_needs_its_op_and_world_given(tmp_path, capsys):
    """A 2 x 8 H20 table pasted from its column header, its rows of 4 to 32 B (busbw 0.00):
    nothing in it tells its op or world, and each refusal names the flag that gives it."""
    assert main(["import", H20, "--out", str(tmp_path)]) == 2
    assert "line 2: the run names no collective" in said(capsys)  # the header's line, not 0
    assert main(["import", H20, "--out", str(tmp_path), "--op", "all_reduce"]) == 2
    assert "does not tell the world of its all_reduce: give --ranks" in said(capsys)
    assert main(["import", H20, "--out", str(tmp_path), "--op", "all_reduce", "--ranks",
                 "16"]) == 0
    (rec,) = [json.loads(f.read_text()) for f in tmp_path.glob("*.json")]
    assert rec["world_size"] == 16 and len(rec["rows"]) == 4
    assert "no device lines; 16 ranks (--ranks)" in rec["launch"]


ALLTOALL_78 = os.path.join(DATA, "nccl_tests_78_v100_8x8_alltoall_blank_redop.log")


def test_an_old_build_s_blank_redop_is_read_and_its_world_off_the_count_column(tmp_path, capsys):
    """nccl-tests#78's 2021 all-to-all table: its header names a redop column that the rows
    leave blank, so each row is a word short. All-gather and all-to-all fit it alike (the same
    bus factor, one rank's block in ``count``), so the op is asked for; given, the world is the
    one its count column allows, and the in-place max error of 1 that the build did not count
    (it checked no in-place all-to-all) flags nothing."""
    text = _text(os.path.basename(ALLTOALL_78))
    rows = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit()]
    world = int(rows[0][0]) // 4 // int(rows[0][1])  # float: size / 4 B / one peer's elements
    assert world == 64 and all(len(r) == 11 for r in rows)
    assert main(["import", ALLTOALL_78, "--out", str(tmp_path / "a")]) == 2
    assert "names no collective and its columns fit none alone; give --op" in said(capsys)
    assert main(["import", ALLTOALL_78, "--out", str(tmp_path / "b"), "--op", "all_to_all"]) == 0
    (rec,) = [json.loads(f.read_text()) for f in (tmp_path / "b").glob("*.json")]
    assert rec["world_size"] == world and "read off the count column" in rec["launch"]
    assert [(r["size"], r["time_us"], r["inplace_us"], r["wrong"], r["redop"]) for r in rec["rows"]] \
        == [(int(r[0]), float(r[3]), float(r[7]), 0, "none") for r in rows]
    assert main(["import", ALLTOALL_78, "--out", str(tmp_path / "c"), "--op", "all_to_all",
                 "--ranks", "8"]) == 2
    assert "--ranks 8: " in (err := said(capsys)) and "all_to_all at 64 ranks" in err


def test_rccl_tests_own_version_line_names_rccl_s_version():
    """rccl-tests prints ``rccl-library=22803`` where nccl-tests prints ``nccl-library=``: the
    header line as ROCm/rocm-systems#3415 quotes it (its table was not quoted: a column header
    line follows it here), read to RCCL 2.28.3."""
    head = ("# rccl-tests version 2.17.9-users/speriaswamy-amd/gfx1151-rccl-tests-enablement:"
            "f220897c9b rccl-headers=22803 rccl-library=22803\n"
            "# Collective test starting: all_reduce_perf\n"
            "#       size         count      type   redop    root     time   algbw   busbw  #wrong"
            "     time   algbw   busbw  #wrong\n")
    (run,) = parse(head, "log")
    assert (run.tool, run.library, run.op) == ("rccl-tests", "2.28.3", "all_reduce")
    assert run.tests_version.startswith("2.17.9-")


def test_a_reader_that_takes_the_short_rows_as_they_are_reads_none(monkeypatch):
    """The broken reader: rows split on white space and matched to the header word for word,
    the blank redop not given back. No row of the table fits."""
    import commbench.results.nccl_tests as nt

    monkeypatch.setattr(nt, "_filled", lambda cols, toks: toks)
    (run,) = parse(_text(os.path.basename(ALLTOALL_78)), "log")
    assert run.rows == []


def test_an_old_build_s_max_error_beyond_its_bound_is_flagged_as_that_build_counted_it(
        tmp_path, capsys):
    """Older builds print a max error, not a count, and counted a check out of bounds past the
    type's bound times (ranks - 1) (1e-5 for float). The GTX 1080 log at 2 ranks with one
    all-reduce row's in-place error raised: past the bound the row is flagged and the import
    exits 1; at the bound it is not. An all-to-all's in-place error was never counted."""
    from commbench.results.nccl_tests_record import out_of_bounds

    text = _text("nccl_osx_gtx1080_g2_five_ops.log")
    row = next(line for line in text.splitlines() if line.split()[:1] == ["67108864"])
    assert row.split()[3] == "sum" and row.endswith("0e+00")  # the all-reduce run's, checked
    for error, flagged in (("3e-01", True), ("1e-05", False), ("2e-05", True)):
        (tmp_path / error).mkdir()
        log = tmp_path / error / "log.log"
        log.write_text(text.replace(row, row[:-5] + error, 1))
        assert main(["import", str(log), "--out", str(tmp_path / error)]) == (1 if flagged else 0)
        rec = json.loads(next((tmp_path / error).glob("*all_reduce*.json")).read_text())
        bad = [r for r in rec["rows"] if r["wrong"]]
        assert [r["size"] for r in bad] == ([67108864] if flagged else [])
        if flagged:
            assert f"in-place max error {float(error):g} > 1e-05" in bad[0]["flag"]
            assert "max error beyond nccl-tests' bound" in capsys.readouterr().err
    (run,) = parse(_text(os.path.basename(ALLTOALL_78)), "log")
    run.op, run.world = "all_to_all", 64
    assert [out_of_bounds(run, r) for r in run.rows] == [[], []]
    run.op = "all_gather"  # the same errors on an op whose in-place half was checked
    assert [len(out_of_bounds(run, r)) for r in run.rows] == [1, 1]


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_to_all", "all_reduce"])
@pytest.mark.parametrize("n", [2, 3, 8, 24, 64, 1000])
def test_the_world_read_off_the_count_column_is_the_run_s_or_none(op, n):
    """Counts as nccl-tests prints them (its ``paramcount``: the size's elements over the ranks,
    rounded down to whole 16 B, for an op that moves blocks; the whole buffer else): the world
    read back is n or none (rows of 1000 elements a rank fit n = 997..1000 alike), never
    another, and n wherever a row is big enough to tell it from its neighbours."""
    from commbench.results.nccl_tests import Row, Timing, world_of_count

    item = 4
    block = op != "all_reduce"
    for sizes in ([1 << 30], [8 << 20, 1 << 30], [n * 1000 * item]):
        rows = [Row(s, (s // item // n) & ~(16 // item - 1) if block else s // item, "float32",
                    "sum", -1, Timing(1.0, 1.0, 1.0, 0, None), None, 0) for s in sizes]
        got = world_of_count(Run(op=op, rows=rows))
        assert got in (n, 0) and (got == 0 or block)
        if block and 1 << 30 in sizes:  # 2**28 elements: n - 1 and n + 1 round to other counts
            assert got == n


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
@pytest.mark.parametrize("n", [2, 3, 8, 16, 64, 72, 128])
def test_the_world_read_off_the_bus_factor_is_the_run_s_or_none(op, n):
    """Rows as nccl-tests prints them (two decimals) of a run at n ranks: the world read back is
    n where the rows print digits enough to tell n from its neighbours, else none, never
    another."""
    from commbench.results.busbw import factor
    from commbench.results.nccl_tests import Row, Timing, world_of_ratio

    f = factor(op, n)
    for algbws in ([1.37], [0.5, 3.9, 47.21], [12.5, 118.43, 301.77]):
        run = Run(op=op, rows=[Row(1 << 20, 1, "float", "sum", -1, Timing(
            1.0, a, round(a * f, 2), 0, None), None, 0) for a in algbws])
        got = world_of_ratio(run)
        assert got in (n, 0), (algbws, got)
        if max(algbws) > 300 and n <= 72:
            assert got == n, algbws


def test_a_world_taken_as_the_nearest_factor_is_caught():
    """The broken rule: the world whose factor lies nearest the ratio, told apart or not. On a
    slow row of a 72-rank all-reduce it names another world."""
    from commbench.results.busbw import factor
    from commbench.results.nccl_tests import Row, Timing, world_of_ratio

    a = 1.37
    b = round(a * factor("all_reduce", 72), 2)
    run = Run(op="all_reduce", rows=[Row(1 << 20, 1, "float", "sum", -1, Timing(
        1.0, a, b, 0, None), None, 0)])
    nearest = min(range(2, 4097), key=lambda n: abs(factor("all_reduce", n) - b / a))
    assert world_of_ratio(run) == 0 and nearest != 72


def test_a_gpu_without_a_preset_says_so_and_topology_sets_one():
    run = parse(_text("rccl_mi300x_g8_all_reduce.log"))[0]
    topo, why = topology_for(run)
    assert topo is None and "no preset for the GPU 'AMD Instinct MI300X VF'" in why
    topo, why = topology_for(run, "dgx-h100")
    assert topo.ranks == 8 and "given" in why


def test_the_gate_judges_imported_logs_and_says_they_have_no_spread(tmp_path, capsys):
    for name in ("cscs_gh200_2x4_all_reduce.log", "cscs_gh200_2x4_all_reduce_nocxi.log"):
        assert main(["import", os.path.join(DATA, name), "--out", str(tmp_path / name)]) == 0
    good, bad = (next((tmp_path / n).glob("*.json")) for n in
                 ("cscs_gh200_2x4_all_reduce.log", "cscs_gh200_2x4_all_reduce_nocxi.log"))
    capsys.readouterr()
    assert main(["compare", str(good), str(bad)]) == 1
    said = capsys.readouterr()
    assert "REGRESSED" in said.out and "no spread" in said.out
    err = said.err.strip().splitlines()  # an exit 1 says why on stderr too
    assert len(err) == 1 and "rows regressed" in err[0]
    assert main(["compare", str(good), str(good)]) == 0


def test_what_nccl_printed_is_read_and_set_against_the_topology(tmp_path, capsys):
    from commbench.costmodel.nccl_said import said_against
    from commbench.costmodel.topology import load
    from commbench.results.nccl_info import nccl_said

    info = _text("nccl_1706_init_info.log").splitlines()
    said = nccl_said(info)
    assert (said.coll_channels, said.nvls_channels, said.p2p_channels, said.nranks,
            said.hosts, said.p2p_intra) == (4, 0, 4, 2, ("deepseek",), False)
    lines = said_against(said, load("dgx-h100").part(1, 2))
    assert any("NCCL built 4 collective channels; dgx-h100 assumes 16" in x for x in lines)
    assert any("NCCL made 0 NVLS channels; dgx-h100 assumes NVLS on" in x for x in lines)
    assert any("no intra-node P2P" in x for x in lines)
    # the same lines interleaved in a real run: its rows unchanged, NCCL's facts beside them
    text = _text("cscs_gh200_2x1_all_reduce.log").splitlines()
    k = next(i for i, line in enumerate(text) if re.search(r"#\s+size\s+count", line))
    log = tmp_path / "mixed.log"
    log.write_text("\n".join(text[:k] + info + text[k:]) + "\n")
    assert [r.out for r in parse(log.read_text())[0].rows] == \
        [r.out for r in parse(_text("cscs_gh200_2x1_all_reduce.log"))[0].rows]
    assert main(["import", str(log), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "# NCCL said: 2 ranks on 1 host(s), 4 collective channels, 0 NVLS channels" in out
    assert "# NCCL against the model's topology: NCCL built 4 collective channels" in out
    assert nccl_said(["no NCCL here"]) is None


def test_nccl_s_own_count_of_nodes_is_read_and_set_against_the_topology():
    """NCCL >= 2.20.3 prints each rank's ``nRanks N nNodes M localRanks L`` once its topology is
    settled: nccl/issues/1519's 2 x 8 H100 excerpt (rank 7's lines), and nccl-tests#213's, whose
    ranks all counted one node of 8 on a run meant to span nodes. The counts are the line's
    own; set against a topology of other nodes or GPUs a node, each is said; a reader blind to
    the line says nothing."""
    from commbench.costmodel.nccl_said import said_against
    from commbench.costmodel.topology import load
    from commbench.results.nccl_info import nccl_said

    lines = _text("nccl_1519_h100_2x8_init_info_excerpt.log").splitlines()
    (line,) = [x for x in lines if "nNodes" in x]
    words = line.split()
    expect = tuple(int(words[words.index(k) + 1]) for k in ("nRanks", "nNodes", "localRanks"))
    said = nccl_said(lines)
    assert (said.nranks, said.nodes, said.local_ranks) == expect == (16, 2, 8)
    assert "16 ranks on 2 node(s), 8 a node" in said.facts()
    h100 = load("dgx-h100")
    assert not [x for x in said_against(said, h100.with_nodes(2)) if "node" in x]
    assert any("NCCL counted 2 node(s); dgx-h100 is priced as 4" in x
               for x in said_against(said, h100.with_nodes(4)))
    assert any("NCCL put 8 rank(s) on a node; dgx-h100 has 4 GPUs per node" in x
               for x in said_against(said, h100.part(2, 4)))
    alone = nccl_said(_text("nccl_tests_213_init_info_excerpt.log").splitlines())
    assert (alone.nranks, alone.nodes, alone.local_ranks, alone.hosts) == (8, 1, 8, ("hw14",))
    assert any("NCCL counted 1 node(s); dgx-h100 is priced as 2" in x
               for x in said_against(alone, h100.with_nodes(2)))
    blind = nccl_said([x for x in lines if "nNodes" not in x])
    assert blind.nodes is None and not [x for x in said_against(blind, h100.with_nodes(4))
                                         if "node" in x]


def test_nccl_s_trees_are_read_channel_by_channel():
    """NCCL prints each rank's place in every channel's tree ("Trees [0] 3/-1/-1->2->1 ...":
    three children, the rank, its parent). nccl-tests#213's two whole lines: 16 channels, each
    rank one child at most (a chain inside one node). A binary tree across nodes has two."""
    from commbench.results.nccl_info import nccl_said

    lines = [x for x in _text("nccl_tests_213_init_info_excerpt.log").splitlines()
             if " Trees " in x]
    channels = {len(re.findall(r"\[\d+\]", x.split(" Trees ")[1])) for x in lines}
    said = nccl_said(lines)
    assert channels == {16} and (said.tree_channels, said.tree_fanout) == (16, 1)
    assert "16 tree channels (chains)" in said.facts()
    two = nccl_said(["n0:1:2 [0] NCCL INFO Trees [0] 1/8/-1->0->-1 [1] 1/-1/-1->0->8"])
    assert (two.tree_channels, two.tree_fanout) == (2, 2)


def test_a_network_plugin_s_lines_and_nccl_s_older_ring_lines_are_read():
    """AWS's OFI plugin names its network and its NICs its own way (nccl/issues/1597, two
    8 x H200 hosts: "Using network Libfabric", "NET/OFI Selected Provider is efa (found 16
    nics)"); NCCL before 2.7 printed its connections as "Ring 00 : 26[2] -> 30[6] via P2P/IPC"
    and a plugin's as "via NET/AWS Libfabric/0" (aws-ofi-nccl#24, under Open MPI's prefixes).
    Each read; 16 NICs set against a preset of 8 a node is said."""
    from commbench.costmodel.nccl_said import said_against
    from commbench.costmodel.topology import load
    from commbench.results.nccl_info import nccl_said

    efa = nccl_said(_text("nccl_1597_h200_efa_ofi_info_excerpt.log").splitlines())
    assert (efa.network, efa.provider, efa.nics, efa.hosts) == \
        ("Libfabric", "efa", 16, ("8h200-2", "8h200-3"))
    assert "network NET/Libfabric (efa) over 16 device(s)" in efa.facts()
    topo = load("dgx-h100").with_nodes(2)
    assert any(f"NCCL uses 16 network device(s); dgx-h100 has {topo.nics_per_node} NICs" in x
               for x in said_against(efa, topo))
    old = _text("aws_ofi_nccl_24_old_ring_lines_excerpt.log").splitlines()
    vias = {line.split(" via ")[1].split("/")[0] for line in old if " via " in line}
    said = nccl_said(old)
    assert said.transports == ("P2P/IPC", "NET/AWS Libfabric") and vias == {"P2P", "NET"}
    assert len(said.hosts) == 4 and said.network == ""  # no line names the network itself


def test_nccl_s_connections_are_read_and_host_memory_set_against_gpu_links(capsys, tmp_path):
    """Excerpts quote NCCL's lines without their host (nccl/issues/1161: "[1] NCCL INFO Channel
    00/0 : 1[21000] -> 0[1000] via P2P/direct pointer"): read all the same, the transport of
    each connection said. GPUs that NCCL connects through host memory (SHM) on a machine with
    GPU links is said against the topology."""
    from commbench.costmodel.nccl_said import said_against
    from commbench.costmodel.topology import load
    from commbench.results.nccl_info import nccl_said

    assert main(["import", PAIR, "--out", str(tmp_path)]) == 0
    assert "# NCCL said: 4 tree channels (chains), connections via P2P/direct" in \
        capsys.readouterr().out
    shm = nccl_said(["gpu7:12:34 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct",
                     "gpu7:12:34 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via SHM/direct/direct",
                     "gpu7:12:35 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/IPC"])
    assert (shm.hosts, shm.transports) == (("gpu7",), ("SHM/direct", "P2P/IPC"))
    (line,) = said_against(shm, load("dgx-h100").part(1, 2))
    assert "NCCL connected GPUs through host memory (SHM/direct), not over nvswitch" in line
    assert said_against(shm, load("pcie-8gpu").part(1, 2)) == []  # no GPU links assumed there


def _tuning_table(choices: dict, op: str = "AllReduce", host: str = "gpu7:1:2 [0]") -> list[str]:
    """NCCL's tuning table in its newer layout, of ``choices`` ((algo, proto) -> (lat, bw), in
    commbench's names) for one collective, every other cell printed disabled."""
    names = {"tree": "Tree", "ring": "Ring", "nvls": "NVLS", "nvls_tree": "NVLSTree"}
    protos = ("LL", "LL128", "Simple")
    cells = [choices.get((a, p), (0.0, 0.0)) for a in names for p in protos]
    return [f"{host} NCCL INFO   Algorithm   | " + " | ".join(f"{n:>40}" for n in names.values())
            + " |",
            f"{host} NCCL INFO   Protocol    | " + " | ".join(f"{p:>14}" for _ in names
                                                         for p in protos) + " |",
            f"{host} NCCL INFO  Max NThreads | " + " | ".join(f"{512:>14}" for _ in cells) + " |",
            f"{host} NCCL INFO {op:>13} | " + " | ".join(f"{lat:6.1f}/{bw:7.1f}" for lat, bw in cells)
            + " |"]


def test_nccl_s_own_tuning_table_is_read_in_both_layouts():
    """As issues quote it: the older layout whole but its last cell (nccl/issues/754), the
    newer one's head and a row cut after two cells (nccl/issues/1154, H800)."""
    from commbench.results.nccl_info import nccl_said

    old = nccl_said(_text("nccl_754_tuning_table_old_format.log").splitlines())
    enabled = {k: v for k, v in old.tuning.items() if v[1] > 0}
    assert enabled == {("broadcast", "ring", "LL"): (6.3, 0.8),
                       ("broadcast", "ring", "Simple"): (18.0, 3.0),
                       ("reduce", "ring", "LL"): (6.3, 0.8), ("reduce", "ring", "Simple"): (18.0, 3.0),
                       ("all_gather", "ring", "LL"): (33.3, 0.8),
                       ("all_gather", "ring", "Simple"): (105.6, 3.2)}
    assert old.tuning[("broadcast", "ring", "LL128")] == (14.0, 0.0)  # printed disabled: bw 0
    assert ("all_gather", "collnet_direct", "Simple") not in old.tuning  # cut: not printed
    new = nccl_said(_text("nccl_1154_h800_tuning_table_head.log").splitlines())
    assert new.tuning == {("broadcast", "tree", "LL"): (0.0, 0.0),
                          ("broadcast", "tree", "LL128"): (0.0, 0.0)}


def test_nccl_s_tuning_table_is_set_against_the_model_and_a_departure_is_named(tmp_path, capsys):
    """The model's own table for an 8-GPU node read back through NCCL's layout agrees with the
    model; a bandwidth half NCCL's, a choice NCCL disables, and one only NCCL enables are each
    named, in the import of a log that carries the table."""
    from commbench.costmodel.nccl import nccl_choices
    from commbench.costmodel.nccl_said import tuning_against
    from commbench.costmodel.topology import load
    from commbench.results.nccl_info import nccl_said

    topo = load("dgx-h100").part(1, 8)
    model = nccl_choices("all_reduce", topo)
    rounded = {k: (round(lat, 1), round(bw, 1)) for k, (lat, bw) in model.items()}
    assert tuning_against(nccl_said(_tuning_table(rounded)), "all_reduce", topo) == []
    off = dict(rounded)
    off[("ring", "Simple")] = (off[("ring", "Simple")][0], off[("ring", "Simple")][1] * 2)
    del off[("tree", "LL")]  # printed 0.0/0.0: NCCL disables it
    off[("nvls", "LL")] = (5.0, 50.0)  # only NCCL enables it
    lines = tuning_against(nccl_said(_tuning_table(off)), "all_reduce", topo)
    assert len(lines) == 3, lines
    assert any("all_reduce ring/Simple: NCCL's own algorithm bandwidth" in x and "(0.50x)" in x
               for x in lines)
    assert any(x.startswith("NCCL disables all_reduce tree/LL") for x in lines)
    assert any(x.startswith("NCCL enables all_reduce nvls/LL (50 GB/s)") for x in lines)
    # in a log: the run's own table beside its rows
    text = _text("rccl_mi300x_g8_all_reduce.log").replace("AMD Instinct MI300X", "NVIDIA H100")
    lines_ = text.splitlines()
    k = next(i for i, line in enumerate(lines_) if re.search(r"#\s+size\s+count", line))
    log = tmp_path / "tuned.log"
    log.write_text("\n".join(lines_[:k] + _tuning_table(off) + lines_[k:]) + "\n")
    assert main(["import", str(log), "--out", str(tmp_path / "out"), "--topology",
                 "dgx-h100"]) == 0
    out = capsys.readouterr().out
    assert "its tuning table (" in out
    assert "# NCCL against the model's topology: all_reduce ring/Simple: NCCL's own" in out


def test_nccl_s_own_picks_sit_beside_the_model_s_and_a_block_of_one_algorithm_is_read(
        tmp_path, capsys):
    """Newer NCCL prints its table in blocks of algorithms, the last of one algorithm (PAT)
    under a protocol line of nine cells, and its pick for each call ("AllReduce: 1048576 Bytes
    -> Algo RING proto SIMPLE"), as a real NCCL 2.29.7 log does (read here, not in the corpus:
    its repository states no licence). Each pick sits beside the model's for its row, and a
    size where they differ is named."""
    from commbench.costmodel.nccl import nccl_predict
    from commbench.costmodel.topology import load
    from commbench.results.nccl_info import nccl_said

    host = "lab:1:1 [0]"
    pat = [f"{host} NCCL INFO   Algorithm   |                             PAT                  |",
           f"{host} NCCL INFO   Protocol    | " + " | ".join(["LL", "LL128", "Simple"] * 3) + " |",
           f"{host} NCCL INFO     AllGather |     0.0/   0.0 |     0.0/   0.0 |    17.6/   3.6 |"]
    said = nccl_said(pat)
    assert said.tuning == {("all_gather", "pat", "LL"): (0.0, 0.0),
                           ("all_gather", "pat", "LL128"): (0.0, 0.0),
                           ("all_gather", "pat", "Simple"): (17.6, 3.6)}
    topo = load("dgx-h100").part(1, 8)
    big = 134217728
    model, small = nccl_predict("all_reduce", big, topo), nccl_predict("all_reduce", 8, topo)
    other = "tree/LL" if f"{small.algo}/{small.proto}" != "tree/LL" else "ring/LL"
    picks = [f"{host} NCCL INFO AllReduce: 8 Bytes -> Algo {other.split('/')[0].upper()} proto "
             f"{other.split('/')[1].upper()} channel{{Lo..Hi}}={{0..0}}",
             f"{host} NCCL INFO AllReduce: {big} Bytes -> Algo {model.algo.upper()} proto "
             f"{model.proto.upper()} channel{{Lo..Hi}}={{0..15}}"]
    assert nccl_said(picks).picks[("all_reduce", big)] == (model.algo, model.proto)
    text = _text("rccl_mi300x_g8_all_reduce.log").replace("AMD Instinct MI300X", "NVIDIA H100")
    lines = text.splitlines()
    log = tmp_path / "picked.log"
    log.write_text("\n".join(lines + picks) + "\n")
    assert main(["import", str(log), "--out", str(tmp_path / "out"), "--topology",
                 "dgx-h100"]) == 0
    out = capsys.readouterr().out
    assert "NCCL's pick" in out and "its own pick for 2 call size(s)" in out
    (rec,) = [json.loads(f.read_text()) for f in (tmp_path / "out").glob("*.json")]
    assert {r["size"]: r.get("nccl_pick") for r in rec["rows"] if "nccl_pick" in r} == {
        8: other, big: f"{model.algo}/{model.proto}"}
    apart = [x for x in rec["measurement"]["nccl_contradicts"] if "NCCL's own tuner" in x]
    assert len(apart) == 1 and "at 1 of 2 sizes (first: 8 B, NCCL " + other in apart[0], apart


# -- OSU Micro-Benchmarks ------------------------------------------------------------------------
OSU_ALLTOALL = "osu_cscs_gh200_2x4_alltoall.log"
OSU_BW = "osu_cscs_gh200_2x1_bw.log"


def _osu_blocks(text: str) -> list[tuple[str, list[tuple[int, float, str]]]]:
    """An independent reading of the OSU blocks: (title, [(size, us, Pass/Fail)])."""
    blocks: list[tuple[str, list]] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("# OSU "):
            blocks.append((line, []))
        elif blocks and re.fullmatch(r"\d+\s+[\d.]+\s+(Pass|Fail)", line):
            size, us, ok = line.split()
            blocks[-1][1].append((int(size), float(us), ok))
    return blocks


def test_osu_all_to_all_imports_row_for_row_with_its_world_from_the_launch_line(tmp_path, capsys):
    """Four osu_alltoall blocks of 8 ranks (srun -N2 --ntasks-per-node=4): CPU and GPU buffers,
    with and without the Slingshot hook. OSU's Size is one rank's block to each peer; the row's
    size is nccl-tests' (the whole send, x 8), its busbw size/time x 7/8."""
    text = _text(OSU_ALLTOALL)
    want = _osu_blocks(text)
    assert [len(rows) for _, rows in want] == [21] * 4
    assert main(["import", os.path.join(DATA, OSU_ALLTOALL), "--out", str(tmp_path)]) == 0
    names = ["osu_all_to_all_mpi-x8", "osu_all_to_all_mpi-x8-2", "osu_all_to_all_mpi-cuda-x8",
             "osu_all_to_all_mpi-cuda-x8-2"]
    for name, (title, rows) in zip(names, want, strict=True):
        rec = json.loads((tmp_path / f"{name}.json").read_text())
        assert rec["world_size"] == 8 and rec["measurement"]["api"] in title
        got = [(r["osu_size"], r["size"], r["time_us"], r["busbw"]) for r in rec["rows"]]
        assert got == [(s, 8 * s, us, pytest.approx(8 * s / us / 1e3 * 7 / 8))
                       for s, us, _ in rows]
        assert all(r["op"] == "all_to_all" and r["transport"] == "mpi" and r["wrong"] == 0
                   and r["spread"] is False for r in rec["rows"])
    assert capsys.readouterr().err == ""
    # the hook disabled against enabled: the gate sees it
    code = main(["compare", str(tmp_path / f"{names[0]}.json"), str(tmp_path / f"{names[1]}.json")])
    out = capsys.readouterr().out
    assert code == 1 and "21 of 21 rows come from logs that print no spread" in out


def test_osu_s_failed_validation_is_flagged_and_its_world_can_be_given(tmp_path, capsys):
    text = _text(OSU_ALLTOALL)
    failed = text.replace("524288                236.43              Pass",
                          "524288                236.43              Fail", 1)
    assert failed != text
    path = tmp_path / "failed.log"
    path.write_text(failed)
    assert main(["import", str(path), "--out", str(tmp_path / "a")]) == 1
    rec = json.loads((tmp_path / "a" / "osu_all_to_all_mpi-x8.json").read_text())
    assert [r["size"] for r in rec["rows"] if r["wrong"]] == [8 * 524288]
    # a finding, not a refusal: every rank of a launched test run prints it
    assert "1 row(s) of the OSU All-to-All Personalized Exchange Latency test failed" in \
        capsys.readouterr().err
    bare = tmp_path / "bare.log"  # no launch line: the world is unknown
    bare.write_text("\n".join(line for line in text.splitlines() if "srun" not in line))
    assert main(["import", str(bare), "--out", str(tmp_path / "b")]) == 2
    assert "the OSU All-to-All Personalized Exchange Latency test's world is unknown" in \
        said(capsys)
    assert main(["import", str(bare), "--out", str(tmp_path / "b"), "--ranks", "4"]) == 0
    rec = json.loads((tmp_path / "b" / "osu_all_to_all_mpi-x4.json").read_text())
    assert rec["world_size"] == 4 and rec["rows"][0]["size"] == 4
    # a typo's world priced a busbw of 1.9e10 GB/s; a world past any job's is refused
    assert main(["import", str(bare), "--out", str(tmp_path / "c"), "--ranks",
                 "99999999999"]) == 2
    assert "--ranks 99999999999: must be 1 to 1048576" in said(capsys)
    assert not (tmp_path / "c").exists()


def test_osu_bandwidth_tests_are_left_out_and_said_so(tmp_path, capsys):
    """osu_bw's window bandwidth is no commbench op: a file of it alone is refused, exit 2."""
    assert main(["import", os.path.join(DATA, OSU_BW), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "line 5: OSU Bandwidth test left out" in err  # every rank says what it leaves out
    assert ("OSU output with no test commbench reads" in err) != quiet_rank()  # rank 0 refuses
    assert not os.listdir(tmp_path)


def test_osu_latency_s_world_is_its_launch_line_s_or_its_own_two(tmp_path, capsys):
    """libfabric-cray#859: OMB 5.0's osu_latency, its srun line echoed as a '### Running:'
    comment, which was not read as the launch line: the import asked for --ranks. It is read
    now; and without any launch line osu_latency's world is its own two processes (OMB runs it
    on exactly two), said so."""
    name = "osu_libfabric_cray_859_latency.log"
    (run,) = osu_parse(_text(name))
    assert (run.api, run.test, run.version, run.ranks, len(run.rows)) == (
        "MPI", "Latency", "5.0", 2, 24)
    assert (run.rows[0][:2], run.rows[-1][:2]) == ((0, 1.84), (4194304, 497.37))
    assert main(["import", os.path.join(DATA, name), "--out", str(tmp_path / "a")]) == 0
    assert "pingpong, 2 ranks (launch line), 24 rows" in capsys.readouterr().out
    bare = tmp_path / "bare.log"
    bare.write_text("\n".join(line for line in _text(name).splitlines() if "srun" not in line))
    assert main(["import", str(bare), "--out", str(tmp_path / "b")]) == 0
    assert "2 ranks (osu_latency's two processes)" in capsys.readouterr().out
    rec = json.loads((tmp_path / "b" / "osu_pingpong_mpi-x2.json").read_text())
    assert rec["world_size"] == 2 and len(rec["rows"]) == 24


@pytest.mark.parametrize("line, ranks", [
    ("$ srun -N2 --ntasks-per-node=4 --mpi=pmix ./collective/osu_alltoall --validation", 8),
    ("$ srun -u --mpi=pmix -n4 osu_iallreduce -d cuda", 4),
    ("mpirun -n 144 -N 36 -hostfile hosts osu_allreduce -x 10", 144),  # Open MPI's -N: per node
    ("mpirun --hostfile ./h --allow-run-as-root -N 2 -np 2 -map-by ppr:1:node osu_allreduce", 2),
    ("time flux run -N4 --tasks-per-node=96 -o cpu-affinity=per-task osu_allreduce", 384),
    ("./collective/osu_allreduce", 0),
    ("### Running: srun -n2 -N2 -t00:8:00 --exclusive --cpu_bind=none -c2 osu_latency", 2)])
def test_an_osu_run_s_world_is_read_off_its_launch_line(line, ranks):
    from commbench.results.osu import OsuRun

    assert OsuRun("MPI", "Allreduce Latency", "7.5", 1, line).ranks == ranks


# -- nccl-tests 2.19 on one H200: its JSON output, and a world of one -----------------------------
def test_nccl_tests_json_output_reads_as_the_text_log_of_the_same_run():
    """nccl-tests 2.19.6's ``-J`` file and its text log of the same run: the same header facts
    and the same rows, the JSON's figures unrounded (the log prints two decimals)."""
    from commbench.results.nccl_tests_json import runs_of

    (log,) = parse(_text("h200_g1_all_reduce.log"), "h200_g1_all_reduce.log")
    (js,) = runs_of(_text("h200_g1_all_reduce.json"), "h200_g1_all_reduce.json")
    assert (log.op, log.op_from, log.tests_version, log.library) == \
        ("all_reduce", "header", "2.19.6", "2.28.9")
    assert (js.op, js.op_from, js.library) == ("all_reduce", "command", "2.28.9")
    assert (js.ranks, js.hosts, js.gpu, js.devices) == (log.ranks, log.hosts, log.gpu, log.devices)
    assert js.params == {k: v for k, v in log.params.items() if k != "unalign"}
    assert len(js.rows) == len(log.rows) == 14 and js.closed and log.closed
    for j, t in zip(js.rows, log.rows, strict=True):
        assert (j.size, j.count, j.dtype, j.redop, j.root, j.wrong, j.checked) == \
            (t.size, t.count, t.dtype, t.redop, t.root, t.wrong, t.checked)
        for a, b in ((j.out, t.out), (j.inplace, t.inplace)):
            assert a.time_us == pytest.approx(b.time_us, abs=0.005 + 5e-4 * b.time_us)
            assert a.busbw == b.busbw == 0  # one rank: nothing crosses a link
    assert js.avg_busbw == log.avg_busbw == 0


def test_a_one_rank_log_and_its_json_import_without_a_model(tmp_path, capsys):
    """A world of one (nccl-tests -g 1 on one GPU): NCCL's model prices nothing there; the rows
    are imported and the model says why it is absent (before: ZeroDivisionError, exit 3)."""
    for name in ("h200_g1_all_reduce.log", "h200_g1_all_reduce.json", "h200_g1_sendrecv.json"):
        out = tmp_path / name
        assert main(["import", os.path.join(DATA, name), "--out", str(out)]) == 0, name
        printed = capsys.readouterr().out
        assert "one rank: nothing crosses a link between GPUs; no model beside it" in printed
        (rec,) = [json.loads(p.read_text()) for p in out.glob("*.json")]
        assert rec["world_size"] == 1 and rec["hardware"] == "NVIDIA H200"
        assert all("nccl_model_busbw" not in r for r in rec["rows"])
    rows = rec["rows"]  # send/recv at one rank: busbw is algbw, the in-place half unchecked
    assert rows[-1]["busbw"] == pytest.approx(rows[-1]["algbw"]) and rows[-1]["busbw"] > 1000
    assert all("checked" not in r for r in rows)  # the out-of-place half was checked


def test_calibrating_on_one_rank_says_there_is_nothing_to_fit(tmp_path, capsys):
    log = os.path.join(DATA, "h200_g1_all_reduce.log")
    assert main(["calibrate", log, "--topology", "dgx-h200",
                 "--json", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert "one rank: nothing crosses a link, nothing to fit" in err
    assert quiet_rank() or "no rows of at least" in err  # the refusal: rank 0's to print
    assert not (tmp_path / "t.json").exists()


def test_nccl_2_28_s_own_lines_on_one_h200_are_read():
    from commbench.results.nccl_info import nccl_said

    (run,) = parse(_text("h200_g1_all_reduce_nccl_info.log"))
    said = run.nccl
    assert (said.nranks, said.coll_channels, said.nvls_channels, said.network) == \
        (1, 64, 0, "Socket")
    assert len(run.rows) == 9 and run.rows[-1].size == 134217728
    assert nccl_said(run.info) == said


@pytest.mark.parametrize(("text", "says"), [
    ('{"config": {}}', "without nccl-tests' 'config' and 'results'"),
    ('{"config": {}, "results": [{"size": "x", "count": 2}]}', "results[0]: size, count or root"),
    ('{"config": {}, "results": [{"size": 8, "count": 2}]}', "results[0]: no out_of_place"),
    ('{"config": {}, "results": [{"size": 8, "count": 2, "out_of_place": {"time": 1}}]}',
     "results[0].out_of_place: time, alg_bw or bus_bw"),
    ('{"config": {"devices": [{"rank": 0}]}, "results": []}', "config.devices[0]: rank or host"),
    ('{"config": {}, "results": [', "not valid JSON"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
])
def test_a_json_file_that_is_not_nccl_tests_output_is_one_line_and_exit_2(text, says, tmp_path,
                                                                        capsys):
    if text.startswith("["):
        text = '{"config": ' + text + "}"
    log = tmp_path / "x.json"
    log.write_text(text)
    assert main(["import", str(log), "--out", str(tmp_path)]) == 2
    err = said(capsys).strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not list(tmp_path.glob("*.md"))


# -- the newer builds' output modes: -S 1 (timestamps), -I 1 (each iteration timed), -C 1 ------
def _float_str(value: float, width: int) -> str:
    """nccl-tests' getFloatStr (src/util.cu): two decimals, else one, else none, else e-form,
    whichever first fits the width."""
    for fmt in (f"%{width}.2f", f"%{width}.1f", f"%{width}.0f"):
        if len(text := fmt % value) <= width:
            return text
    return (f"%{width}.1e" if width >= 7 else f"%{width}.0e") % value


def _newer_log(rows, cputime=False, stamps=False, per_iter=False) -> str:
    """A 2-rank all-reduce table laid out as nccl-tests 2.19.6 prints it (src/util.cu's
    writeResultHeader, writeBenchmarkLinePreamble, writeBenchmarkLineBody, writePerIterReport,
    writeTimestamp): ``rows`` of (size, time us, cpu time us, (i_min, i_max, i_p99, i_cv%))."""
    t = "cputime" if cputime else "time"
    stamp = "timestamp" if stamps else ""
    lines = ["# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22809",
             "# Collective test starting: all_reduce_perf",
             "# nThread 1 nGpus 1 minBytes 1048576 maxBytes 67108864 step: 2(factor) warmup iters:"
             " 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
             "#", "# Using devices",
             "#  Rank  0 Group  0 Pid  40001 on      gpu01 device  0 [0000:1b:00] NVIDIA H100 80GB HBM3",
             "#  Rank  1 Group  0 Pid  40002 on      gpu01 device  1 [0000:29:00] NVIDIA H100 80GB HBM3",
             "#"]
    # the header's widths, as printed: "# %10s  %12s  %8s  %6s  %6s" then each half's columns
    lead = ("size", 10), ("count", 12), ("type", 8), ("redop", 6), ("root", 6)
    half = [(t, 7), ("algbw", 6), ("busbw", 6), ("#wrong", 6)]
    if per_iter:
        half += [("i_min", 7), ("i_max", 7), ("i_p99", 7), ("i_cv%", 7)]
    cols = [*lead, *half, *half]
    lines.append("# " + "  ".join(f"{w:>{n}}" for w, n in cols) + f" {stamp:>{19 if stamps else 0}}")
    for size, us, cpu, spread in rows:
        alg = size / us / 1e3
        body = f"  {_float_str(cpu if cputime else us, 7):>7}  {_float_str(alg, 6):>6}  " \
               f"{_float_str(alg, 6):>6}  {0:6g}"
        extra = "".join(f"  {_float_str(x, 7):>7}" for x in spread) if per_iter else ""
        line = f"{size:12d}  {size // 4:12d}  {'float':>8}  {'sum':>6}  {-1:6d}"
        line += body + extra + body + extra + (f"{'2026-11-30 09:15:42':>21}" if stamps else "")
        lines.append(line)
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1.0 ", "#"]
    return "\n".join(lines) + "\n"


NEWER = [(1 << 20, 95.5, 12.1, (90.2, 130.4, 128.0, 7.5)),
         (4 << 20, 160.25, 12.3, (150.1, 190.7, 188.2, 5.1)),
         (16 << 20, 410.0, 12.2, (398.3, 455.0, 450.9, 3.2)),
         (64 << 20, 1402.7, 12.4, (1380.5, 1466.1, 1460.0, 1.9))]


def test_a_newer_build_s_timestamped_rows_are_read_as_the_plain_ones():
    """-S 1 (nccl-tests >= 2.18.5) ends each row with the date and time it was printed, two
    more fields, and its header with ``timestamp``: the rows are read as without them. The
    broken reader that keeps the stamp reads none of them."""
    import commbench.results.nccl_tests as nt

    plain = parse(_newer_log(NEWER), "log")[0]
    stamped = parse(_newer_log(NEWER, stamps=True), "log")[0]
    assert [r.out for r in stamped.rows] == [r.out for r in plain.rows] and len(plain.rows) == 4
    assert [r.out.time_us for r in plain.rows] == [95.5, 160.25, 410.0, 1402.7]
    keep = re.compile(r"(?!)")  # matches nothing: the stamp stays on the row
    old, nt._STAMP = nt._STAMP, keep
    try:
        assert parse(_newer_log(NEWER, stamps=True), "log")[0].rows == []
    finally:
        nt._STAMP = old


def test_a_newer_build_s_per_iteration_spread_is_the_rows_spread_and_the_gate_judges_by_it(
        tmp_path, capsys):
    """-I 1 (nccl-tests >= 2.19.2) times each iteration by CUDA events and prints their fastest,
    slowest, 99th percentile and variation beside each half: the imported row keeps them as its
    spread (min_us, max_us, p99_us; ``spread`` true). A new log whose means are 12% slower
    than the old one's but whose fastest iterations are not above the old means is judged
    within spread, where the same means without a spread are a regression."""
    (run,) = parse(_newer_log(NEWER, per_iter=True), "log")
    assert [(r.out.min_us, r.out.max_us, r.out.p99_us) for r in run.rows] == \
        [spread[:3] for _, _, _, spread in NEWER]
    for name, per_iter, factor in (("old", True, 1.0), ("new", True, 1.12),
                                   ("old_flat", False, 1.0), ("new_flat", False, 1.12)):
        rows = [(s, us * factor, cpu, sp) for s, us, cpu, sp in NEWER]
        (tmp_path / f"{name}.log").write_text(_newer_log(rows, per_iter=per_iter))
        assert main(["import", str(tmp_path / f"{name}.log"), "--out", str(tmp_path / name)]) == 0
    capsys.readouterr()
    old, new, old_flat, new_flat = (next((tmp_path / n).glob("*.json")) for n in
                                    ("old", "new", "old_flat", "new_flat"))
    rec = json.loads(old.read_text())
    assert all(r["spread"] is True for r in rec["rows"])
    assert [(r["min_us"], r["max_us"], r["p99_us"]) for r in rec["rows"]] == \
        [spread[:3] for _, _, _, spread in NEWER]
    assert "each iteration timed too (-I 1)" in rec["measurement"]["statistic"]
    assert main(["compare", str(old), str(new)]) == 0
    assert "not judged" in capsys.readouterr().out
    assert main(["compare", str(old_flat), str(new_flat)]) == 1


def test_a_newer_build_s_cpu_time_column_is_not_taken_for_the_op_s_time(tmp_path, capsys):
    """-C 1 prints the host's time to launch the op (``cputime``) where the op's time was, while
    algbw and busbw are still the op's: rows are timed by size / algbw, the printed time kept
    as cputime_us, no row flagged for a busbw that disagrees with its time; a row whose algbw
    prints too few digits to time it is left out, and said so."""
    rows = [*NEWER, (1024, 25.0, 11.9, (24.1, 30.0, 29.8, 4.0))]  # 0.04 GB/s: too coarse
    log = tmp_path / "cpu.log"
    log.write_text(_newer_log(rows, cputime=True))
    (run,) = parse(log.read_text(), "log")
    assert run.cputime and run.untimed == 1 and len(run.rows) == 4
    assert check_printed(run) == []
    assert main(["import", str(log), "--out", str(tmp_path / "o")]) == 0
    assert "time column is the host's launch time (-C 1)" in capsys.readouterr().err
    rec = json.loads(next((tmp_path / "o").glob("*.json")).read_text())
    for r, (size, us, cpu, _) in zip(rec["rows"], NEWER, strict=True):
        algbw = float(_float_str(size / us / 1e3, 6))  # as printed: the time read back from it
        assert r["time_us"] == pytest.approx(size / algbw / 1e3) and r["cputime_us"] == cpu
        assert abs(r["time_us"] / us - 1) < 0.005
    assert rec["measurement"]["rows_untimed"] == 1


def test_the_json_output_s_per_iteration_times_and_cpu_time_are_read():
    """The same modes in -J's JSON: ``cpu_time`` for ``time``; ``out_of_place_per_iter`` with
    every iteration's time, the first ``skipped_iterations`` left out of the spread, as
    nccl-tests' own summary leaves them out (-K)."""
    from commbench.results.nccl_tests_json import parse_json
    from commbench.results.nccl_tests_record import record

    times = [500.0, 100.0, 101.0, 102.0, 103.0, 104.0, 105.0, 106.0, 107.0, 108.0, 150.0]
    res = {"size": 1 << 20, "count": 1 << 18, "type": "float", "redop": "sum", "root": "    -1",
           "out_of_place": {"cpu_time": 9.5, "alg_bw": 9.7, "bus_bw": 9.7, "nwrong": 0},
           "out_of_place_per_iter": {"skipped_iterations": 1, "min_us": 100.0, "max_us": 150.0,
                                     "p99_us": 150.0, "times_us": times}}
    doc = {"args": ["all_reduce_perf"], "nccl_version": 22809, "results": [res],
           "config": {"iterations": 11, "devices": [
               {"rank": k, "pid": 1, "hostname": "h", "device": k} for k in range(2)]}}
    (run,) = parse_json(json.dumps(doc), "x.json")
    assert run.cputime and run.rows[0].out.cpu_us == 9.5
    assert run.rows[0].out.time_us == pytest.approx((1 << 20) / 9.7e3)
    assert run.rows[0].out.samples == tuple(times[1:])
    (row,) = record(run, "x.json")["rows"]
    assert (row["min_us"], row["max_us"], row["p10_us"], row["n_samples"]) == \
        (100.0, 150.0, 101.0, 10)


HEADERLESS = {  # file: (op, where the op came from, ranks, --ranks given, rows)
    "rccl_2078_all_reduce_rows_only_excerpt.log": ("all_reduce", "footer", 16, None, 4),
    "rccl_2075_broadcast_rows_only_excerpt.log": ("broadcast", "footer", 2, "2", 10),
    "mooncake_3484_all_reduce_rows_only_excerpt.log": ("all_reduce", "columns", 8, None, 11)}


@pytest.mark.parametrize("name", sorted(HEADERLESS))
def test_rows_pasted_without_any_header_are_read_by_their_shape(name, tmp_path, capsys):
    """Tables pasted as rows alone (ROCm/rccl#2078 and #2075 with rccl-tests' closing lines,
    kvcache-ai/Mooncake#3484 rows only): 13 cells each, read as size count type redop root and
    the two sides' time algbw busbw #wrong; checked against the rows split here."""
    op, origin, ranks, given, n = HEADERLESS[name]
    args = ["import", os.path.join(DATA, name), "--out", str(tmp_path)]
    assert main(args + (["--ranks", given] if given else [])) == 0
    out = capsys.readouterr().out
    assert "# columns: 13 cells: size count type redop root time algbw busbw #wrong" in out
    (f,) = tmp_path.glob("*.json")
    rec = json.loads(f.read_text())
    assert (rec["rows"][0]["op"], rec["measurement"]["op_from"], rec["world_size"]) == \
        (op, origin, ranks)
    raw = {k: line.split() for k, line in enumerate(_text(name).splitlines(), 1)
           if re.match(r"^\s*\d+\s+\d+\s", line)}
    assert sorted(r["line"] for r in rec["rows"]) == sorted(raw) and len(raw) == n
    for row in rec["rows"]:
        toks = raw[row["line"]]
        assert (row["size"], row["count"], row["time_us"], row["log_busbw"],
                row["inplace_us"]) == (int(toks[0]), int(toks[1]), float(toks[5]),
                                       float(toks[7]), float(toks[9]))


def test_a_row_s_shape_is_read_only_where_it_is_nccl_tests_and_no_header_is_anywhere():
    from commbench.results.nccl_tests import shape_columns

    old = "8 2 float sum 25.34 0.00 0.00 0e+00 24.90 0.00 0.00 0e+00".split()
    cols, _ = shape_columns(old)
    assert cols == ("size", "count", "type", "redop", "time", "algbw", "busbw", "error",
                    "time", "algbw", "busbw", "error")
    assert shape_columns("8 2 floaty sum -1 1 2 3 0 1 2 3 0".split()) is None
    assert shape_columns("8 2 float sum x 1 2 3 0 1 2 3 0".split()) is None
    assert shape_columns("8 2 float sum -1 1 2 3 0 1 2".split()) is None
    # a log with a header: its tables are read by it, a stray row of the shape is no table
    text = _text("cscs_gh200_2x1_all_reduce.log")
    stray = "  8 2 float sum -1 1.0 0.00 0.00 0 1.0 0.00 0.00 0\n"
    assert [len(r.rows) for r in parse(stray + text)] == [len(r.rows) for r in parse(text)]
