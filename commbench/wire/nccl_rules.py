"""NCCL's execution model, replayed on every rank's record of posts (:mod:`commbench.wire.posts`).

gloo buffers messages, matches them by tag and runs each call on the host; NCCL does none of
that, so code that works over gloo can hang on the first GPU cluster. :func:`check` replays the
records of all ranks of one run under NCCL's rules and returns what would go wrong there, one
line per problem (empty: nothing):

* **where a message posted alone runs** depends on how the job initialised NCCL (``mode``).
  *Eager* (``init_process_group(device_id=...)``, torch >= 2.3; commbench's own mode): on the
  group's own communicator, in order with its collectives (ProcessGroupNCCL's ``getNCCLComm``
  reuses the bound device's communicator for point-to-point). *Lazy*: on torch's communicator of
  the pair, its own stream, made on first use.
* **connection setup**: the first message between two ranks on a communicator sets up their
  point-to-point connection (NCCL's ``ncclTransportP2pSetup`` in the implicit group of a lone
  send or receive), and that blocks the host until the peer connects too; lazily, making the
  pair's communicator blocks both ends the same way. Each rank's first contacts, in order, must
  pair up (rank r asking for (r-1, r) while r-1 asks for (r-2, r-1) is a circular wait at three
  or more ranks). A group call connects all its peers at once and is not held to this order.
* **tags**: NCCL matches a pair's messages in posting order; a send and the receive it meets
  must carry the same tag, or code that relies on gloo's matching by tag swaps data on NCCL.
* **collective order**: the collectives of one communicator are issued in the same order with
  the same op, dtype and count (root included) by every member; NCCL does not check it.
* **streams**: each communicator has one stream per rank that runs its posts in order, a post
  starting only after the posts its rank had waited for before posting it. A collective completes
  when every member's stream of that communicator is at it; a message when the matching one
  (the k-th send from a to b matches the k-th receive at b from a, on the same communicator) is at
  the head of the peer's stream: a send is a rendezvous at every size, since NCCL moves a
  point-to-point message in chunks (``NCCL_P2P_NVL_CHUNKSIZE`` 512 KiB over NVLink,
  ``NCCL_P2P_NET_CHUNKSIZE`` 128 KiB over the network) that the receiver's kernel must be
  running to take, and a send kernel does not end before its last chunk is taken. The messages
  of one group call are launched together: each completes as soon as its partner runs, and the
  call ends when all have. When nothing can complete and posts remain, the run deadlocks: the
  ranks and the posts at the head of each blocked stream are reported.

Not modelled: the host blocking on a result (``.item()``, ``.tolist()``) between posts, which
only orders posts that the record already orders; CUDA graphs; NCCL's own errors on sizes.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Sequence

from commbench.wire.posts import MODES, Post, stream_of

__all__ = ["check", "describe"]

_MAX_LINES = 8  # ranks described in one deadlock report


def describe(rank: int, p: Post) -> str:
    where = f"group {list(p.comm)}"
    line = f" at {p.where}" if p.where else ""
    if p.kind == "coll":
        count = f"[{p.count}]" if p.count >= 0 else ""
        return f"{p.op} {p.dtype}{count} on {where}{line}"
    way = "to" if p.kind == "send" else "from"
    alone = "posted alone" if p.batch < 0 else f"in group call {p.batch}"
    return f"{p.kind} of {p.nbytes} B {way} rank {p.peer} on {where} ({alone}){line}"


def _records(records: Sequence) -> list[list[Post]]:
    return [[p if isinstance(p, Post) else Post(*p) for p in rec] for rec in records]


def check(records: Sequence, mode: str = "eager") -> list[str]:
    """What NCCL would do wrong with these posts: ``records[r]`` is rank r's (Posts.items or
    Posts.export()), run in NCCL init ``mode`` ("eager" or "lazy", module docstring); the list
    is empty when the run would complete."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: must be one of {', '.join(MODES)}")
    recs = _records(records)
    keys, per_post = _match_keys(recs, mode)
    first = _pair_creation(recs) if mode == "lazy" else []
    problems = first + _collective_order(recs) + _matching(recs, keys)
    return problems or _streams(recs, keys, per_post, mode)


