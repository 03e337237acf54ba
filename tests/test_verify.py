"""``#wrong``: what counts as a wrong element of a collective's result."""

from __future__ import annotations

import pytest
import torch

from commbench.timing.verify import expected, pattern, wrong

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
    assert not bool(torch.signbit(pattern(0, 0, 4096, torch.float32)[
        pattern(0, 0, 4096, torch.float32) == 0]).any())
