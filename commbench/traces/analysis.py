"""A job's calls matched across ranks, with their bandwidth, skew and exposed time (pure).

* **Matching**: a collective is the same call on every member when it has the same group
  (ranks) and sequence number (``Seq``, or its place among the group's collectives). A send
  and a receive are one call when they join the same two ranks on the same group in the same
  place: the k-th send from a to b meets b's k-th receive from a (messages between two ranks do
  not overtake each other, in NCCL as in MPI); one whose other end is not in the traces stays
  alone.
* **Time and bandwidth**: a matched call's time runs from its last member's start to its last
  member's end (the wire's part; the early members' wait is the skew): algbw = size / time,
  busbw = algbw * nccl-tests' factor for the group's size. A member whose kernel is not in its
  trace (``no-kernel``: a one-rank group, or a kernel after the window) gives no time; a call no
  member's kernel timed has its bytes and no time or bandwidth.
* **Skew**: the spread of the members' start times (how long the first waited for the last),
  and the slowest rank, the one that started last.
* **Exposed time**: the part of a call on a rank that no computation kernel covers (kernels that
  are not communication, NCCL's or another library's, on any stream); a call's figure is the
  most any member spent uncovered. Per step (``ProfilerStep#N``, or the whole trace: step 0):
  the union of the rank's communication, the part of it left uncovered, and the overlap
  fraction 1 - exposed / communication.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field

from commbench.rankset import ranks_text
from commbench.results.busbw import factor
from commbench.traces.calls import P2P, Call
from commbench.traces.intervals import union
from commbench.traces.kineto import NO_KERNEL, RankTrace

__all__ = ["Cover", "Matched", "bucket", "covers", "exposed", "match", "match_job", "misaligned",
           "per_group", "per_size", "per_step"]


@dataclass
class Matched:
    """One call of the job: its members' records (one per rank present)."""

    calls: list[Call]
    time_us: float = 0.0
    skew_us: float | None = None
    slowest: int = -1
    exposed_us: float = 0.0
    algbw: float = 0.0
    busbw: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def first(self) -> Call:
        return self.calls[0]

    @property
    def timed(self) -> bool:
        """Whether a member's kernel in the traces timed the call (``no-kernel``: none did)."""
        return any(c.source != NO_KERNEL for c in self.calls)


class Cover:
    """The union of one rank's computation intervals, sorted and merged (as the reader leaves
    them in the rank's trace), for overlap queries."""

    def __init__(self, t: RankTrace) -> None:
        self.lo, self.hi = t.compute_ts, t.compute_end

    def covered(self, a: float, b: float) -> float:
        """Microseconds of [a, b) inside the union (none where b <= a). Each interval met ends
        after ``a`` (the search) and starts before ``b`` (the loop): its share is never
        negative."""
        if b <= a:
            return 0.0
        lo, hi = self.lo, self.hi
        i, n = bisect.bisect_right(hi, a), len(lo)
        total = 0.0
        while i < n:
            start = lo[i]
            if start >= b:
                break
            end = hi[i]
            total += (end if end < b else b) - (start if start > a else a)
            i += 1
        return total


def covers(traces: list[RankTrace]) -> dict[int, Cover]:
    """Each rank's computation union, for the job."""
    return {t.rank: Cover(t) for t in traces}


def exposed(calls: list[Call], cover: Cover) -> tuple[float, float]:
    """(communication, uncovered) microseconds of the union of ``calls`` on one rank."""
    spans = union((c.ts, c.end) for c in calls)
    comm = sum(b - a for a, b in spans)
    return comm, comm - sum(cover.covered(a, b) for a, b in spans)


def _p2p_keys(traces: list[RankTrace]) -> dict[int, tuple]:
    """Each point-to-point call's meeting key (by ``id``): (group, sender, receiver, k), k its
    place among the sender's sends to that receiver on the group (or the receiver's receives
    from that sender), in start order."""
    out: dict[int, tuple] = {}
    for t in traces:
        seen: dict[tuple, int] = {}
        for c in sorted((c for c in t.calls if c.op in P2P), key=lambda c: c.ts):
            pair = (c.rank, c.peer) if c.op == "send" else (c.peer, c.rank)
            k = seen.get((c.group, c.op, pair), 0)
            seen[(c.group, c.op, pair)] = k + 1
            out[id(c)] = (c.group, "p2p", *pair, k)
    return out


def _members(c: Call) -> list[int]:
    """The ranks a complete call has: the group's, or a point-to-point call's two ends."""
    return sorted((c.rank, c.peer)) if c.op in P2P else sorted(c.group)


def _keyed(traces: list[RankTrace]) -> dict[tuple, list[Call]]:
    """The ranks' records of each call: a collective's by (group, Seq), a point-to-point call's
    by its pair's order."""
    keys = _p2p_keys(traces)
    groups: dict[tuple, list[Call]] = {}
    for t in sorted(traces, key=lambda t: t.rank):  # each call's members in rank order
        for k, c in enumerate(t.calls):
            key = ("unlinked", c.rank, k) if not c.group else \
                keys[id(c)] if c.op in P2P else (c.group, c.seq)
            groups.setdefault(key, []).append(c)
    return groups


def misaligned(traces: list[RankTrace]) -> str:
    """'' when the ranks' calls line up call by call (each call the same op, dtype and elements
    on every rank that recorded it), else the first call that does not: sampled ranks whose
    windows cover different steps, or traces of different jobs."""
    return _misaligned(_keyed(traces))


