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

    from commbench.world.spmd import LauncherWorld

    def slow_watchdog(self, done, limit, name, task):
        done.wait(limit)
        time.sleep(0.2)

    monkeypatch.setattr(LauncherWorld, "_watchdog", slow_watchdog)
    nothing = lambda *a: None  # noqa: E731
    ctx = types.SimpleNamespace(
        rank=0, size=1, transports=("gloo",), launcher="mpich", world=types.SimpleNamespace(ranks=(0,)),
        ledger=types.SimpleNamespace(clear=nothing), mpi=types.SimpleNamespace(allgather=lambda o: [o]),
        gather_objects=lambda o: [o],
        tracker=types.SimpleNamespace(start_task=nothing, end_task=nothing, enter=nothing, leave=nothing))
    before = threading.active_count()
    world = LauncherWorld(ctx, timeout_s=60)
    assert world.run(lambda c: 7) == [7]
    assert threading.active_count() == before
    ref = weakref.ref(world)
    del world
    assert ref() is None


# -- every rank of a 2-node x 4-rank job under each launcher ------------------------------------
from launcher_envs import LAUNCHERS, PER_NODE, SIZE, env_of  # noqa: E402


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
@pytest.mark.parametrize("gpus", [4, 8])
def test_every_rank_of_every_launcher_finds_its_place_and_device(launcher, gpus):
    devices: dict[int, set[int]] = {}
    for r in range(SIZE):
        info = detect(env_of(launcher, r))
        got = (info.launcher, info.rank, info.size, info.local_rank, info.local_size, info.node)
        assert got == (LAUNCHERS[launcher], r, SIZE, r % PER_NODE, PER_NODE, r // PER_NODE), \
            (launcher, r, info.source)
        devices.setdefault(info.node, set()).add(info.device(gpus))
    assert all(len(d) == PER_NODE for d in devices.values())  # no two ranks of a host share one


def test_slurms_tasks_per_node_read_in_its_compressed_form():
    from commbench.runtime.launch import tasks_per_node

    assert tasks_per_node("4(x2)") == [4, 4]
    assert tasks_per_node("3,2(x2)") == [3, 2, 2]
    with pytest.raises(LaunchError, match="cannot read"):
        tasks_per_node("4(2)")


def test_a_slurm_local_rank_past_its_nodes_tasks_is_refused():
    env = {**env_of("srun", 3), "SLURM_STEP_TASKS_PER_NODE": "3(x2)"}
    with pytest.raises(LaunchError, match="SLURM_LOCALID=3 is not below this node's 3 tasks"):
        detect(env)


def test_every_rank_of_an_uneven_slurm_job_has_its_nodes_local_size():
    """``3,2``: node 0 runs ranks 0-2, node 1 ranks 3-4; every rank of a node agrees."""
    for r, (local, size, node) in enumerate([(0, 3, 0), (1, 3, 0), (2, 3, 0), (0, 2, 1),
                                              (1, 2, 1)]):
        env = {"SLURM_PROCID": str(r), "SLURM_NTASKS": "5", "SLURM_STEP_ID": "0",
               "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
               "SLURM_STEP_TASKS_PER_NODE": "3,2"}
        info = detect(env)
        assert (info.local_rank, info.local_size, info.node) == (local, size, node)


def test_info_names_ranks_of_one_host_that_would_share_a_gpu():
    from commbench.cli.info import shared_devices

    rows = [(0, 1, "a", "cuda:0", 0), (1, 2, "a", "cuda:1", 1), (2, 3, "b", "cuda:0", 0),
            (3, 4, "b", "cuda:0", 0)]
    assert shared_devices(rows) == ["ranks 2, 3 of b share cuda:0: give each rank its own GPU "
                                    "(one rank per GPU, local ranks 0..n-1 per host)"]
    assert shared_devices(rows[:3]) == [] and shared_devices([(0, 1, "a", "cpu", 0)] * 2) == []


def test_hydra_s_pmi_port_mode_is_refused_not_taken_for_a_world_of_one():
    """mpiexec -pmi-port sets PMI_PORT and PMI_ID but no rank or size: every process would
    believe it is a world of one (before: detected as no launcher at all)."""
    with pytest.raises(LaunchError, match="-pmi-port mode"):
        detect({"PMI_PORT": "host:1234", "PMI_ID": "3"})
    assert detect({"PMI_PORT": "host:1234", "PMI_RANK": "1", "PMI_SIZE": "2"}).size == 2


@pytest.mark.parametrize(("value", "launched", "says"), [
    ("nccl", False, "a local world runs gloo and MPI"),
    ("gloo", False, "a local world runs gloo and MPI"),
    ("ucc", True, "COMMBENCH_BACKEND='ucc': must be gloo, nccl or mpi"),
])
def test_commbench_backend_is_refused_where_it_cannot_hold(value, launched, says):
    from commbench.cli.checks import check_backend
    from commbench.cli.common import UsageError

    with pytest.raises(UsageError, match=says):
        check_backend(launched, {"COMMBENCH_BACKEND": value})
    check_backend(launched, {})  # unset: nothing to refuse


def test_commbench_backend_nccl_without_a_gpu_is_one_line_before_any_rank():
    import torch

    from commbench.cli.checks import check_backend
    from commbench.cli.common import UsageError

    if torch.cuda.is_available():
        check_backend(True, {"COMMBENCH_BACKEND": "nccl"})
        return
    with pytest.raises(UsageError, match="NCCL needs a CUDA GPU"):
        check_backend(True, {"COMMBENCH_BACKEND": "nccl"})


def _torchrun(rank: int, size: int, local: int, local_size: int) -> dict:
    return {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(local_size), "TORCHELASTIC_RUN_ID": "x",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_two_ranks_on_one_gpu_are_refused_on_every_rank_before_any_collective():
    from commbench.cli.checks import check_gpus
    from commbench.cli.common import UsageError
    from commbench.runtime.launch import detect, shared_gpu

    # 8 ranks on a host of 4 GPUs: every rank binds a GPU another rank binds too
    for local in range(8):
        why = shared_gpu(detect(_torchrun(local, 16, local, 8)), 4)
        assert f"would share cuda:{local % 4} with local ranks {local % 4}, {local % 4 + 4}" in why
        with pytest.raises(UsageError, match=f"rank {local} \\(local rank {local} of 8"):
            check_gpus(True, _torchrun(local, 16, local, 8), gpus=4)
    assert shared_gpu(detect(_torchrun(3, 16, 3, 8)), 8) == ""  # one GPU each
    check_gpus(True, {**_torchrun(3, 16, 3, 8), "COMMBENCH_BACKEND": "gloo"}, gpus=4)  # no NCCL
    check_gpus(False, _torchrun(3, 16, 3, 8), gpus=4)  # a local world binds no GPU per rank
