"""Low-precision reductions: every measured error under the bound of its algorithm's summation
depth (commbench.studies.numerics), the same bits on every rank and on a repeated call; and the
bound catches a schedule that adds in a lower precision than the dtype."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from commbench.collectives import ALGORITHMS
from commbench.studies.numerics import (
    ALGOS,
    DISTRIBUTIONS,
    NumericsCase,
    bound,
    depth,
    judge_numerics,
    numerics_case,
)

pytestmark = [pytest.mark.collectives, pytest.mark.ring]

PAIRS = [(op, algo) for op, algos in ALGOS.items() for algo in algos]


@pytest.mark.world(sizes=[2, 3, 4])
@given(pair=st.sampled_from(PAIRS), dtype=st.sampled_from(["float32", "bfloat16", "float16"]),
       dist=st.sampled_from(DISTRIBUTIONS), accumulate=st.sampled_from(["", "float32"]),
       seed=st.integers(0, 999))
def test_rounding_error_stays_under_the_summation_depth_bound(world, pair, dtype, dist,
                                                             accumulate, seed):
    op, algo = pair
    assume(not ALGORITHMS[(op, algo)].needs(world.size))
    case = NumericsCase(op, algo, dtype, dist, count=840, seed=seed, accumulate=accumulate)
    row = judge_numerics(case, world.run(numerics_case, case))
    assert row["max_err"] <= row["bound"], row
    assert row["ranks_bitwise_same"] and row["repeat_bitwise_same"], row


@pytest.mark.world(sizes=[3, 4])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_bound_catches_a_schedule_adding_in_lower_precision(world, dtype):
    case = NumericsCase("all_reduce", "ring", dtype, "normal", count=840, seed=1)
    row = judge_numerics(case, world.run(numerics_case, case, True))
    assert row["max_err"] > row["bound"], row


def test_depths_and_bounds_follow_the_summation_order():
    assert [depth("ring", p) for p in (1, 2, 3, 8)] == [0, 1, 2, 7]
    assert [depth("recursive_doubling", p) for p in (2, 3, 4, 5, 8)] == [1, 2, 2, 3, 3]
    assert depth("hierarchical", 8) == 4 and depth("native", 8) == 7
    assert depth("hierarchical", 8, local=4) == 3 + 1 and depth("hierarchical", 8, local=8) == 7
    assert bound("ring", 4, "float32") == pytest.approx(1.5, rel=1e-6)  # 3 additions, u = eps/2
    assert bound("ring", 4, "bfloat16", "float32") == pytest.approx(0.5, abs=1e-3)
