"""The command line: info, run, compare; every bad argument is one line and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from command import commbench
from said import said

from commbench.cli.main import main
from commbench.results.compare import CompareError, compare, load

pytestmark = pytest.mark.collectives


def _cli(*args: str, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(commbench(*args, env=env), capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize(("args", "message"), [
    (["run", "-b", "0"], "must be > 0"),
    (["run", "-b", "64", "-e", "8"], "-e 8 is below -b 64"),
    (["run", "-b", "-8"], "size '-8'"),
    (["run", "frobnicate"], "unknown suite, collective or pattern 'frobnicate'"),
    (["run", "ulyses"], "did you mean ulysses"),
    (["run", "alreduce"], "patterns: tp_mlp"),
    (["run", "-d", "complex64"], "-d complex64: unknown dtype"),
    (["run", "-o", "xor"], "-o xor: must be sum, prod, min, max or avg"),
    (["run", "-o", "avg", "-d", "int32"], "avg needs a floating dtype"),
    (["run", "-n", "0"], "-n 0: must be 1 to 1048576"),
    (["run", "-n", "99999999999"], "-n 99999999999: must be 1 to 1048576"),
    (["run", "-w", "1048577"], "-w 1048577: must be 0 to 1048576"),
    (["run", "-n", "1024", "--batch", "1025"], "-n 1024 --batch 1025: at most 1048576 timed calls"),
    (["run", "--np", "0"], "--np 0: must be >= 1"),
    (["run", "-f", "1"], "-f 1: must be >= 2"),
    (["run", "all_reduce", "--algo", "quantum"], "--algo quantum: not built for all_reduce"),
    (["run", "overhead", "all_reduce"], "overhead is a study of its own"),
    (["run", "versus", "all_reduce"], "versus is a study of its own"),
    (["run", "versus", "--rounds", "0"], "--rounds 0: must be 1 to 1048576"),
    (["run", "--repeat", "0"], "--repeat 0: must be 1 to 1048576"),
    (["run", "--repeat", "99999999999"], "--repeat 99999999999: must be 1 to 1048576"),
    (["run", "--batch", "0"], "--batch 0: must be 1 to 1048576"),
    (["run", "all_reduce", "--refit"], "--refit: an option of the model study"),
    (["run", "all_reduce", "--cal-samples", "2"], "--cal-samples: an option of the model study"),
    (["run", "model", "--cal-samples", "0"], "--cal-samples 0: must be 1 to 1048576"),
    (["run", "--repeat", "2", "--resume"], "--resume works with --repeat 1 only"),
    (["run", "--topology", "cray-1"], "--topology: topology 'cray-1': no such preset"),
    (["run", "model", "all_reduce"], "model is a study of its own"),
    (["run", "model", "--repeat", "2", "--rounds", "3"], "--repeat 2 --rounds 3: the model study"),
])
def test_bad_run_arguments_fail_before_any_rank_starts(args, message, capsys):
    assert main(args) == 2
    err = said(capsys)
    assert err.startswith("commbench: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.local  # assumes no launcher around pytest
def test_run_prints_the_table_and_writes_results(tmp_path):
    """nccl-tests' layout (names, then units; min/avg/max beside the median; a closing Avg bus
    bandwidth line), OSU's and nccl-tests' names of the collective, -J and --csv, and one row
    where sizes round to the same bytes (4, 8 and 16 B of all-gather on 2 ranks are all 0 B)."""
    out = _cli("run", "allreduce", "all_gather_perf", "--np", "2", "-b", "4", "-e", "1K", "-f",
               "2", "-n", "3", "-w", "1", "--algo", "native,ring", "--out", str(tmp_path),
               "--label", "test-box", "-J", str(tmp_path / "j.json"), "--csv",
               str(tmp_path / "rows.csv"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    names = next(k for k, line in enumerate(lines) if line.startswith("#") and "busbw" in line)
    assert lines[names].split()[9:16] == ["time", "p99", "min", "avg", "max", "algbw", "busbw"]
    assert lines[names + 1].split()[:3] == ["#", "(B)", "(elems)"] and "(GB/s)" in lines[names + 1]
    rows = [line.split() for line in lines if line and not line.startswith("#")]
    assert {r[6] for r in rows} == {"native", "ring"} and all(r[15] == "0" for r in rows)
    assert all(float(r[10]) <= float(r[8]) <= float(r[12]) for r in rows)  # min <= median <= max
    assert all(len(line) == len(lines[names + 2]) for line in lines[names + 2:] if
               line.startswith(" ") and "all_reduce" in line)  # aligned
    zero = [r for r in rows if r[0] == "all_gather" and r[1] == "0"]
    assert len(zero) == 4  # one per (algo, transport)
    assert "# Out of bounds values : 0 OK" in lines
    assert any(line.startswith("# Avg bus bandwidth    : ") for line in lines)
    every = json.loads((tmp_path / "j.json").read_text())["rows"]
    assert len(every) == len(rows)
    csv_lines = (tmp_path / "rows.csv").read_text().splitlines()
    assert csv_lines[0].startswith("op,algo,transport,size") and len(csv_lines) == len(rows) + 1
    written = sorted(p.name for p in tmp_path.iterdir())
    for t in ("gloo", "mpi"):
        assert f"all_reduce_all_gather_test-box-{t}-x2.json" in written
        assert f"all_reduce_all_gather_test-box-{t}-x2.md" in written
    record = load(str(tmp_path / "all_reduce_all_gather_test-box-gloo-x2.json"))
    assert record["measurement"]["rank_aggregation"] == "per-iteration max over ranks"
    assert all(r["sent"] == r["pred_sent"] for r in record["rows"])


@pytest.mark.local  # assumes no launcher around pytest
def test_batched_cadence_checks_one_call_and_books_every_call(tmp_path):
    """Samples of 3 back-to-back calls: in-place inputs are reduced again inside a sample, yet
    the checked result is one call's, and the bytes booked per call still equal the formula."""
    out = _cli("run", "all_reduce", "--np", "2", "-b", "64", "-e", "4K", "-f", "8", "-n", "2",
               "-w", "1", "--batch", "3", "--algo", "native,ring,ring_compiled", "--out",
               str(tmp_path), "--label", "test-box")
    assert out.returncode == 0, out.stderr
    for t in ("gloo", "mpi"):
        record = load(str(tmp_path / f"all_reduce_test-box-{t}-x2.json"))
        assert record["measurement"]["cadence"].startswith("batched (3 calls")
        assert record["measurement"]["batch"] == 3
        assert {r["algo"] for r in record["rows"]} == {"native", "ring", "ring_compiled"}
        assert all(r["wrong"] == 0 and r["sent"] == r["pred_sent"] for r in record["rows"])


