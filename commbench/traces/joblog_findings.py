"""What a failed job's log says of it (pure): per failed call of a process group the ranks it
failed on, and the findings its lines can carry: a rank behind, ranks at different places or in
different collectives or sizes, a rank told of a timeout with nothing in flight, a stuck
watchdog, torch's fingerprint check and monitored barrier, NCCL's warnings and errors, gloo's
timeouts and closed connections. The lines are read by
:mod:`commbench.traces.joblog`."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from commbench.ops import OPS
from commbench.rankset import ranks_text, who
from commbench.traces.joblog import JobLog, Progress, Signal, Timeout

__all__ = ["NCCL_RESULTS", "SAME_SIZE", "WORK", "findings"]

# torch's OpType -> the collective's record: the names are the records' (ops.py)
WORK = {w: o for o in OPS.values() for w in o.names.work}
# collectives whose every member gives a tensor of one size: ranks that disagree on it at one
# call have a bug (an all-to-all, a rooted gather or scatter, a coalesced or point-to-point
# batch may differ by rank)
SAME_SIZE = {w for w, o in WORK.items() if o.agreed and not o.split
             and (o.input in ("whole", "none") or not o.rooted)}
NCCL_RESULTS = ("ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
                "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress",
                "ncclTimeout")  # ncclResult_t, src/nccl.h.in


def _fingerprint(call: tuple) -> str:
    seq, op, shape, dtype = call
    return f"{op}" + (f" #{seq}" if _whole(call) else " (a short fingerprint)") + \
        (f" [{shape}]" if shape is not None else "") + (f" {dtype}" if dtype else "")


def _whole(call: tuple) -> bool:
    """A fingerprint with its place and tensors. A rank's short one (``SequenceNumber=0OpType=
    REDUCE``, no tensors: torch before its fix in pytorch/pytorch#100213) holds no place to
    trust."""
    return call[0] is not None and call[2] is not None


def _who(log_rank: int | None, group_rank: int) -> str:
    return f"rank {log_rank}" if log_rank is not None else f"group rank {group_rank}"


@dataclass
class _Call:
    """One call of one group that failed on the ranks whose lines name it."""

    group: str            # '?': the lines do not name it
    desc: str
    seq: int
    timeouts: list[Timeout] = field(default_factory=list)
    progress: list[Progress] = field(default_factory=list)
    inferred: int = 0     # timeouts put here by their place and collective (no group line)

    def members(self) -> list[int]:
        """The ranks that reported it: the job's where every line says them, else the group's."""
        job = self.job_ranks()
        return sorted({t.rank if job else t.group_rank for t in self.timeouts}
                      | {p.rank if job else p.group_rank for p in self.progress})

    def job_ranks(self) -> bool:
        return all(x.rank is not None for x in [*self.timeouts, *self.progress])


def _calls(log: JobLog) -> tuple[dict[tuple[str, int], _Call], int]:
    """The failed calls by (group, place), and how many timeouts were put in a group by
    inference. A timeout joins its rank's progress line of the same call (same job rank where
    printed, same group rank, same place); one without such a line joins the one named group
    whose failed call has its place and collective, where exactly one has; else a group the
    lines do not name ('?'). A progress line without its timeout line is a call too."""
    calls: dict[tuple[str, int], _Call] = {}
    # (job rank, group rank, place) -> the calls whose progress lines name it: a timeout's home
    homes: dict[tuple, list[_Call]] = {}
    for p in log.progress:
        c = calls.setdefault((p.group, p.at), _Call(p.group, p.desc, p.at))
        found = homes.setdefault((p.rank, p.group_rank, p.at), [])
        if all(x is not c for x in found):  # a rank's line again (older and newer wording)
            c.progress.append(p)
            found.append(c)
    seen, loose, inferred = set(), [], 0
    # one event printed again: the exception's own text, the blocking wait, and a line without
    # the job's rank ("what(): ...") repeating one with it
    told = {(t.group_rank, t.seq, t.op) for t in log.timeouts if t.rank is not None}
    for t in log.timeouts:
        key = (t.rank, t.group_rank, t.seq, t.op)
        if key in seen or (t.rank is None and key[1:] in told):
            continue
        seen.add(key)
        home = homes.get((t.rank, t.group_rank, t.seq), [])
        if len(home) == 1:
            home[0].timeouts.append(t)
        else:
            loose.append(t)
    named = dict(calls)
    for t in loose:
        like = [c for c in named.values() if c.seq == t.seq and c.timeouts
                and all(u.op == t.op for u in c.timeouts)]
        if len(like) == 1:
            like[0].timeouts.append(t)
            like[0].inferred += 1
            inferred += 1
        else:
            calls.setdefault(("?", t.seq), _Call("?", "", t.seq)).timeouts.append(t)
    return calls, inferred


def findings(log: JobLog, notes: list[str] | None = None, world: int = 0
             ) -> tuple[list[dict], list[str]]:
    """(a row per failed call of a group, the findings). Findings: each call that timed out
    (MERGED or more groups failed alike in one line); ranks of a group that never issued the
    call the others wait in (their last enqueued is before it); ranks of one group timed out
    at different calls, or at one call in different collectives or sizes (a desync); a rank
    told of a timeout with nothing in flight before the failed call; torch's fingerprint check
    and monitored barrier; a watchdog that got stuck; NCCL's warnings and errors. ``notes``
    gets what is no finding: every rank that reported issued the call and none completed it
    (the call is stuck in NCCL or on a rank that said nothing), the group's members that said
    nothing, what was inferred, where the ranks named run, NCCL's error path, torchrun's root
    cause. ``world``: the job's size, where known (the default group's members, group "0")."""
    notes = [] if notes is None else notes
    said: list[str] = []
    calls, inferred = _calls(log)
    if inferred:
        notes.append(f"{inferred} timeout line(s) of ranks that printed no line naming their "
                     "group were put in the one named group whose failed call has their place "
                     "and collective")
    rows = []
    alike: dict[tuple, list[tuple[int, dict]]] = {}  # (op, place, timeout, job ranks) -> rows
    for (group, seq), c in sorted(calls.items(),
                                  key=lambda kv: (kv[0][0] == "?", _natural(kv[0][0]), kv[0][1])):
        ts, prog = c.timeouts, c.progress
        ops = Counter(t.op for t in ts)
        sizes = Counter((t.numel_in, t.numel_out) for t in ts)
        size = next((n for t in ts if (n := _group_size(t))), None) or \
            (world if group == "0" and world else None)
        row = {"group": group, "desc": c.desc, "seq": seq, "op": "/".join(ops) or "?",
               "numel_in": sorted({t.numel_in for t in ts if t.numel_in is not None}),
               "numel_out": sorted({t.numel_out for t in ts if t.numel_out is not None}),
               "ranks": c.members(), "job_ranks": c.job_ranks(), "group_size": size,
               "timed_out": sorted({t.rank if c.job_ranks() else t.group_rank for t in ts}),
               "timeout_s": max((t.timeout_ms for t in ts), default=0) / 1000 or None,
               "enqueued": [min(p.enqueued for p in prog), max(p.enqueued for p in prog)]
               if prog else None,
               "completed": [min(p.completed for p in prog), max(p.completed for p in prog)]
               if prog else None}
        rows.append(row)
        named = _named(row)
        subject = who(row["ranks"]) if row["job_ranks"] else "group " + who(row["ranks"])
        if ts and group != "?":  # alike failures of many groups are told together (_merged)
            alike.setdefault((row["op"], seq, row["timeout_s"], row["job_ranks"]), []).append(
                (len(said), row))
        said.append(f"{named}: " + (
            f"{row['op']} #{seq} timed out after {row['timeout_s']:g} s on {subject}" if ts else
            f"call #{seq} failed on {subject} (the line saying which call is not in the log)"))
        if len(ops) > 1:
            parts = "; ".join(f"{who(_ranks(c, op=o))}: {o}" for o in ops)
            if group == "?":
                notes.append(f"{named}, #{seq}: {parts} (may be different groups' calls)")
            elif not _collective(c):
                notes.append(f"{named} call #{seq}: {parts}: point-to-point calls (a send meets "
                             "its receive), not a desync")
            else:
                said.append(f"{named} call #{seq}: the ranks issued different collectives at the "
                            f"same place (a desync): {parts}")
        elif len(sizes) > 1:
            parts = "; ".join(f"{who(_ranks(c, size=s))}: NumelIn={s[0]} NumelOut={s[1]}"
                              for s in sizes)
            op = next(iter(ops))
            if op in SAME_SIZE and group != "?":
                said.append(f"{named} call #{seq}: the ranks give {op} different sizes: {parts}")
            else:
                notes.append(f"{named} call #{seq}: sizes differ by rank ({parts}); "
                             + ("a " + op + " may carry different tensors on each rank"
                                if op not in SAME_SIZE else "the lines name no group, so they "
                                "may be different groups' calls"))
    said[:] = _merged(said, alike)
    _beside(calls, notes)
    blame: set[int] = set()  # job ranks the findings point to: behind, silent, stuck
    _groups(log, calls, rows, said, notes, blame)
    _signals(log, rows, said, notes, blame)
    for (ra, a), (rb, b) in log.mismatches:
        said.append(f"torch's collective check (TORCH_DISTRIBUTED_DEBUG=DETAIL) found a desync: "
                    f"group rank {ra} issued {_fingerprint(a)} where group rank {rb} issued "
                    f"{_fingerprint(b)}" + (" (different places: they issued different numbers "
                                            "of the group's collectives)" if _whole(a) and
                                            _whole(b) and a[0] != b[0] else ""))
    for (waiter, ms), absent in sorted(log.barriers.items()):
        said.append(f"torch's monitored barrier: {who(sorted(absent))} never reached it (rank "
                    f"{waiter} waited {ms / 1000:g} s; gloo group ranks)")
    said += _gloo(log, world)
    blame |= {rank for rank, _, _, _ in log.stuck if rank is not None}
    _where(log, blame, notes)
    for (group, seconds), stuck in _stuck(log).items():
        said.append(f"group {group}: the watchdog of {', '.join(stuck)} got stuck for {seconds} s "
                    "(a CUDA or NCCL call that does not return there, or a thread holding the "
                    "GIL in one)")
    if log.warns:
        hosts = sorted(set().union(*log.warns.values()) - {"?"})
        said.append(f"NCCL warned in {len(log.warns)} way(s)"
                    + (f" on {len(hosts)} host(s) ({', '.join(hosts[:4])}"
                       + (", ..." if len(hosts) > 4 else "") + ")" if hosts else "") + ": "
                    + next(iter(log.warns)))
    for err, n in log.errors.most_common():
        said.append(f"NCCL error ({n} line(s)): {err}")
    if log.dumped:
        ranks = sorted(r for r in log.dumped if r is not None)
        notes.append(f"{who(ranks) if ranks else 'ranks'} set out to dump "
                     f"{'its' if len(ranks) == 1 else 'their'} flight recorder "
                     "buffers (to TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>, by default "
                     "nccl_trace_rank_<rank> in the system's temporary folder): commbench analyze "
                     "of those files names the rank the others wait for")
    if log.chains:
        notes.append("NCCL's error path (its INFO lines 'file:line -> code'): " + "; ".join(
            f"{_result(code)} on {host} from {first} ({n} line(s))"
            for (host, code), (n, first) in log.chains.items()))
    if log.root:
        notes.append("torchrun's root cause (the first rank to exit): "
                     + ", ".join(f"{k} {v}" for k, v in log.root.items())
                     + ("; after a timeout every rank aborts by itself (SIGABRT, exit -6), so "
                        "the first to exit is not the rank to blame" if not log.gloo or
                        log.timeouts or log.progress else "; a rank whose gloo call timed out "
                        "raises and exits by itself, so the first to exit is not the rank to "
                        "blame"))
    return rows, said


def _gloo(log: JobLog, world: int) -> list[str]:
    """gloo's own errors: the ranks whose receive or send timed out in one call (a peer never
    came to it), the ranks whose peer's connection closed under them, and, where the world is
    known and every rank with a gloo error is named, the ranks that printed none (the ones the
    others waited for, or whose process ended)."""
    out = []
    waited: dict[tuple[str, int | None], list] = {}
    closed: dict[str, list] = {}
    for g in log.gloo:
        if g.kind == "closed":
            closed.setdefault(g.call, []).append(g)
        else:
            waited.setdefault((g.call, g.timeout_ms), []).append(g)
    for (call, ms), gs in waited.items():
        kinds = {k: sorted(g.rank for g in gs if g.kind == k and g.rank is not None)
                 for k in ("recv", "send")}
        ranks = sorted({g.rank for g in gs if g.rank is not None})
        unnamed = sum(g.rank is None for g in gs)
        on = ", ".join(([who(ranks)] if ranks else []) +
                       ([f"{unnamed} rank(s) the lines do not name"] if unnamed else []))
        sides = "; ".join(f"{who(rs)} waiting to {'receive' if k == 'recv' else 'send'}"
                          for k, rs in kinds.items() if rs)
        out.append(f"gloo: {call or 'a call'} timed out after {ms / 1000:g} s on {on}"
                   + (f" ({sides})" if sides else "") + ": a peer never came to it")
    for call, gs in closed.items():
        ranks = sorted({g.rank for g in gs if g.rank is not None})
        peers = sorted({g.peer for g in gs})
        out.append(f"gloo: a peer's connection closed under {who(ranks) if ranks else 'a rank'} "
                   f"in {call or 'a call'} (Connection closed by peer {', '.join(peers[:4])}"
                   + (", ..." if len(peers) > 4 else "") + "): that peer's process ended, or "
                   "its host went away")
    named = {g.rank for g in log.gloo}
    if world and named and None not in named:
        silent = [r for r in range(world) if r not in named]
        if silent:
            out.append(f"gloo: {who(silent)} of the world's {world} printed no gloo error: the "
                       "rank(s) the others waited for, or whose process ended (torchrun's report "
                       "says how each rank ended)")
    return out


MERGED = 4  # groups failed alike from which on they are told in one line


def _natural(name: str) -> tuple:
    """A group's name as a reader orders them: tp2 before tp10."""
    return tuple((0, int(x), "") if x.isdigit() else (1, 0, x) for x in re.split(r"(\d+)", name))


