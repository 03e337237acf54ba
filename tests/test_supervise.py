"""A dead rank under a launcher: one line naming it, exit code 3, the rows measured before kept.

Each launched rank's work runs in a child of the process the launcher started
(commbench.runtime.supervise); these tests kill that child with SIGKILL from outside, as the OOM
killer would, in the middle of a sweep.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from commbench.runtime import shm, supervise
from commbench.world.local.spawn import find_mpiexec, mpi_usable

pytestmark = pytest.mark.faults

needs_mpiexec = pytest.mark.skipif(not mpi_usable(), reason="needs mpi4py and mpiexec")
SWEEP = ["run", "all_reduce", "-b", "8", "-e", "1M", "-f", "2", "--algo", "native,ring"]


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)


def _kill_child_of_rank(job: subprocess.Popen, rank_var: str, rank: int, out: str
                        ) -> tuple[int, set[str]]:
    """Wait for the sweep to have saved a row, then SIGKILL the working child of ``rank``; the
    rows saved by then, and the MPICH segments the job's working children map."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job.poll() is None:
        rows = _rows(out)
        children = {pid: _environ(pid) for pid in (int(p) for p in os.listdir("/proc")
                                                   if p.isdigit())}
        children = {pid: env for pid, env in children.items()
                    if env.get(supervise.SUPERVISED) == "1"
                    and env.get("COMMBENCH_TEST_OUT") == out}
        target = next((pid for pid, env in children.items() if env.get(rank_var) == str(rank)),
                      None)
        if rows and target is not None:
            segments = shm.mapped_segments(children)
            os.kill(target, signal.SIGKILL)
            return len(rows), segments
        time.sleep(0.2)
    raise AssertionError(f"no supervised child of rank {rank} found while the job ran")


def _rows(out: str) -> list:
    for name in os.listdir(out) if os.path.isdir(out) else []:
        if name.endswith(".json"):
            try:
                with open(os.path.join(out, name)) as f:
                    return json.load(f)["rows"]
            except (OSError, ValueError, KeyError):
                return []
    return []


def _killed_run(launcher: list[str], rank_var: str, rank: int, tmp_path):
    out = str(tmp_path / "out")
    env = dict(os.environ, COMMBENCH_TEST_OUT=out)
    job = subprocess.Popen([*launcher, sys.executable, "-m", "commbench", *SWEEP, "--out", out],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        before, segments = _kill_child_of_rank(job, rank_var, rank, out)
        stdout, stderr = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    ours = [line for line in stderr.splitlines() if re.match(r"(\[rank \d+\] )?commbench: ", line)]
    left = sorted(p for p in segments if os.path.exists(p))
    return job.returncode, ours, before, len(_rows(out)), stdout, (segments, left)


@pytest.mark.launcher
@pytest.mark.local
@needs_mpiexec
def test_a_rank_killed_under_mpiexec_ends_the_job_with_3_and_one_line(tmp_path):
    code, ours, before, after, stdout, (segments, left) = _killed_run(
        [find_mpiexec(), "-n", "2"], "PMI_RANK", 1, tmp_path)
    assert code == 3, (ours, stdout[-2000:])
    assert len(ours) == 1 and "rank 1 of 2" in ours[0] and "killed by SIGKILL" in ours[0], ours
    assert "BAD TERMINATION" not in stdout  # hydra did not take the ranks down with SIGKILL
    assert after >= before > 0  # the rows measured before the death are kept
    # MPICH unlinks its segment only in MPI_Finalize, which neither rank reached: the ranks'
    # supervisors remove it
    assert segments and not left, (segments, left)


@pytest.mark.launcher
@pytest.mark.local
@needs_mpiexec
def test_rank_0_killed_under_mpiexec_is_named_and_rank_1_says_the_store_went(tmp_path):
    code, ours, _, _, stdout, (segments, left) = _killed_run(
        [find_mpiexec(), "-n", "2"], "PMI_RANK", 0, tmp_path)
    assert code == 3, (ours, stdout[-2000:])
    assert "rank 0 of 2" in ours[0] and "killed by SIGKILL" in ours[0], ours
    assert all("rank 0" in line for line in ours) and len(ours) <= 2, ours
    assert segments and not left, (segments, left)


@pytest.mark.launcher
@pytest.mark.local
def test_a_rank_killed_under_torchrun_is_named_in_one_line(tmp_path):
    """torchrun's own exit code for a failed worker is 1, and it prints its own summary."""
    code, ours, _, _, _, _ = _killed_run([sys.executable, "-m", "torch.distributed.run",
                                          "--nproc-per-node", "2", "--no-python"],
                                         "RANK", 1, tmp_path)
    assert code != 0
    assert len(ours) == 1 and "rank 1 of 2" in ours[0] and "killed by SIGKILL" in ours[0], ours


@pytest.mark.parametrize("argv, env, expected", [
    (["run", "all_reduce"], {"PMI_RANK": "0", "PMI_SIZE": "2"}, True),
    (["--debug", "audit", "x.py"], {"RANK": "1", "WORLD_SIZE": "2"}, True),
    (["run", "all_reduce"], {}, False),  # a local world watches its own ranks
    (["list"], {"PMI_RANK": "0", "PMI_SIZE": "2"}, False),
    (["run", "--help"], {"PMI_RANK": "0", "PMI_SIZE": "2"}, False),
    (["run"], {"PMI_RANK": "0", "PMI_SIZE": "2", supervise.SUPERVISED: "1"}, False),
    (["run"], {"PMI_RANK": "0", "PMI_SIZE": "2", "COMMBENCH_SUPERVISE": "0"}, False),
    (["run"], {"PMI_RANK": "0", "PMI_SIZE": "2", "COMMBENCH_WORKER": "1"}, False),
])
def test_which_command_lines_run_supervised(argv, env, expected):
    assert supervise.wanted(argv, env) is expected


@pytest.mark.local
def test_a_child_s_own_exit_code_passes_through_without_a_word(monkeypatch, capsys):
    """Refused (2) in the child: the supervisor adds nothing and returns 2."""
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "1")
    monkeypatch.setenv("MPI_LOCALRANKID", "0")
    assert supervise.supervise(["run", "no_such_target"]) == 2
    assert "died" not in capsys.readouterr().err


