"""The audit on two libraries' own implementations, when installed (``pip install
'commbench[libs]'``; skipped otherwise): megatron-core's ColumnParallelLinear and
RowParallelLinear with and without sequence parallelism, and DeepSpeed-Ulysses'
DistributedAttention. Each booked list is worked out by hand from the library's design and equals
what torch's CommDebugMode counts for the same script."""

from __future__ import annotations

import importlib.util
import os
from collections import Counter

import pytest
from test_audit import _audit_and_count

pytestmark = pytest.mark.foundation

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


def _by_hand(name: str, args: list[str], P: int) -> Counter:
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


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("name, args", [("megatron_core_sp.py", []),
                                        ("megatron_core_sp.py", ["--no-sp"]),
                                        ("deepspeed_ulysses.py", [])])
def test_a_library_s_own_calls_are_booked(world, name, args):
    _needs(name)
    for booked, counts in world.run(_audit_and_count, name, args):
        assert Counter((t[0], t[4], t[12]) for t in booked) == _by_hand(name, args, world.size)
        assert Counter(t[0] for t in booked) == counts  # CommDebugMode's count


def test_the_library_examples_exist_and_skip_with_their_reason():
    here = os.path.join(os.path.dirname(__file__), "..", "examples")
    assert all(os.path.isfile(os.path.join(here, n)) for n in NEEDS)