@pytest.mark.local  # assumes no launcher around pytest
def test_info_without_a_launcher():
    out = _cli("info")
    assert out.returncode == 0 and "# launcher   : none" in out.stdout and "gloo yes" in out.stdout


@pytest.mark.launcher
@pytest.mark.local  # assumes no launcher around pytest
@pytest.mark.skipif(not __import__("commbench.world.local.spawn", fromlist=["x"]).mpi_usable(),
                    reason="needs mpiexec")
def test_info_under_mpiexec_and_the_wrong_mpi_trap():
    from commbench.world.local import find_mpiexec

    out = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, "-m", "commbench", "info"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "# world size : 2" in out.stdout
    assert "Rank  0" in out.stdout and "Rank  1" in out.stdout
    import os

    # Open MPI's variables over this MPICH library: named from the library, before MPI_Init
    env = dict(os.environ, OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="4")
    trap = _cli("info", env=env)
    assert trap.returncode == 1 and trap.stderr.count("\n") == 1
    assert "Open MPI's mpirun started this rank but mpi4py loads 'MPICH" in trap.stderr



@pytest.mark.launcher
@pytest.mark.skipif(not __import__("commbench.world.local.spawn", fromlist=["x"]).mpi_usable(),
                    reason="needs mpiexec")
def test_a_gloo_run_under_mpiexec_exits_cleanly():
    """Without leaving together, about every second run had a rank abort at exit (gloo's
    teardown while its peer had already gone): three clean runs in a row."""
    from commbench.world.local import find_mpiexec

    for _ in range(3):
        out = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, "-m", "commbench", "run",
                              "all_reduce", "-b", "8", "-e", "8", "-n", "2", "--algo", "native",
                              "--transport", "gloo", "--no-write"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "terminate called" not in out.stderr, out.stderr[-2000:]


