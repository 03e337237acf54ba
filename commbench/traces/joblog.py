"""A failed job's own log read for what its communication did (pure: no torch): torch's NCCL
watchdog lines (which collective of which process group timed out on which ranks, and how far
each rank had issued and completed its group's calls), the dump signal a rank is told of a
timeout by, the heartbeat monitor's "watchdog got stuck", ``TORCH_DISTRIBUTED_DEBUG=DETAIL``'s
fingerprint mismatch, NCCL's warnings, errors and error path, and torchrun's "root cause".
What the lines say of the job, its findings, is :mod:`commbench.traces.joblog_findings`.

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
from dataclasses import dataclass, field, replace

from commbench.results.files import kind_of
from commbench.results.nccl_info import NcclReader, NcclSaid, clean_line
from commbench.traces.calls import TraceError
from commbench.traces.stream import BOMB_CHARS, RATIO, open_text

__all__ = ["GlooWait", "JobLog", "Progress", "Signal", "Timeout", "files_of", "is_job_log",
           "read"]

_RANK = re.compile(r"\[rank(\d+)\]:")
_WORK = (r"WorkNCCL\(SeqNum=(\d+), OpType=(\w+)(?:, NumelIn=(-?\d+), NumelOut=(-?\d+))?, "
         r"Timeout\(ms\)=(\d+)\)")
_TIMEOUT = re.compile(r"\[Rank (\d+)\] Watchdog caught collective operation timeout: " + _WORK +
                      r" ran for (\d+) milliseconds")
_BLOCKING = re.compile(r"\[Rank (\d+)\] Work " + _WORK + r" timed out in blocking wait")
# a log's prefix alone on its line, the message on the next (a paste wrapped after it)
_PREFIX_ONLY = re.compile(r"\[rank\d+\]:\[[EWIF]\d{4} [\d:.]+ \S+:\d+\]$")
HELD_LINES = 4  # a message of torch's wrapped over at most this many lines is read whole
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
# torch.distributed.monitored_barrier (gloo): the ranks that did not reach it, as the rank that
# waited for them names them
_BARRIER = re.compile(r"\[Rank (\d+)\]: Ranks? ([\d, ]+) failed to pass monitoredBarrier in (\d+) ms")
_STUCK = re.compile(_PG + r" ProcessGroupNCCL's watchdog got stuck for (\d+) seconds")
# gloo's own timeout (its TCP or libuv transport), raised in the rank that waited: the source
# file of the throw in brackets where printed; and the error of a rank whose peer went away
_GLOO_WAIT = re.compile(r"(?:gloo/transport/(\w+)/[\w.]+:\d+\]\s*)?Timed out waiting (\d+)ms "
                        r"for (recv|send) operation to complete")
_GLOO_CLOSED = re.compile(r"Connection closed by peer \[([^\]\s]{1,255})\]:(\d+)")
# a traceback's frame in torch.distributed's collectives: the call a rank was waiting in
_C10D_FRAME = re.compile(r'distributed_c10d\.py", line \d+, in (\w+)')
# (a host or a file name is 255 characters at most: a long line holding "NCCL WARN" is scanned
# in linear time)
_WARN = re.compile(r"(?:(\S{1,255}?):\d+:\d+ )?\[\d+\] (?:\S{1,255}:\d+ )?NCCL WARN (.*\S)")
_ERROR = re.compile(r"NCCL error in: \S+?:\d+, (.*?)(?:, NCCL version \S+)?$")
_NCCL_CODE = re.compile(r"\b(ncclRemoteError|ncclSystemError|ncclInternalError|"
                        r"ncclUnhandledCudaError|ncclInvalidUsage|ncclInvalidArgument)\b:?\s*(.*)")
# NCCL's error path under NCCL_DEBUG=INFO: each function an error passes through prints its
# file, line and the code (src/include/checks.h: "-> %d"), the first printed nearest the cause
_CHAIN = re.compile(r"(?:(\S{1,255}?):\d+:\d+ )?\[\d+\] NCCL INFO (\S{1,255}?:\d+) -> (\d+)")
# NCCL's line for each rank of a communicator once it is set up (or aborted): its host, its GPU
# and its rank in the communicator (the world's where the communicator is the world's)
_PLACE = re.compile(r"(\S{1,255}?):\d+:\d+ \[\d+\] NCCL INFO comm 0x[0-9a-f]+ rank (\d+) nranks (\d+) "
                    r"cudaDev (\d+).*?(?:commId (0x[0-9a-f]+))?.*(?:Init|Abort) COMPLETE")
_ROOT = re.compile(r"^\s*(rank|host|exitcode|traceback)\s*:\s*(.*?)\s*$")
# what one warning varies by from rank to rank: pointers, addresses and ports, IB GIDs
_VARIES = re.compile(r"0x[0-9a-fA-F]+|\b\d{1,3}(?:\.\d{1,3}){3}\b(?:<\d+>)?|<\d+>|"
                     r"(?<![0-9a-fA-F:])[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{0,4}){2,7}\b")
SNIFF = 1 << 16
LINE_CHARS = 1 << 20  # characters of one line read at a time


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


@dataclass(frozen=True)
class GlooWait:
    """A rank's gloo error: a receive or send it waited for past the group's timeout, or its
    peer's connection closed under it (``closed``), in the collective its traceback names."""

    rank: int | None      # the job's rank, where the line's prefix says it
    kind: str             # recv, send or closed
    timeout_ms: int | None
    peer: str             # closed: the peer's address and port, as gloo prints them
    call: str             # torch.distributed's function the traceback names ('' if none)
    where: str            # file:line


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
    dumped: set = field(default_factory=set)  # ranks that set out to dump their flight recorder
    # monitored_barrier: (the waiting rank, the barrier's timeout in ms) -> ranks that never came
    barriers: dict[tuple[int, int], set[int]] = field(default_factory=dict)
    # NCCL's Init COMPLETE lines: communicator -> (its size, rank -> (host, GPU))
    places: dict[str, tuple[int, dict[int, tuple[str, int]]]] = field(default_factory=dict)

    def hosts(self) -> dict[int, tuple[str, int]]:
        """Rank -> (host, GPU) in the largest communicator NCCL set up (the world's, where the
        log holds its lines); empty where no Init COMPLETE line is in the log."""
        if not self.places:
            return {}
        return max(self.places.values(), key=lambda p: (p[0], len(p[1])))[1]
    warns: dict[str, set[str]] = field(default_factory=dict)  # message -> hosts
    errors: Counter = field(default_factory=Counter)
    root: dict[str, str] = field(default_factory=dict)  # torchrun's first observed failure
    # NCCL's error path: (host, code) -> [lines, the first location printed]
    chains: dict[tuple[str, int], list] = field(default_factory=dict)
    nccl: NcclSaid | None = None
    gloo: list[GlooWait] = field(default_factory=list)


