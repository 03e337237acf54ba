"""The native collectives' records (commbench/ops.py): one per collective, each complete,
and the expected data made from a record's segments alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from commbench.names import COLLECTIVES, ROOTED
from commbench.ops import OPS, Op, booked, split_sizes
from commbench.timing import verify

pytestmark = pytest.mark.collectives


def test_every_collective_has_a_whole_record():
    for op in COLLECTIVES:
        r = OPS[op]
        assert r.size and r.input in ("whole", "block", "blocks", "none") and r.bus, op
        # terms for the model study: all but the uneven all-to-allv and the bufferless barrier
        assert (r.terms is None) == (op in ("all_to_allv", "barrier")), op
        assert (r.expected is None) == (r.one_way or r.input == "none"), op
        assert r.one_way == (op == "pingpong") and (r.input == "none") == (op == "barrier")
        assert r.rooted == (op in ROOTED)
    assert [o for o in OPS.values() if o.reduces] == [OPS["all_reduce"], OPS["reduce_scatter"],
                                                      OPS["reduce"]]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_a_size_becomes_each_rank_s_input_by_its_kind(n):
    assert OPS["all_reduce"].counts(1000, n, 4) == (250, 1000)
    block = (250 // n) // 4 * 4  # a block of whole 16-byte units
    assert OPS["all_gather"].counts(1000, n, 4) == (block, block * n * 4)
    assert OPS["reduce_scatter"].counts(1000, n, 4) == (block * n, block * n * 4)


def _inputs(n: int, count: int, seed: int = 5) -> list[torch.Tensor]:
    return [verify.seeded(seed, r, count, torch.float32) for r in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_expected_data_is_what_each_collective_delivers(n):
    count, root = 4 * n, n - 1
    x = _inputs(n, count)
    total = torch.stack(x).sum(0)
    block = count // n
    delivered = {  # what each rank holds after a right run, made here by hand
        "all_reduce": lambda r: total,
        "all_gather": lambda r: torch.cat(x),
        "reduce_scatter": lambda r: total[r * block:(r + 1) * block],
        "all_to_all": lambda r: torch.cat([x[s][r * block:(r + 1) * block] for s in range(n)]),
        "broadcast": lambda r: x[root],
        "reduce": lambda r: total if r == root else None,
        "gather": lambda r: torch.cat(x) if r == root else None,
        "scatter": lambda r: x[root][r * block:(r + 1) * block],
        "sendrecv": lambda r: x[(r - 1) % n],
    }
    for op, held in delivered.items():
        for r in range(n):
            want = verify.expected(op, 5, r, n, count, torch.float32, "sum", root)
            assert verify.wrong(held(r), want) == 0, (op, r)


def test_a_record_with_wrong_segments_is_caught(monkeypatch):
    """Negative: all-gather's record with the ranks' blocks in reverse order, and all-to-all's
    taking the whole buffers; data a right run delivers is then counted wrong."""
    n, count = 3, 12
    x = _inputs(n, count)
    broken = dataclasses.replace(OPS["all_gather"], expected=lambda rank, n, count, root: [
        ("input", r, 0, count) for r in reversed(range(n))])
    monkeypatch.setitem(OPS, "all_gather", broken)
    assert verify.wrong(torch.cat(x), verify.expected("all_gather", 5, 0, n, count,
                                                      torch.float32)) > 0
    whole = dataclasses.replace(OPS["all_to_all"], expected=lambda rank, n, count, root: [
        ("input", r, 0, count) for r in range(n)])
    monkeypatch.setitem(OPS, "all_to_all", whole)
    got = torch.cat([x[s][0:4] for s in range(n)])
    assert verify.wrong(got, verify.expected("all_to_all", 5, 0, n, count, torch.float32)) > 0


def test_an_op_without_a_record_is_refused_by_name():
    from commbench.ops import booked, counts_for

    for call in (lambda: booked("fax", 2, 0, 8, 4), lambda: counts_for("fax", 8, 2, 4)):
        with pytest.raises(ValueError, match="op 'fax': no record; known: all_reduce, "):
            call()
    with pytest.raises(ValueError, match="op 'pingpong': no expectation"):
        verify.expected("pingpong", 0, 0, 2, 8, torch.float32)
    assert isinstance(OPS["send"], Op) and OPS["send"].bus is None


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
    from commbench.ops import OPS
    from commbench.results.busbw import algbw, busbw, factor

    assert algbw(10**9, 1.0) == 1.0 and algbw(10**9, 0.0) == 0.0 and algbw(5, -1.0) == 0.0
    assert busbw("all_gather", 4, 0, 1.0) == 0.0
    known = ", ".join(o.name for o in OPS.values() if o.bus is not None)
    with pytest.raises(ValueError, match="op 'fax': no busbw factor; known: " + known):
        factor("fax", 4)
    with pytest.raises(ValueError, match="n=0: must be >= 1"):
        factor("all_reduce", 0)


def test_every_name_a_record_gives_reads_back_as_that_collective():
    """The record is the one place a collective's names are written: what a trace, an execution
    trace, nccl-tests or OSU call it reads back as the record (isend and irecv as the send and
    receive torch records them as), and the tables the rest of commbench keeps are the records'."""
    from commbench.costmodel.nccl import OPS as MODELLED
    from commbench.names import ALIASES, COLLECTIVES, ROOTED, canonical
    from commbench.runtime.debug import OP_CODES
    from commbench.traces.calls import op_of
    from commbench.traces.et import C10D
    from commbench.traces.recorded import COLLECTIVES as REPLAYED
    from commbench.traces.write import NAMES
    from commbench.wire.watch_rules import OP_OF

    base = {"isend": "send", "irecv": "recv"}
    for record in OPS.values():
        for name in record.names.torch:
            assert op_of(name) == base.get(record.name, record.name), name
        for name, _, _ in record.names.c10d:
            assert C10D[name][0] == record.name
        for name in record.names.osu:
            assert canonical(name) == record.name
        for name in record.names.dispatch:
            assert OP_OF[name] == record.name
        if record.names.torch:
            assert op_of(NAMES[record.name]) == base.get(record.name, record.name)
    for op in COLLECTIVES:
        assert OPS[op].bench and canonical(f"{op}_perf") == op
    assert set(ALIASES.values()) <= set(COLLECTIVES)
    assert ROOTED == tuple(op for op in COLLECTIVES if OPS[op].rooted)
    assert list(OP_CODES) == list(REPLAYED) == [o.name for o in OPS.values() if o.agreed]
    assert set(MODELLED) == {o.name for o in OPS.values() if o.nccl}


