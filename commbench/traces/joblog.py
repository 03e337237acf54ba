"""A failed job's own log read for what its communication did: torch's NCCL watchdog lines
(which collective of which process group timed out on which ranks, and how far each rank had
issued and completed its group's calls), NCCL's warnings and errors, the heartbeat monitor's
"watchdog got stuck", and torchrun's "root cause" (pure: no torch).

The lines, as torch's ProcessGroupNCCL prints them (the forms met in public logs:
``docs/traces.md``)::

    [rank13]:[E218 04:54:22.864 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective
        operation timeout: WorkNCCL(SeqNum=216, OpType=ALLTOALL_BASE, NumelIn=1379328,
        NumelOut=1572864, Timeout(ms)=600000) ran for 600045 milliseconds before timing out.
    [rank13]:[E218 ...] [PG ID 11 PG GUID 119 Rank 1] Exception (either an error or timeout)
        detected by watchdog at work: 216, last enqueued NCCL work: 220, last completed NCCL
        work: 215.

``[rank13]:`` is the job's rank (newer torch prefixes its C++ log lines with it); ``[Rank 1]``
is the rank in the process group; ``SeqNum`` the call's place among the group's collectives.
Older torch names no group (``[E ProcessGroupNCCL.cpp:737] [Rank 1] ...``) and no sizes; the
group's name comes as ``[PG 1 Rank 0]``, ``[PG 0 (default_pg) Rank 3]`` or ``[PG ID 0 PG GUID
0(default_pg) Rank 1]``, where the GUID names the group alike on every rank and the ID is the
rank's own count (two groups of one ID are told apart by their GUID). The progress line has two
wordings (``Exception ... detected by watchdog at work: N``, ``Timeout at NCCL work: N``).

A call's line and its rank's progress line are one event where they name the same rank and the
same call; that is how a call learns its group where its own line names none.
"""

from __future__ import annotations

import gzip
import os
import re
from collections import Counter
from dataclasses import dataclass, field

from commbench.ops import OPS
from commbench.rankset import ranks_text, who
from commbench.results.files import kind_of
from commbench.results.nccl_info import NcclSaid, clean_line, nccl_said
from commbench.traces.calls import TraceError

__all__ = ["JobLog", "Progress", "Timeout", "files_of", "findings", "is_job_log", "read"]

_RANK = re.compile(r"\[rank(\d+)\]:")
_WORK = (r"WorkNCCL\(SeqNum=(\d+), OpType=(\w+)(?:, NumelIn=(-?\d+), NumelOut=(-?\d+))?, "
         r"Timeout\(ms\)=(\d+)\)")
_TIMEOUT = re.compile(r"\[Rank (\d+)\] Watchdog caught collective operation timeout: " + _WORK +
                      r" ran for (\d+) milliseconds")
_BLOCKING = re.compile(r"\[Rank (\d+)\] Work " + _WORK + r" timed out in blocking wait")
_PG = r"\[PG (?:ID (\d+) PG GUID )?(\S+?) ?(?:\(([^)]*)\))? Rank (\d+)\]"
_PROGRESS = re.compile(_PG + r" (?:Exception \(either an error or timeout\) detected by watchdog "
                       r"at work|Timeout at NCCL work): (\d+), last enqueued NCCL work: (-?\d+), "
                       r"last completed NCCL work: (-?\d+)")
# newer torch's wording of the progress line
_FAILURE = re.compile(_PG + r"\s+failure detected by watchdog at work sequence id: (\d+) PG status: "
                      r"last enqueued work: (-?\d+), last completed work: (-?\d+)")
# a rank told of a timeout (by the store, from the rank that detected it, or by its own
# watchdog) before it dumps: its state on the group whose monitor prints it
_SIGNAL = re.compile(_PG + r" Received a (?:dump|timeout) signal (?:due to a collective timeout )?"
                     r"from\s+(this local rank|rank (\d+)).*?Last enqueued NCCL work: (-?\d+), "
                     r"last completed NCCL work: (-?\d+)")
