"""The local world's fork server (commbench.world.local.zygote): ranks forked from one process
that imported torch behave as ranks started on their own: their environment, folder, streams,
randomness and exit status are their own, and a rank and its stand-in end together."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from commbench.runtime.errors import RankDied
from commbench.world.local import LocalWorld, spawn, zygote
from commbench.world.local.spawn import mpi_usable

pytestmark = [pytest.mark.foundation, pytest.mark.local,
              pytest.mark.skipif(not zygote.supported(), reason="forks only on Linux")]
LAUNCHES = ["plain", pytest.param("mpi", marks=pytest.mark.skipif(
    not mpi_usable(), reason="mpi4py or mpiexec is not installed"))]


def _me(ctx, var):
    import random

    return os.getpid(), os.getppid(), os.environ.get(var), os.getcwd(), random.random()


def _parent_cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode(errors="replace")


def _gone(pid: int, limit: float = 30.0) -> bool:
    deadline = time.monotonic() + limit  # a bound for a hang, not a speed
    while time.monotonic() < deadline:
        if not spawn.running(pid):
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("launch", LAUNCHES)
def test_ranks_are_forked_with_the_environment_and_folder_the_world_gives(tmp_path, monkeypatch,
                                                                         launch):
    monkeypatch.setenv("COMMBENCH_TEST_MARK", "set by this test")
    monkeypatch.chdir(tmp_path)
    with LocalWorld(3, launch=launch) as w:
        got = w.run(_me, "COMMBENCH_TEST_MARK")
        stand_ins = {p.pid for p in w._procs}
    pids, parents, marks, folders, draws = zip(*got)
    assert all("commbench.world.local.zygote" in _parent_cmdline(p) for p in parents), parents
    assert not set(pids) & stand_ins  # the world watches the ranks, not their stand-ins
    assert set(marks) == {"set by this test"} and set(folders) == {str(tmp_path)}
    assert len(set(draws)) == 3  # each rank's random state is its own, not the zygote's


def test_ranks_whose_import_time_variables_differ_get_a_zygote_of_their_own(monkeypatch):
    """A zygote imported torch with its own ``TORCH_*``/``OMP_*``/... variables: a world whose
    variables differ gets its ranks from a zygote started with theirs, so what torch read
    while it was imported is the rank's."""
    with LocalWorld(2, launch="plain") as w:
        shared = {parent for _, parent, *_ in w.run(_me, "TORCH_SHOW_CPP_STACKTRACES")}
    monkeypatch.setenv("TORCH_SHOW_CPP_STACKTRACES", "1")
    with LocalWorld(2, launch="plain") as w:
        got = w.run(_me, "TORCH_SHOW_CPP_STACKTRACES")
    parents = {parent for _, parent, *_ in got}
    assert len(parents) == 1 and parents != shared, (parents, shared)
    assert "commbench.world.local.zygote" in _parent_cmdline(parents.pop())
    assert {mark for _, _, mark, *_ in got} == {"1"}


def test_without_the_zygote_each_rank_is_a_process_of_its_own(monkeypatch):
    monkeypatch.setenv(zygote.ENV, "0")
    with LocalWorld(2, launch="plain") as w:
        got = w.run(_me, "X")
    assert all(parent == os.getpid() for _, parent, *_ in got), got  # the driver's own children


def test_the_zygote_refuses_an_environment_it_was_not_started_with():
    env = spawn.worker_env(b"")
    path = zygote.address_for(env)
    assert path is not None and zygote.compatible(path, env)
    assert not zygote.compatible(path, dict(env, OMP_NUM_THREADS="7"))
    assert not zygote.compatible(path, dict(env, PYTHONPATH="elsewhere"))
    assert zygote.compatible(path, dict(env, COMMBENCH_DEBUG="0"))  # read later, by commbench


