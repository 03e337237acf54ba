"""The model study's bookkeeping: sweep order, both statistics, the accuracy it reports."""

from __future__ import annotations

import types

import pytest

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
    text = ms.model_markdown(dict(out, measurement={"sweeps": "interleaved per case"},
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
