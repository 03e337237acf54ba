"""busbw factors and the size convention, pinned to nccl-tests' doc/PERFORMANCE.md."""

from __future__ import annotations

import pytest

from commbench.names import parse_size, sizes_between
from commbench.ops import counts_for
from commbench.results.busbw import busbw, factor
from commbench.timing.clock import SampleClock

pytestmark = pytest.mark.collectives


ROWS = [("all_reduce", 8, 2 * 7 / 8), ("all_reduce", 1, 0.0), ("all_gather", 4, 0.75),
        ("reduce_scatter", 2, 0.5), ("all_to_all", 8, 7 / 8), ("broadcast", 8, 1.0),
        ("reduce", 3, 1.0), ("scatter", 4, 0.75), ("gather", 8, 7 / 8), ("all_to_allv", 3, 2 / 3),
        ("sendrecv", 8, 1.0), ("pingpong", 2, 1.0), ("gather", 1, 0.0), ("scatter", 2, 0.5),
        ("barrier", 4, 1.0)]  # barrier: size 0, so its busbw is 0 whatever the factor


@pytest.mark.parametrize(("op", "n", "f"), ROWS)
def test_factors(op, n, f):
    assert factor(op, n) == pytest.approx(f)


def test_every_collective_has_a_factor_row():
    from commbench.names import COLLECTIVES
    from commbench.ops import OPS

    with_bus = {o.name for o in OPS.values() if o.bus is not None}
    assert {op for op, _, _ in ROWS} == with_bus >= set(COLLECTIVES)


def test_busbw_of_a_known_row():
    # 1 GB all-reduced on 8 ranks in 1 s: algbw 1 GB/s, busbw 1.75 GB/s
    assert busbw("all_reduce", 8, 10**9, 1.0) == pytest.approx(1.75)


def test_sizes_follow_nccl_tests():
    assert counts_for("all_reduce", 1000, 4, 4) == (250, 1000)
    assert counts_for("all_gather", 1 << 20, 4, 4) == ((1 << 18) // 4, 1 << 20)  # per-rank block
    # 100 B over 4 ranks: 6 floats a rank, rounded down to 16 bytes: blocks of 4, 64 B in all
    assert counts_for("reduce_scatter", 100, 4, 4) == (16, 64)
    assert parse_size("64K") == 65536 and parse_size("1G") == 1 << 30 and parse_size("8") == 8
    assert sizes_between(8, 64, 2) == [8, 16, 32, 64]


def test_sample_clock_reports_exactly_the_samples():
    clock = SampleClock()
    clock.load([0.5, 0.25])
    t0 = clock()
    clock.step()
    assert clock() - t0 == 0.5
    with pytest.raises(ValueError):
        clock.load([])
