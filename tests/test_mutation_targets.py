"""Single-process tests of the byte formulas the ledger books (commbench.wire.volume), written
from each op's schedule by hand: what ``make mutate`` runs against that module."""

from __future__ import annotations

import pytest

from commbench.wire.volume import booked, split_sizes

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
