"""``commbench calibrate``: NCCL's model fitted to real multi-node logs (CSCS' GH200 all-reduce,
an HGX H100 pair's from NVIDIA/nccl-tests#309; tests/data/nccl_tests), judged on rows held out
of the fit; the fit recovers figures it was generated with; a log of one node says it cannot
calibrate the network; the calibrated file is a topology every command takes."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
from said import said

from commbench.cli.main import main
from commbench.costmodel import calibrate
from commbench.costmodel.calibrate import Measured, error, fit, held_out, interpolated, predict_us
from commbench.costmodel.nccl import nccl_predict, nvls_tree_chunk
from commbench.costmodel.topology import load
from commbench.results.nccl_tests import parse

pytestmark = pytest.mark.nccltests

DATA = os.path.join(os.path.dirname(__file__), "data", "nccl_tests")
V = "2.30.7"


def _rows(name: str, min_size: int = 64 << 10) -> list[Measured]:
    with open(os.path.join(DATA, name)) as f:
        run = parse(f.read(), name)[0]
    return [Measured(run.op, r.size, len(run.hosts), run.gpus_per_node, r.out.time_us, name)
            for r in run.rows if r.size >= min_size]


def _busbw_err(x: float) -> float:
    return abs(1 / (1 + x) - 1)


@pytest.fixture(scope="module")
def held():
    return held_out(load("alps-gh200"), _rows("cscs_gh200_2x4_all_reduce.log"), V)


def test_held_out_large_rows_are_predicted_within_the_target(held):
    largest = [(m.size, x) for s, m, _, x in held if s == "largest"]
    assert [s for s, _ in largest] == [64 << 20, 128 << 20]
    assert all(_busbw_err(x) <= 0.10 for _, x in largest), largest
    alternate = {m.size: x for s, m, _, x in held if s == "alternate"}
    assert all(_busbw_err(x) <= 0.10 for size, x in alternate.items() if size >= 8 << 20), alternate


def test_calibration_improves_every_held_out_row_of_a_mebibyte_and_more(held):
    big = [(m.size, b, x) for _, m, b, x in held if m.size >= 1 << 20]
    assert len(big) == 6
    assert all(abs(x) < abs(b) for _, b, x in big), big
    # the one miss, measured: at 2 MiB the log itself is irregular (1 -> 2 MiB costs 18 us,
    # 2 -> 4 MiB 111 us), so a smooth model fitted on its neighbours misses it by 15.6% in busbw
    miss = {size: _busbw_err(x) for size, _, x in big if _busbw_err(x) > 0.10}
    assert set(miss) <= {2 << 20}


H100_PAIRS = ("nccl_tests_309_h100_2x8_all_reduce.log", "nccl_tests_309_h100_2x8_1m_all_reduce.log")


@pytest.mark.parametrize("name", H100_PAIRS)
def test_two_h100_clusters_held_out_rows_are_predicted_within_the_target(name):
    """NVIDIA/nccl-tests#309's two pairs of HGX H100 nodes (8 x 400G InfiniBand each; two
    clusters) on the NDR preset: calibrated, every held-out row of >= 1 MiB is closer than the
    preset was and within 10% in busbw. Measured: worst 8.9% and 9.8%, both at 2 MiB."""
    held = held_out(load("cluster-h100-ndr"), _rows(name), V)
    big = [(m.size, b, x) for s, m, b, x in held if m.size >= 1 << 20]
    assert len(big) == 9
    assert all(_busbw_err(x) < _busbw_err(b) for _, b, x in big), big
    assert all(_busbw_err(x) <= 0.10 for _, _, x in big), big


@pytest.mark.parametrize("name", H100_PAIRS)
def test_without_nvls_tree_s_pipeline_fill_the_32_mib_row_misses(name, monkeypatch):
    """Negative: the fit without NVLS-tree's pipeline fill (the broken variant) must miss the
    row the fill explains. NCCL's chunk is 64 KiB at 32 MiB and 128 KiB from 64 MiB on; without
    the fill, the fit draws one line through 16 and 64 MiB and prices 32 MiB 11.3% and 12.6%
    too slow in busbw."""
    monkeypatch.setattr(calibrate, "NVLS_TREE_FILL", 0.0)
    held = held_out(load("cluster-h100-ndr"), _rows(name), V)
    worst = max(((m.size, _busbw_err(x)) for _, m, _, x in held if m.size >= 1 << 20),
                key=lambda sx: sx[1])
    assert worst[0] == 32 << 20 and worst[1] > 0.10, worst


def test_nvls_tree_s_chunk_steps_with_the_size_as_nccl_cuts_it():
    """``calcCollChunking`` (NCCL 2.21-2.30) on 16 NVLS channels x 8 heads: 32 KiB below
    8 MiB, 64 KiB below 64 MiB, 128 KiB from there on two nodes; never above 64 KiB at four
    nodes or more; unknown across Blackwell nodes. A calibrated topology's fill steps with it."""
    two = load("cluster-h100-ndr").part(2, 8)
    chunk = {s: nvls_tree_chunk(s, two, 16) for s in (1 << 20, (8 << 20) - 1, 8 << 20,
                                                       32 << 20, (64 << 20) - 1, 64 << 20,
                                                       1 << 30)}
    assert chunk == {1 << 20: 32 << 10, (8 << 20) - 1: 32 << 10, 8 << 20: 64 << 10,
                     32 << 20: 64 << 10, (64 << 20) - 1: 64 << 10, 64 << 20: 128 << 10,
                     1 << 30: 128 << 10}
    eight = two.with_nodes(8)
    assert [nvls_tree_chunk(s, eight, 16) for s in (1 << 20, 8 << 20, 1 << 30)] == \
        [32 << 10, 64 << 10, 64 << 10]
    assert nvls_tree_chunk(1 << 30, replace(two, arch="blackwell"), 16) is None
    filled = replace(two, chunk_fill={"nvls_tree": 2.0})
    step = [nccl_predict("all_reduce", s, t, V, algo="nvls_tree", proto="Simple")
            for t in (two, filled) for s in (32 << 20, 64 << 20)]
    alg = step[0].alg_bw
    assert step[2].lat_us - step[0].lat_us == pytest.approx(2 * (64 << 10) * 128 / (1000 * alg))
    assert step[3].lat_us - step[1].lat_us == pytest.approx(2 * (128 << 10) * 128 / (1000 * alg))