def _groups_text(names: list[str]) -> str:
    """Groups' names in a line: all of a few, else the first three and the last."""
    return ", ".join(names) if len(names) <= 6 else \
        f"{', '.join(names[:3])}, ..., {names[-1]}"


def _merged(said: list[str], alike: dict[tuple, list[tuple[int, dict]]]) -> list[str]:
    """``said`` with the timeouts of MERGED or more groups alike (one collective at one place,
    one timeout: a tensor-parallel job's 64 groups hung in one all-reduce) told in one line
    where the first of them stood."""
    out: dict[int, str | None] = dict(enumerate(said))
    for (op, seq, timeout, job), members in alike.items():
        if len(members) < MERGED:
            continue
        ranks = sorted({r for _, row in members for r in row["ranks"]})
        names = [row["group"] for _, row in members]
        out[members[0][0]] = (f"{len(members)} groups ({_groups_text(names)}): {op} #{seq} timed "
                              f"out after {timeout:g} s on "
                              + (who(ranks) if job else "their members that reported"))
        for k, _ in members[1:]:
            out[k] = None
    return [line for line in out.values() if line is not None]


def _beside(calls: dict, notes: list[str]) -> None:
    """A call of no named group at the place where exactly one named group's call failed in
    another collective: were it that group's, the ranks issued different collectives at one
    place. Said as a note: the lines do not say the group (pytorch/pytorch#20630: ranks 1 and 2
    in ALLREDUCE #4084, rank 3 of group 0 in BROADCAST #4084)."""
    for (group, seq), c in calls.items():
        if group != "?" or not c.timeouts:
            continue
        named = [d for (g, s), d in calls.items() if g != "?" and s == seq and d.timeouts]
        mine = {t.op for t in c.timeouts}
        if len(named) == 1 and not mine & {t.op for t in named[0].timeouts}:
            other = named[0]
            notes.append(f"{who(_ranks(c))} (no line naming their group) failed in "
                         f"{'/'.join(sorted(mine))} #{seq} where {who(_ranks(other))} of group "
                         f"{other.group} failed in "
                         f"{'/'.join(sorted({t.op for t in other.timeouts}))} #{seq}: were theirs "
                         f"group {other.group}'s call too, the ranks issued different collectives "
                         "at one place (a desync)")


