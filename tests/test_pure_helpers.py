"""Single-process tests of the pure helpers, written by hand from what each one must do: the
ledger's byte formulas (from each op's schedule), busbw, sizes, merged rounds, the printed row,
pipeline schedules and bubbles. ``make mutate`` runs them (and tests/test_gate.py) against
those modules."""

from __future__ import annotations

import pytest
from test_gate import _row

from commbench.wire.ops import booked, split_sizes

pytestmark = pytest.mark.foundation


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_booked_bytes_conserve_and_match_the_schedules(n):
    count, b = 12 * n, 4
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "gather",
               "scatter"):
        for root in range(n):
            per = [booked(op, n, i, count, b, root=root) for i in range(n)]
            assert sum(s for s, _ in per) == sum(r for _, r in per), (op, n, root)  # conserved
    block = count // n
    assert booked("all_gather", n, 0, count, b) == ((n - 1) * count * b,) * 2
    assert booked("reduce_scatter", n, n - 1, count, b) == ((n - 1) * block * b,) * 2
    for i in range(n):  # ring all-reduce: 2(n-1) chunks of count/n each way
        assert booked("all_reduce", n, i, count, b) == (2 * (n - 1) * block * b,) * 2
    # broadcast down a chain from the root: the last rank only receives, the root only sends
    root = n // 2
    chain = [booked("broadcast", n, (root + k) % n, count, b, root=root) for k in range(n)]
    if n > 1:
        assert chain[0] == (count * b, 0) and chain[-1] == (0, count * b)
        assert all(c == (count * b, count * b) for c in chain[1:-1])
    # reduce up a chain to the root: the root only receives
    red = booked("reduce", n, root, count, b, root=root)
    assert red == ((0, count * b) if n > 1 else (0, 0))
    assert booked("gather", n, root, count, b, root=root) == (0, (n - 1) * count * b)
    assert booked("scatter", n, root, count, b, root=root) == ((n - 1) * block * b, 0)
    splits = [i % 3 for i in range(n)]
    assert booked("all_to_all", n, 0, 0, b, in_splits=splits, out_splits=splits[::-1], row=2) == \
        ((sum(splits) - splits[0]) * 2 * b, (sum(splits) - splits[-1]) * 2 * b)


def test_uneven_all_reduce_chunks_and_bad_input():
    assert split_sizes(10, 4) == [3, 3, 2, 2] and split_sizes(2, 4) == [1, 1, 0, 0]
    assert sum(booked("all_reduce", 4, i, 10, 1)[0] for i in range(4)) == 2 * 3 * 10
    assert booked("send", 2, 0, 5, 4) == (20, 0) and booked("irecv", 2, 1, 5, 4) == (0, 20)
    with pytest.raises(ValueError, match="member index 4"):
        booked("all_reduce", 4, 4, 8, 4)
    with pytest.raises(ValueError, match="not a multiple"):
        booked("reduce_scatter", 4, 0, 10, 4)
    with pytest.raises(ValueError, match="needs in_splits"):
        booked("all_to_all", 4, 0, 8, 4)


def test_uneven_all_reduce_per_rank_follows_the_ring_chunks():
    """10 elements over 4 ranks: chunks [3, 3, 2, 2]; rank i sends all but chunks i and i+1,
    receives all but chunks i-1 and i (the module docstring's formula, by hand)."""
    want = {0: (20 - 3 - 3, 20 - 2 - 3), 1: (20 - 3 - 2, 20 - 3 - 3), 2: (20 - 2 - 2, 20 - 3 - 2),
            3: (20 - 2 - 3, 20 - 2 - 2)}
    for i, (s, r) in want.items():
        assert booked("all_reduce", 4, i, 10, 1) == (s, r), i
    assert booked("all_reduce", 1, 0, 10, 4) == (0, 0)
    assert split_sizes(0, 3) == [0, 0, 0] and split_sizes(7, 1) == [7]
    for bad, rule in (((5, 0), "n=0: must be >= 1"), ((-1, 2), "count=-1: must be >= 0")):
        with pytest.raises(ValueError, match=rule):
            split_sizes(*bad)


@pytest.mark.parametrize(("op", "want"), [("send", (12, 0)), ("isend", (12, 0)),
                                          ("recv", (0, 12)), ("irecv", (0, 12)),
                                          ("barrier", (0, 0))])
def test_point_to_point_and_barrier_bytes(op, want):
    got = booked(op, 3, 1, 3, 4)
    assert got == want and all(type(v) is int for v in got)


def test_whole_numbers_and_the_rules_in_the_errors():
    assert all(type(v) is int for v in booked("reduce_scatter", 4, 1, 8, 4) + booked(
        "scatter", 4, 0, 8, 4, root=0))
    with pytest.raises(ValueError, match=r"member index 4: must be in 0\.\.3"):
        booked("all_reduce", 4, 4, 8, 4)
    with pytest.raises(ValueError, match="all_to_all needs in_splits and out_splits"):
        booked("all_to_all", 4, 0, 8, 4, in_splits=[1] * 4)
    with pytest.raises(ValueError, match="op 'fax': no record; known: all_reduce, "):
        booked("fax", 4, 0, 8, 4)


