"""Every standard collective through the comm layer, on every transport, against the oracle.

Judged by the one judge of collectives (tests/collective_cases.py:judge): inputs are
:mod:`commbench.timing.verify` patterns (small integers, exact in every dtype tested), so the
expected result is exact and the comparison uses tolerance 0 for every dtype and op, including
the floating ones: any difference is a bug, not rounding. A dtype/op pair a transport cannot do
must fail with a ValueError naming it, never return a wrong answer.
"""

from __future__ import annotations

import pytest
import torch
from collective_cases import judge
from hypothesis import example, given
from hypothesis import strategies as st

from commbench.wire.dtypes import DTYPES

pytestmark = pytest.mark.collectives

OPS = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce",
       "gather", "scatter"]
REDUCING = {"all_reduce", "reduce_scatter", "reduce"}
# element counts: empty, one, primes, and a large prime; the per-rank count is multiplied by the
# world size for reduce-scatter and all-to-all, so their totals do not divide by much else
COUNTS = st.sampled_from([0, 1, 2, 3, 5, 7, 13, 31, 97, 1009, 65537]) | st.integers(0, 300)


@pytest.mark.world(sizes=[1, 2, 3, 4, 5, 8])
@given(op=st.sampled_from(OPS), count=COUNTS, dtype=st.sampled_from(sorted(DTYPES)),
       redop=st.sampled_from(["sum", "prod", "min", "max", "avg"]), root=st.integers(0, 7),
       inplace=st.booleans(), seed=st.integers(0, 2**16))
# the edges every run sees: each reduction (avg in two precisions), counts 0, 1 and prime
@example(op="all_reduce", count=0, dtype="float32", redop="avg", root=0, inplace=False, seed=1)
@example(op="reduce_scatter", count=1, dtype="float64", redop="avg", root=0, inplace=True, seed=2)
@example(op="reduce", count=13, dtype="int32", redop="max", root=7, inplace=False, seed=3)
@example(op="all_reduce", count=97, dtype="float16", redop="min", root=0, inplace=True, seed=4)
@example(op="all_reduce", count=7, dtype="int64", redop="prod", root=0, inplace=False, seed=5)
@example(op="scatter", count=1, dtype="uint8", redop="sum", root=3, inplace=False, seed=6)
def test_native_collectives_match_the_oracle(world, op, count, dtype, redop, root, inplace, seed):
    for transport in world.transports:
        assert judge(world, transport, op, count=count, dtype=dtype, redop=redop, root=root,
                     inplace=inplace, seed=seed) == []


@pytest.mark.world(sizes=[1, 2, 3, 4, 5, 8])
@given(data=st.data(), row=st.integers(1, 3), seed=st.integers(0, 99))
@example(data=None, row=1, seed=0)  # every run: one member sends nothing, one receives nothing
def test_uneven_all_to_allv_matches_the_oracle(world, data, row, seed):
    n = world.size
    splits = data.draw(st.lists(st.lists(st.integers(0, 4), min_size=n, max_size=n),
                                min_size=n, max_size=n), label="splits") if data is not None else \
        [[0] * n] + [[(i + j) % 3 if j else 0 for j in range(n)] for i in range(1, n)]
    for transport in world.transports:
        assert judge(world, transport, "all_to_all", count=0, dtype="int32", seed=seed,
                     splits=splits, row=row) == []


# -- negative tests: each property catches a deliberately broken variant ---------------------------
@pytest.mark.world(sizes=[3, 4])
@pytest.mark.parametrize(("mutant", "op"), [("wrong_root", "broadcast"),
                                            ("wrong_permutation", "all_to_all")])
def test_native_property_catches_broken_variants(world, mutant, op):
    for transport in world.transports:
        problems = judge(world, transport, op, count=5, seed=1, broken=mutant)
        assert problems, f"{mutant} went unnoticed on {transport}"


@pytest.mark.world(sizes=[3, 4])
def test_alltoallv_property_catches_a_wrong_permutation(world):
    n = world.size  # uneven, some empty: member i sends (i + 2 j) % 3 rows to member j
    splits = [[(i + 2 * j) % 3 for j in range(n)] for i in range(n)]
    for transport in world.transports:
        assert judge(world, transport, "all_to_all", count=0, dtype="int32", splits=splits, row=2,
                     broken="wrong_permutation")


def test_a_transport_that_cannot_refuses_clearly():
    """bfloat16 reductions over MPI raise the rule; they are never computed wrongly."""
    from commbench.wire.transport.mpi_backend import MPIBackend

    pytest.importorskip("mpi4py")
    assert "MPI has no reduction" in MPIBackend().unsupported("sum", torch.bfloat16)