def _pair_creation(recs: list[list[Post]]) -> list[str]:
    firsts: list[list[tuple]] = []
    for r, rec in enumerate(recs):
        seen: dict[tuple, None] = {}
        for p in rec:
            if p.kind != "coll" and p.batch < 0:
                seen.setdefault(("pair", p.comm, min(r, p.peer), max(r, p.peer)), None)
        firsts.append(list(seen))
    at = [0] * len(recs)
    moved = True
    while moved:
        moved = False
        for r, keys in enumerate(firsts):
            if at[r] >= len(keys):
                continue
            key = keys[at[r]]
            peer = key[3] if key[2] == r else key[2]
            if at[peer] < len(firsts[peer]) and firsts[peer][at[peer]] == key:
                at[r] += 1
                at[peer] += 1
                moved = True
    stuck = [(r, firsts[r][at[r]]) for r in range(len(recs)) if at[r] < len(firsts[r])]
    if not stuck:
        return []
    waits = "; ".join(f"rank {r} waits to make the communicator of pair ({k[2]}, {k[3]}) of "
                      f"group {list(k[1])}" for r, k in stuck[:_MAX_LINES])
    return [f"NCCL hang making lazy pair communicators (messages posted alone, each pair's "
            f"communicator made on first use, blocking both ends): {waits}"]


def _signature(p: Post) -> tuple:
    return (p.op, p.dtype, p.count)


def _collective_order(recs: list[list[Post]]) -> list[str]:
    seqs: dict[tuple, dict[int, list[Post]]] = defaultdict(lambda: defaultdict(list))
    for r, rec in enumerate(recs):
        for p in rec:
            if p.kind == "coll":
                seqs[p.comm][r].append(p)
    problems = []
    for comm, by_rank in seqs.items():
        members = [m for m in comm if m < len(recs)]
        longest = max(len(by_rank.get(m, [])) for m in members)
        for k in range(longest):
            calls = {m: by_rank[m][k] if k < len(by_rank.get(m, [])) else None for m in members}
            first = calls[members[0]]
            for m in members[1:]:
                other = calls[m]
                if _agree(first, other):
                    continue
                a = describe(members[0], first) if first else "nothing"
                b = describe(m, other) if other else "nothing"
                problems.append(f"NCCL collective order on group {list(comm)}: call {k}: "
                                f"rank {members[0]} posts {a}, rank {m} posts {b}")
                break
            else:
                continue
            break
    return problems


def _agree(a: Post | None, b: Post | None) -> bool:
    if a is None or b is None:
        return False
    if (a.op, a.dtype) != (b.op, b.dtype):
        return False
    return a.count == b.count or -1 in (a.count, b.count)


def _match_keys(recs: list[list[Post]], mode: str):
    """Every message's key (kind, stream, src, dst, k): the k-th from src to dst on one
    communicator; returns {key: (rank, index)} and each rank's keys by post (None: collective)."""
    keys: dict[tuple, tuple[int, int]] = {}
    per_post: list[list[tuple | None]] = []
    for r, rec in enumerate(recs):
        count: dict[tuple, int] = defaultdict(int)
        mine: list[tuple | None] = []
        for i, p in enumerate(rec):
            if p.kind == "coll":
                mine.append(None)
                continue
            src, dst = (r, p.peer) if p.kind == "send" else (p.peer, r)
            base = (p.kind, stream_of(r, p, mode), src, dst)
            key = (*base, count[base])
            count[base] += 1
            keys[key] = (r, i)
            mine.append(key)
        per_post.append(mine)
    return keys, per_post


def _partner(keys, key: tuple) -> tuple[int, int] | None:
    return keys.get(("recv" if key[0] == "send" else "send", *key[1:]))


def _matching(recs: list[list[Post]], keys: dict) -> list[str]:
    problems = []
    for key, (r, i) in keys.items():
        p = recs[r][i]
        found = _partner(keys, key)
        if found is None:
            problems.append(f"NCCL unmatched message: rank {r}'s {describe(r, p)} has no "
                                f"matching {'receive' if p.kind == 'send' else 'send'} on rank "
                                f"{p.peer} on the same communicator")
        elif p.kind == "send" and recs[found[0]][found[1]].nbytes != p.nbytes:
            q = recs[found[0]][found[1]]
            problems.append(f"NCCL size mismatch: rank {r}'s {describe(r, p)} meets rank "
                            f"{found[0]}'s {describe(found[0], q)}")
        elif p.kind == "send" and recs[found[0]][found[1]].tag != p.tag:
            q = recs[found[0]][found[1]]
            problems.append(f"NCCL ignores tags: rank {r}'s {describe(r, p)} (tag {p.tag}) is "
                            f"matched in order with rank {found[0]}'s {describe(found[0], q)} "
                            f"(tag {q.tag}): the messages would land in each other's buffers")
    return problems[:_MAX_LINES]


