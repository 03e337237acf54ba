"""Launcher detection from each launcher's environment, and its errors (pure, no world)."""

from __future__ import annotations

import pytest

from commbench.runtime.launch import LaunchError, detect, first_slurm_host, rendezvous

pytestmark = pytest.mark.foundation

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "node7", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"}
OPENMPI = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "16",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
MPICH = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4"}
SLURM = {"SLURM_PROCID": "9", "SLURM_NTASKS": "12", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
         "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[003-005,9]"}


@pytest.mark.parametrize(("env", "launcher", "rank", "size", "local"), [
    (TORCHRUN, "torchrun", 3, 8, 1),
    (OPENMPI, "openmpi", 5, 16, 1),
    (MPICH, "mpich", 2, 4, 2),
    ({"PMIX_RANK": "1", "PMIX_SIZE": "2"}, "pmix", 1, 2, 0),
    (SLURM, "slurm", 9, 12, 1),
    ({}, "none", 0, 1, 0),
])
def test_each_launcher(env, launcher, rank, size, local):
    info = detect(env)
    assert (info.launcher, info.rank, info.size, info.local_rank) == (launcher, rank, size, local)
    assert info.launched == (launcher != "none")


def test_torchrun_wins_over_slurm_and_gives_rendezvous():
    info = detect({**SLURM, **TORCHRUN})
    assert info.launcher == "torchrun"
    assert rendezvous(info, {}) == ("node7", 29500)


def test_batch_shell_is_not_a_slurm_step():
    env = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_ID"}
    assert detect(env).launcher == "none"
    assert detect({**env, "SLURM_STEP_ID": "batch"}).launcher == "none"


def test_slurm_rendezvous_from_node_list():
    info = detect(SLURM)
    assert rendezvous(info, SLURM) == ("gpu003", 20000 + 4242)
    assert first_slurm_host("cpu1,cpu2") == "cpu1"
    assert first_slurm_host("a-b[10-20]") == "a-b10"


@pytest.mark.parametrize(("env", "message"), [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x': must be an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
    ({"PMI_RANK": "0", "PMI_SIZE": "0"}, "PMI_SIZE=0"),
    ({"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE is not set"),
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "70000"}, "MASTER_PORT=70000"),
])
def test_malformed_environment_is_named(env, message):
    with pytest.raises(LaunchError, match=message.replace("[", r"\[")):
        detect(env)


def test_mpi_launch_without_address_or_mpi_says_what_to_set():
    with pytest.raises(LaunchError, match="set MASTER_ADDR and MASTER_PORT"):
        rendezvous(detect(MPICH), MPICH)


def test_a_launcher_worlds_call_leaves_no_thread_holding_the_world(monkeypatch):
    """The watchdog thread of a call must be over when the call returns: a thread still holding
    the world at exit dropped its process groups while Python finalized (gloo's std::terminate
    under mpiexec). A watchdog slow to wake, as on a loaded machine, makes the race certain."""
    import threading
    import time
    import types
    import weakref

    from commbench.runtime.spmd import LauncherWorld

    def slow_watchdog(self, done, limit, name, task):
        done.wait(limit)
        time.sleep(0.2)

    monkeypatch.setattr(LauncherWorld, "_watchdog", slow_watchdog)
    nothing = lambda *a: None  # noqa: E731
    ctx = types.SimpleNamespace(
        rank=0, size=1, transports=("gloo",), launcher="mpich", world=types.SimpleNamespace(ranks=(0,)),
        ledger=types.SimpleNamespace(clear=nothing), mpi=types.SimpleNamespace(allgather=lambda o: [o]),
        tracker=types.SimpleNamespace(start_task=nothing, end_task=nothing, enter=nothing, leave=nothing))
    before = threading.active_count()
    world = LauncherWorld(ctx, timeout_s=60)
    assert world.run(lambda c: 7) == [7]
    assert threading.active_count() == before
    ref = weakref.ref(world)
    del world
    assert ref() is None