def test_close_waits_for_every_rank_then_destroys_and_names_a_missing_one(monkeypatch, capsys):
    import types

    from commbench.world import context as context_mod

    calls = []

    def barrier(timeout):
        calls.append(("barrier", timeout.total_seconds()))
        if len(calls) > 1:
            raise RuntimeError("Rank 1 failed to pass monitoredBarrier in 5000 ms\nmore")

    fake = types.SimpleNamespace(is_initialized=lambda: True, monitored_barrier=barrier,
                                 destroy_process_group=lambda: calls.append(("destroy",)))
    ctx = context_mod.Context(rank=0, size=2, torch_ready=False)
    ctx.backend = "gloo"
    monkeypatch.setattr(context_mod, "dist", fake)
    ctx.close()  # alone: no wait
    assert calls == [("destroy",)]
    calls.clear()
    ctx.close(together_s=5)
    assert calls == [("barrier", 5.0), ("destroy",)]
    calls.clear()
    calls.append(("earlier",))  # the next barrier fails: a rank never came
    ctx.close(together_s=5)
    assert calls[-1] == ("destroy",)
    assert "closing without the others: Rank 1 failed to pass" in capsys.readouterr().err


def _record(rows, world_size=2):
    return {"schema": "commbench.results.records/1", "world_size": world_size, "rows": rows}


def _row(size, time_us, min_us, busbw, **kw):
    return dict({"op": "all_reduce", "algo": "ring", "transport": "gloo", "type": "float32",
                 "redop": "sum", "root": -1, "size": size, "time_us": time_us, "min_us": min_us,
                 "busbw": busbw}, **kw)


def test_compare_flags_a_planted_regression_and_passes_noise():
    old = _record([_row(1 << 20, 100.0, 90.0, 10.0), _row(1 << 10, 10.0, 9.0, 0.1)])
    planted = _record([_row(1 << 20, 125.0, 112.0, 8.0), _row(1 << 10, 20.0, 18.0, 0.05)])
    rows, bad = compare(old, planted)
    assert [b["size"] for b in bad] == [1 << 20]  # the small size is below the gate's min_size
    noisy = _record([_row(1 << 20, 120.0, 85.0, 8.3), _row(1 << 10, 10.0, 9.0, 0.1)])
    assert compare(old, noisy)[1] == []  # slower median, but the best iteration overlaps