# TORCH_DISTRIBUTED_DEBUG=DETAIL: torch's wrapper checks every collective's fingerprint across
# the group before it runs, and raises naming two ranks' (group ranks) and what differs
_MISMATCH = re.compile(r"Detected mismatch between collectives on ranks\. Rank (\d+) is running "
                       r"(?:inconsistent )?collective: (.*?), but Rank (\d+) is running "
                       r"collective: (.*)")
_PRINT = re.compile(r"CollectiveFingerPrint\((?:SequenceNumber=(\d+),? ?)?OpType=(\w+)"
                    r"(?:, TensorShape=\[([^\]]*)\])?(?:, TensorDtypes=(\w+))?")
_STUCK = re.compile(_PG + r" ProcessGroupNCCL's watchdog got stuck for (\d+) seconds")
_WARN = re.compile(r"(?:(\S+?):\d+:\d+ )?\[\d+\] (?:\S+:\d+ )?NCCL WARN (.*\S)")
_ERROR = re.compile(r"NCCL error in: \S+?:\d+, (.*?)(?:, NCCL version \S+)?$")
_NCCL_CODE = re.compile(r"\b(ncclRemoteError|ncclSystemError|ncclInternalError|"
                        r"ncclUnhandledCudaError|ncclInvalidUsage|ncclInvalidArgument)\b:?\s*(.*)")
# NCCL's error path under NCCL_DEBUG=INFO: each function an error passes through prints its
# file, line and the code (src/include/checks.h: "-> %d"), the first printed nearest the cause
_CHAIN = re.compile(r"(?:(\S+?):\d+:\d+ )?\[\d+\] NCCL INFO (\S+?:\d+) -> (\d+)")
NCCL_RESULTS = ("ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
                "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress",
                "ncclTimeout")  # ncclResult_t, src/nccl.h.in
_ROOT = re.compile(r"^\s*(rank|host|exitcode|traceback)\s*:\s*(.*?)\s*$")
# what one warning varies by from rank to rank: pointers, addresses and ports, IB GIDs
_VARIES = re.compile(r"0x[0-9a-fA-F]+|\b\d{1,3}(?:\.\d{1,3}){3}\b(?:<\d+>)?|<\d+>|"
                     r"(?<![0-9a-fA-F:])[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{0,4}){2,7}\b")
# torch's OpType -> the collective's record: the names are the records' (ops.py)
WORK = {w: o for o in OPS.values() for w in o.names.work}
# collectives whose every member gives a tensor of one size: ranks that disagree on it at one
# call have a bug (an all-to-all, a rooted gather or scatter, a coalesced or point-to-point
# batch may differ by rank)
SAME_SIZE = {w for w, o in WORK.items() if o.agreed and not o.split
             and (o.input in ("whole", "none") or not o.rooted)}
SNIFF = 1 << 16


@dataclass(frozen=True)
class Timeout:
    """A collective the watchdog timed out on one rank."""

    rank: int | None      # the job's rank, where the line's prefix says it
    group_rank: int       # the rank in the process group
    seq: int
    op: str               # torch's OpType: ALLREDUCE, _ALLGATHER_BASE, ALLTOALL_BASE, COALESCED
    numel_in: int | None  # where the line prints sizes (newer torch)
    numel_out: int | None
    timeout_ms: int
    ran_ms: int
    where: str            # file:line


@dataclass(frozen=True)
class Progress:
    """A rank's watchdog on one group: the call it failed at, its last enqueued and completed."""

    rank: int | None
    group_rank: int
    group: str            # the group's name (its GUID where printed), alike on every rank
    desc: str
    at: int
    enqueued: int
    completed: int


@dataclass(frozen=True)
class Signal:
    """A rank told of a timeout before it dumps, and its state on the group then."""

    rank: int | None
    group_rank: int
    group: str
    desc: str
    source: int | None    # the rank that detected the timeout (None: this rank itself)
    enqueued: int
    completed: int


