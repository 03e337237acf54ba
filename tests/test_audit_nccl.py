"""``commbench audit SCRIPT --nccl``: a script's own calls and group creations, run on CPU over
gloo, replayed under NCCL's rules; each finding names the ranks, the calls and the script's
lines. examples/nccl_hang.py hangs only under eager init; tests/data/audit/nccl_mistakes.py
makes three other mistakes, and its good variant none."""

from __future__ import annotations

import os

import pytest

from commbench.cli.main import main

pytestmark = [pytest.mark.foundation, pytest.mark.local]

HERE = os.path.dirname(__file__)
HANG = os.path.join(HERE, "..", "examples", "nccl_hang.py")
MISTAKES = os.path.join(HERE, "data", "audit", "nccl_mistakes.py")


def _audit(capsys, script, np, mode, *args) -> tuple[int, str]:
    # a limit: a script that hangs on gloo fails the test instead of blocking the suite
    code = main(["audit", script, "--np", str(np), "--nccl", mode, "--no-write", "--timeout",
                 "120", *args])
    return code, capsys.readouterr().out


def test_a_send_before_a_collective_hangs_under_eager_init_only(capsys):
    code, out = _audit(capsys, HANG, 2, "eager")
    assert code == 1
    assert "NCCL's rules (eager: as asked (--nccl eager)): 1 finding(s)" in out
    assert ("rank 0: send of 16 B to rank 1 on group [0, 1] (posted alone) at nccl_hang.py:23"
            in out)
    assert "rank 1: all_reduce float32[4] on group [0, 1] at nccl_hang.py:27" in out
    code, out = _audit(capsys, HANG, 2, "lazy")
    assert code == 0 and "nothing would hang or fail" in out


def test_split_counts_a_bitwise_reduction_and_lone_rings_are_found_with_their_lines(capsys):
    code, out = _audit(capsys, MISTAKES, 3, "eager")
    assert code == 1
    assert "NCCL has no band reduction: rank 0's all_reduce on group [0, 1, 2] at " \
           "nccl_mistakes.py:18" in out
    assert "rank 0's host waits to connect to rank 2" in out and "nccl_mistakes.py:26" in out
    assert "ncclCommSplit 0: ranks [0] pass the colour of group [0, 2]" in out


def test_the_same_script_done_right_passes(capsys):
    code, out = _audit(capsys, MISTAKES, 3, "eager", "--", "good")
    assert code == 0 and "nothing would hang or fail" in out, out


EAGER = """
import torch
import torch.distributed as dist

# what a GPU script gives: under the audit init_process_group does not run, so a CUDA device_id
# on a CPU machine is only read
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
x = torch.ones(4)
if dist.get_rank() == 0:
    work = dist.isend(x, 1)  # kept and waited: a send whose work is dropped may never arrive
dist.all_reduce(x)
if dist.get_rank() == 0:
    work.wait()
else:
    dist.recv(x, 0)
"""


def test_auto_takes_eager_init_from_the_device_id_the_script_gives(capsys, tmp_path):
    script = tmp_path / "eager.py"
    script.write_text(EAGER)
    code, out = _audit(capsys, str(script), 2, "auto")
    assert "NCCL's rules (eager: the script gives init_process_group a device_id (ranks " \
           "[0, 1])): 1 finding(s)" in out, out
    assert code == 1
