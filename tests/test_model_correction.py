"""The calibrated local model: each algorithm's line times its residual ratios, interpolated."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commbench.costmodel import fitting
from commbench.costmodel.alphabeta import Fit, Params, terms
from commbench.costmodel.correction import Correction

pytestmark = pytest.mark.model

N = 4
CAL = [4096 << (2 * k) for k in range(8)]  # 4 KiB .. 64 MiB, factor 4: the study's calibration
NEW = [8192 << (2 * k) for k in range(7)]  # factor 2 between them: never calibrated


def _rows(times, sizes=CAL, op="broadcast"):
    return [{"op": op, "algo": "native", "size": s, "time_us": t} for s, t in zip(sizes, times)]


def _violations(model: Fit, rows: list[dict], op: str = "broadcast") -> list[str]:
    """What the corrected model must do: return each calibration row's time at its size; at the
    geometric midpoint of two neighbours, the line times the geometric mean of their ratios;
    beyond either end, the line times the end ratio."""
    line = Fit(model.classes, [], model.algos, model.knee, model.curve, model.above)
    bad = []

    def off(got: float, want: float, what: str):
        if abs(got / want - 1) > 1e-9:
            bad.append(f"{what}: {got} != {want}")

    ratio = {r["size"]: r["time_us"] / line.predict_us(op, "native", N, r["size"]) for r in rows}
    for r in rows:
        off(model.predict_us(op, "native", N, r["size"]), r["time_us"], f"at {r['size']}")
    sizes = sorted(ratio)
    for a, b in zip(sizes, sizes[1:]):
        mid = math.sqrt(a * b)
        off(model.predict_us(op, "native", N, mid),
            line.predict_us(op, "native", N, mid) * math.sqrt(ratio[a] * ratio[b]), f"at {mid}")
    for s, end in ((sizes[0] / 8, sizes[0]), (sizes[-1] * 8, sizes[-1])):
        off(model.predict_us(op, "native", N, s), line.predict_us(op, "native", N, s) * ratio[end],
            f"beyond, at {s}")
    return bad


times = st.lists(st.floats(5.0, 1e5), min_size=len(CAL), max_size=len(CAL)).map(sorted)


@given(times, st.sampled_from(["broadcast", "all_reduce"]))
def test_the_corrected_line_returns_calibration_rows_and_interpolates_their_ratios(ts, op):
    rows = _rows(ts, op=op)
    model = fitting.fit(rows, N, forms=("line",), correct=True)
    assert _violations(model, rows, op) == []


def test_an_interpolation_linear_in_size_is_caught(monkeypatch):
    """Negative: ratios interpolated linearly in bytes (not in log bytes) miss the midpoints."""
    rows = _rows([30, 80, 100, 240, 580, 2300, 10600, 46700])
    model = fitting.fit(rows, N, forms=("line",), correct=True)

    def linear(self, size):
        pts = self.points
        if size <= pts[0][0] or size >= pts[-1][0]:
            return pts[0][1] if size <= pts[0][0] else pts[-1][1]
        (s0, r0), (s1, r1) = next((p, q) for p, q in zip(pts, pts[1:]) if p[0] <= size <= q[0])
        return r0 + (r1 - r0) * (size - s0) / (s1 - s0)

    monkeypatch.setattr(Correction, "__call__", linear)
    assert any(v.startswith("at ") for v in _violations(model, rows))


def test_an_inverted_ratio_is_caught():
    """Negative: dividing by the ratio instead of multiplying misses every calibration row."""
    rows = _rows([30, 80, 100, 240, 580, 2300, 10600, 46700])
    model = fitting.fit(rows, N, forms=("line",), correct=True)
    inverted = {k: Correction(tuple((s, 1 / r) for s, r in c.points))
                for k, c in model.corrections.items()}
    broken = Fit(model.classes, [], model.algos, model.knee, model.curve, None, inverted)
    assert len(_violations(broken, rows)) >= len(rows)


# A library with three regimes, like MPICH's broadcast at 4 ranks here: one shared-memory cell
# below 8 KiB, pipelined cells to 512 KiB, scatter + all-gather beyond.
REGIMES = ((0, Params(9e-6, 0.3e-9, 0.0)), (8192, Params(38e-6, 0.2e-9, 0.0)),
           (524288, Params(20e-6, 0.34e-9, 0.0)))


def _three(size: float) -> float:
    p = [p for lo, p in REGIMES if size >= lo][-1]
    return p.time(terms("broadcast", "native", N, size)) * 1e6


def test_three_regimes_are_followed_between_calibration_sizes_where_no_form_is():
    rows = _rows([_three(s) for s in CAL])
    corrected = fitting.fit(rows, N, forms=("line",), correct=True)
    forms = fitting.fit(rows, N)
    clear = [s for s in NEW if s not in (8192, 524288)]  # sizes at a switch: a guess either way

    def worst(model):
        return max(abs(model.predict_us("broadcast", "native", N, s) / _three(s) - 1)
                   for s in clear)

    assert worst(corrected) < 0.1
    assert worst(forms) > 0.15  # two regimes at most: one switch is left out


def test_a_corrected_model_survives_its_json():
    rows = _rows([30, 80, 100, 240, 580, 2300, 10600, 46700])
    model = fitting.fit(rows, N, forms=("line",), correct=True)
    again = Fit.from_dict(model.as_dict())
    assert again.corrections == model.corrections
    for s in NEW:
        assert again.predict_us("broadcast", "native", N, s) == model.predict_us(
            "broadcast", "native", N, s)


def test_uncorrected_fits_and_the_textbook_model_are_left_alone():
    rows = _rows([30, 80, 100, 240, 580, 2300, 10600, 46700], op="all_reduce")
    plain = fitting.fit(rows, N, forms=("line",))
    corrected = fitting.fit(rows, N, forms=("line",), correct=True)
    assert plain.corrections is None and corrected.corrections
    for s in NEW:
        assert corrected.predict_us("all_reduce", "native", N, s, per_algo=False) == \
            plain.predict_us("all_reduce", "native", N, s, per_algo=False)


@pytest.mark.parametrize("points, message", [
    (((8192, 1.0), (4096, 1.0)), "must be positive and increasing"),
    (((4096, 1.0), (4096, 2.0)), "must be positive and increasing"),
    ((), "must be positive and increasing"),
    (((4096, 1.0), (8192, 0.0)), "correction ratios=[0.0]: must be > 0"),
])
def test_bad_correction_points_are_refused_naming_them(points, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Correction(points)
