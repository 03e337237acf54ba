"""``#wrong``: what counts as a wrong element of a collective's result."""

from __future__ import annotations

import pytest
import torch

from commbench.ops import booked
from commbench.timing.verify import expected, seeded, wrong

pytestmark = pytest.mark.collectives


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize(("bad", "count"), [
    (float("nan"), 1), (float("inf"), 1), (float("-inf"), 1), ("negate", 1), ("+1", 1),
    ("-0.0", 1), ("all nan", 8),
])
def test_every_kind_of_wrong_element_is_counted(dtype, bad, count):
    want = expected("all_reduce", 3, 0, 4, 8, dtype)
    want[5] = 0.0 if bad == "-0.0" else want[5] if want[5] != 0 else 2.0
    got = want.clone()
    if bad == "negate":
        got[5] = -got[5]
    elif bad == "+1":
        got[5] += 1
    elif bad == "-0.0":
        got[5] = -0.0
    elif bad == "all nan":
        got.fill_(float("nan"))
    else:
        got[5] = bad
    assert wrong(want.clone(), want) == 0
    assert wrong(got, want) == count


def test_integers_missing_and_misshapen_results():
    want = expected("all_reduce", 1, 0, 2, 6, torch.int32)
    assert wrong(want.clone(), want) == 0
    got = want.clone()
    got[0] += 1
    assert wrong(got, want) == 1
    assert wrong(None, want) == 6 and wrong(want[:5], want) == 6
    assert wrong(None, None) == 0 and wrong(want, None) == 1  # a result where none is due


def test_no_exact_result_is_a_negative_zero():
    """The sign-of-zero rule is safe: the patterns' exact results never hold -0.0."""
    for redop in ("sum", "avg", "min", "max", "prod"):
        for n in (2, 3, 4):
            want = expected("all_reduce", 7, 0, n, 4096, torch.float32, redop)
            assert not bool((torch.signbit(want) & (want == 0)).any()), (redop, n)
    assert not bool(torch.signbit(seeded(0, 0, 4096, torch.float32)[
        seeded(0, 0, 4096, torch.float32) == 0]).any())


def _hand_pattern(seed, rank, count, redop="sum", signed=True):
    """The documented hash, element by element in Python integers."""
    out = []
    for k in range(count):
        h = (k * 2654435761 + (rank + 1) * 40503 + seed * 69069) % 1000003
        v = 1 + h % 2 if redop == "prod" else h % 17 - 8 if redop in ("min", "max") else h % 9 - 4
        out.append(v if signed else abs(v))
    return out


@pytest.mark.parametrize("redop", ["sum", "avg", "prod", "min", "max"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.uint8, torch.bfloat16])
def test_the_pattern_is_the_documented_hash_in_its_ranges(redop, dtype):
    signed = dtype.is_floating_point or dtype.is_signed
    for seed, rank in ((0, 0), (3, 1), (11, 6)):
        got = seeded(seed, rank, 50, dtype, redop)
        assert got.dtype == dtype and got.tolist() == _hand_pattern(seed, rank, 50, redop, signed)
    lo, hi = {"prod": (1, 2), "min": (-8, 8), "max": (-8, 8)}.get(redop, (-4, 4))
    values = seeded(5, 2, 2000, torch.float64, redop)
    assert values.min() == lo and values.max() == hi  # the whole range, nothing outside


def _hand_at(seed, rank, ks, redop="sum"):
    """The documented hash at the positions ``ks``."""
    out = []
    for k in ks:
        h = (k * 2654435761 + (rank + 1) * 40503 + seed * 69069) % 1000003
        out.append(1 + h % 2 if redop == "prod" else h % 17 - 8 if redop in ("min", "max") else h % 9 - 4)
    return out