def _head(path: str) -> str:
    try:
        with open_text(path, errors="replace") as f:
            return f.read(SNIFF)
    except (OSError, EOFError, gzip.BadGzipFile):
        return ""


def is_job_log(path: str) -> bool:
    """Whether ``path`` may be a job's text log: text that is not JSON (a trace, a dump, a
    results file) and not a pickle."""
    raw = _head(path)
    head = raw.lstrip()
    if not head:  # white space only as far as looked (a progress bar's carriage returns)
        return bool(raw) and "\x00" not in raw
    if head[0] in "{\x80" or "\x00" in head:
        return False
    return not re.match(r'\[\s*[{\["\]]', head)  # a JSON array; a log's "[rank0]:" is not


def files_of(names: list[str], skipped: list[str] | None = None) -> list[str] | None:
    """The logs ``names`` stand for, or None where any of them is no text log. A folder is its
    files and its subfolders' (srun's ``--output=%t``: one log a rank; torchrun's ``--log-dir``:
    ``<run>/attempt_<n>/<local rank>/stderr.log``), empty files and torchrun's ``error.json``
    passed over; of several ``attempt_<n>`` folders the last alone is read (a restarted job's
    calls start again from 1 in each attempt), the others added to ``skipped``."""
    paths: list[str] = []
    for name in names:
        if os.path.isdir(name):
            found = _walk(name, skipped if skipped is not None else [])
            if found is None:
                return None
            paths += found
        elif kind_of(name) == "a regular file" and is_job_log(name):
            paths.append(name)
        else:
            return None
    return paths or None


_ATTEMPT = re.compile(r"attempt_(\d+)")
WALK_FILES = 100_000  # files a folder of logs may hold


def _walk(folder: str, skipped: list[str]) -> list[str] | None:
    files: list[str] = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        attempts = sorted((d for d in dirs if _ATTEMPT.fullmatch(d)),
                          key=lambda d: int(d.split("_")[1]))
        if len(attempts) > 1:
            skipped += [os.path.join(root, d) for d in attempts[:-1]]
            dirs[:] = [d for d in dirs if d not in attempts[:-1]]
        files += sorted(os.path.join(root, n) for n in names if not n.startswith("."))
        if len(files) > WALK_FILES:
            return None
    logs = []
    for p in files:
        if is_job_log(p):
            logs.append(p)
        elif os.path.isfile(p) and os.path.getsize(p) and os.path.basename(p) != "error.json":
            return None  # a trace, a dump or another file: not a folder of logs
    return logs or None


