"""The model study's bookkeeping: sweep order, both statistics, the accuracy it reports."""

from __future__ import annotations

import types

import pytest

from commbench.costmodel.alphabeta import Params, terms
from commbench.studies import model as ms
from commbench.studies import model_judge as mj

pytestmark = pytest.mark.model

TRUE = Params(20e-6, 0.2e-9, 0.1e-9)


def _fake_series(log, slow=1.0):
    """run_series stand-in: times from TRUE's alpha-beta-gamma (lower decile 10% faster)."""

    def series(world, case, sizes, *_, **__):
        log.append((case.op, case.algo, case.check, tuple(sizes), case.iters))
        out = []
        for s in sizes:
            t = TRUE.time(terms(case.op, case.algo, world.size, s)) * 1e6 * slow
            out.append({"op": case.op, "algo": case.algo, "size": s, "time_us": t,
                        "min_us": 0.8 * t, "p10_us": 0.9 * t, "max_us": t, "p99_us": t, "wrong": 0})
        return out

    return series


@pytest.mark.parametrize("separate", [False, True])
def test_sweep_order(monkeypatch, separate):
    log = []
    monkeypatch.setattr(ms, "run_series", _fake_series(log))
    world = types.SimpleNamespace(size=2)
    cases = [("all_reduce", "ring"), ("all_gather", "ring")]
    cal, ev = ms._sweeps(world, "mpi", cases, 5, 1, 4096, 65536, 1, separate)
    order = [(op, sizes[0] >> 10, check) for op, _, check, sizes, _ in log]
    if separate:
        kinds = [(op, check) for op, _, check in order]
        kinds = [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]
        assert kinds == [("all_reduce", False), ("all_gather", False),
                         ("all_reduce", True), ("all_gather", True)]
    else:  # by size: each evaluation row right after the calibration row below it
        assert order[:5] == [("all_reduce", 4, False), ("all_reduce", 8, True),
                             ("all_reduce", 16, False), ("all_reduce", 32, True),
                             ("all_reduce", 64, False)]
        assert [o[0] for o in order[5:]] == ["all_gather"] * 5
    assert [r["size"] for r in cal if r["op"] == "all_reduce"] == [4096, 16384, 65536]
    assert [r["size"] for r in ev if r["op"] == "all_reduce"] == [8192, 32768]  # held out


def test_evaluation_sizes_are_never_calibration_sizes():
    """Factor-4 calibration: the factor-2 sizes between; ping-pong's sqrt(2) curve: a
    quarter-octave off its points; the largest calibration size has none above it."""
    grid = [4096 << k for k in range(15)]
    four = [4096 << (2 * k) for k in range(8)]
    assert ms.held_out(four, grid) == [8192 << (2 * k) for k in range(7)]
    curve = ms.curve_sizes(4096, 64 << 20)
    got = ms.held_out(curve, grid)
    assert len(got) == 14 and not set(got) & set(curve)
    assert all(a < g < b for g in got for a, b in zip(curve, curve[1:]) if a <= g <= b)
    assert ms.held_out([4096, 16384], [4096, 8192, 16384]) == [8192]
    assert ms.held_out([4096, 8192], [4096, 8192]) == [5824]  # the middle, 64-byte multiple


def test_small_rows_get_more_iterations(monkeypatch):
    """OSU's practice: 4x the iterations for small rows, tapering to 1x from 4 MiB."""
    log = []
    monkeypatch.setattr(ms, "run_series", _fake_series(log))
    ms._sweeps(types.SimpleNamespace(size=2), "gloo", [("all_reduce", "ring")], 5, 1,
               1 << 18, 1 << 24, 1, False)
    got = {sizes[0]: iters for *_, sizes, iters in log}
    assert got == {1 << 18: 20, 1 << 19: 20, 1 << 20: 20, 1 << 21: 10, 1 << 22: 5, 1 << 23: 5,
                   1 << 24: 5}


@pytest.mark.parametrize("k", [1, 3])
def test_calibration_rows_take_k_times_the_iterations(monkeypatch, k):
    log = []
    monkeypatch.setattr(ms, "run_series", _fake_series(log))
    ms._sweeps(types.SimpleNamespace(size=2), "gloo", [("all_reduce", "ring")], 5, 1,
               1 << 22, 1 << 24, 1, False, cal_samples=k)
    got = [(check, sizes[0], iters) for _, _, check, sizes, iters in log]
    assert got == [(False, 1 << 22, 5 * k), (True, 1 << 23, 5), (False, 1 << 24, 5 * k)]