def _where(log: JobLog, blame: set[int], notes: list[str]) -> None:
    """Where the ranks the findings point to run, by NCCL's Init COMPLETE lines: the hosts to
    look at (or drain), each with its ranks and their GPUs; else, where the log holds such lines,
    where the ranks that NCCL placed run."""
    hosts = log.hosts()
    if not hosts:
        return
    if not blame:
        by: dict[str, list[int]] = {}
        for rank, (host, _) in sorted(hosts.items()):
            by.setdefault(host, []).append(rank)
        notes.append("NCCL placed " + "; ".join(f"rank{'s' if len(rs) > 1 else ''} "
                                               f"{ranks_text(rs)} on {h}"
                                               for h, rs in list(by.items())[:8])
                     + (f"; and {len(by) - 8} more host(s)" if len(by) > 8 else "")
                     + f" (of its {max(p[0] for p in log.places.values())}-rank communicator)")
        return
    placed = {r: hosts[r] for r in sorted(blame) if r in hosts}
    if not placed:
        return
    by = {}
    for rank, (host, gpu) in placed.items():
        by.setdefault(host, []).append(f"{rank} (GPU {gpu})")
    unknown = sorted(blame - set(placed))
    notes.append("where the ranks these findings name run (NCCL's Init COMPLETE lines): "
                 + "; ".join(f"{h}: rank(s) {', '.join(rs)}" for h, rs in list(by.items())[:8])
                 + (f"; and {len(by) - 8} more host(s)" if len(by) > 8 else "")
                 + (f"; {who(unknown)} not placed by any line here" if unknown else ""))


