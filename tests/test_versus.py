"""The side-by-side study's bookkeeping: order of timings, best algorithm, ratios, errors."""

from __future__ import annotations

import pytest

from commbench.results import records as res
from commbench.studies import versus as vs
from commbench.studies.model import iters_for

pytestmark = pytest.mark.collectives

ALGOS = ["native", "ring_compiled", "recursive_doubling_compiled"]


class FakeWorld:
    """world.run stand-in: 2 ranks, each timing ``speed[algo](round)`` seconds per iteration,
    rank 1 slower by ``skew`` (the per-iteration max over ranks must pick it)."""

    def __init__(self, speed, skew=1e-6, wrong=None):
        self.speed, self.skew, self.wrong = speed, skew, wrong or {}
        self.log: list[tuple[str, int, int]] = []

    def run(self, fn, case, nbytes):
        k = sum(1 for a, s, _ in self.log if a == case.algo and s == nbytes)  # this algo's round
        self.log.append((case.algo, nbytes, case.iters))
        t = self.speed[case.algo](k)
        return [{"times": [t] * case.iters, "wrong": self.wrong.get(case.algo, 0)},
                {"times": [t + self.skew] * case.iters, "wrong": 0}]


def test_each_round_times_every_algorithm_once_in_a_rotated_order():
    w = FakeWorld({a: (lambda k: 1e-3) for a in ALGOS})
    vs.versus(w, "mpi", [8, 1 << 24], iters=5, warmup=0, rounds=4, emit=lambda s: None,
              algos=ALGOS)
    for size in (8, 1 << 24):
        seq = [a for a, s, _ in w.log if s == size]
        rounds = [seq[i:i + 3] for i in range(0, 12, 3)]
        assert rounds == [vs.order(ALGOS, k) for k in range(4)]
        assert [r[0] for r in rounds] == ["native", "ring_compiled",
                                          "recursive_doubling_compiled", "native"]
    assert {it for a, s, it in w.log if s == 8} == {iters_for(8, 5)} == {50}
    assert {it for a, s, it in w.log if s == 1 << 24} == {5}


def test_best_ratio_range_and_wins_from_the_rounds():
    speed = {"native": lambda k: 4e-6 if k == 2 else 10e-6,  # native wins round 2 only
             "ring_compiled": lambda k: 8e-6, "recursive_doubling_compiled": lambda k: 5e-6}
    (row,) = vs.versus(FakeWorld(speed, skew=0.0), "gloo", [64], iters=3, warmup=0, rounds=4,
                       emit=lambda s: None, algos=ALGOS)
    assert row["best_algo"] == "recursive_doubling_compiled"
    assert row["native_us"] == pytest.approx(10.0) and row["best_us"] == pytest.approx(5.0)
    assert row["native_over_best"] == pytest.approx(2.0)  # medians over all rounds' samples
    assert (row["ratio_lo"], row["ratio_hi"]) == (pytest.approx(0.8), pytest.approx(2.0))
    assert row["wins"] == 3 and row["rounds"] == 4
    assert row["median_us"]["ring_compiled"] == pytest.approx(8.0)


def test_max_over_ranks_per_iteration():
    speed = {a: (lambda k: 10e-6) for a in ALGOS}
    (row,) = vs.versus(FakeWorld(speed, skew=5e-6), "mpi", [8], iters=2, warmup=0, rounds=1,
                       emit=lambda s: None, algos=ALGOS)
    assert row["native_us"] == pytest.approx(15.0)


def test_a_transport_faster_than_every_algorithm_is_reported_as_such():
    """The study can say no: native/best < 1, no round won, 0 sizes met."""
    speed = {"native": lambda k: 10e-6, "ring_compiled": lambda k: 20e-6,
             "recursive_doubling_compiled": lambda k: 40e-6}
    rows = vs.versus(FakeWorld(speed, skew=0.0), "mpi", [8], iters=2, warmup=0, rounds=2,
                     emit=lambda s: None, algos=ALGOS)
    assert rows[0]["best_algo"] == "ring_compiled" and rows[0]["wins"] == 0
    assert rows[0]["native_over_best"] == pytest.approx(0.5)
    record = res.header("versus", 2, "local-mpi", "cpu", {"rounds": 2})
    record.update(transport="mpi", rows=rows)
    assert "At least as fast at 0 of 1 sizes" in vs.versus_markdown(record)


def test_wrong_elements_stop_the_study_naming_the_algorithm_and_size():
    w = FakeWorld({a: (lambda k: 1e-6) for a in ALGOS}, wrong={"ring_compiled": 3})
    with pytest.raises(RuntimeError, match=r"all_reduce/ring_compiled over mpi at 512 B: 3 wrong"):
        vs.versus(w, "mpi", [512], iters=2, warmup=0, rounds=1, emit=lambda s: None, algos=ALGOS)


@pytest.mark.parametrize("kw, msg", [({"rounds": 0}, "rounds=0: must be >= 1"),
                                     ({"algos": ["ring_compiled", "native"]}, "start with 'native'"),
                                     ({"algos": ["native"]}, "at least one other")])
def test_bad_arguments_fail_before_any_timing(kw, msg):
    w = FakeWorld({})
    with pytest.raises(ValueError, match=msg):
        vs.versus(w, "mpi", [8], **kw)
    assert w.log == []


def test_markdown_counts_the_sizes_met():
    speed = {"native": lambda k: 10e-6, "ring_compiled": lambda k: 5e-6,
             "recursive_doubling_compiled": lambda k: 20e-6}
    rows = vs.versus(FakeWorld(speed, skew=0.0), "gloo", [8, 64], iters=2, warmup=0, rounds=2,
                     emit=lambda s: None, algos=ALGOS)
    record = res.header("versus", 2, "local-mpi", "cpu", {"rounds": 2})
    record.update(transport="gloo", rows=rows)
    text = vs.versus_markdown(record)
    assert "At least as fast at 2 of 2 sizes" in text
    assert "| ring_compiled" in text or "ring_compiled |" in text
