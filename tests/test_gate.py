"""The regression gate (commbench.results.compare) at its edges: exact thresholds and sizes,
runs of slow sizes, series kept apart, soundness rules, the report; what ``make mutate`` runs
against that module."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.collectives


def _rec(rows, n=2):
    return {"schema": "commbench.results.records/1", "world_size": n, "rows": rows}


def _row(size, time_us, min_us=None, busbw=None, algo="ring", op="all_reduce"):
    return {"op": op, "algo": algo, "transport": "gloo", "type": "float32",
            "redop": "sum", "root": -1, "size": size, "time_us": time_us,
            "min_us": time_us if min_us is None else min_us,
            "busbw": size / time_us / 1e3 if busbw is None else busbw}


def test_the_gate_at_its_exact_boundaries():
    """A drop of exactly the threshold is not a regression, just past it is; a row at exactly
    min_size is judged; an unmatched row in the middle does not end the matching."""
    from commbench.results.compare import compare

    sizes = [1 << 16, 1 << 17, 1 << 18]
    old = _rec([_row(s, 100.0) for s in sizes])
    at = _rec([_row(s, 100.0 / 0.9) for s in sizes])  # busbw down exactly 10%
    past = _rec([_row(s, 100.0 / 0.9 * 1.001) for s in sizes])
    assert compare(old, at, 0.10, 1 << 16)[1] == []
    rows, bad = compare(old, past, 0.10, 1 << 16)
    assert len(bad) == 3 and {r["size"] for r in bad} == set(sizes)
    assert all(r["ratio"] == pytest.approx(0.9 / 1.001) and r["new_min_us"] > 111 for r in rows)
    mid = _rec([_row(sizes[0], 200.0), _row(sizes[1], 200.0, algo="other"), _row(sizes[1], 200.0),
                _row(sizes[2], 200.0)])
    assert len(compare(old, mid, 0.10, 1 << 16)[0]) == 3  # the unmatched row is skipped, not the end
    only_min = _rec([_row(s, 200.0, min_us=100.0) for s in sizes])  # median slower, best not
    assert compare(old, only_min, 0.10, 1 << 16)[1] == []
    with pytest.raises(ValueError, match="threshold=1: must be between 0 and 1"):
        compare(old, past, 1, 1 << 16)
    with pytest.raises(ValueError, match="threshold=1.5"):
        compare(old, past, 1.5, 1 << 16)


def test_a_zero_busbw_baseline_never_regresses_and_has_no_ratio():
    import math

    from commbench.results.compare import compare

    old = _rec([_row(1 << 16, 100.0, busbw=0.0)], n=1)
    new = _rec([_row(1 << 16, 300.0, busbw=0.0)], n=1)
    rows, bad = compare(old, new, 0.10, 1 << 16)
    assert bad == [] and math.isnan(rows[0]["ratio"])
    slow = _rec([_row(1 << 16, 300.0)])
    low = _rec([_row(1 << 16, 100.0, busbw=0.5)])  # a busbw below 1 is still a baseline
    assert compare(low, slow, 0.10, 1 << 16)[1] != []


def test_soundness_rules_at_their_edges(tmp_path):
    import json

    from commbench.results.compare import load

    def sound(row, n=2):
        path = tmp_path / "r.json"
        path.write_text(json.dumps(_rec([row], n)))
        try:
            load(str(path))
            return ""
        except ValueError as exc:
            return str(exc)

    assert sound(_row(0, 5.0, busbw=0.0)) == ""  # size 0 moves nothing
    assert sound(_row(64, 5.0, busbw=0.0), n=1) == ""  # a world of one moves nothing
    assert "busbw = 0.0: must be a finite number, > 0 at a size above 0" in \
        sound(_row(64, 5.0, busbw=0.0))
    assert "busbw = 0.0" in sound(_row(1, 5.0, busbw=0.0))
    assert sound(_row(64, 5.0, busbw=0.5)) == ""
    assert "min_us = 0.0: must be a finite number > 0" in sound(_row(64, 5.0, min_us=0.0))
    assert "time_us = -1.0" in sound(_row(64, -1.0, min_us=1.0, busbw=1.0))
    assert "size = True" in sound(_row(True, 5.0, busbw=1.0))
    assert "size = -1: must be a whole number of bytes in 0..2**50" in sound(_row(-1, 5.0,
                                                                               busbw=1.0))
    assert "size = 1125899906842625" in sound(_row(2**50 + 1, 5.0, busbw=1.0))
    assert "row 0 (all_reduce ring gloo size 64): busbw = -0.5" in sound(_row(64, 5.0, busbw=-0.5))
    assert "r.json: row 0 lacks min_us, busbw" in sound({k: v for k, v in _row(8, 5.0).items()
                                                        if k not in ("busbw", "min_us")})
    for text, rule in (("", "not valid JSON"), ('{"schema": "commbench.results.records/1", '
                       '"rows": {}}', "'rows' must be a list"),
                       ('{"schema": "commbench.results.records/1", "rows": [], "world_size": '
                        '"2"}', "'world_size' must be an integer")):
        (tmp_path / "x.json").write_text(text)
        with pytest.raises(ValueError, match=rule):
            load(str(tmp_path / "x.json"))
    with pytest.raises(ValueError, match="nope.json: no such file"):
        load(str(tmp_path / "nope.json"))
    with pytest.raises(ValueError, match=": is a folder; a results file must be a regular file"):
        load(str(tmp_path))


def test_the_gate_report_says_what_it_found():
    from commbench.results.compare import compare, report

    sizes = [1 << 16, 1 << 17, 1 << 18]
    old = _rec([_row(s, 100.0) for s in sizes])
    new = _rec([_row(s, 125.0) for s in sizes])
    rows, bad = compare(old, new, 0.10, 1 << 16)
    text = report(rows, bad, 0.10, 1 << 16)
    head, rule, *table, verdict = text.splitlines()
    assert [c.strip() for c in head.split("|")[1:-1]] == [
        "op", "algo", "transport", "size", "old(us)", "new(us)", "time new/old", "old range(us)",
        "new range(us)", "busbw new/old", "witness(us)", "adds(us)", "verdict"] \
        and set(rule) <= set("|- ")
    first = [c.strip() for c in table[0].split("|")[1:-1]]
    assert first == ["all_reduce", "ring", "gloo", "65536", "100.0", "125.0", "1.250",
                     "100.0-100.0", "125.0-125.0", "0.800", "", "", "REGRESSED"]
    test = ("the new run's range of typical times (rounds' medians, else lower decile to median "
            "of its iterations) above the old run's by > 11.1% (busbw down > 10%), at >= 65536 "
            "B, over 3 consecutive sizes of a series")
    assert verdict == "# 3 of 3 rows regressed: " + test
    rows, bad = compare(old, old, 0.10, 1 << 16)
    text = report(rows, bad, 0.10, 1 << 16)
    assert text.splitlines()[-1] == "# no regression in 3 matched rows (" + test + ")"
    assert "REGRESSED" not in text and len(text.splitlines()) == 6


def test_a_row_is_judged_against_both_runs_own_spread():
    """Rounds give the run-to-run spread, iterations the lower decile: a median 50% slower whose
    ranges overlap is not judged (exit 0, listed); ranges apart by more than the threshold are a
    regression; a row beyond the spread at one size alone is an isolated one, not judged."""
    from commbench.results.compare import compare, report, typical

    sizes = [1 << 16, 1 << 17, 1 << 18]

    def rounds(t, *rs):
        return [{**_row(s, t), "rounds_us": list(rs)} for s in sizes]

    old = _rec(rounds(100.0, 100.0, 120.0, 160.0))
    assert typical(old["rows"][0]) == (100.0, 160.0)
    within = _rec(rounds(150.0, 150.0, 170.0, 175.0))  # 150 <= 160 x 1.111
    rows, bad = compare(old, within, 0.10, 1 << 16)
    assert bad == [] and [r["verdict"] for r in rows] == ["within spread"] * 3
    apart = _rec(rounds(180.0, 180.0, 181.0, 200.0))  # 180 > 160 x 1.111 = 177.8
    assert len(compare(old, apart, 0.10, 1 << 16)[1]) == 3
    # iterations: the lower decile to the median
    deciles = _rec([{**_row(s, 100.0, min_us=50.0), "p10_us": 90.0} for s in sizes])
    assert typical(deciles["rows"][0]) == (90.0, 100.0)
    wide = _rec([{**_row(s, 150.0, min_us=60.0), "p10_us": 105.0} for s in sizes])
    rows, bad = compare(deciles, wide, 0.10, 1 << 16)
    assert bad == [] and {r["verdict"] for r in rows} == {"within spread"}
    text = report(rows, bad, 0.10, 1 << 16)
    assert text.splitlines()[-1] == (
        "# 3 rows not judged: slower by > 11.1% in the median, but 3 within the runs' own spread "
        "and 0 beyond it at fewer than 3 consecutive sizes (the machine's noise cannot be told "
        "from the code's)")
    one = _rec([{**_row(s, 300.0 if k == 1 else 100.0), "p10_us": 300.0 if k == 1 else 90.0}
                for k, s in enumerate(sizes)])
    rows, bad = compare(deciles, one, 0.10, 1 << 16)
    assert bad == [] and [r["verdict"] for r in rows] == ["", "isolated", ""]
    # a file without spread: its one figure is the range
    flat = _rec([{**_row(s, 100.0, min_us=50.0), "spread": False} for s in sizes])
    assert typical(flat["rows"][0]) == (100.0, 100.0)


def test_a_run_slower_as_a_whole_is_said_so_and_none_of_its_rows_is_judged():
    """Every series of the new run slower alike (a slow spell of a shared machine over the whole
    run looks so): a line says the run moved as a whole and by how much, and none of its rows is
    judged (``run shifted``), not even a series far slower than the shift (such a spell slows
    some rows 5 to 9x). One series slowed alone among unchanged ones moves the run's median too
    little to be a shift, and so does exactly the threshold's time growth."""
    from commbench.results.compare import Shift, compare, report, run_shift, shifted

    sizes = [1 << 16 << k for k in range(3)]
    algos = ("ring", "tree", "bruck")

    def rec(slow: dict[str, float]):
        return _rec([_row(s, 100.0 * slow.get(a, 1.0), algo=a) for a in algos for s in sizes])

    old = rec({})
    whole = rec(dict.fromkeys(algos, 1.4))
    assert run_shift(old, whole).run == pytest.approx(1.4)
    rows, bad = compare(old, whole, 0.10, 1 << 16)
    assert shifted(rows, 0.10, 1 << 16).startswith(
        "# the new run is slower as a whole: its median row takes 1.40x the old one's time, "
        "over 9 judged rows of 3 series; no row of it is judged")
    assert bad == [] and {r["verdict"] for r in rows} == {"run shifted"}
    assert report(rows, bad, 0.10, 1 << 16).endswith(
        "# 9 rows not judged: slower by > 11.1% in the median, but 0 within the runs' own "
        "spread and 0 beyond it at fewer than 3 consecutive sizes, 9 in a run or op slower as a "
        "whole (the machine's noise cannot be told from the code's)")
    # ring 5x in a run shifted 1.4x: not judged either
    rows, bad = compare(old, rec({"ring": 5.0, "tree": 1.4, "bruck": 1.4}), 0.10, 1 << 16)
    assert bad == [] and {r["verdict"] for r in rows} == {"run shifted"}
    rows, bad = compare(old, rec({"ring": 2.0}), 0.10, 1 << 16)
    assert shifted(rows, 0.10, 1 << 16) == "" and len(bad) == 3
    rows, _ = compare(old, rec(dict.fromkeys(algos, 1 / 0.9)), 0.10, 1 << 16)
    assert shifted(rows, 0.10, 1 << 16) == ""
    rows, _ = compare(rec({}), rec({"ring": 1.4}), 0.10, 1 << 16)
    one = [r for r in rows if r["algo"] == "ring"]
    assert shifted(one, 0.10, 1 << 16) == ""  # one series: its shift is its own
    # imported logs (nccl-tests before and after a change of the cluster) give no shift: every
    # row slower by 1.4x is a regression, and the line says they stand as measured
    for suite in ("nccl-tests", "osu"):
        log_old, log_new = {**old, "suite": suite}, {**whole, "suite": suite}
        assert run_shift(log_old, log_new) == Shift() == run_shift(old, log_new)
        rows, bad = compare(log_old, log_new, 0.10, 1 << 16)
        assert len(bad) == 9 and "(rows of imported logs, judged as they stand)" in \
            shifted(rows, 0.10, 1 << 16)
    ring_only = _rec([_row(s, 140.0, algo="ring") for s in sizes])
    assert run_shift(old, ring_only) == Shift() and len(compare(old, ring_only, 0.10, 1 << 16)[1]) == 3
    # a part of a run judged at the whole run's shift (the sweep's second look)
    assert compare(old, ring_only, 0.10, 1 << 16, shift=Shift(1.4))[1] == []
    assert compare(old, ring_only, 0.10, 1 << 16, shift=Shift(1.0, (("all_reduce (gloo)", 1.4),)))[1] == []
    assert len(compare(old, ring_only, 0.10, 1 << 16, shift=Shift(1.0, (("all_reduce (mpi)", 1.4),)))[1]) == 3