def _result(code: int) -> str:
    return f"{NCCL_RESULTS[code]} ({code})" if 0 <= code < len(NCCL_RESULTS) else f"code {code}"


def _named(row: dict) -> str:
    if row["group"] == "?":
        return "a group the lines do not name"
    return f"group {row['group']}" + (f" ({row['desc']})" if row["desc"] else "")


def _groups(log: JobLog, calls: dict, rows: list[dict], said: list[str], notes: list[str],
            blame: set[int]) -> None:
    """Per named group, from its ranks' progress lines (each rank's latest): ranks whose last
    enqueued call is before the latest one others failed in never issued it (a finding);
    else ranks failed at different calls issued different numbers of the group's
    collectives (a finding); else, where every rank that reported issued the call and none
    completed it, a note. An unnamed group's calls at different places may be different
    groups': a note."""
    stuck: dict[tuple, list[tuple[int, str, str]]] = {}  # (place, enqueued) -> notes alike
    progress: dict[str, list[Progress]] = {}  # each group's progress lines, bucketed once
    for p in log.progress:
        progress.setdefault(p.group, []).append(p)
    seqs: dict[str, list[int]] = {}
    for group, seq in calls:
        seqs.setdefault(group, []).append(seq)
    for group, every in seqs.items():
        at = [s for s in every if _collective(calls[(group, s)])]
        if len(at) < len(every) and group != "?":
            notes.append(f"group {group}: point-to-point calls ("
                         + ", ".join(f"#{s}" for s in sorted(set(every) - set(at)))
                         + ") are numbered apart from its collectives (torch counts each kind "
                           "on its own): their places are not set against the collectives'")
        if not at:
            continue
        top = max(at)
        parts = "; ".join(f"#{s}: {who(_ranks(calls[(group, s)]))}" for s in sorted(at))
        if group == "?":
            if len(at) > 1:
                notes.append("these lines name no process group (older torch printed none), "
                             f"and calls at different places timed out ({parts}): they may be "
                             "different groups' calls, so they are not set against each other")
            continue
        latest: dict[tuple, Progress] = {}
        for p in progress.get(group, ()):
            k = (p.rank, p.group_rank)
            if p.at in at and (k not in latest or p.at > latest[k].at):
                latest[k] = p
        row = next(r for r in rows if r["group"] == group and r["seq"] == top)
        named = _named(row)
        behind = sorted((p for p in latest.values() if p.enqueued < top),
                        key=lambda p: (p.rank is None, p.rank or 0, p.group_rank))
        blame |= {p.rank for p in behind if p.rank is not None}
        if behind:
            said.append(f"{named}: " + ", ".join(
                f"{_who(p.rank, p.group_rank)} last issued #{p.enqueued}" for p in behind)
                + f"; {who(_ranks(calls[(group, top)]))} failed in #{top}: never issued it")
        elif len(at) > 1:
            said.append(f"{named}: its ranks failed at different calls ({parts}): they "
                        "issued different numbers of its collectives")
        elif latest and all(p.completed < top for p in latest.values()):
            c = calls[(group, top)]
            reported = {t.group_rank for t in c.timeouts} | {p.group_rank for p in latest.values()}
            size = row["group_size"]
            silent = sorted(set(range(size)) - reported) if size else []
            if group == "0":  # the default group's ranks are the job's
                blame |= set(silent)
            if not silent:  # told with the groups alike, where there are many (below)
                stuck.setdefault((top, _span(row["enqueued"])), []).append((len(notes), named,
                                                                              group))
            notes.append(f"{named}: every rank that reported issued #{top} (last enqueued "
                         f"{_span(row['enqueued'])}) and none completed it: the call is stuck "
                         "in NCCL or the network, or on a member that did not report"
                         + (f"; of its {size} members, group rank(s) {ranks_text(silent)} said "
                            "nothing here" if silent else ""))
    drop: set[int] = set()
    for (top, span), alike in stuck.items():
        if len(alike) >= MERGED:
            notes[alike[0][0]] = (
                f"{len(alike)} groups ({_groups_text([g for _, _, g in alike])}): in each, every "
                f"rank that reported issued #{top} (last enqueued {span}) and none completed it: "
                "the call is stuck in NCCL or the network, or on a member that did not report")
            drop |= {k for k, _, _ in alike[1:]}
    notes[:] = [n for k, n in enumerate(notes) if k not in drop]