def test_busbw_edges_and_errors():
    from commbench.results.busbw import algbw, busbw, factor
    from commbench.wire.ops import OPS

    assert algbw(10**9, 1.0) == 1.0 and algbw(10**9, 0.0) == 0.0 and algbw(5, -1.0) == 0.0
    assert busbw("all_gather", 4, 0, 1.0) == 0.0
    known = ", ".join(o.name for o in OPS.values() if o.bus is not None)
    with pytest.raises(ValueError, match="op 'fax': no busbw factor; known: " + known):
        factor("fax", 4)
    with pytest.raises(ValueError, match="n=0: must be >= 1"):
        factor("all_reduce", 0)


def test_sizes_and_their_rules():
    from commbench.names import parse_size, sizes_between

    assert [parse_size(t) for t in ("8", "8B", "64k", "2M", "1G", " 4 ")] == \
        [8, 8, 65536, 2 << 20, 1 << 30, 4]
    for bad, rule in (("abc", "write a whole number"), ("0", "must be > 0"), ("-8", "size '-8'"),
                      ("1.5M", "write a whole number")):
        with pytest.raises(ValueError, match=rule):
            parse_size(bad)
    assert sizes_between(8, 8, 2) == [8] and sizes_between(3, 30, 3) == [3, 9, 27]
    for args, rule in (((0, 8, 2), "-b 0: must be > 0"), ((16, 8, 2), "-e 8 is below -b 16"),
                       ((8, 64, 1), "-f 1: must be >= 2")):
        with pytest.raises(ValueError, match=rule):
            sizes_between(*args)


def test_defaults_and_edges_of_the_small_helpers():
    import torch

    from commbench.names import parse_size, sizes_between
    from commbench.studies.sweep import merge_rounds
    from commbench.timing.verify import expected, wrong

    assert parse_size("1") == 1 and sizes_between(1, 4, 2) == [1, 2, 4]
    assert booked("broadcast", 3, 0, 4, 4) == booked("broadcast", 3, 0, 4, 4, root=0)
    assert torch.equal(expected("broadcast", 1, 2, 3, 5, torch.float32),
                       expected("broadcast", 1, 2, 3, 5, torch.float32, root=0))
    assert expected("all_reduce", 1, 0, 3, 5, torch.bfloat16, "max").dtype == torch.bfloat16
    assert expected("all_reduce", 1, 0, 3, 5, torch.int32, "sum").dtype == torch.int32
    assert wrong(None, torch.empty(0)) == 1  # a result missing, even an empty one, counts
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
    from commbench.results.busbw import algbw

    assert merged[0]["algbw"] == algbw(64, 5.0 / 1e6) and merged[0]["rounds_us"] == [10.0, 5.0]
    assert merged[0]["busbw"] == pytest.approx(64 / 5.0 / 1e3)  # all-reduce on 2 ranks: x1
    with pytest.raises(ValueError):
        merge_rounds([a, b[:1]], 2)  # rounds of other lengths do not pair up


def test_pipeline_schedules_in_their_exact_order():
    """1F1B without v (its default, 1), and Megatron's interleaved order on 2 ranks, 2 virtual
    stages, 4 micro-batches, by hand: rank 0 warms up with (p-r-1)*2 + (v-1)*p = 4 forwards,
    rank 1 with 2; forwards take chunks in turn p micro-batches at a time, backwards the chunks
    in reverse."""
    from commbench.patterns.pp.schedule import schedule

    assert schedule("interleaved", 2, 0, 2) == schedule("interleaved", 2, 0, 2, 1)  # v = 1
    assert schedule("1f1b", 3, 0, 4) == [("F", 0, 0), ("F", 0, 1), ("F", 0, 2), ("B", 0, 0),
                                         ("F", 0, 3), ("B", 0, 1), ("B", 0, 2), ("B", 0, 3)]

    def seq(text):
        return [(t[0], int(t[1]), int(t[3])) for t in text.split()]

    assert schedule("interleaved", 2, 0, 4, 2) == seq(
        "F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1 B2.2 B2.3 B0.2 B0.3")
    assert schedule("interleaved", 2, 1, 4, 2) == seq(
        "F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 F1.3 B1.1 F3.2 B3.2 F3.3 B3.3 B1.2 B1.3")


def test_bubble_fractions_and_the_printed_row():
    from commbench.patterns.pp.schedule import bubble_fraction
    from commbench.studies.sweep import HEADER, format_row, row_key

    assert bubble_fraction("gpipe", 4, 8) == 3 / 11 == bubble_fraction("1f1b", 4, 8)
    assert bubble_fraction("interleaved", 4, 8, 2) == 3 / 19
    assert bubble_fraction("1f1b", 1, 8) == 0.0
    assert bubble_fraction("interleaved", 4, 8) == 3 / 11  # one virtual stage by default
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