def test_an_op_slower_as_a_whole_is_said_so_and_its_rows_are_not_judged():
    """Every algorithm of one op slower alike, the run as a whole not (this machine's slow
    spells strike one op's series so): a line names the op and its shift, and none of its rows
    is judged (``op shifted``); another op's slowed series is still a regression. An op needs
    three series for a shift of its own: with two, one regressed series is half of its rows,
    and is judged; with three, one regressed series moves the op's median too little."""
    from commbench.results.compare import compare, run_shift, shifted

    sizes = [1 << 16 << k for k in range(3)]
    plan = {"all_reduce": ("ring", "tree", "rabenseifner"),
            "all_gather": ("ring", "bruck", "naive", "native"), "broadcast": ("binomial", "native")}

    def rec(slow: dict[tuple[str, str], float]):
        return _rec([_row(s, 100.0 * slow.get((op, a), 1.0), algo=a, op=op)
                     for op, algos in plan.items() for a in algos for s in sizes])

    old = rec({})
    ar = {("all_reduce", a): 1.5 for a in plan["all_reduce"]}
    new = rec({**ar, ("all_gather", "bruck"): 2.0})
    shift = run_shift(old, new)
    assert shift.run == 1.0 and dict(shift.ops) == {"all_reduce (gloo)": 1.5, "all_gather (gloo)": 1.0}
    rows, bad = compare(old, new, 0.10, 1 << 16)
    assert {(r["op"], r["algo"]) for r in bad} == {("all_gather", "bruck")} and len(bad) == 3
    assert {r["verdict"] for r in rows if r["op"] == "all_reduce"} == {"op shifted"}
    assert shifted(rows, 0.10, 1 << 16) == (
        "# all_reduce (gloo) is slower as a whole in the new run: its median row takes 1.50x the "
        "old one's time, over 9 judged rows of 3 series; no row of all_reduce (gloo) is judged, "
        "for a shift "
        "that many series share is the machine's state during one of the runs as often as the "
        "code: rerun both, one after the other, to judge them")
    # one series of three slowed: a regression, not the op's shift
    rows, bad = compare(old, rec({("all_reduce", "ring"): 2.0}), 0.10, 1 << 16)
    assert {r["algo"] for r in bad} == {"ring"} and len(bad) == 3
    assert shifted(rows, 0.10, 1 << 16) == ""
    # an op of two series has no shift of its own: one slowed is judged
    rows, bad = compare(old, rec({("broadcast", "binomial"): 2.0}), 0.10, 1 << 16)
    assert {r["algo"] for r in bad} == {"binomial"} and len(bad) == 3


