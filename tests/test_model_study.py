"""The model study's bookkeeping: sweep order, both statistics, the accuracy it reports."""

from __future__ import annotations

import types

import pytest

from commbench import model_judge as mj
from commbench import model_study as ms
from commbench.costmodel.alphabeta import Params, terms

pytestmark = pytest.mark.model

TRUE = Params(20e-6, 0.2e-9, 0.1e-9)


def _fake_series(log, slow=1.0):
    """run_series stand-in: times from TRUE's alpha-beta-gamma (best iteration 10% faster)."""

    def series(world, case, sizes, *_):
        log.append((case.op, case.algo, case.check, tuple(sizes)))
        out = []
        for s in sizes:
            t = TRUE.time(terms(case.op, case.algo, world.size, s)) * 1e6 * slow
            out.append({"op": case.op, "algo": case.algo, "size": s, "time_us": t,
                        "min_us": 0.9 * t, "max_us": t, "p99_us": t, "wrong": 0})
        return out

    return series


@pytest.mark.parametrize("separate", [False, True])
def test_sweep_order(monkeypatch, separate):
    log = []
    monkeypatch.setattr(ms, "run_series", _fake_series(log))
    world = types.SimpleNamespace(size=2)
    cases = [("all_reduce", "ring"), ("all_gather", "ring")]
    cal, ev = ms._sweeps(world, "mpi", cases, 5, 1, 4096, 65536, 1, separate)
    kinds = [(op, check) for op, _, check, _ in log]
    if separate:
        assert kinds == [("all_reduce", False), ("all_gather", False),
                         ("all_reduce", True), ("all_gather", True)]
    else:
        assert kinds == [("all_reduce", False), ("all_reduce", True),
                         ("all_gather", False), ("all_gather", True)]
    assert [r["size"] for r in cal if r["op"] == "all_reduce"] == [4096, 16384, 65536]
    assert [r["size"] for r in ev if r["op"] == "all_reduce"] == [4096, 8192, 16384, 32768, 65536]


def test_study_fits_both_statistics_and_reports_small_errors_for_a_true_model(monkeypatch):
    monkeypatch.setattr(ms, "run_series", _fake_series([]))
    world = types.SimpleNamespace(size=4)
    cases = [("all_reduce", "ring"), ("all_reduce", "ring_compiled"), ("sendrecv", "native")]
    out = ms.model_study(world, "mpi", cases, 5, 1, lambda s: None, 4096, 1 << 22)
    for acc in (out["accuracy"], out["accuracy_min"]):
        for a in acc:
            assert a["median_error"] < 1e-6, a
            assert a["rerun_difference"] == 0
    ring = out["model"]["algorithms"]["all_reduce/ring"]
    assert ring["alpha"] == pytest.approx(TRUE.alpha, rel=1e-6)
    assert out["model_min"]["algorithms"]["all_reduce/ring"]["alpha"] == pytest.approx(
        0.9 * TRUE.alpha, rel=1e-6)
    text = mj.model_markdown(dict(out, measurement={"sweeps": "interleaved per case"},
                                  suite="model", world_size=4, launch="local", hardware="cpu",
                                  host="h", created="", versions={}, commit=""))
    assert "3 of 3 collective/algorithm pairs on median times, 3 of 3 on best times" in text


def test_accuracy_sees_a_drifted_evaluation(monkeypatch):
    """An evaluation slower than its calibration by 30% shows as 0.3 error and 0.3 noise floor."""
    calls = {"n": 0}
    fast, slow = _fake_series([]), _fake_series([], slow=1 / 0.7)

    def series(world, case, sizes, *rest):
        calls["n"] += 1
        return (slow if case.check else fast)(world, case, sizes, *rest)

    monkeypatch.setattr(ms, "run_series", series)
    out = ms.model_study(types.SimpleNamespace(size=2), "mpi", [("all_reduce", "ring")], 5, 1,
                         lambda s: None, 4096, 1 << 20)
    (a,) = out["accuracy"]
    assert a["median_error"] == pytest.approx(0.3, abs=1e-6)
    assert a["rerun_difference"] == pytest.approx(0.3, abs=1e-6)


def test_knee_term_recovers_a_steeper_slope_past_the_cache():
    """Times that steepen past a 1 MiB knee: the knee fit finds delta, the plain fit cannot."""
    from commbench.costmodel.alphabeta import beyond, fit

    true, knee, n = Params(20e-6, 0.2e-9, 0.1e-9, 0.6e-9), float(1 << 20), 2
    rows = []
    for s in [4096 << (2 * k) for k in range(7)]:  # 4 KiB .. 16 MiB
        t = terms("all_reduce", "ring", n, s)
        rows.append({"op": "all_reduce", "algo": "ring", "size": s,
                     "time_us": true.time(t, beyond(t, s, knee)) * 1e6})
    with_knee, plain = fit(rows, n, knee=knee), fit(rows, n)
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
    cases = [("all_reduce", "ring"), ("all_reduce", "native")]
    out = ms.model_study(world, "mpi", cases, 5, 1, lambda s: None, 4096, 1 << 22)
    again = mj.refit(dict(out, world_size=2))
    assert again["accuracy"] == out["accuracy"] and again["accuracy_min"] == out["accuracy_min"]
    assert [r["pred_us"] for r in again["rows"]] == [r["pred_us"] for r in out["rows"]]


def test_last_level_cache_is_a_positive_size():
    assert mj.last_level_cache() >= 1 << 16