def _misaligned(groups: dict[tuple, list[Call]]) -> str:
    for cs in groups.values():
        kinds = {(c.op, c.dtype, c.in_elems) for c in cs}
        if len(kinds) > 1 and cs[0].op not in P2P:
            c = cs[0]
            return (f"call #{c.seq} on ranks {ranks_text(c.group)} is "
                    + "; ".join(f"rank {x.rank}: {x.op} {x.dtype}[{x.in_elems}]" for x in cs))
    return ""


def match(traces: list[RankTrace]) -> list[Matched]:
    """Every call of the job, in the order of its first member's start; each rank's calls
    alone when the ranks' calls do not line up (:func:`misaligned`)."""
    return match_job(traces)[0]


def match_job(traces: list[RankTrace], cover: dict[int, Cover] | None = None
              ) -> tuple[list[Matched], str]:
    """:func:`match`'s calls and :func:`misaligned`'s verdict, the calls keyed once;
    ``cover``: the ranks' :func:`covers`, where the caller has them."""
    cover = covers(traces) if cover is None else cover
    groups = _keyed(traces)
    apart = _misaligned(groups)
    if apart:
        groups = {(c.rank, k): [c] for t in traces for k, c in enumerate(t.calls)}
    # the members in rank order (:func:`_keyed`); a pair's row leads with its send
    rows = [Matched(cs if cs[0].op not in P2P else sorted(cs, key=lambda c: c.op != "send"))
            for cs in groups.values()]
    for m in rows:
        # a member whose kernel is not in the trace has no time: the others time the call
        cs = [c for c in m.calls if c.source != NO_KERNEL]
        if not cs:  # no member's kernel in the traces: a call with its bytes, no time
            continue
        c0 = cs[0]
        if len(cs) > 1 and len(cs) == (2 if c0.op in P2P else len(c0.group)) and \
                sorted(c.rank for c in cs) == _members(c0):
            last = max(cs, key=lambda c: (c.ts, c.rank))
            m.time_us = max(c.ts + c.dur for c in cs) - last.ts
            m.skew_us = last.ts - min(c.ts for c in cs)
            m.slowest = last.rank
        else:  # one rank's record, or members whose files are not here: no cross-rank figures
            m.time_us = min(c.dur for c in cs)
        m.exposed_us = max(c.dur - cover[c.rank].covered(c.ts, c.ts + c.dur) for c in cs)
        size, n = c0.size, len(c0.group)
        if not n or all(c.source == "cpu" for c in cs):  # a CPU op times the enqueue, not the transfer:
            continue                            # no bandwidth rather than a wrong one
        if not cs[0].sized:  # recorded without shapes: no size, so no bandwidth
            continue
        m.algbw = size / m.time_us / 1e3 if m.time_us > 0 else 0.0
        try:
            m.busbw = m.algbw * factor("sendrecv" if cs[0].op in P2P else cs[0].op, n)
        except ValueError:
            m.busbw = None
    rows.sort(key=lambda m: (min(c.ts for c in m.calls), m.first.rank))
    return rows, apart


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def per_group(rows: list[Matched]) -> list[dict]:
    """Per group: calls, bytes, communication and exposed time, median busbw."""
    out: dict[tuple, dict] = {}
    for m in rows:
        c = m.first
        g = out.setdefault(c.group, {"group": list(c.group), "name": c.group_name,
                                     "desc": c.group_desc, "calls": 0, "bytes": 0,
                                     "time_us": 0.0, "exposed_us": 0.0, "_bw": []})
        g["calls"] += 1
        g["bytes"] += c.size
        g["time_us"] += m.time_us
        g["exposed_us"] += m.exposed_us
        if m.busbw is not None:
            g["_bw"].append(m.busbw)
    for g in out.values():
        g["busbw_median"] = _median(g.pop("_bw"))
    return sorted(out.values(), key=lambda g: -g["exposed_us"])


def bucket(size: int) -> int:
    """The power of two at or below ``size`` (0 for 0)."""
    return 1 << (size.bit_length() - 1) if size > 0 else 0


def per_size(rows: list[Matched]) -> list[dict]:
    """Per (op, group size, size bucket): calls, median time and busbw, and any extra figures
    (model, baseline) as medians."""
    out: dict[tuple, dict] = {}
    for m in rows:
        c = m.first
        key = (c.op, len(c.group), bucket(c.size))
        b = out.setdefault(key, {"op": c.op, "ranks": len(c.group), "bucket": key[2],
                                 "calls": 0, "_t": [], "_bw": [], "_x": {}})
        b["calls"] += 1
        if m.timed:
            b["_t"].append(m.time_us)
        if m.busbw is not None:
            b["_bw"].append(m.busbw)
        for k, v in m.extra.items():
            if isinstance(v, int | float):
                b["_x"].setdefault(k, []).append(v)
    for b in out.values():
        b["time_us_median"] = _median(b.pop("_t"))
        b["busbw_median"] = _median(b.pop("_bw"))
        for k, vs in b.pop("_x").items():
            b[k] = _median(vs)
    return [out[k] for k in sorted(out)]


def per_step(traces: list[RankTrace], cover: dict[int, Cover] | None = None) -> list[dict]:
    """Per rank and step: communication time, its exposed part, the overlap fraction
    (``cover``: the ranks' :func:`covers`, where the caller has them)."""
    cover = covers(traces) if cover is None else cover
    out = []
    for t in traces:
        steps: dict[int, list[Call]] = {}
        for c in t.calls:
            steps.setdefault(c.step, []).append(c)
        for n in sorted(steps):
            comm, bare = exposed(steps[n], cover[t.rank])
            out.append({"rank": t.rank, "step": n, "calls": len(steps[n]), "comm_us": comm,
                        **({"outside": bool(t.steps)} if not n else {}), "exposed_us": bare,
                        "overlap": (1 - bare / comm) if comm > 0 else None})
    return out