def test_the_gate_at_exact_limits_and_windows():
    """threshold 0.5 makes the limit exactly 2: a time of exactly twice is not past it; a run of
    three slow sizes flags those three and not the sizes after them; series are kept apart
    by every field but size (algorithm, root)."""
    from commbench.results.compare import compare, report

    sizes = [1 << 16 << k for k in range(5)]
    old = _rec([_row(s, 100.0) for s in sizes])
    exact = _rec([_row(s, 200.0, min_us=300.0) for s in sizes])
    assert compare(old, exact, 0.5, 1 << 16)[1] == []  # median at exactly 2x
    exact = _rec([_row(s, 300.0, min_us=200.0) for s in sizes])
    assert compare(old, exact, 0.5, 1 << 16)[1] == []  # best at exactly 2x
    between = _rec([_row(s, 105.0, min_us=300.0) for s in sizes])  # median 5% slower only
    assert compare(old, between, 0.10, 1 << 16)[1] == []
    first3 = _rec([_row(s, 300.0 if k < 3 else 100.0) for k, s in enumerate(sizes)])
    rows, bad = compare(old, first3, 0.10, 1 << 16)
    assert sorted(r["size"] for r in bad) == sizes[:3]
    table = [x for x in report(rows, bad, 0.10, 1 << 16).splitlines() if x.startswith("|")]
    # the two sizes after them, unchanged, are faster than the rest of their series: not flagged,
    # and not judged either (a slowdown there would hide behind it)
    assert [[c.strip() for c in x.split("|")[1:-1]][-1] for x in table[-2:]] == ["faster alone"] * 2
    one = _rec([_row(s, 300.0 if k == 0 else 100.0) for k, s in enumerate(sizes)])
    assert compare(old, one, 0.10, 1 << 16)[1] == []  # the row at min_size alone: no run
    with pytest.raises(ValueError, match="threshold=0: must be between 0 and 1"):
        compare(old, one, 0, 1 << 16)
    # two series, each slow at two sizes only: no run of three inside either
    two_old = _rec([_row(s, 100.0, algo=a) for a in ("ring", "tree") for s in sizes[:3]])
    two_new = _rec([_row(s, 300.0 if k < 2 else 100.0, algo=a) for a in ("ring", "tree")
                    for k, s in enumerate(sizes[:3])])
    assert compare(two_old, two_new, 0.10, 1 << 16)[1] == []
    roots_old = _rec([dict(_row(s, 100.0), op="broadcast", root=r) for r in (0, 1)
                      for s in sizes[:3]])
    roots_new = _rec([dict(_row(s, 300.0 if k < 2 else 100.0), op="broadcast", root=r)
                      for r in (0, 1) for k, s in enumerate(sizes[:3])])
    assert compare(roots_old, roots_new, 0.10, 1 << 16)[1] == []