@dataclass
class JobLog:
    paths: list[str]
    lines: int = 0
    timeouts: list[Timeout] = field(default_factory=list)
    progress: list[Progress] = field(default_factory=list)
    stuck: list[tuple[int | None, int, str, int]] = field(default_factory=list)
    signals: list[Signal] = field(default_factory=list)
    # torch's fingerprint check: ((group rank, its call), (group rank, its call)), a call as
    # (place or None, OpType, shape or None, dtype or None)
    mismatches: list[tuple] = field(default_factory=list)
    warns: dict[str, set[str]] = field(default_factory=dict)  # message -> hosts
    errors: Counter = field(default_factory=Counter)
    root: dict[str, str] = field(default_factory=dict)  # torchrun's first observed failure
    # NCCL's error path: (host, code) -> [lines, the first location printed]
    chains: dict[tuple[str, int], list] = field(default_factory=dict)
    nccl: NcclSaid | None = None


def _open(path: str):
    with open(path, "rb") as f:
        magic = f.read(2)
    opener = gzip.open if magic == b"\x1f\x8b" else open
    return opener(path, "rt", encoding="utf-8", errors="replace")


def _head(path: str) -> str:
    try:
        with _open(path) as f:
            return f.read(SNIFF)
    except (OSError, EOFError, gzip.BadGzipFile):
        return ""


def is_job_log(path: str) -> bool:
    """Whether ``path`` may be a job's text log: text that is not JSON (a trace, a dump, a
    results file) and not a pickle."""
    head = _head(path).lstrip()
    if not head or head[0] in "{\x80" or "\x00" in head:
        return False
    return not re.match(r'\[\s*[{\["\]]', head)  # a JSON array; a log's "[rank0]:" is not


def files_of(names: list[str]) -> list[str] | None:
    """The logs ``names`` stand for (a folder: its files, one log a rank as srun's
    ``--output=%t`` writes them), or None where any of them is no text log."""
    paths: list[str] = []
    for name in names:
        if os.path.isdir(name):
            files = sorted(os.path.join(name, f) for f in os.listdir(name)
                           if os.path.isfile(os.path.join(name, f)))
            if not files or not all(is_job_log(p) for p in files):
                return None
            paths += files
        elif kind_of(name) == "a regular file" and is_job_log(name):
            paths.append(name)
        else:
            return None
    return paths or None


def read(paths: list[str], limit: int) -> JobLog:
    """The lines of ``paths`` that say what the job's communication did (each file read up to
    ``limit`` characters); TraceError where none of them holds one."""
    log, nccl_lines, chars = JobLog(list(paths)), [], 0
    for path in paths:
        root_block, chars = False, 0
        try:
            with _open(path) as f:
                for n, raw in enumerate(f, 1):
                    chars += len(raw)
                    if chars > limit:
                        raise TraceError(f"{path}: more than {limit / 2**30:g} GiB of text: give "
                                         "--max-size GB to read a larger log")
                    log.lines += 1
                    line = clean_line(raw)
                    if "NCCL INFO" in line or "RCCL INFO" in line:
                        nccl_lines.append(line)
                        if " -> " in line and (m := _CHAIN.search(line)):
                            seen = log.chains.setdefault((m.group(1) or "?", int(m.group(3))),
                                                         [0, m.group(2)])
                            seen[0] += 1
                        continue
                    if "Root Cause (first observed failure)" in line:
                        root_block = True
                        continue
                    if root_block:
                        m = _ROOT.match(line)
                        if m:
                            log.root.setdefault(m.group(1), m.group(2))
                        elif line.startswith(("===", "---")) and log.root:
                            root_block = False
                        continue
                    _line(log, line, f"{os.path.basename(path)}:{n}")
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise TraceError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
    log.nccl = nccl_said(nccl_lines)
    if not (log.timeouts or log.progress or log.stuck or log.warns or log.errors or log.root
            or log.nccl or log.chains or log.signals or log.mismatches):
        raise TraceError(f"{', '.join(paths)}: no line of torch's NCCL watchdog, of NCCL "
                         "(INFO, WARN, an error) or of torchrun's failure report: not a job's log "
                         "analyze reads")
    return log


