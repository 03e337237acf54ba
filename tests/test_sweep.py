"""The sweep's own bookkeeping (commbench/studies/sweep.py): repeated rounds merged into one
row, the printed row in nccl-tests' layout and its key."""

from __future__ import annotations

import pytest
from test_gate import _row

pytestmark = pytest.mark.foundation


def test_rounds_merge_into_the_best_round_s_row():
    from commbench.results.busbw import algbw
    from commbench.studies.sweep import merge_rounds

    stats = ("p10_us", "p99_us", "max_us", "avg_us")
    a = [dict(_row(64, 10.0), wrong=0, **dict.fromkeys(stats, 11.0)),
         dict(_row(128, 20.0), wrong=0, **dict.fromkeys(stats, 21.0))]
    b = [dict(_row(64, 5.0, min_us=4.0), wrong=1, **{k: 6.0 + i for i, k in enumerate(stats)}),
         dict(_row(128, 40.0), wrong=0, **dict.fromkeys(stats, 41.0))]
    merged = merge_rounds([a, b], 2)
    assert [r["time_us"] for r in merged] == [5.0, 20.0] and merged[0]["min_us"] == 4.0
    assert [r["wrong"] for r in merged] == [1, 0]
    assert [merged[0][k] for k in stats] == [6.0, 7.0, 8.0, 9.0]  # the best round's statistics
    assert [merged[1][k] for k in stats] == [21.0] * 4
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