def _with_requested(rows):
    return [{**r, "requested": r["size"]} for r in rows]


def test_the_sweep_counts_a_regression_only_when_measuring_it_again_confirms_it():
    """A slow spell slows a series once; the code slows it every time. The sweep measures the
    regressed rows again at once and reports only those slow twice."""
    from commbench.studies.collectives import _against

    sizes = [1 << 16, 1 << 17, 1 << 18]
    steady = ("tree", "bruck", "pairwise")  # unchanged: the run as a whole did not shift
    old = _rec([_row(s, 100.0, algo=a) for a in ("ring", "naive", *steady) for s in sizes])
    new = _rec(_with_requested([_row(s, 150.0 if a in ("ring", "naive") else 100.0, algo=a)
                                for a in ("ring", "naive", *steady) for s in sizes]))
    asked: list[tuple] = []

    def again(key, wanted):  # ring is slow again, naive was a spell
        asked.append((key[1], wanted))
        return _with_requested([_row(s, 150.0 if key[1] == "ring" else 101.0, algo=key[1])
                                for s in wanted])

    said: list[str] = []
    _against(old, new, "old.json", said.append, again)
    assert sorted(asked) == [("naive", sizes), ("ring", sizes)]
    assert "6 rows regressed against old.json; measured again at once, 3 regressed again" in said[0]
    assert "3 of 15 rows regressed" in said[-1]
    tables = "\n".join(said)
    assert tables.count("REGRESSED") == 3 and "| naive" not in tables
    said.clear()  # both slow again: judged at the whole run's shift (1.0), not at theirs (1.5)
    _against(old, new, "old.json", said.append,
             lambda key, wanted: _with_requested([_row(s, 150.0, algo=key[1]) for s in wanted]))
    assert "measured again at once, 6 regressed again" in said[0]
    said.clear()
    _against(old, new, "old.json", said.append)  # nobody to measure again: all six stand
    assert "6 of 15 rows regressed" in said[-1]


