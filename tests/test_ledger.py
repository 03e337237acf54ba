"""The ledger books every op with the exact bytes this rank sends and receives.

Expected bytes are written here by hand from each op's schedule (commbench.ops's docstring),
independently of commbench.ops's code: closed forms where the count divides, a literal table
where it does not, and conservation (what all ranks send, all ranks receive) everywhere.
"""

from __future__ import annotations

import pytest
import torch

from commbench.wire.ledger import Ledger, summarize

pytestmark = pytest.mark.foundation

F32 = 4


def _every_op(ctx, transport, count):
    """Run each op once on the world group; return (op, count, sent, recv, group) per call."""
    comm, g, n, r = ctx.comm(transport), ctx.world, ctx.size, ctx.rank
    x = torch.arange(count, dtype=torch.float32) + 100 * r
    values = {}
    with ctx.ledger.capture() as cap:
        values["all_reduce"] = comm.all_reduce(x, g)
        values["all_gather"] = comm.all_gather(x, g)
        values["reduce_scatter"] = comm.reduce_scatter(torch.ones(n * count), g)
        values["all_to_all"] = comm.all_to_all(torch.full((n * 2, 3), float(r)), g)
        in_splits = [(r + j) % 3 for j in range(n)]  # uneven, some empty
        rows = torch.full((sum(in_splits), 2), float(r))
        values["all_to_allv"] = comm.all_to_all(rows, g, in_splits)  # counts exchanged first
        values["broadcast"] = comm.broadcast(x, g, root=0)
        values["reduce"] = comm.reduce(x, g, root=0)
        values["gather"] = comm.gather(x, g, root=n - 1)
        src = torch.arange(n * count, dtype=torch.float32) if r == 0 else torch.empty(count)
        values["scatter"] = comm.scatter(src, g, root=0)
        if n > 1:
            work = comm.irecv(x, g, (r - 1) % n)
            comm.send(x, g, (r + 1) % n)
            values["ring"] = work.wait()
        comm.barrier(g)
    entries = [(e.op, e.count, e.sent, e.recv, e.group, e.transport) for e in cap.entries]
    return entries, {k: (v.tolist() if v is not None else None) for k, v in values.items()}


