"""The command line's contract beyond argument parsing: exit codes of failed runs, checks made
before any rank starts, the folder lock, the resume key, the stuck-rank message, fast help."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from said import said

from commbench.cli.main import _parser, main
from commbench.names import ALIASES, COLLECTIVES, canonical
from commbench.results.lock import folder_lock
from commbench.runtime.errors import describe_hang

pytestmark = [pytest.mark.faults]


def _one_line_error(capsys, *fragments: str) -> str:
    err = said(capsys)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in err, err
    return err


@pytest.mark.parametrize(("args", "fragments"), [
    (["run", "broadcast", "-r", "5", "--np", "2"], ["-r 5", "0..1"]),
    (["run", "all_reduce", "-r", "1", "--np", "2"], ["-r 1: none of all_reduce has a root"]),
    (["run", "all_reduce", "-b", "16G", "-e", "16G", "--np", "2"],
     ["-e 16G: 2 rank(s) on this host", "GiB available (MemAvailable)"]),
    (["run", "--np", "100000"], ["--np 100000", "per core"]),
    (["run", "zero", "--transport", "mpi", "-d", "int8"], ["-d --transport", "pattern study"]),
    (["run", "zero", "--algo", "ring"], ["--algo: flags of the collective sweeps"]),
    (["run", "all_reduce", "--transport", "nccl"], ["--transport nccl: this world will have"]),
    (["predict", "collective", "all_reduce", "1M", "--ranks", "100000"], ["give --nodes 12500"]),
    (["predict", "collective", "all_reduce", "1M", "--ranks", "1"], ["a world of one moves"]),
    (["claims", "--np", "1"], ["at least 2 ranks"]),
    (["run", "numerics", "--trace", "t.json"], ["--trace: a timeline of collective sweeps"]),
])
@pytest.mark.local
def test_refused_before_any_rank_starts(args, fragments, capsys):
    assert main(args) == 2
    _one_line_error(capsys, *fragments)


@pytest.mark.local
def test_an_out_that_is_a_file_or_unwritable_is_refused(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    assert main(["run", "all_reduce", "--np", "2", "--out", str(f)]) == 2
    _one_line_error(capsys, "exists and is not a folder")
    assert main(["run", "all_reduce", "--np", "2", "-J", str(tmp_path)]) == 2
    _one_line_error(capsys, "-J", "is a folder")
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        assert main(["run", "all_reduce", "--np", "2", "--out", str(ro / "sub")]) == 2
        _one_line_error(capsys, "cannot be written")
    # what root cannot write either: a folder under /proc, a name too long for the file system
    assert main(["run", "all_reduce", "--np", "2", "--out", "/proc/commbench-x"]) == 2
    _one_line_error(capsys, "--out /proc/commbench-x: cannot be written")
    assert main(["run", "all_reduce", "--np", "2", "--out", str(tmp_path / ("z" * 300))]) == 2
    _one_line_error(capsys, "cannot be written (File name too long)")
    assert main(["run", "ddp", "--np", "2", "--label", "x" * 65]) == 2
    _one_line_error(capsys, "--label of 65 characters: at most 64")


@pytest.mark.local
def test_a_second_run_into_a_held_folder_names_the_holder(tmp_path, capsys):
    with folder_lock(str(tmp_path)):
        assert main(["run", "all_reduce", "--np", "2", "--out", str(tmp_path)]) == 2
    _one_line_error(capsys, f"pid {os.getpid()}", "give --out another folder")
    with folder_lock(str(tmp_path)):  # released with the run: taken again at once
        pass


@pytest.mark.local
def test_a_run_that_fails_exits_3_in_one_line_with_its_traceback_in_a_log(tmp_path, capsys,
                                                                          monkeypatch):
    """A call that outlives its timeout: exit code 3, one line naming the op and the ranks, the
    traceback kept in the log the line names."""
    monkeypatch.delenv("COMMBENCH_DEBUG", raising=False)  # the tests' default prints tracebacks
    args = ["run", "all_reduce", "--np", "2", "-b", "8", "-e", "8", "-n", "100000", "--algo",
            "native", "--transport", "gloo", "--timeout", "3", "--out", str(tmp_path)]
    assert main(args) == 3
    err = _one_line_error(capsys, "run failed: CallTimeout", "timed all_reduce/native loop",
                          "sample", "on group [0, 1]", "traceback in ")
    log = err.rsplit("traceback in ", 1)[1].strip()
    assert "Traceback" in open(log).read()
    os.unlink(log)


def test_describe_hang_names_the_rank_behind_in_a_timing_loop():
    loop = "timed all_reduce/native loop (1 call(s) per sample, a barrier before each)"
    statuses = {0: ("in op", 2, f"{loop}, sample 41 of 50 (call #2) on group [0, 1, 2]"),
                1: ("in op", 2, f"{loop}, sample 41 of 50 (call #2) on group [0, 1, 2]"),
                2: ("in op", 2, f"{loop}, sample 40 of 50 (call #2) on group [0, 1, 2]")}
    text = describe_hang(statuses, {2: "77 stopped (SIGSTOP?)"})
    assert "(call #2, sample 41) on group [0, 1, 2]: ranks [0, 1] arrived, ranks [2] did not" \
        in text
    assert "rank 2: " + loop + ", sample 40 of 50" in text and "77 stopped" in text
    # before the loop: a rank still in its previous call is the one missing
    statuses[2] = ("in op", 1, "all_reduce (call #1) on group [0, 1, 2]")
    text = describe_hang(statuses)
    assert "ranks [0, 1] arrived, ranks [2] did not" in text


def test_a_hang_of_512_ranks_is_told_in_ranges_not_in_512_numbers():
    """At 512 ranks, half of them still in a stall: the group, who arrived and who did not are
    ranges with their counts; the ranks not arrived are told together where they all are, and
    the pids given are the first sixteen of theirs, not 512. A raise on 41 ranks, 40 of them
    alike, prints two tracebacks, not 41."""
    from commbench.runtime.errors import RemoteError, SPMDError

    w = 512
    group = "[" + ", ".join(map(str, range(w))) + "]"
    statuses = {r: ("in op", 1, f"all_reduce (call #1) on group {group}") for r in range(256)}
    statuses |= {r: ("running", 0, "running _stall, no call yet") for r in range(256, w)}
    text = describe_hang(statuses, {r: str(1000 + r) for r in range(w)})
    head, pids = text.splitlines()
    assert head == ("all_reduce (call #1) on group [0-511] (512 ranks): ranks [0-255] (256 "
                    "ranks) arrived, ranks [256-511] (256 ranks) did not (ranks 256-511: running "
                    "_stall, no call yet)")
    assert pids.count(" pid ") == 16 and pids.startswith("processes: rank 256 pid 1256,")
    assert "(the first 16 of the ranks that did not arrive; 512 processes)" in pids
    fails = [RemoteError(r, "ValueError", "bad x", "Traceback\nValueError: bad x\n")
             for r in range(40)] + [RemoteError(40, "KeyError", "k", "Traceback\nKeyError: k\n")]
    message = str(SPMDError("run", fails))
    assert message.startswith("run: 41 rank(s) [0-40] (41 ranks) raised; first: rank 0 raised")
    assert message.count("Traceback") == 2 and "--- ranks 0-39 ---" in message \
        and "--- rank 40 ---" in message


@pytest.mark.local
def test_resume_refuses_another_configuration_in_one_short_line(tmp_path, capsys):
    """The resume key: a results file measured with other iterations is refused in one line;
    another dtype is another file."""
    base = ["run", "all_reduce", "--np", "2", "-b", "8", "-e", "8", "-n", "2", "-w", "0",
            "--algo", "native", "--transport", "mpi", "--out", str(tmp_path)]
    if "mpi" not in _transports():
        pytest.skip("needs mpiexec")
    assert main(base) == 0
    capsys.readouterr()
    assert main([*base, "-n", "3", "--resume"]) == 2
    err = _one_line_error(capsys, "--resume:", "iters 2 -> 3")
    assert len(err) < 200
    assert main([*base, "-d", "float64", "--resume"]) == 0
    names = sorted(p.name for p in tmp_path.glob("*.json"))
    assert any(n.endswith("-x2-float64-sum.json") for n in names) and len(names) == 2
    rows = json.loads(next(tmp_path.glob("*float64-sum.json")).read_text())["rows"]
    assert [r["type"] for r in rows] == ["float64"]


def _transports() -> list[str]:
    from commbench.world.local.spawn import mpi_usable

    return ["gloo", "mpi"] if mpi_usable() else ["gloo"]


def test_aliases_name_the_collectives_of_nccl_tests_and_osu():
    assert canonical("all_reduce_perf") == canonical("osu_allreduce") == "all_reduce"
    assert canonical("alltoall_perf") == "all_to_all" and canonical("osu_latency") == "pingpong"
    assert canonical("zero") == "zero" and set(ALIASES.values()) <= set(COLLECTIVES)


def test_every_option_states_its_default():
    def parsers(p):
        yield p
        for action in p._actions:
            for sub in (getattr(action, "choices", None) or {}).values() if \
                    action.__class__.__name__ == "_SubParsersAction" else ():
                yield from parsers(sub)

    for p in parsers(_parser()):
        fmt = p._get_formatter()
        for action in p._actions:
            if not action.option_strings or action.default in (False, "==SUPPRESS=="):
                continue
            text = fmt._get_help_string(action) or ""
            assert "default" in text, (p.prog, action.option_strings, text)


def test_help_and_version_answer_without_importing_torch():
    code = ("import sys, contextlib, io\nfrom commbench.cli.main import main\n"
            "for argv in (['--help'], ['run', '--help'], ['predict', 'layout', '--help'], "
            "['--version']):\n"
            "    with contextlib.redirect_stdout(io.StringIO()):\n"
            "        try: main(argv)\n"
            "        except SystemExit as e: assert e.code == 0, (argv, e.code)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr



@pytest.mark.parametrize(("launcher_env", "refused"), [
    ({"RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"}, False),
    ({"PMI_RANK": "0", "PMI_SIZE": "8", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "8"}, True),
])
def test_bfloat16_is_refused_only_where_mpi_is_in_the_world(monkeypatch, launcher_env, refused):
    """torchrun's world has no MPI: a bfloat16 all-reduce runs there on gloo or NCCL; under
    mpiexec MPI is in the world and has no bfloat16 reduction."""
    from commbench.cli.common import UsageError
    from commbench.cli.run_args import check_run_args

    for k, v in launcher_env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("COMMBENCH_BACKEND", "gloo")
    a = _parser().parse_args(["run", "all_reduce", "-d", "bfloat16", "-b", "8", "-e", "8"])
    if refused:
        with pytest.raises(UsageError, match="over mpi"):
            check_run_args(a)
    else:
        check_run_args(a)


def test_every_predict_flag_says_what_it_means_and_each_command_gives_an_example():
    from commbench.cli.common import Parser

    top = _parser()
    predict = top._subparsers._group_actions[0].choices["predict"]
    for name, sub in predict._subparsers._group_actions[0].choices.items():
        assert isinstance(sub, Parser) and "Example: commbench predict " + name in sub.description
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help and len(action.help) > 8, (name, action.option_strings)


def test_every_command_s_help_gives_every_flag_a_meaning_and_an_example():
    import argparse

    from commbench.cli.main import _parser

    def parsers(name, parser):
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    yield from parsers(f"{name} {sub}", p)

    for name, parser in list(parsers("commbench", _parser()))[1:]:
        text = parser.format_help()
        blank = [a.dest for a in parser._actions if a.help in (None, "") and a.dest != "help"
                 and not isinstance(a, argparse._SubParsersAction)]
        assert not blank, f"{name}: flags without a meaning: {blank}"
        subs = any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
        assert subs or "Example" in text, f"{name} --help gives no example"


def test_the_readme_stays_a_manual_of_at_most_14_kb_and_its_doc_links_exist():
    import re

    root = os.path.join(os.path.dirname(__file__), "..")
    with open(os.path.join(root, "README.md"), "rb") as f:
        text = f.read()
    assert len(text) <= 14 * 1024, f"README.md is {len(text)} bytes: detail goes to docs/"
    links = re.findall(r"\]\((docs/[\w.-]+\.md)\)", text.decode())
    assert links and all(os.path.exists(os.path.join(root, p)) for p in links), links


def test_every_study_target_runs_a_study_and_gets_its_settings_not_the_namespace():
    import argparse

    from commbench.cli import run, run_args
    from commbench.studies.settings import StudySettings

    assert set(run.STUDIES) == set(run_args.STUDY_TARGETS)
    p = argparse.ArgumentParser()
    run_args.add_parser(p.add_subparsers(dest="cmd"))
    a = p.parse_args(["run", "model", "-b", "4K", "-n", "3", "--no-write", "--transport", "mpi"])
    a.rounds = 3
    s = run_args.study_settings(a)
    assert isinstance(s, StudySettings)
    assert (s.lo, s.hi, s.iters, s.write, s.transports) == (4096, None, 3, False, ("mpi",))
    assert s.stem("model", "mpi", 4).endswith(f"model_{s.machine}-mpi-x4")


@pytest.mark.parametrize("launcher", ["torchrun", "srun", "srun --mpi=pmi2", "mpirun (Open MPI)"])
def test_a_command_of_files_runs_on_rank_0_alone_under_any_launcher(launcher, monkeypatch):
    """analyze, import, calibrate, predict, compare and list start no ranks: under a launcher
    of 512 ranks each would read (and write) the same files 512 times. Rank 0 runs it; every
    other rank exits at once (0: the job's exit is rank 0's)."""
    from launcher_envs import SIZE, env_of

    from commbench.cli.main import OFFLINE, _elsewhere

    monkeypatch.delenv("COMMBENCH_WORKER", raising=False)
    assert _elsewhere(env_of(launcher, 0)) == SIZE
    assert all(_elsewhere(env_of(launcher, r)) == -1 for r in range(1, SIZE))
    assert _elsewhere({}) == 0
    assert {"analyze", "import", "calibrate", "predict", "compare"} <= set(OFFLINE)
    assert not {"run", "audit", "replay", "claims", "info", "gpu-check"} & set(OFFLINE)


def test_the_command_line_of_a_command_of_files_under_a_launcher(tmp_path):
    """The installed command under torchrun's variables: rank 1 says nothing, writes nothing and
    exits 0; rank 0 says on stderr that it alone runs, and does."""
    log = os.path.join(os.path.dirname(__file__), "data", "joblogs",
                       "basicsr_737_default_pg_excerpt.log")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMBENCH_", "SLURM_",
                                                                      "PMI", "OMPI_"))}
    codes = {}
    for rank in (1, 0):
        env |= {"RANK": str(rank), "WORLD_SIZE": "512", "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": "8", "MASTER_ADDR": "localhost", "MASTER_PORT": "1",
                "TORCHELASTIC_RUN_ID": "job"}
        out = tmp_path / f"r{rank}.json"
        p = subprocess.run([sys.executable, "-m", "commbench", "analyze", log, "--json", str(out)],
                           capture_output=True, text=True, env=env, timeout=120)
        codes[rank] = (p.returncode, p.stdout, p.stderr, out.exists())
    assert codes[1] == (0, "", "", False)
    code, stdout, stderr, wrote = codes[0]
    assert code == 1 and wrote and stdout.count("# commbench analyze:") == 1
    assert stderr.startswith("# analyze starts no ranks: rank 0 of the launcher's 512 runs it")
