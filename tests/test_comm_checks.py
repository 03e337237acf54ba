"""The comm layer refuses bad calls on the calling rank, before anything reaches the wire;
and hypothesis shrinks a failure found through the world to its minimal example."""

from __future__ import annotations

import pytest
import torch
from hypothesis import find, settings
from hypothesis import strategies as st

from commbench.runtime.errors import SPMDError

pytestmark = pytest.mark.foundation


def _bad_call(ctx, transport, which):
    comm, g = ctx.comm(transport), ctx.world
    n = ctx.size
    calls = {
        "reduce_scatter_indivisible": lambda: comm.reduce_scatter(torch.ones(n + 1), g),
        "root_out_of_range": lambda: comm.broadcast(torch.ones(2), g, root=n),
        "unknown_op": lambda: comm.all_reduce(torch.ones(2), g, op="xor"),
        "avg_on_int": lambda: comm.all_reduce(torch.ones(2, dtype=torch.int32), g, op="avg"),
        "splits_do_not_sum": lambda: comm.all_to_all(torch.ones(5), g, [1] * n),
        "negative_split": lambda: comm.all_to_all(torch.ones(0), g, [-1] + [1] * (n - 1)),
        "not_a_tensor": lambda: comm.all_gather([1, 2], g),
        "send_to_self": lambda: comm.send(torch.ones(1), g, g.index),
        "bf16_sum_on_mpi": lambda: comm.all_reduce(torch.ones(2, dtype=torch.bfloat16), g),
    }
    calls[which]()
    return ctx.ledger.entries  # nothing may have been booked: the call never started


MESSAGES = {
    "reduce_scatter_indivisible": r"dim 0 of x \(\d+\) must be a multiple of the group size",
    "root_out_of_range": r"root=\d+: must be a position in 0\.\.\d+",
    "unknown_op": r"op='xor': must be one of sum, prod, min, max, avg",
    "avg_on_int": r"avg needs a floating dtype",
    "splits_do_not_sum": r"in_splits \[.*\] sum to \d+, but dim 0 of x is 5",
    "negative_split": r"counts must be >= 0",
    "not_a_tensor": r"x must be a torch.Tensor, got list",
    "send_to_self": r"peer=\d+ is this rank's own position",
    "bf16_sum_on_mpi": r"sum on torch.bfloat16 over mpi: MPI has no reduction for this dtype",
}


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("which", sorted(MESSAGES))
def test_bad_calls_fail_with_the_rule(world, which):
    transports = ["mpi"] if which == "bf16_sum_on_mpi" else list(world.transports)
    if which == "bf16_sum_on_mpi" and "mpi" not in world.transports:
        pytest.skip("no MPI transport in this world")
    if which == "send_to_self" and world.size == 1:
        pytest.skip("a world of one has no peer")
    for transport in transports:
        with pytest.raises(SPMDError, match=MESSAGES[which]) as info:
            world.run(_bad_call, transport, which)
        assert len(info.value.failures) == world.size  # every rank refused on its own


def _sum_is_small(ctx, count):
    total = ctx.comm().all_reduce(torch.ones(count), ctx.world)
    return bool(total.sum().item() >= 60)


@pytest.mark.world(sizes=[2, 3, 4])
def test_hypothesis_shrinks_through_the_world(world):
    """A property that fails from count*n >= 60 on shrinks to the smallest such count."""
    smallest = find(st.integers(0, 500), lambda k: world.run(_sum_is_small, k)[0],
                    settings=settings(derandomize=True, database=None, max_examples=200))
    assert smallest == -(-60 // world.size)  # every element of the sum is n: n*count >= 60