def _streams(recs: list[list[Post]], keys: dict, per_post: list, mode: str) -> list[str]:
    # items: a collective, a group call, or a message posted alone; (rank, first, end) posts
    queues: dict[tuple, deque] = defaultdict(deque)  # (rank, stream) -> items in order
    item_of: list[list[tuple]] = []
    for r, rec in enumerate(recs):
        mine: list[tuple] = []
        i = 0
        while i < len(rec):
            j = i + 1
            if rec[i].kind != "coll" and rec[i].batch >= 0:
                while j < len(rec) and rec[j].kind != "coll" and rec[j].batch == rec[i].batch:
                    j += 1
            item = (r, i, j)
            mine += [item] * (j - i)
            queues[(r, stream_of(r, rec[i], mode))].append(item)
            i = j
        item_of.append(mine)
    done_items: set[tuple] = set()
    done_posts: set[tuple[int, int]] = set()
    contacts = _contacts(recs, mode)
    reach = [-1] * len(recs)  # the last post each rank's host has made

    def postable(r: int, i: int) -> bool:
        return (all(item_of[r][a] in done_items for a in recs[r][i].after)
                and all(reach[q] >= k for j, q, k in contacts[r] if j < i))

    def advance() -> None:
        moved = True
        while moved:
            moved = False
            for r in range(len(recs)):
                i = reach[r] + 1
                while i < len(recs[r]) and postable(r, i):
                    i += 1
                if i - 1 != reach[r]:
                    reach[r], moved = i - 1, True

    def ready(item) -> bool:
        r, i, _ = item
        return i <= reach[r]

    while queues:
        advance()
        running = {q[0] for q in queues.values() if ready(q[0])}
        heads = {(it[0], stream_of(it[0], recs[it[0]][it[1]], mode)): it for it in running}
        progress = False
        for it in running:
            r, i, j = it
            for k in range(i, j):
                if (r, k) in done_posts:
                    continue
                p = recs[r][k]
                if p.kind == "coll":  # every member's stream of the communicator is at it
                    if all(_at_collective(heads.get((m, ("group", p.comm))), recs)
                           for m in p.comm if m < len(recs)):
                        done_posts.add((r, k))
                        progress = True
                    continue
                hit = _partner(keys, per_post[r][k])
                if hit is not None and item_of[hit[0]][hit[1]] in running:
                    done_posts.update({(r, k), hit})  # both ends running: the message moves
                    progress = True
        for key, q in list(queues.items()):
            r, i, j = q[0]
            if all((r, k) in done_posts for k in range(i, j)):
                q.popleft()
                done_items.add((r, i, j))
                progress = True
                if not q:
                    del queues[key]
        if not progress:
            hosts = []
            for r in range(len(recs)):
                i = reach[r] + 1
                waits = [(j, q) for j, q, k in contacts[r] if j < i and reach[q] < k]
                if i < len(recs[r]) and waits:
                    j, q = waits[0]
                    hosts.append(f"rank {r}'s host waits to connect to rank {q} "
                                 f"({describe(r, recs[r][j])}, its first to it)")
            return [_deadlock(recs, queues, ready, done_posts, hosts)]
    return []


def _contacts(recs: list[list[Post]], mode: str) -> list[list[tuple[int, int, float]]]:
    """Per rank, its first message posted alone to each peer on each communicator, if that is its
    first message to the peer there: (its index, the peer, the index of the peer's first message
    back that connects them; inf: none). The host blocks in it until the peer has posted that one
    (connection setup). Eagerly any first message of the peer's connects them (a group call
    connects all its peers); lazily only one posted alone, which asks for the pair's
    communicator."""
    lone: list[dict[tuple, int]] = []
    anyway: list[dict[tuple, int]] = []
    for rec in recs:
        first_lone: dict[tuple, int] = {}
        first_any: dict[tuple, int] = {}
        for i, p in enumerate(rec):
            if p.kind == "coll":
                continue
            first_any.setdefault((p.comm, p.peer), i)
            if p.batch < 0:
                first_lone.setdefault((p.comm, p.peer), i)
        lone.append(first_lone)
        anyway.append(first_any)
    back = lone if mode == "lazy" else anyway
    out = []
    for r in range(len(recs)):
        mine = lone[r] if mode == "lazy" else {k: i for k, i in lone[r].items()
                                                if anyway[r][k] == i}
        out.append([(i, q, back[q].get((comm, r), math.inf) if q < len(recs) else math.inf)
                    for (comm, q), i in mine.items()])
    return out


def _at_collective(head, recs) -> bool:
    return head is not None and recs[head[0]][head[1]].kind == "coll"


def _deadlock(recs, queues, ready, done_posts, hosts=()) -> str:
    lines = list(hosts)
    for (r, _), q in sorted(queues.items(), key=lambda kv: kv[0][0]):
        it = q[0]
        if not ready(it):
            continue
        posts = "; ".join(describe(r, recs[r][k]) for k in range(it[1], it[2])
                          if (r, k) not in done_posts)
        lines.append(f"rank {r}: {posts}")
    lines = lines[:_MAX_LINES] or ["every stream waits for an earlier post of its own rank"]
    return ("NCCL deadlock: no stream can make progress; at the head of each blocked stream: "
            + " | ".join(lines))