def test_a_two_node_calibration_is_far_off_at_eight_nodes_and_predict_says_so(tmp_path, capsys):
    """NVIDIA/nccl-tests#309's second cluster (H100, 8 x 400G InfiniBand a node), one run at 2
    nodes and one at 8: fitted on the 2-node run, the model prices the 8-node run's all-reduces
    of 1 GiB and more 21 to 28% too slow in busbw, about as far off as the uncalibrated preset
    (19 to 30% too fast): NCCL's tree at 2 nodes is its own case, and the fitted figures are
    effective ones for it. So predict warns wherever a calibrated topology is priced at a node
    count its logs did not have."""
    two, eight = (_rows(f"nccl_tests_309_h100_{n}_all_reduce.log", 1 << 20)
                  for n in ("2x8_1m", "8x8"))
    base = load("cluster-h100-ndr")
    fitted = fit(base, two, V).topology
    big = [m for m in eight if m.size >= 1 << 30]

    def busbw(topo, m):  # model busbw / measured - 1
        return 1 / (1 + error(topo, m, V)) - 1

    assert all(busbw(fitted, m) < -0.2 and busbw(base, m) > 0.15 for m in big), \
        [(m.size, busbw(fitted, m), busbw(base, m)) for m in big]
    path = str(tmp_path / "two.json")
    assert main(["calibrate", os.path.join(DATA, "nccl_tests_309_h100_2x8_1m_all_reduce.log"),
                 "--topology", "cluster-h100-ndr", "--json", path]) == 0
    assert json.load(open(path))["calibration"]["nodes"] == [2]
    capsys.readouterr()
    for nodes, warned in ((2, False), (8, True)):
        assert main(["predict", "layout", "--topology", path, "--nodes", str(nodes), "--tp", "8",
                     "--dp", str(nodes)]) == 0
        out = capsys.readouterr().out
        assert ("# warning: cluster-h100-ndr-calibrated was calibrated on runs of 2 node(s) and "
                f"is priced here at {nodes}" in out) is warned, out[:600]
    assert main(["predict", "collective", "all_reduce", "1G", "--topology", path]) == 0
    assert "calibrated on runs of 2 node(s) and is priced here at 16" in capsys.readouterr().out
    assert main(["import", os.path.join(DATA, "nccl_tests_309_h100_8x8_all_reduce.log"),
                 "--topology", path, "--out", str(tmp_path / "imported")]) == 0
    assert "; warning: cluster-h100-ndr-calibrated was calibrated on runs of 2 node(s) and is " \
           "priced here at 8" in capsys.readouterr().out