def _line(log: JobLog, line: str, where: str) -> None:
    if "WorkNCCL(" in line:
        m = _TIMEOUT.search(line) or _BLOCKING.search(line)
        if m:
            r = _RANK.search(line[:m.start()])
            g = m.groups()
            log.timeouts.append(Timeout(int(r.group(1)) if r else None, int(g[0]), int(g[1]), g[2],
                                        int(g[3]) if g[3] is not None else None,
                                        int(g[4]) if g[4] is not None else None, int(g[5]),
                                        int(g[6]) if m.re is _TIMEOUT else int(g[5]), where))
            return
    if "Detected mismatch" in line and (m := _MISMATCH.search(line)):
        a, b = _PRINT.search(m.group(2)), _PRINT.search(m.group(4))
        if a and b:
            pair = ((int(m.group(1)), _print(a)), (int(m.group(3)), _print(b)))
            if pair not in log.mismatches:  # raised on several ranks alike
                log.mismatches.append(pair)
        return
    if "signal" in line and (m := _SIGNAL.search(line)):
        r = _RANK.search(line[:m.start()])
        g = m.groups()
        signal = Signal(int(r.group(1)) if r else None, int(g[3]), g[1], g[2] or "",
                        int(g[5]) if g[5] is not None else None, int(g[6]), int(g[7]))
        if signal not in log.signals:  # printed twice
            log.signals.append(signal)
    elif ("NCCL work:" in line and (m := _PROGRESS.search(line))) or \
            ("sequence id:" in line and (m := _FAILURE.search(line))):
        r = _RANK.search(line[:m.start()])
        g = m.groups()
        log.progress.append(Progress(int(r.group(1)) if r else None, int(g[3]), g[1], g[2] or "",
                                     int(g[4]), int(g[5]), int(g[6])))
    elif "got stuck" in line and (m := _STUCK.search(line)):
        r = _RANK.search(line[:m.start()])
        log.stuck.append((int(r.group(1)) if r else None, int(m.group(4)), m.group(2),
                          int(m.group(5))))
    elif "NCCL WARN" in line and (m := _WARN.search(line)):
        log.warns.setdefault(_VARIES.sub("..", m.group(2)), set()).add(m.group(1) or "?")
    elif m := (_ERROR.search(line) if "NCCL error in:" in line else None):
        log.errors[m.group(1)] += 1
    elif "nccl" in line and (m := _NCCL_CODE.search(line)) and "NCCL error in" not in line:
        log.errors[f"{m.group(1)}: {m.group(2)}".rstrip(": ")] += 1