def test_the_sweep_says_every_line_of_its_verdict_and_the_run_s_shift():
    """A run slower as a whole than the table it replaces: the sweep prints the verdict, the
    rows it could not judge and the shift, each on its own line (none is dropped for another)."""
    from commbench.studies.collectives import _against

    sizes = [1 << 16, 1 << 17, 1 << 18]
    algos = ("ring", "tree", "bruck")
    old = _rec([_row(s, 100.0, algo=a) for a in algos for s in sizes])
    new = _rec(_with_requested([_row(s, 140.0, algo=a) for a in algos for s in sizes]))
    said: list[str] = []
    _against(old, new, "old.json", said.append)
    assert said[1].startswith("# no regression in 9 matched rows")
    assert said[2].startswith("# 9 rows not judged") and "9 in a run or op slower as a whole" in said[2]
    assert said[3].startswith("# the new run is slower as a whole: its median row takes 1.40x")
    assert len(said) == 4


def _slowed_in_a_faster_run() -> None:
    """A series slowed 2x by the code in a run the machine sped 0.55x as a whole (1.1x the old
    time, under the threshold), and one slowed 2x at rows the machine sped 4x (0.5x, as fast as
    the run): none of the run's rows passes (``run faster``); a series regressed even so, 3x, is
    flagged."""
    from commbench.results.compare import compare

    sizes = [1 << 16 << k for k in range(3)]
    algos = ("ring", "tree", "bruck", "pairwise", "direct")
    old = _rec([_row(s, 100.0, algo=a) for a in algos for s in sizes])
    new = _rec([_row(s, 100.0 * f, algo=a) for a, f in (("ring", 1.1), ("tree", 0.55),
                                                         ("bruck", 0.55), ("pairwise", 0.5),
                                                         ("direct", 3.0)) for s in sizes])
    rows, bad = compare(old, new, 0.10, 1 << 16)
    assert {r["algo"] for r in bad} == {"direct"}
    assert {r["algo"]: r["verdict"] for r in rows} == {
        "ring": "run faster", "tree": "run faster", "bruck": "run faster",
        "pairwise": "run faster", "direct": "REGRESSED"}


def test_a_row_slowed_in_a_run_faster_as_a_whole_is_not_judged_rather_than_passed():
    """The machine sped the new run as a whole (0.55x): a series the code slowed 2x there takes
    1.1x the old time, under the threshold, and would pass unseen; no row of the run passes
    (``run faster``), a line says the run moved, and the gate still exits clean. With the run
    unchanged the same 1.1x is no finding at all. An op faster as a whole (three series or
    more) does the same for its rows alone, with a line of its own."""
    from commbench.results.compare import compare, report, shifted

    _slowed_in_a_faster_run()
    sizes = [1 << 16 << k for k in range(3)]
    algos = ("ring", "tree", "bruck")

    def rec(slow: dict[str, float], op: str = "all_reduce"):
        return _rec([_row(s, 100.0 * slow.get(a, 1.0), algo=a, op=op) for a in algos
                     for s in sizes])

    old = rec({})
    rows, bad = compare(old, rec({"ring": 1.1, "tree": 0.55, "bruck": 0.55}), 0.10, 1 << 16)
    assert shifted(rows, 0.10, 1 << 16).startswith(
        "# the new run is faster as a whole: its median row takes 0.55x the old one's time, over "
        "9 judged rows of 3 series; none of its rows passes (9 not judged, rows regressed even "
        "so flagged)")
    assert ("# 9 rows not judged: no slower than the old run's, in a new run (or op) faster as a "
            "whole (its median row under 0.90x the old one's time" in report(rows, bad, 0.10, 1 << 16))
    rows, bad = compare(old, rec({"ring": 1.1}), 0.10, 1 << 16)
    assert bad == [] and {r["verdict"] for r in rows} == {""}
    assert shifted(rows, 0.10, 1 << 16) == ""
    # one op faster as a whole beside another unchanged: its rows alone not judged
    both = _rec(old["rows"] + rec({}, "all_gather")["rows"])
    new = _rec(rec({"ring": 1.1, "tree": 0.55, "bruck": 0.55})["rows"] +
               rec({}, "all_gather")["rows"])
    rows, bad = compare(both, new, 0.10, 1 << 16)
    assert bad == [] and {(r["op"], r["verdict"]) for r in rows} == {
        ("all_reduce", "op faster"), ("all_gather", "")}
    assert shifted(rows, 0.10, 1 << 16).startswith(
        "# all_reduce (gloo) is faster as a whole in the new run: its median row takes 0.55x")


def test_a_gate_blind_to_a_run_faster_as_a_whole_is_caught(monkeypatch):
    """The broken rule: no shift the other way, so the slowed series passes unseen."""
    from commbench.results import compare as cmp

    monkeypatch.setattr(cmp.Shift, "faster", lambda self, op, limit: "")
    with pytest.raises(AssertionError):
        _slowed_in_a_faster_run()