def test_a_topology_fitted_on_another_cluster_state_misses(held):
    """Negative: the network without its Slingshot hook (the same nodes, 20x slower at 128 MiB)
    calibrates a topology that must not pass for the healthy run."""
    other = fit(load("alps-gh200"), _rows("cscs_gh200_2x4_all_reduce_nocxi.log"), V).topology
    errs = [_busbw_err(error(other, m, V)) for m in _rows("cscs_gh200_2x4_all_reduce.log")
            if m.size >= 1 << 20]
    assert min(errs) > 0.5


def test_the_fit_recovers_the_figures_it_was_generated_with():
    base = load("cluster-h100-ndr")
    truth = replace(base, intra_GBps=180.0, nic_GBps=31.0, latency_inter_us=12.0,
                    chunk_fill={"nvls_tree": calibrate.NVLS_TREE_FILL})
    rows = [Measured("all_reduce", 1 << k, nodes, per, predict_us(truth, m, V), "made")
            for nodes, per in ((1, 8), (2, 8), (4, 8)) for k in range(16, 31, 2)
            for m in [Measured("all_reduce", 1 << k, nodes, per, 1.0)]]
    got = fit(base, rows, V)
    assert all(abs(error(got.topology, m, V)) < 0.01 for m in rows)
    t = got.topology
    assert (t.nic_GBps, t.latency_inter_us) == (pytest.approx(31.0, rel=0.02),
                                                pytest.approx(12.0, abs=0.5))
    assert t.intra_GBps == pytest.approx(180.0, rel=0.05)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_the_fit_reproduces_all_gather_and_reduce_scatter_rows_it_was_generated_with(op):
    """No public log of several sizes of all-gather or reduce-scatter across nodes is in the
    corpus, so the fit is held to rows the model made for them on 1, 2 and 4 nodes: far off
    before the fit, within 1% after it. (These rows do not identify the NIC's figure on their
    own: 37 GB/s fitted against 31 made, with the same times.)"""
    base = load("cluster-h100-ndr")
    truth = replace(base, intra_GBps=180.0, nic_GBps=31.0, latency_inter_us=12.0,
                    chunk_fill={"nvls_tree": calibrate.NVLS_TREE_FILL})
    rows = [Measured(op, 1 << k, nodes, 8, predict_us(truth, m, V), "made")
            for nodes in (1, 2, 4) for k in range(16, 31, 2)
            for m in [Measured(op, 1 << k, nodes, 8, 1.0)]]
    assert max(abs(error(base, m, V)) for m in rows) > 0.3
    got = fit(base, rows, V).topology
    assert max(abs(error(got, m, V)) for m in rows) < 0.01


