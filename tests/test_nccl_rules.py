"""NCCL's execution model (commbench.wire.nccl_rules) on hand-made records, and on the records of
every collective algorithm at world sizes 2 to 8 (a thread world: no ranks to spawn).

Each rule has its negative test: a record that breaks it must be reported. The sweep's own
negative test runs the exchange as it was first written, a receive and a send each posted alone,
and the checker must fail it at every size for every schedule that sends and receives at once.
"""

from __future__ import annotations

import pytest
import torch
from thread_world import run_threads

from commbench.collectives import ALGORITHMS
from commbench.patterns.device import device_guard
from commbench.timing import verify
from commbench.wire.comm import Comm
from commbench.wire.nccl_rules import check
from commbench.wire.posts import Posts

pytestmark = [pytest.mark.foundation, pytest.mark.collectives]

W2, W3 = (0, 1), (0, 1, 2)


def _ranks(n: int) -> list[Posts]:
    return [Posts(r) for r in range(n)]


def _msg(p: Posts, kind: str, comm, peer: int, nbytes: int = 8, wait: bool = True) -> int:
    i = p.post(kind, kind, comm, peer=peer, nbytes=nbytes, dtype="float32", count=nbytes // 4)
    if wait:
        p.wait(i)
    return i


def _grouped(p: Posts, comm, recv_from: int | None, send_to: int | None) -> None:
    with p.group():
        ids = ([_msg(p, "recv", comm, recv_from, wait=False)] if recv_from is not None else [])
        ids += [_msg(p, "send", comm, send_to, wait=False)] if send_to is not None else []
    for i in ids:
        p.wait(i)


def test_receive_then_send_posted_alone_deadlocks_at_two_ranks():
    a, b = _ranks(2)
    for me, peer in ((a, 1), (b, 0)):
        r = _msg(me, "recv", W2, peer, wait=False)
        _msg(me, "send", W2, peer)
        me.wait(r)
    problems = check([a.items, b.items])
    assert len(problems) == 1 and "deadlock" in problems[0]
    assert "rank 0: recv" in problems[0] and "rank 1: recv" in problems[0]


def test_the_same_exchange_as_one_group_call_completes():
    a, b = _ranks(2)
    _grouped(a, W2, 1, 1)
    _grouped(b, W2, 0, 0)
    assert check([a.items, b.items]) == []


def test_send_then_receive_against_receive_then_send_completes():
    a, b = _ranks(2)
    _msg(a, "send", W2, 1)
    _msg(a, "recv", W2, 1)
    _msg(b, "recv", W2, 0)
    _msg(b, "send", W2, 0)
    assert check([a.items, b.items]) == []


def test_a_ring_of_lone_messages_is_a_circular_wait_making_pair_communicators():
    ranks = _ranks(3)
    for r, p in enumerate(ranks):
        rx = _msg(p, "recv", W3, (r - 1) % 3, wait=False)
        _msg(p, "send", W3, (r + 1) % 3)
        p.wait(rx)
    problems = check([p.items for p in ranks], mode="lazy")
    assert problems and "lazy pair communicators" in problems[0]
    assert all(f"rank {r} waits" in problems[0] for r in range(3))
    eager = check([p.items for p in ranks])  # the same first contacts on the group's own
    assert eager and "deadlock" in eager[0]
    assert all(f"rank {r}'s host waits to connect to rank {(r - 1) % 3}" in eager[0]
               for r in range(3))


def test_collectives_issued_in_another_order_are_reported():
    a, b = _ranks(2)
    a.post("coll", "all_reduce", W2, dtype="float32", count=4)
    a.post("coll", "all_gather", W2, dtype="float32", count=4)
    b.post("coll", "all_gather", W2, dtype="float32", count=4)
    b.post("coll", "all_reduce", W2, dtype="float32", count=4)
    problems = check([a.items, b.items])
    assert problems and "collective order" in problems[0] and "call 0" in problems[0]


def test_collectives_of_another_count_are_reported_and_equal_ones_pass():
    a, b = _ranks(2)
    a.post("coll", "all_reduce", W2, dtype="float32", count=4)
    b.post("coll", "all_reduce", W2, dtype="float32", count=5)
    assert check([a.items, b.items])
    c, d = _ranks(2)
    for p in (c, d):
        p.post("coll", "all_reduce", W2, dtype="float32", count=4)
    assert check([c.items, d.items]) == []


def test_unmatched_and_mismatched_messages_are_reported():
    a, b = _ranks(2)
    _grouped(a, W2, None, 1)
    assert "unmatched" in check([a.items, b.items])[0]
    c, d = _ranks(2)
    _msg(c, "send", W2, 1, nbytes=8)
    _msg(d, "recv", W2, 0, nbytes=16)
    assert "size mismatch" in check([c.items, d.items])[0]


def test_a_wait_before_a_collective_orders_the_streams():
    """Lazily, with the pair's communicator made by an earlier message: rank 0 waits for its send
    before the all-reduce; rank 1 receives only after it: a cycle through the compute streams.
    Without rank 0's wait both complete."""
    def record(wait: bool):
        a, b = _ranks(2)
        _msg(a, "send", W2, 1)  # the pair's communicator made and connected
        _msg(b, "recv", W2, 0)
        _msg(a, "send", W2, 1, wait=wait)
        a.post("coll", "all_reduce", W2, dtype="float32", count=1)
        i = b.post("coll", "all_reduce", W2, dtype="float32", count=1)
        b.wait(i)
        _msg(b, "recv", W2, 0)
        return check([a.items, b.items], mode="lazy")  # eagerly both hang (the next test)

    assert record(wait=False) == []
    assert "deadlock" in record(wait=True)[0]


def test_a_first_message_posted_alone_blocks_until_the_peer_makes_the_pair():
    """Lazily, the same program without the earlier message: rank 0's send makes the pair's
    communicator, which blocks its host until rank 1 asks for it too, and rank 1 asks only after
    an all-reduce that rank 0 has not posted yet. The check before connection setup was modelled
    passed it."""
    a, b = _ranks(2)
    _msg(a, "send", W2, 1, wait=False)
    a.post("coll", "all_reduce", W2, dtype="float32", count=1)
    i = b.post("coll", "all_reduce", W2, dtype="float32", count=1)
    b.wait(i)
    _msg(b, "recv", W2, 0)
    problems = check([a.items, b.items], mode="lazy")
    assert problems and "rank 0's host waits to connect to rank 1" in problems[0]


def _send_then_collective(a: Posts, b: Posts) -> None:
    """Rank 0 isends to rank 1 (not waited) and then all-reduces; rank 1 all-reduces and then
    receives."""
    _msg(a, "send", W2, 1, wait=False)
    a.post("coll", "all_reduce", W2, dtype="float32", count=1)
    b.post("coll", "all_reduce", W2, dtype="float32", count=1)
    _msg(b, "recv", W2, 0)


def test_eager_init_runs_a_lone_send_on_the_groups_communicator_in_order():
    """Under eager init (device_id given; torch >= 2.3) the send is queued before rank 0's
    all-reduce on one communicator, and rank 1's receive behind its all-reduce: a deadlock.
    Lazily, the send has the pair's communicator and both complete: the check before eager
    init was modelled said no problem here."""
    a, b = _ranks(2)
    _send_then_collective(a, b)
    eager = check([a.items, b.items])
    assert eager and "deadlock" in eager[0]
    assert "rank 0: send of 8 B to rank 1 on group [0, 1] (posted alone)" in eager[0]
    assert "rank 1: all_reduce float32[1] on group [0, 1]" in eager[0]
    assert check([a.items, b.items], mode="lazy") == []


def test_connection_setup_blocks_the_host_before_its_later_posts():
    """Rank 0's first message to rank 1 blocks its host until rank 1 posts one back; rank 1's
    host waits for an all-reduce (a .item()) before it does, and rank 0 never posts its part of
    that all-reduce: a hang the streams alone do not show (the all-reduce and the message are on
    different communicators), in either init mode."""
    side = (0, 1, 2)
    a, b, c = _ranks(3)
    _msg(a, "send", side, 1, wait=False)
    a.post("coll", "all_reduce", W2, dtype="float32", count=1)
    i = b.post("coll", "all_reduce", W2, dtype="float32", count=1)
    b.wait(i)
    _msg(b, "recv", side, 0)
    for mode in ("eager", "lazy"):
        problems = check([a.items, b.items, c.items], mode=mode)
        assert problems and "rank 0's host waits to connect to rank 1" in problems[0], mode
    # posted the other way round (rank 1 receives first), it completes
    a, b, c = _ranks(3)
    _msg(a, "send", side, 1, wait=False)
    a.post("coll", "all_reduce", W2, dtype="float32", count=1)
    r = _msg(b, "recv", side, 0, wait=False)
    i = b.post("coll", "all_reduce", W2, dtype="float32", count=1)
    b.wait(i)
    b.wait(r)
    assert check([a.items, b.items, c.items]) == []


def test_an_unknown_init_mode_is_refused():
    with pytest.raises(ValueError, match="mode='later': must be one of eager, lazy"):
        check([[]], mode="later")


def test_messages_on_two_communicators_do_not_match():
    a, b = _ranks(2)
    _grouped(a, W2, None, 1)  # on the group's communicator
    _msg(b, "recv", W2, 0)  # posted alone: the pair's, lazily; the group's, eagerly
    assert check([a.items, b.items], mode="lazy")
    assert check([a.items, b.items]) == []


# -- every algorithm on the thread world ------------------------------------------------------
ALGOS = sorted(k for k, rec in ALGORITHMS.items() if rec.fn is not None)
BUFFSIZE = 4 << 20  # NCCL_BUFFSIZE's default: messages above it cannot complete early


class LoneMessagesComm(Comm):
    """The exchange as first written: the receive and the send each posted alone."""

    def exchange(self, sends, recvs, group, *, tag=0):
        rx = [self.irecv(t, group, p, tag=tag) for t, p in recvs if t.numel()]
        tx = [self.isend(t, group, p, tag=tag) for t, p in sends if t.numel()]
        for w in tx:
            w.wait()
        got = iter(w.wait() for w in rx)
        return [next(got) if t.numel() else torch.empty_like(t) for t, _ in recvs]


def _algorithm_posts(ctx, op: str, algo: str, count: int, lone: bool):
    comm = ctx.comm()
    if lone:
        comm = LoneMessagesComm(comm.backend, comm.ledger, comm.tracker, device=comm.device)
        comm.posts = ctx.posts
    n = ctx.size
    total = count * n if op in ("reduce_scatter", "all_to_all") else count
    x = verify.seeded(7, ctx.rank, total, torch.float32)
    splits = [count] * n if op == "all_to_all" else None
    with device_guard(ctx.device):  # every tensor the library makes names its device
        ALGORITHMS[(op, algo)].bind(ctx, comm, x, root=n - 1, splits=splits)()
    return ctx.posts.export()


def _problems(n: int, op: str, algo: str, count: int, lone: bool = False) -> list[str]:
    if ALGORITHMS[(op, algo)].needs(n):
        pytest.skip(f"{op}/{algo} does not run at {n} ranks")
    return check(run_threads(n, _algorithm_posts, op, algo, count, lone))


@pytest.mark.parametrize("n", range(2, 9))
@pytest.mark.parametrize("key", ALGOS, ids=["/".join(k) for k in ALGOS])
def test_every_algorithm_keeps_nccls_rules(key, n):
    assert _problems(n, *key, 37) == []


@pytest.mark.parametrize("n", [2, 3, 8])
@pytest.mark.parametrize("algo", ["ring", "rabenseifner", "ring_compiled"])
def test_all_reduce_above_ncclS_buffer_keeps_ncclS_rules(algo, n):
    assert _problems(n, "all_reduce", algo, BUFFSIZE // 4 + 1) == []


# the schedules that send and receive in one step; the tree family posts one side at a time
BOTH_WAYS = [k for k in ALGOS if not k[1].endswith("_compiled") and k[1] not in
             ("binomial", "naive")]


@pytest.mark.parametrize("n", range(2, 9))
@pytest.mark.parametrize("key", BOTH_WAYS, ids=["/".join(k) for k in BOTH_WAYS])
def test_the_checker_fails_lone_messages_in_every_two_way_schedule(key, n):
    problems = _problems(n, *key, 37, lone=True)
    assert problems, f"{key} with lone messages passed at {n} ranks"
    assert "deadlock" in problems[0] or "connections" in problems[0], problems
    lazy = check(run_threads(n, _algorithm_posts, *key, 37, True), mode="lazy")
    assert lazy and ("deadlock" in lazy[0] or "pair communicators" in lazy[0]), lazy


# -- what the replay still reports in a registered pattern --------------------------------------
def _pattern_posts(ctx, name: str, cfg, variant: str):
    from commbench.patterns.registry import get

    pattern = get(name)
    groups = pattern.groups(ctx, cfg)
    parts = pattern.parts_for(None)
    local = pattern.shard(cfg, pattern.inputs(cfg, 1, ctx.device), groups, variant, parts)
    pattern.step(ctx, cfg, local, variant, groups, parts)
    return ctx.posts.export()


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 4), (2, 3, 6), (3, 2, 6), (4, 2, 8)])
def test_the_interleaved_pipeline_keeps_nccls_rules_past_as_many_micro_batches_as_stages(p, v, m):
    from commbench.patterns.pp.configs import PPConfig

    cfg = PPConfig(stages=p, layers=2 * p * v, hidden=2, batch=2 * m, micro=m, virtual=v)
    assert check(run_threads(p, _pattern_posts, "pp", cfg, "interleaved")) == []