@pytest.mark.parametrize("redop", ["sum", "min", "max"])
def test_a_buffer_longer_than_the_hash_s_period_is_still_the_hash_everywhere(redop):
    """Past 1000003 elements the values are one period repeated (not hashed element by
    element): the same values at the period's seams, and in a block that starts past them (a
    reduce-scatter's or all-to-all's part of a long buffer)."""
    count = 2_500_000
    got = seeded(4, 3, count, torch.float32, redop)
    seams = [0, 1, 999_999, 1_000_002, 1_000_003, 1_000_004, 2_000_006, 2_000_007, count - 1]
    assert got[seams].tolist() == _hand_at(4, 3, seams, redop)
    # rank 2 of 2's reduce-scatter block starts mid-period: every rank's block, summed by hand
    want = expected("reduce_scatter", 4, 1, 2, count, torch.float32, redop)
    ks = [count // 2 + j for j in (0, 1, 2, 3, 5, 8, 13, 21, 34, 1_000_003 - (count // 2) % 1_000_003)]
    fold = {"sum": sum, "min": min, "max": max}[redop]
    hand = [fold(c) for c in zip(_hand_at(4, 0, ks, redop), _hand_at(4, 1, ks, redop), strict=True)]
    assert want[[k - count // 2 for k in ks]].tolist() == hand


def _hand_reduce(columns, redop):
    import functools
    import operator

    ops = {"sum": sum, "avg": lambda c: sum(c) / len(c), "min": min, "max": max,
           "prod": lambda c: functools.reduce(operator.mul, c, 1)}
    return [ops[redop](c) for c in zip(*columns, strict=True)]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("redop", ["sum", "avg", "prod", "min", "max"])
def test_expected_results_by_hand(n, redop):
    """Every collective's expectation, rebuilt from the hash with Python lists."""
    seed, count, root = 4, 6 * n, n - 1
    ins = [_hand_pattern(seed, r, count, redop) for r in range(n)]
    block = count // n
    total = _hand_reduce(ins, redop)
    for r in range(n):
        def got(op, rank=r, red=redop):
            out = expected(op, seed, rank, n, count, torch.float64, red, root)
            return None if out is None else out.tolist()

        assert got("all_reduce") == pytest.approx(total)
        assert got("reduce") == (pytest.approx(total) if r == root else None)
        assert got("reduce_scatter") == pytest.approx(total[r * block:(r + 1) * block])
        assert got("all_gather", red="sum") == [x for i in range(n) for x in
                                                _hand_pattern(seed, i, count)]
        assert got("gather", red="sum") == ([x for i in range(n) for x in
                                             _hand_pattern(seed, i, count)] if r == root else None)
        assert got("broadcast", red="sum") == _hand_pattern(seed, root, count)
        assert got("scatter", red="sum") == _hand_pattern(seed, root, count)[r * block:
                                                                            (r + 1) * block]
        assert got("all_to_all", red="sum") == [x for i in range(n) for x in _hand_pattern(
            seed, i, count)[r * block:(r + 1) * block]]
        assert got("sendrecv", red="sum") == _hand_pattern(seed, (r - 1) % n, count)
    with pytest.raises(ValueError, match="op 'fax': no expectation"):
        expected("fax", 0, 0, n, count, torch.float32)


def test_expected_rounds_avg_in_the_dtype_and_wraps_integers():
    """avg: the exact sum in the dtype, divided in the dtype (the comm layer's avg); integer
    products in the integer dtype."""
    got = expected("all_reduce", 2, 0, 3, 40, torch.bfloat16, "avg")
    ins = [_hand_pattern(2, r, 40) for r in range(3)]
    want = torch.tensor([sum(c) for c in zip(*ins)], dtype=torch.float64).to(torch.bfloat16) / 3
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    big = expected("all_reduce", 1, 0, 8, 512, torch.int8, "prod")
    ins = [_hand_pattern(1, r, 512, "prod") for r in range(8)]
    assert big.dtype == torch.int8 and big.tolist() == _hand_reduce(ins, "prod")
    with pytest.raises(ValueError, match="redop 'xor': must be sum, prod, min, max or avg"):
        expected("all_reduce", 0, 0, 2, 4, torch.float32, "xor")


def test_the_root_s_default_and_the_result_s_dtype():
    assert booked("broadcast", 3, 0, 4, 4) == booked("broadcast", 3, 0, 4, 4, root=0)
    assert torch.equal(expected("broadcast", 1, 2, 3, 5, torch.float32),
                       expected("broadcast", 1, 2, 3, 5, torch.float32, root=0))
    assert expected("all_reduce", 1, 0, 3, 5, torch.bfloat16, "max").dtype == torch.bfloat16
    assert expected("all_reduce", 1, 0, 3, 5, torch.int32, "sum").dtype == torch.int32
    assert wrong(None, torch.empty(0)) == 1  # a result missing, even an empty one, counts


def test_a_block_past_three_billion_elements_is_the_hash_too():
    """A block of a very large buffer (an int8 all-gather of 8 GiB, say) starts past 3.4e9
    elements, where k * 2654435761 no longer fits an int64: its values are still the
    documented hash, as the repeated period gives them."""
    from commbench.timing.verify import _values

    lo = 5_000_000_000
    got = _values(1, 2, lo, lo + 64, torch.float32, "sum", "cpu")
    assert got.tolist() == _hand_at(1, 2, range(lo, lo + 64))
