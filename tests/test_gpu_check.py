"""``commbench gpu-check`` on a machine without a GPU: it refuses, and everything it checks but
CUDA passes on a CPU world of one."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.foundation


def test_gpu_check_refuses_a_machine_without_cuda(capsys):
    """`make gpu-check` must not pass with everything skipped: without CUDA it says so, exit 3."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: `make gpu-check` runs the real check")
    from commbench.cli.main import main

    assert main(["gpu-check"]) == 3
    assert "no CUDA device here" in capsys.readouterr().err


@pytest.mark.world(sizes=[1])
def test_gpu_check_runs_every_pattern_on_a_cpu_world_of_one(world):
    """What the GPU check does but CUDA: every pattern's variants judged on a world of one (here
    gloo on the CPU), so that a GPU session sees only what CUDA changes. (Its study configs run
    in `commbench run <pattern>`.)"""
    from commbench.cli.gpu_check import check_every_pattern

    lines: list[str] = []
    assert check_every_pattern(world, lines.append, study=False) == 0, "\n".join(lines)


@pytest.mark.world(sizes=[1])
def test_gpu_check_runs_every_collective_and_algorithm_on_a_cpu_world_of_one(world):
    from commbench.cli.gpu_check import check_big_all_reduce, check_every_collective

    lines: list[str] = []
    assert check_every_collective(world, lines.append, sizes=(8, 4096)) == 0, "\n".join(lines)
    assert any("ring_compiled" in line for line in lines) and len(lines) > 20
    assert check_big_all_reduce(world, lines.append, 1 << 20, device="cpu") == 0, lines[-1]
    # negative: a result on the wrong device fails the big check
    assert check_big_all_reduce(world, lines.append, 1 << 10, device="cuda") == 1


@pytest.mark.parametrize("launcher", ["torchrun", "srun", "mpirun (Open MPI)"])
def test_under_a_launcher_each_rank_checks_its_own_gpu(launcher):
    """Eight ranks of a node each check the GPU of their local rank (in the GPUs the launcher
    left visible), not eight times GPU 0; with no launcher, the first GPU."""
    from launcher_envs import PER_NODE, SIZE, env_of

    from commbench.cli.gpu_check import launched_gpu
    from commbench.runtime.launch import detect

    for r in range(SIZE):
        info = detect(env_of(launcher, r))
        assert launched_gpu(info, PER_NODE, None) == (r % PER_NODE, str(r % PER_NODE))
        assert launched_gpu(info, PER_NODE, "4,5,6,7") == (r % PER_NODE, str(4 + r % PER_NODE))
    assert launched_gpu(detect({}), 8, "0,1") == (0, None)


def test_a_rank_other_than_0_prints_its_failures_alone_marked_with_it():
    from commbench.cli.gpu_check import _failures_of

    lines: list[str] = []
    quiet = _failures_of(lines.append, 37)
    for line in ("# commbench gpu-check: NVIDIA H100, one rank, NCCL", " all_reduce ring 8 0 1.0 ok",
                 " all_reduce ring 8 - -  FAILED: boom", "# gpu-check: 1 failed"):
        quiet(line)
    assert lines == ["rank 37: # commbench gpu-check: NVIDIA H100, one rank, NCCL",
                     "rank 37:  all_reduce ring 8 - -  FAILED: boom", "rank 37: # gpu-check: 1 failed"]