def test_a_stand_in_ends_with_its_rank_s_exit_status_and_streams():
    """A rank that exits (here argparse refusing its arguments) ends its stand-in with the same
    status, its words (under the stand-in's program name) on the stand-in's stderr."""
    env = dict(spawn.worker_env(b""), **{zygote.ENV: zygote.address_for(spawn.worker_env(b""))})
    done = subprocess.run([sys.executable, "-m", "commbench.world.local.worker", "--no-such"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "worker.py: error: the following arguments are required: --address" in done.stderr


@pytest.mark.parametrize("killed", ["rank", "stand-in"])
def test_a_rank_and_its_stand_in_end_together(killed):
    """A rank killed by a signal ends its stand-in by that signal; a stand-in killed (by its
    launcher, say) takes its rank with it. Either way the world names the rank as dead."""
    with LocalWorld(2, launch="plain") as w:
        rank, stand_in = w.pids[1], w._procs[1]  # plain: the driver starts stand-in r for rank r
        assert rank != stand_in.pid
        os.kill(rank if killed == "rank" else stand_in.pid, signal.SIGKILL)
        assert stand_in.wait(timeout=60) == -signal.SIGKILL
        assert _gone(rank)
        with pytest.raises(RankDied, match="rank 1"):
            w.run(_me, "X")


def test_a_test_session_starts_a_zygote_only_where_its_tests_start_ranks(tmp_path):
    """The plugin loads in every pytest session of an environment that has commbench; a
    session none of whose tests takes a world or starts one (``local``) starts no zygote."""
    (tmp_path / "test_plain.py").write_text(
        "import os\n\ndef test_env():\n    print('ZYGOTE', os.environ.get('COMMBENCH_ZYGOTE'))\n")
    (tmp_path / "test_local.py").write_text(
        "import os, pytest\n\n@pytest.mark.local\ndef test_env():\n"
        "    print('ZYGOTE', os.environ.get('COMMBENCH_ZYGOTE'))\n")
    env = {k: v for k, v in os.environ.items() if k != zygote.ENV}
    seen = {}
    for name in ("test_plain.py", "test_local.py"):
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                              name], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        seen[name] = next(line.split(" ", 1)[1] for line in out.stdout.splitlines()
                          if line.startswith("ZYGOTE"))
    assert seen["test_plain.py"] == "None" and seen["test_local.py"].endswith("/socket"), seen


def test_a_malformed_request_leaves_the_zygote_serving():
    """A request cut short or not JSON is dropped with the descriptors it brought; the next
    world's ranks are still forked there."""
    import socket

    path = zygote.address_for(spawn.worker_env(b""))
    for junk in (b"\x00\x00\x00\x09{not json", b"\x00\x00", b"\x00\x00\x01\x00{}"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        socket.send_fds(s, [junk], [0])
        s.close()
    with LocalWorld(2, launch="plain") as w:
        got = w.run(_me, "X")
    assert all("commbench.world.local.zygote" in _parent_cmdline(p) for _, p, *_ in got)


_AT_EXIT = '''import atexit, os, sys


def main(argv):
    from commbench.world.context import import_mpi

    import_mpi(None)  # a singleton MPI_Init, as `commbench info` makes
    segments = [line.split()[-1] for line in open("/proc/self/maps") if "mpich_shm_" in line]
    atexit.register(lambda: open(argv[0], "w").write("ran"))
    print(os.getppid(), *segments[:1])
    return 0
'''


@pytest.mark.skipif(not mpi_usable(), reason="mpi4py or mpiexec is not installed")
def test_a_command_forked_here_ends_as_a_process_of_its_own_would(tmp_path):
    """A command run through the zygote (how the tests run the command line) runs at its end
    what a process of its own runs at exit: Python's exit handlers, and mpi4py's MPI_Finalize,
    where MPICH unlinks the /dev/shm segment of a singleton MPI_Init. Each `commbench info` run
    so had left a megabyte of the host's memory there."""
    (tmp_path / "at_exit.py").write_text(_AT_EXIT)
    z = zygote.own(dict(os.environ))
    assert z is not None
    flag = tmp_path / "flag"
    p = subprocess.Popen([sys.executable, "-m", "commbench.world.local.zygote", "--through",
                          z.path, "at_exit:main", str(flag)], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    parent, segment = out.split()
    assert int(parent) != p.pid  # forked by the zygote, not run by its stand-in
    assert segment.startswith("/dev/shm/mpich_shm_") and not os.path.exists(segment)
    assert flag.read_text() == "ran"