def test_the_all_to_allv_counts_are_uneven_whole_and_the_same_on_every_rank():
    from commbench.ops import WEIGHTS, vsplits

    for n in (1, 2, 3, 4, 8):
        for count in (0, 1, 7, 1024, 65536):
            m = vsplits(n, count)
            assert m == vsplits(n, count)  # every rank computes the same matrix
            assert all(sum(row) == count and len(row) == n for row in m)
            if count >= 1024:  # at most WEIGHTS times as much to one member as to another
                assert all(max(row) <= WEIGHTS * min(row) + WEIGHTS for row in m)
    assert len({c for row in vsplits(4, 1024) for c in row}) > 4  # uneven, not one split
    # by hand: one member sends everything to itself
    assert vsplits(1, 10) == [[10]]
    # the receive side of member r is column r; its expected data is each sender's block for r
    m = vsplits(3, 300)
    segs = OPS["all_to_allv"].expected(1, 3, 300, 0)
    assert [(r, hi - lo) for _, r, lo, hi in segs] == [(j, m[j][1]) for j in range(3)]
    assert segs[0][2] == m[0][0]  # sender 0's block for member 1 starts after its block for 0


def _split_size_off_by_one(count: int, n: int, k: int) -> int:  # the larger parts one too many
    base, extra = divmod(count, n)
    return base + (1 if k <= extra else 0)


def _parts_differ(fn) -> list[tuple[int, int, int]]:
    """(count, n, k) where ``fn``'s part differs from the list's, over every small case."""
    return [(count, n, k) for n in range(1, 25) for count in range(0, 80) for k in range(n)
            if fn(count, n, k) != split_sizes(count, n)[k]]


def test_one_part_of_a_split_is_that_part_of_the_whole_split():
    """The all-reduce's booking reads three parts of the split without making it (at 512 ranks
    the list took 45 us a call); each part is the list's own, every small case and drawn large
    ones alike, and an off-by-one part is caught."""
    from hypothesis import given
    from hypothesis import strategies as st

    from commbench.ops import split_size

    assert _parts_differ(split_size) == []
    assert _parts_differ(_split_size_off_by_one)  # the broken variant: caught

    @given(count=st.integers(0, 10**9), n=st.integers(1, 4096), data=st.data())
    def large(count, n, data):
        k = data.draw(st.integers(0, n - 1))
        assert split_size(count, n, k) == split_sizes(count, n)[k]

    large()