def _slowed_after_a_spell_of_the_old_run() -> None:
    """A series the code slowed 2x, whose old run met a slow spell at its first size (2.5x its
    time there): that size takes 0.8x its old time and would pass; it is not judged (``faster
    alone``), the other sizes are flagged."""
    from commbench.results.compare import compare

    sizes = [1 << 16 << k for k in range(5)]
    old = _rec([_row(s, 250.0 if k == 0 else 100.0) for k, s in enumerate(sizes)])
    new = _rec([_row(s, 200.0) for s in sizes])
    rows, bad = compare(old, new, 0.10, 1 << 16)
    assert [r["verdict"] for r in rows] == ["faster alone"] + ["REGRESSED"] * 4
    assert len(bad) == 4


def test_a_size_faster_than_the_rest_of_its_series_is_not_judged_rather_than_passed():
    """A size that moved apart from its series the faster way (a slow spell of the old run
    there) hides a slowdown of the code at that size: it is listed as not judged, with a line
    that says why. A series faster at every size is judged as before, and so is a series of
    fewer than four judged sizes, and the rows of imported logs."""
    from commbench.results.compare import compare, report

    _slowed_after_a_spell_of_the_old_run()
    sizes = [1 << 16 << k for k in range(5)]
    old = _rec([_row(s, 250.0 if k == 0 else 100.0) for k, s in enumerate(sizes)])
    same = _rec([_row(s, 100.0) for s in sizes])  # the same code, the spell gone
    rows, bad = compare(old, same, 0.10, 1 << 16)
    assert bad == [] and [r["verdict"] for r in rows] == ["faster alone"] + [""] * 4
    text = report(rows, bad, 0.10, 1 << 16)
    assert ("# 1 rows not judged: their time new/old under 0.90x the median of the other sizes "
            "of their series, at fewer than 3 consecutive sizes" in text)
    assert "slower by" not in text
    # at the threshold's edge: 1/1.111 of the others' median is no finding, a little less is
    edge = _rec([_row(s, 100.0 * (0.9 if k == 0 else 1.0) * (1.0001 if k == 0 else 1.0))
                 for k, s in enumerate(sizes)])
    base = _rec([_row(s, 100.0) for s in sizes])
    assert compare(base, edge, 0.10, 1 << 16)[0][0]["verdict"] == ""
    edge["rows"][0]["time_us"] = 89.99
    assert compare(base, edge, 0.10, 1 << 16)[0][0]["verdict"] == "faster alone"
    faster = _rec([_row(s, 50.0) for s in sizes])  # the code sped every size
    assert {r["verdict"] for r in compare(base, faster, 0.10, 1 << 16)[0]} == {""}
    # the code sped a range of three sizes: judged; one size of four sped: not judged
    six = [1 << 16 << k for k in range(6)]
    ranged = _rec([_row(s, 50.0 if k < 3 else 100.0) for k, s in enumerate(six)])
    assert {r["verdict"] for r in compare(_rec([_row(s, 100.0) for s in six]), ranged, 0.10,
                                          1 << 16)[0]} == {""}
    four = _rec([_row(s, 50.0 if k == 0 else 100.0) for k, s in enumerate(sizes[:4])])
    assert [r["verdict"] for r in compare(_rec(base["rows"][:4]), four, 0.10, 1 << 16)[0]] == \
        ["faster alone", "", "", ""]
    three = _rec([_row(s, 100.0 * (0.5 if k == 0 else 1.0)) for k, s in enumerate(sizes[:3])])
    assert {r["verdict"] for r in compare(_rec(base["rows"][:3]), three, 0.10, 1 << 16)[0]} == {""}
    # one slow spell among the other sizes leaves the rest as they are
    spell = _rec([_row(s, 300.0 if k == 2 else 100.0) for k, s in enumerate(sizes[:4])])
    rows = compare(_rec(base["rows"][:4]), spell, 0.10, 1 << 16)[0]
    assert [r["verdict"] for r in rows] == ["", "", "isolated", ""]
    below = compare(old, same, 0.10, 1 << 17)[0]  # the spell's size below min_size: not judged
    assert [r["verdict"] for r in below] == [""] * 5
    logs = [{**r, "spread": False} for r in old["rows"]], [{**r, "spread": False}
                                                           for r in same["rows"]]
    imported = [{**_rec(rows), "suite": "nccl-tests"} for rows in logs]
    assert {r["verdict"] for r in compare(*imported, 0.10, 1 << 16)[0]} == {""}


def test_a_gate_blind_to_a_size_faster_alone_is_caught(monkeypatch):
    """The broken rule: no size set beside its series, so the slowed size passes unseen."""
    from commbench.results import compare as cmp

    monkeypatch.setattr(cmp, "_alone", lambda rows, limit: None)
    with pytest.raises(AssertionError):
        _slowed_after_a_spell_of_the_old_run()


def _with_witness(rows, witness):
    return _rec([{**r, "witness_us": witness(r)} for r in rows])