def test_fewer_than_one_calibration_sample_is_refused():
    with pytest.raises(ValueError, match=r"cal_samples=0: must be >= 1"):
        ms._sweeps(types.SimpleNamespace(size=2), "gloo", [("all_reduce", "ring")], 5, 1,
                   1 << 22, 1 << 24, 1, False, cal_samples=0)


def test_study_fits_both_statistics_and_reports_small_errors_for_a_true_model(monkeypatch):
    monkeypatch.setattr(ms, "run_series", _fake_series([]))
    world = types.SimpleNamespace(size=4)
    cases = [("all_reduce", "ring"), ("all_reduce", "ring_compiled"), ("sendrecv", "native")]
    out = ms.model_study(world, "mpi", cases, 5, 1, lambda s: None, 4096, 1 << 22)
    for acc in (out["accuracy"], out["accuracy_low"]):
        for a in acc:
            assert a["median_error"] < 1e-6, a
            assert a["rerun_difference"] is None  # nothing measured twice
    ring = out["model"]["algorithms"]["all_reduce/ring"]
    assert ring["alpha"] == pytest.approx(TRUE.alpha, rel=1e-6)
    assert all(a["form_ceiling"] < 1e-6 for a in out["accuracy"])
    assert out["low_statistic"] == "p10"
    assert out["model_low"]["algorithms"]["all_reduce/ring"]["alpha"] == pytest.approx(
        0.9 * TRUE.alpha, rel=1e-6)
    text = mj.model_markdown(dict(out, measurement={"sweeps": "interleaved per size"},
                                  suite="model", world_size=4, launch="local", hardware="cpu",
                                  host="h", created="", versions={}, commit=""))
    assert ("3 of 3 collective/algorithm pairs on median times (3 of 3 on new sizes alone), "
            "3 of 3 on lower decile times") in text
    assert all(a["forms_median_error"] < 1e-6 for a in out["accuracy"])
    fixes = out["model"]["corrections"]["all_reduce/ring"]
    assert all(r == pytest.approx(1.0) for _, r in fixes)  # a true line leaves nothing to correct


def test_accuracy_sees_a_drifted_evaluation(monkeypatch):
    """An evaluation slower than its calibration by 30% shows as 0.3 error; with nothing
    measured twice there is no noise floor to report."""
    calls = {"n": 0}
    fast, slow = _fake_series([]), _fake_series([], slow=1 / 0.7)

    def series(world, case, sizes, *rest, **kw):
        calls["n"] += 1
        return (slow if case.check else fast)(world, case, sizes, *rest, **kw)

    monkeypatch.setattr(ms, "run_series", series)
    out = ms.model_study(types.SimpleNamespace(size=2), "mpi", [("all_reduce", "ring")], 5, 1,
                         lambda s: None, 4096, 1 << 20)
    (a,) = out["accuracy"]
    assert a["median_error"] == pytest.approx(0.3, abs=1e-6)
    assert a["rerun_difference"] is None