def test_the_interleaved_pipeline_needs_its_units(monkeypatch):
    """Negative: with GPipe's policy (a send with the next step's receive, else alone) the
    interleaved stages, which send both ways at once, deadlock without buffering."""
    from commbench.patterns.pp import pp_comms
    from commbench.patterns.pp.configs import PPConfig

    monkeypatch.setattr(pp_comms, "units", lambda kinds, warm: None)
    cfg = PPConfig(stages=2, layers=8, hidden=2, batch=8, micro=4, virtual=2)
    problems = check(run_threads(2, _pattern_posts, "pp", cfg, "interleaved"))
    assert problems and "deadlock" in problems[0]


@pytest.mark.parametrize("variant", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [2, 3, 4])
def test_pipelines_keep_nccls_rules_at_any_stage_count(p, variant):
    from commbench.patterns.pp.configs import PPConfig

    cfg = PPConfig(stages=p, layers=2 * p, hidden=2, batch=12, micro=6)
    assert check(run_threads(p, _pattern_posts, "pp", cfg, variant)) == []


def test_messages_that_rely_on_tags_are_reported():
    a, b = _ranks(2)
    for tag in (1, 2):
        a.wait(a.post("send", "send", W2, peer=1, nbytes=8, tag=tag))
    for tag in (2, 1):  # gloo matches by tag; NCCL in order
        b.wait(b.post("recv", "recv", W2, peer=0, nbytes=8, tag=tag))
    assert "ignores tags" in check([a.items, b.items])[0]


def _pingpong_posts(ctx):
    from commbench.timing.native import prepare_native

    src = verify.seeded(3, ctx.rank, 16, torch.float32)
    prepare_native(ctx.comm(), ctx.world, "pingpong", "sum", 0, src, 16).first()
    return ctx.posts.export()


@pytest.mark.parametrize("n", [2, 3, 4])
def test_pingpong_posts_through_the_comm_layer_and_keeps_ncclS_rules(n):
    recs = run_threads(n, _pingpong_posts)
    assert [len(r) for r in recs] == [2, 2] + [0] * (n - 2)  # recorded: a send and a receive each
    assert check(recs) == [] and check(recs, mode="lazy") == []