def _in_states(algos, sizes, state, moved: dict, still: dict | None = None) -> tuple[dict, dict]:
    """(old, new) records of ``algos`` at ``sizes``, 100 us a row and the witnesses ``moved`` and
    ``still`` beside each; in the new one, ``state[algo]`` = (factor on the time, factor on the
    witnesses ``moved``)."""
    still = still or {}
    old = _rec([{**_row(s, 100.0, algo=a), **moved, **still} for a in algos for s in sizes])
    new = _rec([{**_row(s, 100.0 * state.get(a, (1, 1))[0], algo=a), **still,
                 **{k: v * state.get(a, (1, 1))[1] for k, v in moved.items()}}
                for a in algos for s in sizes])
    return old, new


def _one_series_in_a_slow_state() -> None:
    """The false alarm a slow state of the machine gives: one series of the new run measured
    while this machine ran its transport 2.7x slower (the witness beside each row says so), the
    others as before. The series is not judged (``machine slower``); a series the code slowed
    2x, its witness unmoved, is flagged beside it; and one the code slowed 2x in a state 2x
    faster, which takes its old time, does not pass (``machine faster``)."""
    from commbench.results.compare import compare

    sizes = [1 << 16 << k for k in range(4)]
    algos = ("native", "ring", "tree", "bruck", "pairwise", "direct")
    state = {"native": (2.7, 2.7), "ring": (2.0, 1.0), "direct": (1.0, 0.5)}  # (time, witness)
    rows, bad = compare(*_in_states(algos, sizes, state, {"witness_us": 135.0}), 0.10, 1 << 16)
    assert {r["algo"]: r["verdict"] for r in rows} == {
        "native": "machine slower", "ring": "REGRESSED", "tree": "", "bruck": "",
        "pairwise": "", "direct": "machine faster"}
    assert {r["algo"] for r in bad} == {"ring"}


def test_a_row_measured_in_another_state_of_the_machine_is_not_judged():
    """A row whose witness moved past the threshold, beyond every witness of its series in the
    other run, was measured in another state of the machine: slower, it is not judged, nor,
    in a faster state, when it would pass; a line says why. It leaves a gap, not a break, in a
    range of regressed sizes. Where a row has no witness (a file written before it), in a
    series of one judged size, and in imported logs, rows are judged as before."""
    from commbench.results.compare import compare, report

    _one_series_in_a_slow_state()
    sizes = [1 << 16 << k for k in range(4)]
    old = _with_witness([_row(s, 100.0) for s in sizes], lambda r: 135.0)

    def new(witnesses, t=270.0):
        return _rec([{**_row(s, t), "witness_us": w} for s, w in zip(sizes, witnesses,
                                                                    strict=True)])

    rows, bad = compare(old, new([370.0] * 4), 0.10, 1 << 16)
    assert bad == [] and {r["verdict"] for r in rows} == {"machine slower"}
    text = report(rows, bad, 0.10, 1 << 16)
    assert [c.strip() for c in text.splitlines()[2].split("|")[1:-1]][-3:] == [
        "135->370", "", "machine slower"]
    assert ("# 4 rows not judged: a witness beside them (the transport's own all_reduce of "
            "1 MiB, or four adds of 256 KiB, timed after each row's loop) moved by more than 11.1% "
            "between the runs" in text)
    assert "slower by" not in text
    # at the edge: a witness 1/0.9 of the old series' highest is no move, a little more is
    assert len(compare(old, new([150.0] * 4), 0.10, 1 << 16)[1]) == 4
    assert compare(old, new([150.01] * 4), 0.10, 1 << 16)[1] == []
    # one size in another state: a gap in the regressed range, the other three still flagged
    rows, bad = compare(old, new([135.0, 370.0, 135.0, 135.0]), 0.10, 1 << 16)
    assert [r["verdict"] for r in rows] == ["REGRESSED", "machine slower", "REGRESSED",
                                            "REGRESSED"]
    # a size the old run measured in a slow state: the new row would pass, and does not
    spell = _with_witness([_row(s, 250.0 if k == 2 else 100.0) for k, s in enumerate(sizes)],
                       lambda r: 400.0 if r["size"] == sizes[2] else 135.0)
    rows, bad = compare(spell, new([135.0] * 4, t=100.0), 0.10, 1 << 16)
    assert bad == [] and [r["verdict"] for r in rows] == ["", "", "machine faster", ""]
    older = _rec([_row(s, 100.0) for s in sizes])  # no witness in the old file
    assert len(compare(older, new([370.0] * 4), 0.10, 1 << 16)[1]) == 4
    one = compare(_rec(old["rows"][:1]), _rec(new([370.0] * 4)["rows"][:1]), 0.10, 1 << 16)
    assert one[0][0]["verdict"] == "REGRESSED" and len(one[1]) == 1
    logs = [{**_rec([{**r, "spread": False} for r in rec["rows"]]), "suite": "nccl-tests"}
            for rec in (old, new([370.0] * 4))]
    assert len(compare(*logs, 0.10, 1 << 16)[1]) == 4
    # below min_size no row is judged, and none is set beside the witness
    assert {r["verdict"] for r in compare(old, new([370.0] * 4), 0.10, 1 << 30)[0]} == {""}


def test_a_gate_blind_to_the_witness_is_caught(monkeypatch):
    """The broken rule: no witness read, so the series measured in a slow state is flagged."""
    from commbench.results import compare as cmp

    monkeypatch.setattr(cmp, "_witnessed", lambda pairs, min_size, limit: {})
    with pytest.raises(AssertionError):
        _one_series_in_a_slow_state()