def _signals(log: JobLog, rows: list[dict], said: list[str], notes: list[str],
             blame: set[int]) -> None:
    """What the ranks told of a timeout say: the ranks that detected one (a finding where no
    timeout line of theirs is in the log), and each told rank's state on the group: with no
    call of it in flight it never issued the call the detecting rank waits in, if that call is
    this group's (a finding where the log shows that call, a note where it does not); the
    detecting rank itself with none in flight timed out in another group's call."""
    if not log.signals:
        return
    timed = {r for row in rows if row["job_ranks"] for r in row["timed_out"]}
    told: dict[int | None, list[Signal]] = {}
    for sig in log.signals:
        told.setdefault(sig.rank if sig.source is None else sig.source, []).append(sig)
    for source, sigs in told.items():
        others = sorted({s.rank for s in sigs if s.source is not None and s.rank is not None})
        if source not in timed:
            said.append(f"a collective timed out on {f'rank {source}' if source is not None else 'a rank'}"
                        " (torch's dump signal" + (f", told to {who(others)}" if others else "")
                        + "; its timeout line is not in the log)")
    idle = {(sig.rank, sig.group) for sig in log.signals  # detected with nothing in flight
            if sig.source is None and sig.enqueued == sig.completed}
    for sig in log.signals:
        named = f"group {sig.group}" + (f" ({sig.desc})" if sig.desc else "")
        me = _who(sig.rank, sig.group_rank)
        if sig.enqueued != sig.completed:
            notes.append(f"{named}: {me} had #{sig.completed + 1}"
                         + (f"-#{sig.enqueued}" if sig.enqueued > sig.completed + 1 else "")
                         + " in flight when " + ("it detected the timeout" if sig.source is None
                                                 else f"rank {sig.source} signalled its timeout"))
            continue
        if sig.source is None:
            notes.append(f"{named}: {me} detected a timeout itself and had no call of this group "
                         f"in flight (last #{sig.enqueued} completed): the call that timed out is "
                         "another group's")
            continue
        if (sig.source, sig.group) in idle:
            notes.append(f"{named}: {me} had no call of this group in flight either (last "
                         f"#{sig.enqueued} completed)")
            continue
        failed = [r for r in rows if r["group"] == sig.group and sig.source in r["timed_out"]
                  and r["job_ranks"]]
        if failed and max(r["seq"] for r in failed) > sig.enqueued:
            seq = max(r["seq"] for r in failed)
            said.append(f"{named}: {me} last issued #{sig.enqueued} and completed it; rank "
                        f"{sig.source} failed in #{seq}: {me} never issued it")
            if sig.rank is not None:
                blame.add(sig.rank)
        else:
            notes.append(f"{named}: {me} had no call of this group in flight (last "
                         f"#{sig.enqueued} completed) when rank {sig.source} signalled its "
                         f"timeout: if rank {sig.source}'s call is this group's, {me} never "
                         "issued it")


