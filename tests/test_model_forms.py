"""The model's per-algorithm forms: two regimes split at a size, chosen on calibration rows."""

from __future__ import annotations

import pytest

from commbench.costmodel import fitting, forms
from commbench.costmodel.alphabeta import Fit, Params, terms

pytestmark = pytest.mark.model

N = 2
CAL = [4096 << (2 * k) for k in range(8)]  # 4 KiB .. 64 MiB, factor 4: the study's calibration
EVAL = [4096 << k for k in range(15)]      # factor 2: half of them never calibrated
BELOW, ABOVE = Params(8e-6, 0.5e-9, 0.1e-9), Params(40e-6, 0.2e-9, 0.1e-9)
SWITCH = 600_000  # bytes: the library changes algorithm between 256 KiB and 1 MiB


def _lib(size: float) -> float:
    """A library that switches algorithm at SWITCH: other constants on each side (seconds)."""
    return (BELOW if size < SWITCH else ABOVE).time(terms("all_reduce", "native", N, size))


def _rows(sizes, time=_lib):
    return [{"op": "all_reduce", "algo": "native", "size": s, "time_us": time(s) * 1e6}
            for s in sizes]


def _worst(model: Fit, sizes) -> float:
    return max(abs(model.predict_us("all_reduce", "native", N, s) / (_lib(s) * 1e6) - 1)
               for s in sizes)


# sizes away from the bracket (256 KiB, 1 MiB) where the break must be placed by a guess
CLEAR = [s for s in EVAL if not 262144 < s < 1 << 20]


def test_a_library_switch_is_fitted_as_two_regimes_and_chosen_by_held_out_rows():
    model = fitting.fit(_rows(CAL), N)
    assert model.above and "all_reduce/native" in model.above
    b, hi = model.above["all_reduce/native"]
    assert 262144 < b < 1 << 20 and b == pytest.approx((262144 * (1 << 20)) ** 0.5)
    assert model.algos["all_reduce/native"].alpha == pytest.approx(BELOW.alpha, rel=1e-6)
    assert hi.alpha == pytest.approx(ABOVE.alpha, rel=1e-6)
    assert _worst(model, CLEAR) < 1e-6
    line = fitting.fit(_rows(CAL), N, forms=("line",))
    assert line.above is None and _worst(line, CLEAR) > 0.1


def test_a_broken_regime_lookup_is_caught():
    """Negative: predicting every size from the constants below the break misses above it."""
    model = fitting.fit(_rows(CAL), N)
    broken = Fit(model.classes, [], model.algos, model.knee, model.curve, None)
    assert _worst(broken, CLEAR) > 0.1


def test_one_regime_stays_one_line():
    """A library without a switch: the split fits as well, so the tie goes to the line."""
    rows = _rows(CAL, lambda s: BELOW.time(terms("all_reduce", "native", N, s)))
    assert forms.choose(rows, N, 0.0, None) == "line"
    assert fitting.fit(rows, N).above is None


def test_split_needs_enough_rows_and_keeps_each_row_once_in_the_residuals():
    assert forms.choose(_rows(CAL[:6]), N, 0.0, None) == "line"  # 5 held in: one side too thin
    res: list[dict] = []
    lo, b, hi = forms.split_fit(_rows(CAL), N, 0.0, None, res, "all_reduce/native")
    assert sorted(r["size"] for r in res) == CAL
    assert forms.split_fit(_rows(CAL[:5]), N, 0.0, None) is None


def test_a_split_model_survives_its_json():
    model = fitting.fit(_rows(CAL), N)
    again = Fit.from_dict(model.as_dict())
    for s in EVAL:
        assert again.predict_us("all_reduce", "native", N, s) == pytest.approx(
            model.predict_us("all_reduce", "native", N, s), rel=1e-12)


def test_forms_are_tried_simplest_first_whatever_order_they_are_given_in():
    rows = _rows(CAL, lambda s: BELOW.time(terms("all_reduce", "native", N, s)))
    assert forms.choose(rows, N, 0.0, None, ("split", "line")) == "line"
    with pytest.raises(ValueError, match=r"forms=\['spline'\]: each must be one of line"):
        forms.choose(rows, N, 0.0, None, ("line", "spline"))
