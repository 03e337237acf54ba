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