def test_compare_does_not_count_a_slow_spell_on_one_size_of_a_series():
    sizes = [1 << 16, 1 << 18, 1 << 20, 1 << 22]
    old = _record([_row(s, 100.0, 90.0, 10.0) for s in sizes])
    spell = _record([_row(s, 150.0 if s == 1 << 20 else 100.0, 130.0 if s == 1 << 20 else 90.0,
                          6.7 if s == 1 << 20 else 10.0) for s in sizes])
    rows, bad = compare(old, spell)
    assert bad == [] and len(rows) == 4
    two = _record([_row(s, 150.0 if s >= 1 << 20 else 100.0, 130.0 if s >= 1 << 20 else 90.0,
                        6.7 if s >= 1 << 20 else 10.0) for s in sizes])
    assert compare(old, two)[1] == []  # two sizes: within what a slow spell does here
    three = _record([_row(s, 150.0 if s >= 1 << 18 else 100.0, 130.0 if s >= 1 << 18 else 90.0,
                          6.7 if s >= 1 << 18 else 10.0) for s in sizes])
    assert [b["size"] for b in compare(old, three)[1]] == [1 << 18, 1 << 20, 1 << 22]
    both = _record([_row(s, 100.0, 90.0, 10.0, algo=a) for s in sizes for a in ("ring", "naive")])
    apart = _record([_row(s, *((150.0, 130.0, 6.7) if (s, a) in ((1 << 20, "ring"),
                                                                 (1 << 18, "naive"))
                                else (100.0, 90.0, 10.0)), algo=a)
                     for s in sizes for a in ("ring", "naive")])
    assert compare(both, apart)[1] == []  # a neighbour must be of the same series


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not valid JSON"),
    ('{"schema": "commbench.results.records/1", "world_size": 2, "rows": [{"op": "x"}]', "not valid JSON"),
    ('{"schema": "commbench.results.records/0", "world_size": 2, "rows": []}', "schema"),
    ('{"rows": []}', "no 'schema' field"),
    ('{"schema": "commbench.results.records/1", "world_size": 2, "rows": [{"op": "x"}]}', "row 0 lacks"),
])
def test_compare_refuses_bad_files(tmp_path, content, message, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_record([_row(1 << 20, 1.0, 1.0, 1.0)])))
    assert main(["compare", str(good), str(bad)]) == 2
    err = said(capsys)
    assert message in err and "Traceback" not in err


def test_compare_refuses_different_world_sizes():
    with pytest.raises(CompareError, match="world sizes differ"):
        compare(_record([], 2), _record([], 4))


def test_repeated_rounds_keep_the_best_round_and_every_round_median():
    from commbench.studies.sweep import merge_rounds

    def row(t, lo, wrong=0):
        return {"op": "all_reduce", "size": 1 << 20, "time_us": t, "min_us": lo,
                "p10_us": 1.1 * lo, "p99_us": 2 * t, "max_us": 3 * t, "wrong": wrong,
                "algbw": 0.0, "busbw": 0.0}
    merged = merge_rounds([[row(300.0, 250.0)], [row(200.0, 190.0, 1)], [row(250.0, 180.0)]], 2)
    (m,) = merged
    assert (m["time_us"], m["min_us"], m["p99_us"], m["wrong"]) == (200.0, 180.0, 400.0, 1)
    assert m["p10_us"] == pytest.approx(1.1 * 190.0)  # the best round's, as its median
    assert m["rounds_us"] == [300.0, 200.0, 250.0]
    assert m["busbw"] == pytest.approx((1 << 20) / 200e-6 / 1e9)  # n = 2: factor 1


@pytest.mark.parametrize("args, counts", [
    (["model"], (1, 10, 2)), (["model", "--repeat", "2"], (1, 10, 2)),
    (["model", "--rounds", "3", "-n", "30"], (3, 30, 2)), (["versus"], (6, 20, 5)),
    (["overhead"], (6, 20, 5)), (["all_reduce", "-w", "0"], (6, 20, 0))])
def test_rounds_and_iterations_default_per_study(args, counts):
    """The model study: one pass, -n 10 -w 2 (its validated settings); versus and overhead:
    6 interleaved rounds; every other target -n 20 -w 5; what is given is kept."""
    from commbench.cli.main import _parser
    from commbench.cli.run_args import check_run_args as _check_run_args

    a = _parser().parse_args(["run", *args])
    _check_run_args(a)
    assert (a.rounds, a.iters, a.warmup_iters) == counts


def test_results_are_named_by_machine_class():
    from commbench.results.machine import machine_class, slug

    assert slug("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz") == "intel-xeon-platinum-8481c"
    assert slug("AMD EPYC 7B13 64-Core Processor") == "amd-epyc-7b13-64-core"
    assert slug("NVIDIA H200") == "nvidia-h200"
    assert machine_class("my-box") == "my-box"
    name = machine_class()
    assert name == slug(name) and name.endswith(("c", "gpu")) and name != "cpu"
    with pytest.raises(ValueError, match="--label 'My Box': use lower-case letters"):
        machine_class("My Box")


