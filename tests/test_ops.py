"""The native collectives' records (commbench/wire/ops.py): one per collective, each complete,
and the expected data made from a record's segments alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from commbench.names import COLLECTIVES, ROOTED
from commbench.timing import verify
from commbench.wire.ops import OPS, Op

pytestmark = pytest.mark.collectives


def test_every_collective_has_a_whole_record():
    for op in COLLECTIVES:
        r = OPS[op]
        assert r.size and r.input in ("whole", "block", "blocks") and r.bus and r.terms, op
        assert (r.expected is None) == r.one_way == (op == "pingpong"), op
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
    from commbench.wire.ops import booked, counts_for

    for call in (lambda: booked("fax", 2, 0, 8, 4), lambda: counts_for("fax", 8, 2, 4)):
        with pytest.raises(ValueError, match="op 'fax': no record; known: all_reduce, "):
            call()
    with pytest.raises(ValueError, match="op 'pingpong': no expectation"):
        verify.expected("pingpong", 0, 0, 2, 8, torch.float32)
    assert isinstance(OPS["send"], Op) and OPS["send"].bus is None
