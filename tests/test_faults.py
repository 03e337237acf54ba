"""Faults and bad input: mismatched collectives, stalls, kills and interrupts mid-sweep, fuzzed
arguments. Each ends in a bounded time with the op and the ranks named, and loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from commbench.results.compare import CompareError, load
from commbench.runtime.errors import CallTimeout, SPMDError
from commbench.world.local import LocalWorld, spawn, zygote

pytestmark = pytest.mark.faults


def _mismatched(ctx, transport, kind, board=True):
    comm, g, r = ctx.comm(transport), ctx.world, ctx.rank
    if not board:  # the agreement a launcher's ranks make: an all-gather over the group
        from commbench.wire.comm import Comm

        comm = Comm(comm.backend, comm.ledger, comm.tracker, debug=True, device=comm.device)
    x = torch.ones(4)
    if kind == "op":
        return comm.all_reduce(x, g) if r == 0 else comm.all_gather(x, g)
    if kind == "shape":
        return comm.all_reduce(torch.ones(4 + r), g)
    if kind == "dtype":
        return comm.all_reduce(x.to(torch.float64) if r else x, g)
    if kind == "redop":
        return comm.all_reduce(x, g, op="max" if r else "sum")
    if kind == "root":
        return comm.broadcast(x, g, root=r % 2)
    if kind == "async_op":  # the asynchronous calls DDP's buckets and ZeRO-3's prefetch post
        return (comm.all_reduce_async(x, g) if r == 0 else comm.all_gather_async(x, g)).wait()
    if kind == "async_shape":
        return comm.all_reduce_async(torch.ones(4 + r), g).wait()
    if kind == "async_dtype":
        return comm.all_gather_async(x.to(torch.float64) if r else x, g).wait()
    if kind == "async_redop":
        return comm.all_reduce_async(x, g, op="max" if r else "sum").wait()
    raise ValueError(kind)


@pytest.mark.world(sizes=[2, 3, 4])
@pytest.mark.parametrize(("kind", "field"), [("op", "op"), ("shape", "count"),
                                              ("dtype", "dtype"), ("redop", "redop"),
                                              ("root", "root"), ("async_op", "op"),
                                              ("async_shape", "count"),
                                              ("async_dtype", "dtype"),
                                              ("async_redop", "redop")])
def test_mismatched_collectives_are_named_before_they_start(world, kind, field):
    for transport in world.transports:
        with pytest.raises(SPMDError, match=f"the members disagree on [a-z, ]*{field}") as info:
            world.run(_mismatched, transport, kind)  # named by the check, not by a timeout
        assert len(info.value.failures) == world.size  # every rank says the same
        assert "rank 0:" in str(info.value) and "rank 1:" in str(info.value)
        # a local world's members agree through shared memory (runtime.board); a launcher's
        # ranks, which may be on other hosts, by an all-gather
        by_call = ", in agree\n" in info.value.failures[0].traceback
        assert by_call is not isinstance(world, LocalWorld)


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize(("kind", "field"), [("op", "op"), ("shape", "count"),
                                              ("root", "root"), ("async_dtype", "dtype")])
def test_without_a_board_the_members_agree_by_an_all_gather(world, kind, field):
    """The agreement of ranks on several hosts (no shared memory): the same verdict."""
    for transport in world.transports:
        with pytest.raises(SPMDError, match=f"the members disagree on [a-z, ]*{field}") as info:
            world.run(_mismatched, transport, kind, False)
        assert len(info.value.failures) == world.size
        assert ", in agree\n" in info.value.failures[0].traceback


def _unmatched_without_debug(ctx):
    from commbench.wire.comm import Comm

    base = ctx.comm()
    comm = Comm(base.backend, base.ledger, base.tracker, debug=False)
    if ctx.rank == 0:
        comm.all_reduce(torch.ones(4), ctx.world)
    else:
        comm.recv(torch.ones(4), ctx.world, 0)


def _stall(ctx):
    if ctx.rank == 1:
        time.sleep(60)
    ctx.comm().all_reduce(torch.ones(2), ctx.world)


@pytest.mark.local
@pytest.mark.parametrize(("fn", "expected"), [
    (_unmatched_without_debug, ["all_reduce (call #1) on group [0, 1]: ranks [0] arrived, "
                                "ranks [1] did not", "rank 1: recv (call #1) on group [0, 1]"]),
    (_stall, ["ranks [0] arrived, ranks [1] did not", "rank 1: running _stall, no call yet"]),
])
def test_hangs_without_debug_and_stalls_are_named_by_the_timeout(fn, expected):
    """A 3 s limit: what rank 0 does before the all-reduce takes milliseconds even on a loaded
    machine; that the limit, not the stall's end, stopped the call is CallTimeout itself."""
    with LocalWorld(2, launch="plain") as w:
        with pytest.raises(CallTimeout) as info:
            w.run(fn, timeout=3.0)
        for text in expected:
            assert text in str(info.value)