def _a_series_in_a_milder_state() -> None:
    """The false alarm of a milder state: one series of commbench's own algorithms 1.3x slower
    in the new run, the transport's own all-reduce beside it unmoved and the arithmetic
    witness's adds 1.4x slower. The series is not judged (``machine slower``); a series the code
    slowed 2x, both witnesses unmoved, is flagged beside it."""
    from commbench.results.compare import compare

    sizes = [1 << 16 << k for k in range(4)]
    algos = ("native", "rabenseifner", "ring", "tree", "bruck", "pairwise")
    state = {"rabenseifner": (1.3, 1.4), "ring": (2.0, 1.0)}  # (time, adds)
    rows, bad = compare(*_in_states(algos, sizes, state, {"witness_add_us": 24.0},
                                    {"witness_us": 135.0}), 0.10, 1 << 16)
    assert {r["algo"]: r["verdict"] for r in rows} == {
        "native": "", "rabenseifner": "machine slower", "ring": "REGRESSED", "tree": "",
        "bruck": "", "pairwise": ""}
    assert {r["algo"] for r in bad} == {"ring"}


def test_a_row_whose_arithmetic_witness_moved_is_not_judged():
    """The arithmetic witness is read as the transport's is, on its own; the report shows it
    old -> new in its own column."""
    from commbench.results.compare import compare, report

    _a_series_in_a_milder_state()
    sizes = [1 << 16 << k for k in range(4)]
    old = _rec([{**_row(s, 100.0), "witness_us": 135.0, "witness_add_us": 24.0} for s in sizes])
    new = _rec([{**_row(s, 130.0), "witness_us": 135.0, "witness_add_us": 34.0} for s in sizes])
    rows, bad = compare(old, new, 0.10, 1 << 16)
    text = report(rows, bad, 0.10, 1 << 16)
    assert [c.strip() for c in text.splitlines()[2].split("|")[1:-1]][-3:] == [
        "135->135", "24->34", "machine slower"]
    # the transport's witness slower and the adds faster: the row is still not judged
    mixed = _rec([{**_row(s, 130.0), "witness_us": 370.0, "witness_add_us": 12.0} for s in sizes])
    assert {r["verdict"] for r in compare(old, mixed, 0.10, 1 << 16)[0]} == {"machine slower"}


def test_a_gate_blind_to_the_arithmetic_witness_is_caught(monkeypatch):
    """The broken rule: the transport's witness read alone, so the milder state is flagged."""
    from commbench.results import compare as cmp

    monkeypatch.setattr(cmp, "WITNESSES", ("witness_us",))
    with pytest.raises(AssertionError):
        _a_series_in_a_milder_state()


def test_two_real_runs_in_two_states_of_the_machine_give_no_false_alarm(monkeypatch):
    """Two launches of one commit (tests/data/gate): the first measured its native and naive
    all-reduce while the machine ran MPI 2.7x slower, and its witness says so. Read as the gate
    does, no row is flagged and every row of those two series is not judged for it; with the
    witness ignored, both are flagged: the false alarm the witness is there to stop."""
    import os

    from commbench.results import compare as cmp

    data = os.path.join(os.path.dirname(__file__), "data", "gate")
    steady, slow = (cmp.load(os.path.join(data, f"state_{s}_mpi-x2.json"))
                    for s in ("steady", "slow"))
    rows, bad = cmp.compare(steady, slow)
    assert bad == []
    state = {(r["algo"], r["size"]) for r in rows if r["verdict"] == "machine slower"}
    assert {(a, 1 << 16 << 2 * k) for a in ("native", "naive") for k in range(4)} <= state
    monkeypatch.setattr(cmp, "_witnessed", lambda pairs, min_size, limit: {})
    assert {(r["op"], r["algo"]) for r in cmp.compare(steady, slow)[1]} == {
        ("all_reduce", "native"), ("all_reduce", "naive")}


def test_two_real_runs_one_in_a_milder_state_give_no_false_alarm(monkeypatch):
    """Two launches of one commit (tests/data/gate, the milder pair): the Rabenseifner
    all-reduce 1.3-1.5x slower in the second, its transport witness about as before and its
    arithmetic witness 1.5x slower. Read as the gate does, no row is flagged; with the
    transport's witness alone, the series is flagged: the false alarm the adds are there to
    stop."""
    import os

    from commbench.results import compare as cmp

    data = os.path.join(os.path.dirname(__file__), "data", "gate")
    steady, slow = (cmp.load(os.path.join(data, f"milder_{s}_mpi-x2.json"))
                    for s in ("steady", "slow"))
    rows, bad = cmp.compare(steady, slow)
    assert bad == []
    assert {r["size"] for r in rows if (r["op"], r["algo"], r["verdict"]) ==
            ("all_reduce", "rabenseifner", "machine slower")} == {1 << 16 << 2 * k for k in range(4)}
    monkeypatch.setattr(cmp, "WITNESSES", ("witness_us",))
    assert {(r["op"], r["algo"]) for r in cmp.compare(steady, slow)[1]} == {
        ("all_reduce", "rabenseifner")}
