"""A recorded job's calls as each rank must re-issue them, and the checks that keep a replay from
hanging (pure).

Sources: a folder of Kineto traces (:mod:`commbench.traces.job`), PyTorch's execution traces
(:mod:`commbench.traces.et`), or a ``commbench audit`` result (its ``calls``: every rank's
booked entries in order). A recording is replayed only when
it cannot hang: every member of a group recorded the same collectives on it in the same order
(op, dtype, elements), every send has its receive (same pair, same elements, in order), and
every group lies inside the world.

``--scale`` keeps the groups' shapes on a smaller world: only the calls on groups of rank 0 (of
at most the new world's size) are kept, and a group's i-th member is played by rank i; rank i
re-issues rank 0's calls with member i's own sizes where the recording has them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from commbench.names import DTYPE_NAMES
from commbench.ops import OPS, bufferless
from commbench.rankset import rank_list
from commbench.traces.calls import P2P, TraceError
from commbench.traces.job import load as load_job
from commbench.traces.kineto import LIBRARY
from commbench.traces.stream import LIMIT

__all__ = ["Rec", "check", "complete", "from_audit", "from_traces", "scale", "unsplit"]

# what a replay re-issues as one collective: the calls every member makes alike (Op.agreed)
COLLECTIVES = tuple(o.name for o in OPS.values() if o.agreed)


@dataclass(frozen=True)
class Rec:
    """One call to re-issue. ``count``: this rank's input elements as the ledger books them
    (an all-gather's contribution, a reduce-scatter's whole input, an all-to-all's whole send);
    ``peer``: a point-to-point call's other end, a global rank."""

    op: str
    group: tuple[int, ...]
    dtype: str
    count: int
    in_splits: tuple[int, ...] = ()
    out_splits: tuple[int, ...] = ()
    peer: int = -1
    redop: str = "sum"
    step: int = 0

    def __post_init__(self) -> None:
        # torch numbers a group's members in ascending order, whatever order a record gives
        object.__setattr__(self, "group", tuple(sorted(self.group)))

    def key(self) -> tuple:
        return (self.op, self.dtype, self.count, self.in_splits if self.op != "all_to_all" else ())


def from_traces(names: list[str], limit: int | None = None,
                said: list[str] | None = None, world: int = 0
                ) -> tuple[int, dict[int, list[Rec]]]:
    """(the world size, each rank's calls) of a job's Kineto traces; ``said`` gets a line for
    the kernels launched before a trace's window, which have no call to re-issue; ``world``:
    the job's world size where the traces state none."""
    traces = load_job(names, limit=limit or LIMIT, world=world)
    world = max([t.world_size for t in traces] + [len(traces)])
    unlinked = {t.rank: t.unlinked for t in traces if t.unlinked}
    if unlinked and said is not None:
        said.append(f"not replayed: {sum(unlinked.values())} NCCL kernel(s) launched before the "
                    f"traces' window (ranks {rank_list(unlinked)}), whose calls they do not hold")
    graphed = {t.rank: t.graphed for t in traces if t.graphed}
    if graphed and said is not None:
        said.append(f"not replayed: {sum(graphed.values())} NCCL kernel(s) replayed from a CUDA "
                    f"graph (ranks {rank_list(graphed)}), whose calls ran at its capture, before the "
                    "traces")
    # another library's kernels, but for those whose call torch recorded (op, sizes, group)
    library = {t.rank: n for t in traces if t.library and (n := sum(
        1 for c in t.calls if c.source == LIBRARY and not (c.group and c.sized)))}
    if library and said is not None:
        libs = sorted({lib for t in traces if t.rank in library for lib in t.library})
        said.append(f"not replayed: {sum(library.values())} kernel(s) of {', '.join(libs)} "
                    f"(ranks {rank_list(library)}): communication of its own, whose sizes and "
                    "groups the traces do not hold")
    unsized = {t.rank: t.unsized for t in traces if t.unsized}
    if unsized and said is not None:
        said.append(f"not replayed: {sum(unsized.values())} call(s) whose sizes the traces do "
                    f"not hold, recorded without shapes (ranks {rank_list(unsized)})")
    plan = {t.rank: [Rec(c.op, c.group, c.dtype, c.in_elems, c.in_splits, c.out_splits,
                         c.peer, step=c.step) for c in sorted(t.calls, key=lambda c: c.ts)
                     # a kernel launched before the trace, or a call without its sizes:
                     # nothing to re-issue
                     if c.group and c.sized]
            for t in traces}
    return world, plan


def from_audit(path: str, record: dict) -> tuple[int, dict[int, list[Rec]]]:
    calls = record.get("calls")
    if not isinstance(calls, list):
        raise TraceError(f"{path}: a commbench audit result without calls (written by an older "
                         "commbench; audit the script again)")
    plan: dict[int, list[Rec]] = {}
    for rank, entries in enumerate(calls):
        out = []
        for k, e in enumerate(entries):
            try:
                op = {"isend": "send", "irecv": "recv"}.get(e["op"], e["op"])
                sp = e.get("splits") or [[], []]
                out.append(Rec(op, tuple(e["group"]), e["dtype"], int(e["count"]),
                               tuple(sp[0]), tuple(sp[1]), int(e.get("peer", -1)),
                               e.get("redop") or "sum"))
            except (KeyError, TypeError, ValueError, IndexError):
                raise TraceError(f"{path}: rank {rank}'s call {k} cannot be read") from None
        plan[rank] = out
    return len(calls), plan


def unsplit(plan: dict[int, list[Rec]]) -> list[str]:
    """The all-to-alls whose splits the recording does not hold (torch < 2.1 records none, later
    ones only where the job gave them) and whose elements do not divide evenly over the group:
    the job gave them splits of its own, which no equal split stands for and which only it
    knew. Each is left out on every member alike (one left out on some would hang the others)
    and named, not guessed. Returns the line that says so ([] where none is)."""
    def bare(r: Rec) -> bool:
        return r.op == "all_to_all" and not r.in_splits and r.count % max(1, len(r.group)) != 0

    gone = {rank: sum(map(bare, recs)) for rank, recs in plan.items()}
    if not any(gone.values()):
        return []
    for rank in plan:
        plan[rank] = [r for r in plan[rank] if not bare(r)]
    ranks = sorted(r for r, k in gone.items() if k)
    return [f"not replayed: {max(gone.values())} all-to-all call(s) whose elements do not divide "
            f"evenly over their group and whose splits the recording does not hold (ranks "
            f"{ranks}; the job's own splits are unknown)"]


def complete(world: int, plan: dict[int, list[Rec]]) -> list[str]:
    """The calls of ranks with no recording, where they follow from one that has: every member
    of a group issues its collectives alike, so a missing rank gets, in the recorded rank's
    order, its collectives on the groups both are in, and the other end of its sends and
    receives with it (all-to-alls with uneven splits left out: a member's own splits are not
    the recorded one's). What only the missing ranks could say (their groups without the
    recorded rank, their point-to-point calls with others) is named, not guessed. Returns the
    lines that say so; ``plan`` gains the ranks completed. The recorded rank is the lowest one
    that has a recording."""
    missing = sorted(set(range(world)) - set(plan))
    if not missing or not plan:
        return []
    ref = min(plan)
    said = [f"ranks {rank_list(missing)} have no recording: each replays rank {ref}'s calls on the groups "
            f"it shares with it (every member issues a collective alike)"]
    uneven = 0
    for m in missing:
        mine = []
        for r in plan[ref]:
            if r.op in P2P:
                if r.peer == m:
                    mine.append(replace(r, op="recv" if r.op == "send" else "send", peer=ref))
            elif m in r.group:
                if r.op == "all_to_all" and len(set(r.in_splits)) > 1:
                    uneven += 1
                    continue
                mine.append(r)
        plan[m] = mine
    if uneven:
        said.append(f"{uneven} all-to-all call(s) with uneven splits left out on the ranks "
                    "without a recording (their own splits are not recorded)")
    said.append("not replayed, as only those ranks' own traces could say: their groups "
                f"without rank {ref}, their point-to-point calls with other ranks")
    return said


def check(world: int, plan: dict[int, list[Rec]]) -> None:
    """TraceError unless ``plan`` can run on ``world`` ranks without a hang."""
    missing = sorted(set(range(world)) - set(plan))
    if missing:
        raise TraceError(f"ranks {rank_list(missing)} have no recorded calls: a replay needs every rank's")
    per_group: dict[tuple, dict[int, list[tuple]]] = {}
    sends: dict[tuple[int, int], list[int]] = {}
    recvs: dict[tuple[int, int], list[int]] = {}
    for rank, recs in plan.items():
        for k, r in enumerate(recs):
            if r.op not in COLLECTIVES + P2P:
                raise TraceError(f"rank {rank}, call {k}: op {r.op!r} cannot be replayed; "
                                 f"replayed: {', '.join(COLLECTIVES + P2P)}")
            if r.dtype not in DTYPE_NAMES and not bufferless(r.op):
                raise TraceError(f"rank {rank}, call {k} ({r.op}): dtype {r.dtype!r} cannot be "
                                 f"replayed; replayed: {', '.join(DTYPE_NAMES)}")
            bad = [x for x in r.group if not 0 <= x < world]
            if bad or rank not in r.group:
                raise TraceError(f"rank {rank}, call {k} ({r.op}): group {list(r.group)} is not "
                                 f"a group of this rank in a world of {world}")
            if r.op in P2P:
                if r.peer not in r.group or r.peer == rank:
                    raise TraceError(f"rank {rank}, call {k} ({r.op}): its peer is not recorded")
                pair = (rank, r.peer) if r.op == "send" else (r.peer, rank)
                (sends if r.op == "send" else recvs).setdefault(pair, []).append(r.count)
            else:
                per_group.setdefault(r.group, {}).setdefault(rank, []).append(r.key())
    for group, by in sorted(per_group.items()):
        lists = [by.get(m, []) for m in group]
        for m, got in zip(group, lists, strict=True):
            if got != lists[0]:
                i = next((j for j, (a, b) in enumerate(zip(lists[0], got)) if a != b),
                         min(len(got), len(lists[0])))
                raise TraceError(f"group {list(group)}: rank {group[0]} and rank {m} recorded "
                                 f"different collectives on it ({len(lists[0])} and {len(got)} "
                                 f"calls, first difference at call {i}): a replay would hang")
    for pair in sorted(set(sends) | set(recvs)):
        if sends.get(pair, []) != recvs.get(pair, []):
            raise TraceError(f"rank {pair[0]} -> rank {pair[1]}: {len(sends.get(pair, []))} "
                             f"sends and {len(recvs.get(pair, []))} receives of other sizes or "
                             "number: a replay would hang")


def scale(world: int, plan: dict[int, list[Rec]], np: int) -> dict[int, list[Rec]]:
    """Rank 0's groups of at most ``np`` members, played by ranks 0.. of each group (above)."""
    if 0 not in plan:
        raise TraceError("--scale: replays rank 0's groups; rank 0's calls are not recorded")
    pos = {}  # (recorded group, index in it) -> that member's calls on the group
    for rank, recs in plan.items():
        for r in recs:
            if r.op not in P2P:
                pos.setdefault((r.group, r.group.index(rank)), []).append(r)
    out: dict[int, list[Rec]] = {i: [] for i in range(np)}
    seen: dict[tuple, int] = {}
    for r in plan[0]:
        n = len(r.group)
        if n > np or r.op in P2P:
            continue
        k = seen.get(r.group, 0)
        seen[r.group] = k + 1
        local = tuple(range(n))
        for i in range(n):
            own = pos.get((r.group, i), [])
            mine = own[k] if k < len(own) and own[k].op == r.op else r
            out[i].append(replace(mine, group=local))
    if not out[0]:
        widths = sorted({len(r.group) for r in plan[0] if r.op not in P2P})
        raise TraceError(f"--scale --np {np}: keeps no call: rank 0's collectives are on groups "
                         f"of {', '.join(map(str, widths)) or 'no'} ranks (point-to-point calls "
                         "are not scaled); give --np of at least the smallest")
    return out