class _Store:
    def __init__(self, value: bytes | None) -> None:
        self.value = value

    def check(self, keys):
        return self.value is not None

    def get(self, key):
        return self.value


def test_a_death_notice_is_read_as_checked_json_never_unpickled():
    good = json.dumps({"rank": 3, "host": "n7", "signal": "SIGKILL"}).encode()
    assert supervise.death_notice(_Store(good)) == "rank 3 (host n7) died: killed by SIGKILL"
    assert supervise.death_notice(_Store(None)) is None
    import pickle

    assert "could not be read" in supervise.death_notice(_Store(pickle.dumps({"rank": 3})))


@pytest.mark.parametrize("where", ["task", "gather", "sigterm"])
def test_a_lost_peer_with_a_death_notice_ends_the_rank_quietly_wherever_it_surfaces(
        monkeypatch, where):
    """The transport's error ("Connection reset by peer") may come in the task or in the gather
    of its results; with a dead rank's notice in the store the rank leaves (exit 3, no line of
    its own), without one the error stands."""
    import types

    from commbench.runtime.status import Tracker
    from commbench.world import spmd

    lost = RuntimeError("[gloo] Read error [127.0.0.1]:1: Connection reset by peer")

    def gather(obj):
        if where == "gather":
            raise lost
        return [obj]

    ctx = types.SimpleNamespace(rank=0, size=1, world=types.SimpleNamespace(ranks=(0,)),
                                ledger=types.SimpleNamespace(clear=lambda: None),
                                tracker=Tracker(), gather_objects=gather, store_address=None,
                                transports=("gloo",), launcher="torchrun")
    world = spmd.LauncherWorld(ctx, timeout_s=None)

    def task(ctx):
        if where == "task":
            raise lost
        if where == "sigterm":  # commbench.cli.main.Terminated is a KeyboardInterrupt
            raise KeyboardInterrupt
        return 1

    class Left(Exception):
        pass

    def leave(self, line=""):
        raise Left(line)

    monkeypatch.setattr(spmd.LauncherWorld, "_leave", leave)
    monkeypatch.setattr(spmd.LauncherWorld, "_dead_rank", lambda self: True)
    with pytest.raises(Left, match="^$"):
        world.outcomes(task)
    import threading

    # the task's watchdog ended with it (left running, it would go on polling for notices)
    assert not [t for t in threading.enumerate() if "_watchdog" in t.name]
    monkeypatch.setattr(spmd.LauncherWorld, "_dead_rank", lambda self: False)
    monkeypatch.setattr(supervise, "POLL_S", 0.1)
    if where == "gather":
        with pytest.raises(RuntimeError, match="Connection reset"):
            world.outcomes(task)
    else:  # no notice: the error or the interruption is the rank's own
        assert not world.outcomes(task)[0].ok