def test_the_noise_floor_is_the_spread_of_a_row_s_passes(monkeypatch):
    """With passes, each row is measured several times minutes apart: a second pass 50%
    slower gives every row a (slowest - fastest pass) / pooled median of 0.5 / its median."""
    log = []
    per_pass = 5  # rows of one pass over 1 MiB..16 MiB: 3 calibration sizes, 2 held out
    monkeypatch.setattr(ms, "run_series",
                        _spelled_series(log, lambda k: 1.5 if per_pass <= k < 2 * per_pass else 1))
    out = ms.model_study(types.SimpleNamespace(size=2), "mpi", [("all_reduce", "ring")], 6, 1,
                         lambda s: None, 1 << 20, 1 << 24, passes=2)
    assert len(log) == 2 * per_pass
    (a,) = out["accuracy"]
    rows = out["rows"]
    assert all(r["passes_us"][1] == pytest.approx(1.5 * r["passes_us"][0]) for r in rows)
    assert a["rerun_difference"] == pytest.approx(
        sorted(0.5 * r["passes_us"][0] / r["time_us"] for r in rows)[len(rows) // 2])
    assert a["rerun_difference"] > 0.3


def _spelled_series(log, spells):
    """run_series stand-in whose machine has slow spells: the k-th row measured takes
    ``spells(k)`` times TRUE, each iteration alike (with samples when asked)."""

    def series(world, case, sizes, *_, samples=False):
        (s,) = sizes
        t = TRUE.time(terms(case.op, case.algo, world.size, s)) * spells(len(log))
        log.append((case.op, s, case.check, case.iters))
        row = {"op": case.op, "algo": case.algo, "size": s, "time_us": t * 1e6,
               "min_us": t * 1e6, "p10_us": t * 1e6, "max_us": t * 1e6, "p99_us": t * 1e6,
               "wrong": 0}
        return [dict(row, samples_s=[t] * case.iters) if samples else row]

    return series


def test_passes_split_each_rows_iterations_and_pool_them(monkeypatch):
    log = []
    monkeypatch.setattr(ms, "run_series", _spelled_series(log, lambda k: 1.0))
    cases = [("all_reduce", "ring")]
    cal, ev = ms._sweeps(types.SimpleNamespace(size=2), "mpi", cases, 5, 1, 1 << 20, 1 << 22, 1,
                         False, passes=3)
    per_pass = len(log) // 3
    rows = [(op, s, it) for op, s, _, it in log]
    assert rows[:per_pass] == rows[per_pass:2 * per_pass] == rows[2 * per_pass:]  # list again
    assert [s for _, s, check, _ in log[:per_pass] if check] == [1 << 21]  # held out
    assert [it for *_, it in log[:per_pass]] == [7, 4, 2]  # ceil(iters_for / 3)
    assert all("samples_s" not in r for r in cal + ev)
    assert [r["n_samples"] for r in ev] == [12] and len(ev[0]["passes_us"]) == 3


def test_pooled_passes_smooth_a_slow_spell_that_one_pass_leaves_in_one_size(monkeypatch):
    """A spell that triples the two rows measured during it, the 4 MiB calibration row and the
    8 MiB evaluation row of a single pass: the model takes the spell for the machine and
    misses both held-out neighbours of 4 MiB. With three passes the same spell covers a third
    of those rows' iterations; their medians, and the model, are exact again."""
    cases = [("all_reduce", "ring")]
    got = {}
    for passes in (1, 3):
        log = []
        monkeypatch.setattr(ms, "run_series",
                            _spelled_series(log, lambda k: 3.0 if k in (10, 11) else 1.0))
        out = ms.model_study(types.SimpleNamespace(size=2), "mpi", cases, 5, 1, lambda s: None,
                             4096, 1 << 24, passes=passes)
        assert [(s, check) for _, s, check, _ in log[10:12]] == [(1 << 22, False), (1 << 23, True)]
        got[passes] = out["accuracy"][0]
    assert got[1]["rerun_difference"] is None and got[1]["max_error"] > 0.5
    assert got[3]["max_error"] < 1e-6


def test_form_ceiling_is_zero_for_a_true_model_and_not_for_a_zigzag():
    """The least error the forms reach on the rows themselves: none on alpha-beta-gamma times,
    more than the 15% target on times that alternate between 1x and 2x of them from one size
    to the next."""
    sizes = [4096 << k for k in range(15)]

    def rows(wiggle):
        return [{"op": "all_reduce", "algo": "ring", "size": s,
                 "time_us": TRUE.time(terms("all_reduce", "ring", 2, s)) * 1e6 * wiggle(k)}
                for k, s in enumerate(sizes)]

    knee = float(1 << 25)
    assert mj.form_ceiling(rows(lambda k: 1.0), 2, knee, None) < 1e-6
    assert mj.form_ceiling(rows(lambda k: 1.0 + k % 2), 2, knee, None) > 0.15
    assert mj.form_ceiling(rows(lambda k: 1.0)[:3], 2, knee, None) is None


def test_knee_term_recovers_a_steeper_slope_past_the_cache():
    """Times that steepen from a 1 MiB knee on: the knee fit finds delta, the plain fit cannot."""
    from commbench.costmodel.alphabeta import beyond
    from commbench.costmodel.fitting import fit

    true, knee, n = Params(20e-6, 0.2e-9, 0.1e-9, 0.6e-9), float(1 << 20), 2
    t = terms("all_reduce", "ring", n, knee)  # from the knee on, every byte of the call pays
    assert beyond(t, knee, knee) == t[1] and beyond(t, knee - 64, knee) == 0
    rows = []
    for s in [4096 << (2 * k) for k in range(7)]:  # 4 KiB .. 16 MiB
        t = terms("all_reduce", "ring", n, s)
        rows.append({"op": "all_reduce", "algo": "ring", "size": s,
                     "time_us": true.time(t, beyond(t, s, knee)) * 1e6})
    with_knee, plain = fit(rows, n, knee=knee), fit(rows, n, forms=("line",))
    assert with_knee.algos["all_reduce/ring"].delta == pytest.approx(true.delta, rel=1e-6)
    for r in rows:
        assert with_knee.predict_us("all_reduce", "ring", n, r["size"]) == pytest.approx(
            r["time_us"], rel=1e-6)
    assert max(abs(plain.predict_us("all_reduce", "ring", n, r["size"]) / r["time_us"] - 1)
               for r in rows) > 0.2
    again = type(with_knee).from_dict(with_knee.as_dict())
    assert again.knee == knee and again.algos == with_knee.algos


def test_refit_of_a_stored_study_reproduces_it(monkeypatch):
    monkeypatch.setattr(ms, "run_series", _fake_series([]))
    world = types.SimpleNamespace(size=2)
    cases = [("all_reduce", "ring"), ("all_reduce", "native"), ("pingpong", "native")]
    out = ms.model_study(world, "mpi", cases, 5, 1, lambda s: None, 4096, 1 << 22)
    assert len(out["model"]["curve"]) == len(ms.curve_sizes(4096, 1 << 22))  # 256 B .. 4 MiB
    again = mj.refit(dict(out, world_size=2))
    assert again["model"]["curve"] == out["model"]["curve"]
    assert again["accuracy"] == out["accuracy"] and again["accuracy_low"] == out["accuracy_low"]
    assert [r["pred_us"] for r in again["rows"]] == [r["pred_us"] for r in out["rows"]]


def test_last_level_cache_is_a_positive_size():
    assert mj.last_level_cache() >= 1 << 16


# -- the point-to-point curve ----------------------------------------------------------------------
def _protocol(m: float) -> float:
    """A transport with an eager/rendezvous switch at 64 KiB: dearer per message above it, but
    cheaper per byte (seconds, one way)."""
    return 5e-6 + 1e-9 * m if m <= 65536 else 40e-6 + 0.25e-9 * m


CURVE_SIZES = [1024 << k for k in range(17)]  # 1 KiB .. 64 MiB: every message size used below


def _rows(op, algo, n, sizes, per_step=3e-6, scale=1.5, gamma=0.2e-9, price=None):
    from commbench.costmodel.alphabeta import Curve

    curve = Curve(tuple((float(s), _protocol(s)) for s in CURVE_SIZES))
    rows = []
    for s in sizes:
        t = terms(op, algo, n, s)
        priced = (price or curve.price)(t)
        rows.append({"op": op, "algo": algo, "size": s,
                     "time_us": (per_step * t[0] + scale * priced + gamma * t[2]) * 1e6})
    return rows


def test_curve_is_exact_on_a_linear_transport_and_never_slopes_down_outside():
    from commbench.costmodel.alphabeta import Curve

    c = Curve(((1000.0, 2e-6), (2000.0, 3e-6), (4000.0, 5e-6)))
    for m in (1000, 1500, 3000, 4000):
        assert c(m) == pytest.approx(1e-6 + 1e-9 * m)
    assert c(8000) == pytest.approx(9e-6) and c(10) == pytest.approx(1.01e-6)
    assert c.price((4, 8000, 0)) == pytest.approx(4 * c(2000))
    flat = Curve(((1000.0, 5e-6), (2000.0, 4e-6), (4000.0, 3e-6)))  # noisy: falling ends
    assert flat(100) == pytest.approx(5e-6) and flat(1e6) == pytest.approx(3e-6)


def test_fit_prices_messages_with_the_ping_pong_curve_and_picks_it_by_held_out_rows(monkeypatch):
    """An algorithm on a transport with a protocol switch: its own fit through ping-pong's curve
    predicts sizes it was not calibrated at; a straight line cannot, and the choice between the
    two, made on calibration rows alone, picks the curve. A broken variant that prices the whole
    call's bytes as each message's size misses."""
    from commbench.costmodel import alphabeta as ab
    from commbench.costmodel import fitting

    n, cal = 4, [4096 << (2 * k) for k in range(8)]  # 4 KiB .. 64 MiB, factor 4
    pp = [{"op": "pingpong", "algo": "native", "size": s, "time_us": _protocol(s) * 1e6}
          for s in CURVE_SIZES]
    ring = _rows("all_reduce", "ring", n, cal)
    truth = _rows("all_reduce", "ring", n, [4096 << k for k in range(15)])  # half of them new

    def worst(model) -> float:
        return max(abs(model.predict_us("all_reduce", "ring", n, r["size"]) / r["time_us"] - 1)
                   for r in truth)

    model = fitting.fit(pp + ring, n)
    own = model.algos["all_reduce/ring"]
    assert own.scale == pytest.approx(1.5, rel=1e-6) and own.beta == 0
    line = fitting.fit(ring, n, forms=("line",))  # no ping-pong rows: the straight line
    assert line.algos["all_reduce/ring"].scale == 0
    assert worst(model) < 1e-6 and worst(line) > 0.1
    monkeypatch.setattr(ab.Curve, "price", lambda self, t: t[0] * self(t[1]) if t[0] else 0.0)
    # (line or curve only: two straight regimes would fit this one switch exactly, curve or not)
    assert worst(fitting.fit(pp + ring, n, forms=("line", "curve"))) > 0.1