def _in_the_foreground() -> None:
    """SIGINT as a terminal's foreground job has it: a shell starts a background job (``make
    test &``, a CI step run in the background) with SIGINT ignored, the sweep would inherit
    that and rightly run on through the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _sweep(tmp_path, *extra):
    return subprocess.Popen(
        [sys.executable, "-m", "commbench", "run", "all_reduce", "--np", "2", "--launch", "plain",
         "--transport", "gloo", "--algo", "native,ring,naive", "-b", "8", "-e", "64M", "-f", "2",
         "-n", "3", "-w", "1", "--out", str(tmp_path), "--label", "test-box", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_in_the_foreground,
        # as a user runs it: no debug checks, and its own zygote (which these tests find)
        env={k: v for k, v in os.environ.items() if k not in ("COMMBENCH_DEBUG", zygote.ENV)})


def _wait_rows(path, n, proc, limit=120.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists():
            try:
                if len(json.loads(path.read_text())["rows"]) >= n:
                    return
            except (json.JSONDecodeError, KeyError):
                pytest.fail("a reader saw a half-written results file")
        time.sleep(0.05)
    pytest.fail(f"the sweep did not reach {n} rows")


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    table[int(name)] = (ppid, f.read().replace(b"\0", b" ").decode())
            except (OSError, IndexError, ValueError):
                pass
    return table


def _started_by(pid: int) -> tuple[list[int], list[int], bool]:
    """(the ranks, every process) that driver ``pid`` started, directly or not, and whether it
    forked them: its ranks are the children of its zygote, or its worker processes where it
    forks none."""
    table = _processes()
    below, todo = [], [pid]
    while todo:
        parent = todo.pop()
        kids = [p for p, (pp, _) in table.items() if pp == parent]
        below += kids
        todo += kids
    zygotes = [p for p in below if "commbench.world.local.zygote" in table[p][1]]
    ranks = [p for p in below if table[p][0] in zygotes] if zygotes else \
        [p for p in below if "commbench.world.local.worker" in table[p][1]]
    return ranks, below, bool(zygotes)


@pytest.mark.local
@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "kill a rank", "stop a rank"])
def test_an_interrupted_sweep_keeps_its_rows_and_resumes(tmp_path, how):
    path = tmp_path / "all_reduce_test-box-gloo-x2.json"
    # a stopped rank is named after a quarter of the call's limit (at most 10 s): 3 s here
    proc = _sweep(tmp_path, *(["--timeout", "12"] if how == "stop a rank" else []))
    _wait_rows(path, 3, proc)
    ranks, started, forked = _started_by(proc.pid)
    assert len(ranks) == 2 and forked == zygote.supported(), (ranks, started)
    if how in ("kill a rank", "stop a rank"):
        victim = ranks[0]
        os.kill(victim, signal.SIGKILL if how == "kill a rank" else signal.SIGSTOP)
    else:
        proc.send_signal(getattr(signal, how))
    out, err = proc.communicate(timeout=120)  # a bound for a hang, not a speed: no load decides it
    assert proc.returncode == {"SIGINT": 130, "SIGTERM": 143, "kill a rank": 3,
                               "stop a rank": 3}[how], (err, out[-2000:])
    assert err.count("\n") == 1 and "Traceback" not in err, err  # one line
    if how == "kill a rank":
        assert "rank" in err and "died" in err and "traceback in " in err
    if how == "stop a rank":  # named by its state after 3 s, not by the call's 12 s limit
        assert f"(pid {victim}) stopped (SIGSTOP: the kernel's state T) for 3 s or more" in err, \
            err
        assert "timed out" not in err
    kept = load(str(path))["rows"]  # valid JSON, finished rows all there
    assert len(kept) >= 3 and all(r["wrong"] == 0 for r in kept)
    assert not [p for p in started if spawn.running(p)]  # nothing it started outlives it
    if how == "SIGINT":  # resume the same run: the kept rows are not measured again
        again = _sweep(tmp_path, "--resume", "-e", "1K")
        out, err = again.communicate(timeout=300)
        assert again.returncode == 0, err
        assert "resuming" in out
        rows = load(str(path))["rows"]
        keys = [(r["algo"], r["requested"]) for r in rows]
        assert len(keys) == len(set(keys)) and rows[: len(kept)] == kept


FLAGS = st.sampled_from(["-b", "-e", "-f", "-n", "-w", "-d", "-o", "-r", "-c", "--np",
                         "--transport", "--algo", "--timeout", "--rounds", "--launch"])
VALUES = st.one_of(st.integers(-5, 1 << 31).map(str), st.sampled_from(
    ["0", "8", "1K", "64M", "1G", "-1", "x", "", "float32", "bfloat16", "int8", "sum", "avg",
     "prod", "gloo", "mpi", "ring", "native,ring", "nccl", "auto", "plain", "1e3", "8X"]))
TARGETS = st.lists(st.sampled_from(["collectives", "all_reduce", "overhead", "bogus",
                                    "all_to_all", "pingpong"]), max_size=2)


@given(targets=TARGETS, pairs=st.lists(st.tuples(FLAGS, VALUES), max_size=5))
def test_fuzzed_run_arguments_get_a_clear_verdict(targets, pairs):
    """Validation either accepts (sizes ascending and positive, ops known) or says why in one
    line; nothing else escapes, and nothing starts a rank."""
    from commbench.cli.common import UsageError
    from commbench.cli.main import _parser
    from commbench.cli.run_args import SUITES
    from commbench.cli.run_args import check_run_args as _check_run_args

    argv = ["run", *targets] + [x for pair in pairs for x in pair]
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        assert exc.code == 2
        return
    try:
        ops, sizes = _check_run_args(args)
    except UsageError as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    assert sizes and sizes == sorted(sizes) and sizes[0] > 0
    assert all(op in {o for v in SUITES.values() for o in v} for op in ops)


@given(blob=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_fuzzed_results_files_never_crash_compare(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("fuzz") / "r.json"
    path.write_bytes(blob)
    try:
        load(str(path))
    except CompareError as exc:
        assert str(exc).startswith(str(path))


@given(batch=st.integers(-1, 9), seq=st.integers(-1, 17), hidden=st.integers(-1, 33),
       ffn=st.integers(-1, 33), heads=st.integers(-1, 9), vocab=st.integers(-1, 33),
       tp=st.integers(-1, 5), dp=st.integers(-1, 3), dropout=st.floats(-1, 2),
       dtype=st.sampled_from(["float64", "float32", "int8", ""]),
       variant=st.sampled_from(["tp", "sp", "sp_regather", "naive"]), world=st.integers(1, 8))
def test_fuzzed_tp_configs_are_accepted_or_refused_with_the_rule(
        batch, seq, hidden, ffn, heads, vocab, tp, dp, dropout, dtype, variant, world):
    from commbench.patterns.tp.configs import SP_VARIANTS, TPConfig

    cfg = TPConfig(batch, seq, hidden, ffn, heads, vocab, tp, dp, True, dropout, dtype)
    try:
        cfg.validate(world, variant)
    except ValueError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert tp * dp == world and heads % tp == 0 and hidden % heads == 0 and vocab % tp == 0
    assert batch % dp == 0 and (variant not in SP_VARIANTS or seq % tp == 0) and 0 <= dropout < 1


def test_more_ranks_than_the_launcher_gave_is_refused_before_starting(capsys):
    from unittest import mock

    from commbench.cli.main import main

    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "9"}
    with mock.patch.dict(os.environ, env):
        assert main(["run", "all_reduce", "--np", "8"]) == 2
    err = capsys.readouterr().err
    assert "--np 8: the launcher (torchrun) started 2 ranks" in err, err


FAILING = """
from hypothesis import given, strategies as st

@given(st.lists(st.integers(0, 100), min_size=1))
def test_sum_is_small(xs):
    assert sum(xs) < 150
"""


@pytest.mark.local  # under a launcher the inner run is derandomized: its replay is the same command
def test_a_failing_property_prints_the_command_that_replays_it(pytester):
    pytester.makepyfile(test_prop=FAILING)
    first = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    first.assert_outcomes(failed=1)
    text = first.stdout.str()
    replay = next(line for line in text.splitlines() if line.startswith("replay: "))
    seed = replay.split("--hypothesis-seed=")[1].strip()
    falsifying = [line for line in text.splitlines() if "xs=" in line]
    again = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--hypothesis-seed={seed}")
    again.assert_outcomes(failed=1)
    assert [line for line in again.stdout.str().splitlines() if "xs=" in line] == falsifying