def _print(m: re.Match) -> tuple:
    seq, op, shape, dtype = m.groups()
    return (int(seq) if seq is not None else None, op, shape, dtype)


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
    for p in log.progress:
        c = calls.setdefault((p.group, p.at), _Call(p.group, p.desc, p.at))
        if (p.rank, p.group_rank) not in {(q.rank, q.group_rank) for q in c.progress}:
            c.progress.append(p)
    seen, loose, inferred = set(), [], 0
    # one event printed again: the exception's own text, the blocking wait, and a line without
    # the job's rank ("what(): ...") repeating one with it
    told = {(t.group_rank, t.seq, t.op) for t in log.timeouts if t.rank is not None}
    for t in log.timeouts:
        key = (t.rank, t.group_rank, t.seq, t.op)
        if key in seen or (t.rank is None and key[1:] in told):
            continue
        seen.add(key)
        home = [c for c in calls.values() if c.seq == t.seq and
                any(p.rank == t.rank and p.group_rank == t.group_rank for p in c.progress)]
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
    """(a row per failed call of a group, the findings). Findings: each call that timed out;
    ranks of a group that never issued the call the others wait in (their last enqueued is
    before it); ranks of one group timed out at different calls, or at one call in different
    collectives or sizes (a desync); a watchdog that got stuck; NCCL's warnings and errors.
    ``notes`` gets what is no finding: every rank that reported issued the call and none
    completed it (the call is stuck in NCCL or on a rank that said nothing), the group's
    members that said nothing, what was inferred, torchrun's root cause. ``world``: the job's
    size, where known (the default group's members, group "0")."""
    notes = [] if notes is None else notes
    said: list[str] = []
    calls, inferred = _calls(log)
    if inferred:
        notes.append(f"{inferred} timeout line(s) of ranks that printed no line naming their "
                     "group were put in the one named group whose failed call has their place "
                     "and collective")
    rows = []
    for (group, seq), c in sorted(calls.items(), key=lambda kv: (kv[0][0] == "?", kv[0])):
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
    _groups(log, calls, rows, said, notes)
    _signals(log, rows, said, notes)
    for (ra, a), (rb, b) in log.mismatches:
        said.append(f"torch's collective check (TORCH_DISTRIBUTED_DEBUG=DETAIL) found a desync: "
                    f"group rank {ra} issued {_fingerprint(a)} where group rank {rb} issued "
                    f"{_fingerprint(b)}" + (" (different places: they issued different numbers "
                                            "of the group's collectives)" if _whole(a) and
                                            _whole(b) and a[0] != b[0] else ""))
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
    if log.chains:
        notes.append("NCCL's error path (its INFO lines 'file:line -> code'): " + "; ".join(
            f"{_result(code)} on {host} from {first} ({n} line(s))"
            for (host, code), (n, first) in log.chains.items()))
    if log.root:
        notes.append("torchrun's root cause (the first rank to exit): "
                     + ", ".join(f"{k} {v}" for k, v in log.root.items())
                     + "; after a timeout every rank aborts by itself (SIGABRT, exit -6), so the "
                       "first to exit is not the rank to blame")
    return rows, said


def _result(code: int) -> str:
    return f"{NCCL_RESULTS[code]} ({code})" if 0 <= code < len(NCCL_RESULTS) else f"code {code}"


def _named(row: dict) -> str:
    if row["group"] == "?":
        return "a group the lines do not name"
    return f"group {row['group']}" + (f" ({row['desc']})" if row["desc"] else "")


def _groups(log: JobLog, calls: dict, rows: list[dict], said: list[str], notes: list[str]
            ) -> None:
    """Per named group, from its ranks' progress lines (each rank's latest): ranks whose last
    enqueued call is before the latest one others failed in never issued it (a finding);
    else ranks failed at different calls issued different numbers of the group's
    collectives (a finding); else, where every rank that reported issued the call and none
    completed it, a note. An unnamed group's calls at different places may be different
    groups': a note."""
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
        for p in log.progress:
            k = (p.rank, p.group_rank)
            if p.group == group and p.at in at and (k not in latest or p.at > latest[k].at):
                latest[k] = p
        row = next(r for r in rows if r["group"] == group and r["seq"] == top)
        named = _named(row)
        behind = sorted((p for p in latest.values() if p.enqueued < top),
                        key=lambda p: (p.rank is None, p.rank or 0, p.group_rank))
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
            notes.append(f"{named}: every rank that reported issued #{top} (last enqueued "
                         f"{_span(row['enqueued'])}) and none completed it: the call is stuck "
                         "in NCCL or the network, or on a member that did not report"
                         + (f"; of its {size} members, group rank(s) {ranks_text(silent)} said "
                            "nothing here" if silent else ""))


def _signals(log: JobLog, rows: list[dict], said: list[str], notes: list[str]) -> None:
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
