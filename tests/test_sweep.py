"""The sweep's own bookkeeping (commbench/studies/sweep.py): repeated rounds merged into one
row, the printed row in nccl-tests' layout and its key."""

from __future__ import annotations

import dataclasses

import pytest
from test_gate import _row

pytestmark = pytest.mark.foundation


def test_rounds_merge_into_the_best_round_s_row():
    from commbench.results.busbw import algbw
    from commbench.studies.sweep import merge_rounds

    stats = ("p10_us", "p99_us", "max_us", "avg_us", "witness_us", "witness_add_us")
    a = [dict(_row(64, 10.0), wrong=0, **dict.fromkeys(stats, 11.0)),
         dict(_row(128, 20.0), wrong=0, **dict.fromkeys(stats, 21.0))]
    b = [dict(_row(64, 5.0, min_us=4.0), wrong=1, **{k: 6.0 + i for i, k in enumerate(stats)}),
         dict(_row(128, 40.0), wrong=0, **dict.fromkeys(stats, 41.0))]
    merged = merge_rounds([a, b], 2)
    assert [r["time_us"] for r in merged] == [5.0, 20.0] and merged[0]["min_us"] == 4.0
    assert [r["wrong"] for r in merged] == [1, 0]
    # the best round's statistics, and its witnesses: the machine's state in that round
    assert [merged[0][k] for k in stats] == [6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
    assert [merged[1][k] for k in stats] == [21.0] * 6
    assert merged[0]["algbw"] == algbw(64, 5.0 / 1e6) and merged[0]["rounds_us"] == [10.0, 5.0]
    assert merged[0]["busbw"] == pytest.approx(64 / 5.0 / 1e3)  # all-reduce on 2 ranks: x1
    with pytest.raises(ValueError):
        merge_rounds([a, b[:1]], 2)  # rounds of other lengths do not pair up


def test_the_printed_row_lines_up_with_its_header():
    from commbench.studies.sweep import HEADER, format_row, row_key

    row = {"op": "all_reduce", "size": 8192, "count": 2048, "type": "float32", "redop": "sum",
           "root": -1, "algo": "recursive_doubling_compiled", "transport": "mpi",
           "time_us": 26.04, "p99_us": 41.2, "min_us": 24.9, "avg_us": 27.3, "max_us": 44.0,
           "algbw": 0.3146, "busbw": 0.4719, "wrong": 0, "sent": 6144, "pred_sent": 6144}
    line = format_row(row)
    names, units = HEADER.splitlines()
    assert len(line) == len(names) == len(units)
    assert line.split() == ["all_reduce", "8192", "2048", "float32", "sum", "-1",
                            "recursive_doubling_compiled", "mpi", "26.0", "41.2", "24.9", "27.3",
                            "44.0", "0.315", "0.472", "0", "6144", "6144"]
    for name in names[1:].split():  # each column's name ends where its values end
        end = names.index(name) + len(name)
        assert line[end - 1] != " " and (end == len(line) or line[end] == " "), name
    older = {k: v for k, v in row.items() if k != "avg_us"}  # a row kept from an older file
    assert format_row(older).split()[11] == "nan"
    assert row_key(row) == ("all_reduce", "recursive_doubling_compiled", "mpi", "float32", "sum",
                            -1, 8192)


# two ranks whose medians and totals are the same, each slowest in other samples: the
# per-sample maximum [3, 3, 1, 3, 3] has median 3; any one rank's series has median 1
RANK_TIMES = [[1e-3, 1e-3, 1e-3, 3e-3, 3e-3], [3e-3, 3e-3, 1e-3, 1e-3, 1e-3]]


def test_the_slowest_rank_is_taken_per_sample():
    from commbench.timing.loop import slowest

    assert slowest(RANK_TIMES) == [3e-3, 3e-3, 1e-3, 3e-3, 3e-3]
    with pytest.raises(ValueError):
        slowest([[1.0, 2.0], [1.0]])  # ranks with other sample counts do not pair up


class _World:
    """A world of two ranks whose measurements are given: each call returns ``outs``."""

    size, transports = 2, ("gloo",)

    def __init__(self, outs):
        self.outs, self.calls = outs, []

    def run(self, fn, *args, **kwargs):
        self.calls.append((fn.__name__, args))
        return self.outs


def test_a_sweep_row_is_the_per_sample_maximum_over_ranks():
    """A rank slower on purpose in some samples shows in the row: its median is 3 ms though
    each rank's own median is 1 ms (rank 0's times, or one rank's whole series, give 1)."""
    from commbench.collectives.measure import Case
    from commbench.studies.sweep import run_series

    outs = [{"times": t, "size": 64, "count": 16, "wrong": 0, "sent": 48, "recv": 48,
             "pred_sent": 48} for t in RANK_TIMES]
    rows = run_series(_World(outs), Case("all_reduce"), [64], emit=lambda line: None,
                      samples=True)
    assert rows[0]["time_us"] == pytest.approx(3000.0)
    assert rows[0]["samples_s"] == [3e-3, 3e-3, 1e-3, 3e-3, 3e-3]


def test_a_row_s_witness_is_the_median_of_its_per_sample_maximum_over_ranks():
    """The witnesses beside a row are read as the row is: per sample the slowest rank, then the
    median (3 ms here, each rank's own median 1 ms); a row measured without them has none."""
    from commbench.collectives.measure import Case
    from commbench.studies.sweep import run_series

    outs = [{"times": [1e-3] * 5, "size": 64, "count": 16, "wrong": 0, "sent": 48, "recv": 48,
             "pred_sent": 48, "witness": t, "witness_add": [x / 2 for x in t]}
            for t in RANK_TIMES]
    (row,) = run_series(_World(outs), Case("all_reduce"), [64], emit=lambda line: None)
    assert row["witness_us"] == pytest.approx(3000.0) and row["time_us"] == pytest.approx(1000.0)
    assert row["witness_add_us"] == pytest.approx(1500.0)
    bare = [{k: v for k, v in o.items() if not k.startswith("witness")} for o in outs]
    assert "witness_us" not in run_series(_World(bare), Case("all_reduce"), [64],
                                          emit=lambda line: None)[0]


def test_a_pattern_study_row_is_the_per_sample_maximum_and_asks_for_its_counts():
    """The same two ranks under the pattern study: its time is 3 ms; and the study asks each
    rank for ``iters`` timed steps after ``warmup`` untimed ones, in that order."""
    from commbench.patterns.registry import get
    from commbench.studies.patterns import pattern_study

    pattern = get("ddp")
    cfg = pattern.bench_configs(2)[0]
    ledger = [dataclasses.astuple(c) for c in pattern.predicted(cfg, "ddp", 0)]
    world = _World([{"times": t, "ledger": ledger} for t in RANK_TIMES])
    rows = pattern_study(world, ["ddp"], iters=5, warmup=2, emit=lambda line: None)
    assert rows[0]["variant"] == "ddp" and rows[0]["time_us"] == pytest.approx(3000.0)
    name, args = world.calls[0]
    assert name == "run_pattern" and args[-2:] == (5, 2)  # ..., iters, warmup


class _Echo:
    """A world of ``size`` ranks whose every rank measures what it is asked: its row's figures
    come from the (case, size) it was sent, so a row can be checked against its request."""

    transports = ("gloo",)

    def __init__(self, size=4):
        self.size, self.asked = size, []

    def run(self, fn, case, nbytes):
        self.asked.append((fn.__name__, case.op, nbytes))
        out = []
        for r in range(self.size):
            out.append({"times": [1e-3 * (r + 1)] * 3, "size": nbytes, "count": nbytes // 4,
                        "wrong": r % 2, "sent": 10 * r, "recv": 20 * r, "pred_sent": 30 * r,
                        "timeline": [("x", r)], "span": (r, r + 1)})
        return out


def test_a_series_row_by_row_from_what_each_rank_measured(tmp_path):
    """Each size asked once (a size already in the record is skipped, the rest measured in
    order); per row: the op's reduction and root only where it takes them, the busiest rank's
    bytes, every rank's wrong elements summed, the slowest rank's time; printed, recorded,
    written, and traced when asked."""
    import json

    from commbench.collectives.measure import Case
    from commbench.studies.sweep import format_row, row_key, run_series

    world, lines, timeline = _Echo(), [], []
    record = {"rows": [{"op": "all_gather", "algo": "native", "transport": "gloo",
                        "type": "float32", "redop": "-", "root": -1, "size": 4096}]}
    path = str(tmp_path / "rows.json")
    case = Case("all_gather", "gloo", root=3, redop="max", iters=3, warmup=0)
    rows = run_series(world, case, [1024, 4096, 8192], record=record, path=path,
                      emit=lines.append, timeline=timeline)
    assert [a for _, _, a in world.asked] == [1024, 8192]  # 4096: in the record already
    assert [r["size"] for r in rows] == [1024, 8192]
    row = rows[0]
    assert (row["redop"], row["root"], row["requested"]) == ("-", -1, 1024)  # takes neither
    assert (row["sent"], row["recv"], row["pred_sent"], row["wrong"]) == (30, 60, 90, 2)
    assert row["time_us"] == pytest.approx(4000.0)  # rank 3's, the slowest
    assert lines == [format_row(r) for r in rows]
    assert record["rows"][1:] == rows
    assert json.load(open(path))["rows"][1:] == json.loads(json.dumps(rows))
    assert [t[0] for t in timeline] == ["all_gather/native gloo 1024 B",
                                        "all_gather/native gloo 8192 B"]
    assert timeline[0][1] == [[("x", r)] for r in range(4)] and timeline[0][2][3] == (3, 4)
    rooted = run_series(_Echo(), Case("broadcast", "gloo", root=6), [64], emit=lambda s: None)
    reduced = run_series(_Echo(), Case("all_reduce", "gloo", redop="max"), [64],
                         emit=lambda s: None)
    assert (rooted[0]["root"], rooted[0]["redop"]) == (2, "-")  # root 6 of 4 ranks: rank 2
    assert (reduced[0]["root"], reduced[0]["redop"]) == (-1, "max")
    assert row_key(rows[0])[-1] == 1024