def test_a_log_of_one_node_cannot_calibrate_the_network(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert main(["calibrate", os.path.join(DATA, "rccl_mi300x_g8_all_reduce.log"),
                 "--topology", "dgx-h100", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "not fitted: nic_GBps, latency_inter_us: the logs cover only one node, so they " \
           "cannot calibrate inter-node links" in text
    data = json.loads(out.read_text())
    assert data["nic_GBps"] == load("dgx-h100").nic_GBps and data["intra_GBps"] > 0


def test_the_calibrated_file_is_a_topology_every_command_takes(tmp_path, capsys):
    out = tmp_path / "alps.json"
    assert main(["calibrate", os.path.join(DATA, "cscs_gh200_2x4_all_reduce.log"),
                 "--topology", "alps-gh200", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "held-out rows of >= 1 MiB: worst busbw error" in text
    topo = load(str(out))
    assert topo.calibration["logs"] == ["cscs_gh200_2x4_all_reduce.log"] and topo.proto_bw
    assert main(["predict", "collective", "all_reduce", "128M", "--topology", str(out)]) == 0
    assert main(["predict", "layout", "--topology", str(out), "--tp", "4", "--dp", "2"]) == 0
    assert main(["import", os.path.join(DATA, "cscs_gh200_2x4_all_reduce.log"), "--topology",
                 str(out), "--out", str(tmp_path / "imp")]) == 0


@pytest.mark.parametrize("args, words", [
    (["--topology", "nope"], "no such preset or file"),
    (["--topology", "alps-gh200", "--min-size", "1G"], "no rows of at least"),
    (["--topology", "alps-gh200", "--nccl-version", "1.0"], "--nccl-version 1.0"),
])
def test_bad_calibrations_are_one_line_and_exit_2(args, words, tmp_path, capsys):
    code = main(["calibrate", os.path.join(DATA, "cscs_gh200_2x4_all_reduce.log"), *args,
                 "--json", str(tmp_path / "x.json")])
    assert code == 2 and not (tmp_path / "x.json").exists()
    err = said(capsys).strip().splitlines()
    assert len(err) == 1 and words in err[0]


def test_a_log_of_more_gpus_per_node_than_the_topology_is_refused(tmp_path, capsys):
    code = main(["calibrate", os.path.join(DATA, "rccl_mi300x_g8_all_reduce.log"), "--topology",
                 "alps-gh200", "--json", str(tmp_path / "x.json")])
    assert code == 2 and "8 GPUs per node, 4 in alps-gh200" in said(capsys)


def test_a_row_whose_out_of_place_run_met_a_hiccup_is_fitted_at_its_in_place_time(
        tmp_path, capsys):
    """NVIDIA/nccl-tests#309's 8-node log has one row whose out-of-place run took 4x its
    in-place run (8 MiB: 1272.4 us against 321.4, between rows of 204 and 378 us): the same
    bytes, the same algorithm, a disturbed run. Calibration takes such a row (1.5x apart or
    more) at its in-place time and says so; every other row keeps its out-of-place time
    (nccl-tests' convention). Fitted with the hiccup, a held-out row was 414% off."""
    log = os.path.join(DATA, "nccl_tests_309_h100_8x8_all_reduce.log")
    path = str(tmp_path / "eight.json")
    assert main(["calibrate", log, "--topology", "cluster-h100-ndr", "--json", path]) == 0
    out = capsys.readouterr().out
    assert "# 1 row(s) taken at their in-place time, their out-of-place run 1.5x slower or " \
           "more (a hiccup): nccl_tests_309_h100_8x8_all_reduce.log 8388608 B (1272.4 us out " \
           "of place, 321.4 in place)" in out
    table = {int(line.split()[2]): float(line.split()[3]) for line in out.splitlines()
             if line.startswith("nccl_tests_309_h100_8x8_all_reduce.log  all_reduce")}
    assert table[8 << 20] == 321.4
    assert (table[4 << 20], table[16 << 20]) == (203.8, 378.1)  # out of place, as logged
    worst = float(out.split("worst busbw error ")[1].split("%")[0])
    assert worst < 50, out


def test_the_log_s_own_bends_are_measured_without_a_model(tmp_path, capsys):
    """Each alternate held-out row read off the line through its two neighbours (log-log): zero
    on a power law, the planted bend on a row moved off it, and on the real logs the floor
    that a model as smooth as the rows cannot go below: NVIDIA/nccl-tests#290's 2-node log bends
    by 14.5% at 16 MiB, beyond the 10% target; #309's first by 8.9%, within it."""
    line = [Measured("all_reduce", 1 << k, 2, 8, 3.0 * (1 << k) ** 0.7, "p") for k in range(20, 27)]
    assert all(abs(x) < 1e-12 for _, x in interpolated(line))
    bent = [replace(m, time_us=m.time_us * 1.25) if m.size == 1 << 23 else m for m in line]
    assert [(m.size, round(x, 12)) for m, x in interpolated(bent)] == \
        [(1 << 21, 0.0), (1 << 23, round(1 / 1.25 - 1, 12)), (1 << 25, 0.0)]
    floors = {}
    for name in ("nccl_tests_290_h100_2x8_srun_all_reduce.log",
                 "nccl_tests_309_h100_2x8_all_reduce.log"):
        big = [(m.size, _busbw_err(x)) for m, x in interpolated(_rows(name)) if m.size >= 1 << 20]
        floors[name] = max(big, key=lambda sx: sx[1])
    assert floors["nccl_tests_290_h100_2x8_srun_all_reduce.log"][0] == 16 << 20
    assert floors["nccl_tests_290_h100_2x8_srun_all_reduce.log"][1] == pytest.approx(0.145, abs=0.001)
    assert floors["nccl_tests_309_h100_2x8_all_reduce.log"] == (32 << 20, pytest.approx(0.089, abs=0.001))
    assert main(["calibrate", os.path.join(DATA, "nccl_tests_290_h100_2x8_srun_all_reduce.log"),
                 "--topology", "cluster-h100-ndr", "--json", str(tmp_path / "c.json")]) == 0
    assert "# the log's own bends: each alternate held-out row of >= 1 MiB read off the line " \
           "through its two neighbours (log-log) misses by up to 14.5% in busbw " \
           "(nccl_tests_290_h100_2x8_srun_all_reduce.log 16777216 B)" in capsys.readouterr().out