@pytest.mark.world(sizes=[1, 2, 3, 4])
@pytest.mark.parametrize("count", [12, 10])
def test_exact_bytes_for_every_op(world, count):
    for transport in world.transports:
        results = world.run(_every_op, transport, count)
        n = world.size
        per_rank = [_by_call(entries) for entries, _ in results]
        for r, (entries, values) in enumerate(results):
            ops = [e[0] for e in entries]
            expected_ops = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                            "all_to_all", "all_to_all", "broadcast", "reduce", "gather",
                            "scatter"] + (["irecv", "send"] if n > 1 else []) + ["barrier"]
            assert sorted(ops) == sorted(expected_ops), (transport, r)
            assert all(e[4] == tuple(range(n)) and e[5] == transport for e in entries)
            booked = {op: (s, rv) for op, _, s, rv, _, _ in entries if op != "all_to_all"}
            S = count * F32
            if count % n == 0:  # the closed forms of the notes and of nccl-tests
                assert booked["all_reduce"] == (2 * (n - 1) * S // n,) * 2
            assert booked["all_gather"] == ((n - 1) * S,) * 2
            assert booked["reduce_scatter"] == ((n - 1) * S,) * 2
            chain_b = (S if r < n - 1 else 0, S if r > 0 else 0)  # 0 -> 1 -> ... -> n-1
            assert booked["broadcast"] == chain_b
            chain_r = (S if r != 0 else 0, S if r != 1 % n and n > 1 else 0)  # 1 -> ... -> 0
            assert booked["reduce"] == chain_r
            assert booked["gather"] == ((0, (n - 1) * S) if r == n - 1 else (S, 0))
            assert booked["scatter"] == (((n - 1) * S, 0) if r == 0 else (0, S))
            assert booked["barrier"] == (0, 0)
            if n > 1:
                assert booked["send"] == (S, 0) and booked["irecv"] == (0, S)
            a2a = [e for e in entries if e[0] == "all_to_all"]
            assert a2a[0][2:4] == ((n - 1) * 2 * 3 * F32,) * 2  # even: 2 rows of 3 per peer
            # the split exchange: n int64 counts, one to each peer
            assert a2a[1][1:4] == (n, (n - 1) * 8, (n - 1) * 8)
            sent_rows = sum((r + j) % 3 for j in range(n)) - (2 * r) % 3
            recv_rows = sum((j + r) % 3 for j in range(n)) - (2 * r) % 3
            assert a2a[2][2:4] == (sent_rows * 2 * F32, recv_rows * 2 * F32)
            _check_values(values, r, n, count)
        for key in per_rank[0]:  # conservation: every byte sent is received by someone
            assert sum(p[key][2] for p in per_rank) == sum(p[key][3] for p in per_rank), key


def _by_call(entries):
    """Key each collective by (op, occurrence); sends and receives pair up as one 'p2p' key."""
    out, seen = {}, {}
    for e in entries:
        op = "p2p" if e[0] in ("send", "irecv") else e[0]
        k = seen[op] = seen.get(op, -1) + (0 if op == "p2p" else 1)
        prev = out.get((op, k))
        out[(op, k)] = e if prev is None else (op, 0, prev[2] + e[2], prev[3] + e[3])
    return out


def _check_values(values, r, n, count):
    base = list(range(count))
    assert values["all_reduce"] == [n * b + 100 * sum(range(n)) for b in base]
    assert values["all_gather"] == [b + 100 * k for k in range(n) for b in base]
    assert values["reduce_scatter"] == [float(n)] * count
    assert values["all_to_all"] == [[float(k)] * 3 for k in range(n) for _ in range(2)]
    assert values["all_to_allv"] == [[float(k)] * 2 for k in range(n) for _ in range((k + r) % 3)]
    assert values["broadcast"] == base
    assert values["reduce"] == (values["all_reduce"] if r == 0 else None)
    assert values["gather"] == (values["all_gather"] if r == n - 1 else None)
    assert values["scatter"] == list(range(r * count, (r + 1) * count))
    if n > 1:
        assert values["ring"] == [b + 100 * ((r - 1) % n) for b in base]


def _uneven_all_reduce(ctx, transport):
    with ctx.ledger.capture() as cap:
        ctx.comm(transport).all_reduce(torch.ones(10), ctx.world)
    (e,) = cap.entries
    return e.sent, e.recv


@pytest.mark.world(sizes=[3, 4])
def test_uneven_all_reduce_books_ring_chunks(world):
    """10 float32 on 3 ranks: ring chunks of 4, 3, 3 elements, worked by hand.

    Rank i sends every chunk but its own in reduce-scatter and every chunk but i+1 in all-gather.
    """
    if world.size != 3:
        pytest.skip("the table is worked out for 3 ranks")
    for transport in world.transports:
        got = world.run(_uneven_all_reduce, transport)
        assert got == [(13 * 4, 13 * 4), (14 * 4, 13 * 4), (13 * 4, 14 * 4)]


def test_summaries_by_group_and_op():
    led = Ledger()
    led.record("all_reduce", (0, 1), "gloo", "float32", 4, 16, 16, 0.001)
    with led.scope("ring"), led.capture() as cap:
        led.record("send", (0, 1), "gloo", "float32", 2, 8, 0, 0.002)
        led.record("send", (0, 1), "gloo", "float32", 2, 8, 0, 0.002)
    led.record("all_gather", (0, 2), "mpi", "bfloat16", 3, 6, 6, 0.0)
    assert [e.scope for e in cap.entries] == ["ring", "ring"] and cap.sent == 16
    totals = summarize(led.entries)
    assert totals[((0, 1), "send")]["sent"] == 16 and totals[((0, 1), "send")]["calls"] == 2
    table = led.table()
    assert "[0,1]" in table and "all_gather" in table and "sent(B)" in table


def test_nested_captures_each_hold_what_ran_inside_them():
    """An outer capture holds everything, an inner one only its block; leaving the inner one
    (also by an exception) detaches that one and not an outer one with equal contents."""
    led = Ledger()

    def book(op: str) -> None:
        led.record(op, (0, 1), "gloo", "float32", 4, 16, 16, 0.0)

    book("before")
    with led.capture() as outer:
        with led.capture() as inner:  # both empty when the inner one ends
            pass
        book("a")
        with led.capture() as second:
            book("b")
            with pytest.raises(RuntimeError), led.capture() as failing:
                book("c")
                raise RuntimeError("a step that fails")
            book("d")
        book("e")
    book("after")
    assert outer.ops() == ["a", "b", "c", "d", "e"]
    assert inner.ops() == [] and second.ops() == ["b", "c", "d"] and failing.ops() == ["c"]
    assert led._captures == [] and [e.op for e in led.entries][-1] == "after"
    assert outer.sent == 5 * 16 and second.by("op")[("c",)]["calls"] == 1
