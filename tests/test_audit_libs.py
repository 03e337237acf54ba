"""The audit on two libraries' own implementations, when installed (``pip install
'commbench[libs]'``; skipped otherwise): megatron-core's ColumnParallelLinear and
RowParallelLinear with and without sequence parallelism, and DeepSpeed-Ulysses'
DistributedAttention, each booked call worked out by hand from the library's design.

Each runs as its own ``commbench audit`` (a fresh local world): the libraries are heavy to
import (megatron-core leaves some 390,000 Python objects, which slowed every later test of a
shared world's ranks threefold through the garbage collector). DeepSpeed compiles its
shared-memory communication op the first time its torch backend starts (minutes on 2 cores,
whatever ``DS_BUILD_OPS`` says): it is built once, before the audit is given its time."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter

import pytest

pytestmark = [pytest.mark.foundation, pytest.mark.local]

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")
NEEDS = {"megatron_core_sp.py": ("megatron.core", "megatron-core"),
         "deepspeed_ulysses.py": ("deepspeed", "deepspeed")}


def _needs(name: str) -> None:
    module, package = NEEDS[name]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        pytest.skip(f"{name}: needs {package} (pip install 'commbench[libs]')")


def _warm(name: str) -> None:
    """Build the library's compiled op ahead of the audit (a no-op once it is cached), with
    its own time: the audit's 300 s are for the audit."""
    if name != "deepspeed_ulysses.py":
        return
    code = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=1800)
    except subprocess.TimeoutExpired:
        pytest.fail("DeepSpeed's shared-memory op was still compiling after 1800 s")
    if out.returncode != 0:
        pytest.fail(f"DeepSpeed's shared-memory op did not build: {out.stderr[-1500:]}")


def _by_hand(name: str, args: list[str], P: int) -> Counter:
    """(op, elements per call, phase) -> calls on the busiest rank."""
    s, b, h = 8, 2, 16  # the examples' defaults
    if name == "deepspeed_ulysses.py":  # q, k, v and the output; and their gradients
        return Counter({("all_to_all", s // P * b * 4 * 4, "forward"): 4,
                        ("all_to_all", s // P * b * 4 * 4, "backward"): 4})
    if args == ["--no-sp"]:  # Megatron's f and g: one all-reduce each way
        return Counter({("all_reduce", s * b * h, "forward"): 1,
                        ("all_reduce", s * b * h, "backward"): 1})
    # SP: gather before up, scatter after down; backward: the scatter's gather, the input's
    # re-gather for the weight gradient, and the gather's reduce-scatter
    return Counter({("all_gather", s // P * b * h, "forward"): 1,
                    ("reduce_scatter", s * b * h, "forward"): 1,
                    ("all_gather", s // P * b * h, "backward"): 2,
                    ("reduce_scatter", s * b * h, "backward"): 1})


@pytest.mark.parametrize("name, args, P", [("megatron_core_sp.py", [], 2),
                                           ("megatron_core_sp.py", ["--no-sp"], 2),
                                           ("deepspeed_ulysses.py", [], 2)])
def test_a_library_s_own_calls_are_booked(tmp_path, name, args, P):
    _needs(name)
    _warm(name)
    cmd = [sys.executable, "-m", "commbench", "audit", os.path.join(EXAMPLES, name), "--np",
           str(P), "--out", str(tmp_path), "--label", "t", "--", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (path,) = tmp_path.glob("audit_*.json")
    groups = json.loads(path.read_text())["rows"]["groups"]
    want = _by_hand(name, args, P)
    assert {(r["op"], r["phase"]): r["calls"] for r in groups} == \
        {(op, phase): k for (op, _, phase), k in want.items()}
    for r in groups:  # every call of a kind has the same size: elements sum to calls x size
        (size,) = [e for (op, e, phase) in want if (op, phase) == (r["op"], r["phase"])]
        assert r["elements"] == r["calls"] * size and r["ranks"] == P


def test_the_library_examples_exist():
    assert all(os.path.isfile(os.path.join(EXAMPLES, n)) for n in NEEDS)