def read(paths: list[str], limit: int) -> JobLog:
    """The lines of ``paths`` that say what the job's communication did (each file read up to
    ``limit`` characters); TraceError where none of them holds one."""
    log, nccl, chars = JobLog(list(paths)), NcclReader(), 0
    for path in paths:
        root_block, chars = False, 0
        frames: dict[int | None, str] = {}  # job rank -> the c10d call its traceback named last
        held: list[tuple[str, str]] = []  # (line, where) of a wrapped message, read so far
        base = os.path.basename(path)
        disk = max(os.path.getsize(path), 1)
        try:
            with open_text(path, errors="replace") as f:
                gzipped = isinstance(getattr(f, "buffer", None), gzip.GzipFile)
                # a line is read a piece of at most LINE_CHARS at a time: a file of one endless
                # line (a progress bar's carriage returns, a binary) never sits in memory whole
                for n, raw in enumerate(iter(lambda f=f: f.readline(LINE_CHARS), ""), 1):
                    chars += len(raw)
                    if chars > limit:
                        raise TraceError(f"{path}: more than {limit / 2**30:g} GiB of text: give "
                                         "--max-size GB to read a larger log")
                    if gzipped and chars > BOMB_CHARS and chars > RATIO * disk:
                        raise TraceError(f"{path}: decompresses to more than {RATIO} times its "
                                         f"{disk} bytes: not a job's log (a gzip bomb?)")
                    if raw.endswith("\n") or len(raw) < LINE_CHARS:  # a line's last piece
                        log.lines += 1
                    line = clean_line(raw)
                    if "NCCL INFO" in line or "RCCL INFO" in line:
                        nccl.feed(line)
                        if " COMPLETE" in line and (m := _PLACE.search(line)):
                            _, where = log.places.setdefault(
                                m.group(5) or f"nranks {m.group(3)}", (int(m.group(3)), {}))
                            where.setdefault(int(m.group(2)), (m.group(1), int(m.group(4))))
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
                    where = f"{base}:{n}"
                    if held and len(held) < HELD_LINES and _continues(held[-1][0], line):
                        held.append((line, where))
                        joined = " ".join(x for x, _ in held)
                        if not _wrapped(joined):
                            _line(log, joined, held[0][1], frames)
                            held = []
                        continue
                    for x, w in held:  # not a message wrapped after all: each line alone
                        _line(log, x, w, frames)
                    held = []
                    if ("Watchdog" in line or "detected" in line or line.endswith("]")) and \
                            _wrapped(line):  # the cheap tests first: most lines are none
                        held = [(line, where)]
                    else:
                        _line(log, line, where, frames)
                for x, w in held:
                    _line(log, x, w, frames)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise TraceError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
    log.nccl = nccl.result()
    # each gloo error once, where first printed: a wrapper's exception repeats the message
    first: dict[GlooWait, GlooWait] = {}
    for g in log.gloo:
        first.setdefault(replace(g, where=""), g)
    log.gloo = list(first.values())
    if not (log.timeouts or log.progress or log.stuck or log.warns or log.errors or log.root
            or log.nccl or log.chains or log.signals or log.mismatches or log.dumped
            or log.barriers or log.gloo):
        raise TraceError(f"{', '.join(paths)}: no line of torch's NCCL watchdog, of NCCL "
                         "(INFO, WARN, an error), of gloo's timeouts or of torchrun's failure "
                         "report: not a job's log analyze reads")
    return log


def _wrapped(line: str) -> bool:
    """Whether ``line`` begins a message of torch's watchdog whose end is on the lines after it
    (a logger or a paste wrapped it): the timeout line before its ``ran for ... milliseconds``,
    the progress line before its last completed work, or the log's prefix alone."""
    if "Watchdog caught collective operation timeout" in line:
        return "milliseconds" not in line
    if "Exception (either an error or timeout) detected" in line:
        return "last completed NCCL work" not in line
    return line.endswith("]") and "[rank" in line and _PREFIX_ONLY.search(line) is not None


def _continues(last: str, line: str) -> bool:
    """Whether ``line`` may go on the wrapped message whose last line read is ``last``: not a
    rank's own line (its prefix), nor, after the message has begun, another message's start."""
    if _RANK.search(line):
        return False
    if _PREFIX_ONLY.search(last):
        return True
    return "[Rank " not in line and "[PG " not in line and "Watchdog caught" not in line


def _line(log: JobLog, line: str, where: str, frames: dict[int | None, str]) -> None:
    """``line`` (at ``where``, file:line) taken into ``log``; ``frames``: the file's job ranks'
    last torch.distributed calls a traceback named, for gloo's errors."""
    if "distributed_c10d" in line and (m := _C10D_FRAME.search(line)):
        r = _RANK.search(line[:m.start()])
        frames[int(r.group(1)) if r else None] = m.group(1)
        return
    if "Timed out waiting" in line or "Connection closed by peer" in line:
        m = _GLOO_WAIT.search(line) or _GLOO_CLOSED.search(line)
        if m:
            r = _RANK.search(line[:m.start()])
            rank = int(r.group(1)) if r else None
            call = frames.get(rank, "")
            log.gloo.append(GlooWait(rank, m.group(3), int(m.group(2)), "", call, where)
                            if m.re is _GLOO_WAIT else
                            GlooWait(rank, "closed", None, f"{m.group(1)}:{m.group(2)}", call,
                                     where))
            return
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
    if "monitoredBarrier" in line and (m := _BARRIER.search(line)):
        log.barriers.setdefault((int(m.group(1)), int(m.group(3))), set()).update(
            int(x) for x in m.group(2).replace(",", " ").split())
        return
    if "preparing to dump debug info" in line:  # its flight recorder buffers, to files
        r = _RANK.search(line)
        log.dumped.add(int(r.group(1)) if r else None)
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