def _collective(c: _Call) -> bool:
    """Whether the call is a collective every member issues alike (by its records: not a send,
    a receive or a coalesced batch, whose places torch numbers apart); a call known only by its
    progress line is taken as one."""
    return all(t.op in WORK and WORK[t.op].agreed for t in c.timeouts)


def _ranks(c: _Call, op: str | None = None, size: tuple | None = None) -> list[int]:
    job = c.job_ranks()
    out = {t.rank if job else t.group_rank for t in c.timeouts
           if (op is None or t.op == op) and (size is None or (t.numel_in, t.numel_out) == size)}
    if op is None and size is None:
        out |= {p.rank if job else p.group_rank for p in c.progress}
    return sorted(out)


def _group_size(t: Timeout) -> int | None:
    """The group's size where the call's sizes tell it: an all-gather's output is its input
    times the members, a reduce-scatter's input its output times them."""
    if not t.numel_in or not t.numel_out:
        return None
    o = WORK.get(t.op)
    if o is None or o.rooted:
        return None
    if o.input == "block" and t.numel_out % t.numel_in == 0:  # each rank's block gathered
        return t.numel_out // t.numel_in
    if o.input == "blocks" and o.reduces and t.numel_in % t.numel_out == 0:  # one block kept
        return t.numel_in // t.numel_out
    return None


def _stuck(log: JobLog) -> dict[tuple[str, int], list[str]]:
    out: dict[tuple[str, int], list[str]] = {}
    for rank, group_rank, group, seconds in dict.fromkeys(log.stuck):
        out.setdefault((group, seconds), []).append(_who(rank, group_rank))
    return out


def _span(pair: list[int] | None) -> str:
    if not pair:
        return "-"
    return str(pair[0]) if pair[0] == pair[1] else f"{pair[0]}-{pair[1]}"