@pytest.mark.local  # assumes no launcher around pytest
def test_a_sweep_compares_with_the_table_it_replaces(tmp_path):
    """A second run with the same settings prints the gate's verdict against the first."""
    args = ("run", "all_reduce", "--np", "2", "-b", "8", "-e", "64", "-f", "8", "-n", "2", "-w",
            "1", "--algo", "native", "--launch", "plain", "--transport", "gloo", "--out",
            str(tmp_path), "--label", "test-box")
    assert _cli(*args).returncode == 0
    again = _cli(*args)
    assert again.returncode == 0 and "# against the table it replaces" in again.stdout
    assert "no regression in 2 matched rows" in again.stdout


def test_a_table_measured_with_other_settings_is_not_written_over(tmp_path):
    from commbench.results import records as res
    from commbench.studies.collectives import _previous

    path = str(tmp_path / "t.json")
    record = res.header("collectives", 2, "local-plain", "test-box", {})
    res.write_json(path, {**record, "settings": {"iters": 2, "sizes": [8]}})
    assert _previous(path, {"iters": 2, "sizes": [8]})["settings"] == {"iters": 2, "sizes": [8]}
    with pytest.raises(ValueError, match=r"t.json holds a run with other settings \(iters\); "
                                         r"give --out another folder or --label another name"):
        _previous(path, {"iters": 3, "sizes": [8]})
    res.write_json(path, record)  # a table from before settings were recorded
    with pytest.raises(ValueError, match=r"other settings \(not recorded\)"):
        _previous(path, {"iters": 2, "sizes": [8]})


@pytest.mark.local  # assumes no launcher around pytest
def test_the_default_suite_runs_every_collective_and_algorithm(tmp_path):
    """`make bench`'s suite, every collective and algorithm on both transports, at one size."""
    out = _cli("run", "--np", "2", "-b", "64", "-e", "64", "-n", "2", "-w", "1", "--no-write")
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line and not line.startswith("#")]
    ops = {r[0] for r in rows}
    # the committed tables' collectives; all-to-allv and barrier are run by name
    assert ops == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                   "reduce", "gather", "scatter", "sendrecv", "pingpong"}
    assert all(r[15] == "0" and r[16] == r[17] for r in rows)  # #wrong, sent = predicted


@pytest.mark.launcher
@pytest.mark.local  # assumes no launcher around pytest
@pytest.mark.skipif(not __import__("commbench.world.local.spawn", fromlist=["x"]).mpi_usable(),
                    reason="needs mpiexec")
def test_a_refusal_of_one_rank_under_a_launcher_ends_every_rank(tmp_path):
    """Rank 0 alone takes the results folder's lock; held by someone else, only rank 0 can
    refuse. The ranks agree first: both exit 2, one line from rank 0, nobody waits."""
    from commbench.results.lock import folder_lock
    from commbench.world.local import find_mpiexec

    with folder_lock(str(tmp_path)):
        out = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, "-m", "commbench", "run",
                              "all_reduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0",
                              "--out", str(tmp_path)], capture_output=True, text=True,
                             timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commbench: error: rank 0: ")
    assert "another commbench run" in lines[0]


def test_the_default_suite_is_the_one_the_committed_tables_were_measured_with():
    """`make bench` compares with the committed table of its machine class and refuses to write
    over one measured with other settings: a collective added to the default suite would make
    it refuse until every committed table is measured again."""
    import glob
    import os

    from commbench.names import SUITE

    tables = glob.glob(os.path.join(os.path.dirname(__file__), "..", "results",
                                    "collectives_*.json"))
    recorded = 0
    for path in tables:
        with open(path) as f:
            settings = json.load(f).get("settings")  # older tables recorded none
        if settings is not None:
            recorded += 1
            assert settings["ops"] == list(SUITE), path
    assert recorded