def test_the_command_line_s_table_of_what_mpi_cannot_reduce_is_mpi_s_own():
    """The names the command line refuses without torch (commbench.names.MPI_CANNOT_REDUCE) are
    exactly the dtypes MPIBackend refuses, with its words."""
    from commbench.names import DTYPE_NAMES, MPI_CANNOT_REDUCE
    from commbench.wire.dtypes import DTYPES
    from commbench.wire.transport.mpi_backend import MPIBackend

    for name in DTYPE_NAMES:
        for op in ("sum", "prod", "min", "max", "avg"):
            assert MPI_CANNOT_REDUCE.get(name) == MPIBackend.unsupported(op, DTYPES[name]), name


# -- all-to-allv and barrier as the benchmark times them (commbench.timing.native) ---------------
def _measured(ctx, op, transport, nbytes, reversed_rows=False):
    """One benchmark row's measurement of ``op`` on this rank; ``reversed_rows``: the broken
    variant, every member sending its uneven counts to the members in reverse order (the
    exchange stays consistent, the data lands where the record says it must not)."""
    from commbench.collectives.measure import Case, measure
    from commbench.timing import native

    original = native.vsplits
    if reversed_rows:
        native.vsplits = lambda n, count: [row[::-1] for row in original(n, count)]
    try:
        out = measure(ctx, Case(op, transport, iters=2, warmup=1), nbytes)
    finally:
        native.vsplits = original
    return {k: out[k] for k in ("wrong", "sent", "recv", "pred_sent", "pred_recv", "size", "count")}


def _witnessed(ctx, transport, nbytes, witness):
    """A row's measurement with or without the witness: its keys, the witness's sample count,
    and how many ledger entries the measurement booked."""
    from commbench.collectives.measure import Case, measure

    before = len(ctx.ledger.entries)
    out = measure(ctx, Case("all_gather", transport, algo="ring", iters=3, warmup=1,
                            witness=witness), nbytes)
    return (sorted(out), len(out.get("witness", [])), len(out.get("witness_add", [])),
            len(ctx.ledger.entries) - before, out["wrong"])


@pytest.mark.world(sizes=[2])
def test_the_witness_is_timed_beside_rows_the_gate_judges_and_booked_nowhere(world):
    """A row of 64 KiB or more measured with the witnesses carries their samples (8 per rank
    each), a smaller row none; they add no entry to the ledger, whose bytes are the rows'."""
    from commbench.collectives.measure import WITNESS_FROM, WITNESS_SAMPLES

    for transport in world.transports:
        small, big, plain = (world.run(_witnessed, transport, nbytes, w) for nbytes, w in
                             ((WITNESS_FROM // 2, True), (WITNESS_FROM, True),
                              (WITNESS_FROM, False)))
        assert all(o[1] == o[2] == 0 and "witness" not in o[0] for o in small + plain), transport
        assert all(o[1] == o[2] == WITNESS_SAMPLES for o in big), transport
        assert [o[3] for o in big] == [o[3] for o in plain] and all(o[4] == 0 for o in big)


@pytest.mark.world(sizes=[1, 2, 3, 4])
@pytest.mark.parametrize("nbytes", [16, 4000, 1 << 16])
def test_the_benchmarked_all_to_allv_is_exact_and_booked_at_its_uneven_counts(world, nbytes):
    from commbench.ops import vsplits

    n = world.size
    for transport in world.transports:
        outs = world.run(_measured, "all_to_allv", transport, nbytes)
        count = outs[0]["count"]
        m = vsplits(n, count)
        for i, out in enumerate(outs):
            assert out["wrong"] == 0
            assert out["sent"] == out["pred_sent"] == (count - m[i][i]) * 4
            assert out["recv"] == out["pred_recv"] == (sum(m[j][i] for j in range(n))
                                                       - m[i][i]) * 4
        assert outs[0]["size"] == count * 4


@pytest.mark.world(sizes=[3, 4])
def test_the_all_to_allv_check_catches_counts_sent_to_the_wrong_members(world):
    for transport in world.transports:
        outs = world.run(_measured, "all_to_allv", transport, 4000, True)
        assert sum(o["wrong"] for o in outs) > 0, transport


@pytest.mark.world(sizes=[1, 2, 4])
def test_the_benchmarked_barrier_moves_nothing_and_has_one_row_of_size_0(world):
    for transport in world.transports:
        for out in world.run(_measured, "barrier", transport, 1 << 20):
            assert out == {"wrong": 0, "sent": 0, "recv": 0, "pred_sent": 0, "pred_recv": 0,
                           "size": 0, "count": 0}
