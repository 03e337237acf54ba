"""torch's flight recorder dumps read as a job's last collectives, and what they say of a hang:
the rank the others wait for, and ranks that issued different collectives at the same place.

With ``TORCH_FR_BUFFER_SIZE`` (``TORCH_NCCL_TRACE_BUFFER_SIZE`` in older torch) set, every
process group of a rank records its last collectives in a ring buffer, and torch writes it to
``<prefix><rank>`` (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``; by default ``nccl_trace_rank_<rank>``
in the system's temporary folder) when its watchdog times a collective out, or when asked
(``_dump_fr_trace``, ``_dump_fr_trace_json``).
A dump (format ``version`` 2.x; facts: ``docs/traces.md``) holds ``entries``, one per call:
``process_group`` (name, description), ``pg_id``, ``collective_seq_id`` (the call's place among
its group's collectives; ``p2p_seq_id`` for sends and receives, ``is_p2p``), ``profiling_name``
(``nccl:all_reduce``, ``gloo:all_gather``), ``input_sizes`` / ``input_dtypes``,
``output_sizes``, ``state`` (``scheduled``, ``started``, ``completed``), ``retired``,
``time_created_ns`` and, with CUDA events, ``time_discovered_started_ns``,
``time_discovered_completed_ns`` and ``duration_ms``; ``pg_status``, per ``pg_id`` the last call
enqueued, started and completed; ``pg_config``, per group its ranks where the backend says them
(NCCL's; gloo's is empty). The rank is not in the dump: it is the file name's last number, as
torch names the files.

Read as pickle or JSON. A pickle is loaded by an unpickler that refuses every global (a dump
is dicts, lists, strings and numbers only), so that a file made to run code when unpickled is
refused without running it.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
from dataclasses import dataclass, field

from commbench.rankset import who
from commbench.results.files import FileRefused, kind_of, read_bytes
from commbench.traces.calls import PROFILER, TraceError

__all__ = ["DUMP_LIMIT", "Dump", "Entry", "files_of", "findings", "is_dump", "read"]

DUMP_LIMIT = 1 << 30  # bytes read of one dump at most: its rank's last N calls (TORCH_FR_BUFFER_SIZE)
_RANK = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle))?$")
_SNIFF = 1 << 16


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"it names {module}.{name}, and a flight recorder dump "
                                     "names nothing")


@dataclass(frozen=True)
class Entry:
    """One call in a rank's buffer."""

    group: str            # the process group's name (torch's: "0" the default group)
    desc: str
    pg_id: int
    seq: int              # collective_seq_id (p2p_seq_id for a send or receive)
    p2p: bool
    op: str               # commbench's op ('' where the profiling name is not a collective)
    name: str             # the profiling name, as recorded
    sizes: tuple          # input sizes, one tuple a tensor
    dtypes: tuple
    state: str
    retired: bool
    duration_ms: float | None = None

    def what(self) -> str:
        return f"{self.op or self.name} #{self.seq} {list(map(list, self.sizes))} {'/'.join(self.dtypes)}"


@dataclass
class Dump:
    path: str
    rank: int
    version: str
    entries: list[Entry] = field(default_factory=list)
    # pg_id -> (last enqueued, last started, last completed); -1 where not said
    status: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)  # name -> ranks, if said


def is_dump(path: str) -> bool:
    """Whether ``path`` looks like a flight recorder dump: a pickle (its first byte), or JSON
    whose first bytes hold ``"entries"`` and no ``"traceEvents"``."""
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF)
    except OSError:
        return False
    if head[:1] == b"\x80":
        return True
    text = head.lstrip()
    return text[:1] == b"{" and b'"entries"' in text and b'"traceEvents"' not in text


def files_of(names: list[str]) -> list[str] | None:
    """The dumps ``names`` stand for (a folder: those of its files that are dumps), or None
    where they are not dumps (Kineto traces)."""
    paths: list[str] = []
    for name in names:
        if os.path.isdir(name):
            paths += sorted(os.path.join(name, f) for f in os.listdir(name)
                            if os.path.isfile(os.path.join(name, f))
                            and is_dump(os.path.join(name, f)))
        elif kind_of(name) == "a regular file" and is_dump(name):
            paths.append(name)
        else:
            return None
    return paths or None


def _list(v) -> list:
    return list(v) if isinstance(v, list | tuple) else []


def _dict(v) -> dict:
    return v if isinstance(v, dict) else {}


def _int(v, default: int = -1) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def read(path: str) -> Dump:
    """One rank's dump (TraceError naming the file on bad input)."""
    try:
        data = read_bytes(path, "flight recorder dump", DUMP_LIMIT)
    except FileRefused as exc:
        raise TraceError(str(exc)) from None
    m = _RANK.search(os.path.basename(path))
    if m is None:
        raise TraceError(f"{path}: a flight recorder dump holds no rank and its name ends in no "
                         "number: name it as torch does (<prefix><rank>, nccl_trace_rank_3)")
    try:
        if data[:1] == b"\x80":
            doc = _NoGlobals(io.BytesIO(data)).load()
        else:
            doc = json.loads(data.decode("utf-8"))
    except (pickle.UnpicklingError, EOFError, ValueError, UnicodeDecodeError, RecursionError,
            TypeError, IndexError, KeyError) as exc:
        raise TraceError(f"{path}: not a flight recorder dump ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise TraceError(f"{path}: not a flight recorder dump (no 'entries' list)")
    out = Dump(path, int(m.group(1)), str(doc.get("version", "")))
    for k, e in enumerate(doc["entries"]):
        if not isinstance(e, dict):
            raise TraceError(f"{path}: entries[{k}] is not an object")
        pg = e.get("process_group")
        pg = pg if isinstance(pg, list | tuple) else ("", "")
        p2p = bool(e.get("is_p2p"))
        name = str(e.get("profiling_name", ""))
        out.entries.append(Entry(
            str(pg[0]) if len(pg) > 0 else "", str(pg[1]) if len(pg) > 1 else "",
            _int(e.get("pg_id")), _int(e.get("p2p_seq_id" if p2p else "collective_seq_id")),
            p2p, PROFILER.get(name, ""), name,
            tuple(tuple(_int(x) for x in s) for s in _list(e.get("input_sizes")) if
                  isinstance(s, list | tuple)),
            tuple(str(d) for d in _list(e.get("input_dtypes"))), str(e.get("state", "")),
            bool(e.get("retired")),
            float(e["duration_ms"]) if isinstance(e.get("duration_ms"), int | float) else None))
    for pg_id, st in _dict(doc.get("pg_status")).items():
        if isinstance(st, dict):
            out.status[_int(pg_id)] = tuple(_int(st.get(k)) for k in (
                "last_enqueued_collective", "last_started_collective",
                "last_completed_collective"))
    for name, cfg in _dict(doc.get("pg_config")).items():
        try:
            ranks = json.loads(cfg["ranks"]) if isinstance(cfg["ranks"], str) else cfg["ranks"]
            if name and ranks:
                out.groups[str(name)] = tuple(int(r) for r in ranks)
        except (KeyError, TypeError, ValueError):
            continue  # a group whose ranks the dump does not say: its members are the dumps'
    return out


def _last(d: Dump, mine: list[Entry], ids: set[int]) -> int:
    """The last collective ``d``'s rank enqueued on a group (its calls there ``mine``, the
    group's id on that rank ``ids``): its status where the dump has one, else its buffer's
    last."""
    said = [d.status[i][0] for i in ids if i in d.status and d.status[i][0] >= 0]
    return max(said + [e.seq for e in mine], default=0)


def _done(d: Dump, mine: list[Entry], ids: set[int]) -> int:
    """The last collective ``d``'s rank completed on a group (as :func:`_last`; its buffer's
    last call completed or retired where its status says none); 0 where nothing says."""
    said = [d.status[i][2] for i in ids if i in d.status and d.status[i][2] >= 0]
    return max(said + [e.seq for e in mine if e.state == "completed" or e.retired], default=0)


def _states(calls: dict[int, dict[int, Entry]], ranks: list[int], seq: int) -> str:
    """Where the ranks' call ``seq`` stands, where their backend says more than that it was
    scheduled (NCCL with CUDA events: started, completed): '' else."""
    by: dict[str, list[int]] = {}
    for r in ranks:
        if seq in calls[r]:
            by.setdefault(calls[r][seq].state or "?", []).append(r)
    if set(by) <= {"scheduled"}:
        return ""
    return " (" + "; ".join(f"{state} on {who(rs)}" for state, rs in by.items()) + ")"


def findings(dumps: list[Dump], notes: list[str] | None = None
             ) -> tuple[list[dict], list[str]]:
    """(a row per process group, the findings): per group its members (the dump's config,
    else the ranks whose dumps name it), the last collective each enqueued, and, where they
    differ, the ranks the others wait for; and every place where members' buffers hold
    different collectives at the same sequence number (a desync). ``notes`` gets what is no
    finding: a call every member issued and not every member completed (in flight when the
    dumps were taken)."""
    notes = [] if notes is None else notes
    by_rank = {d.rank: d for d in dumps}
    index: dict[str, dict[int, list[Entry]]] = {}  # group -> rank -> its collectives there
    for d in dumps:
        for e in d.entries:
            if not e.p2p:
                index.setdefault(e.group, {}).setdefault(d.rank, []).append(e)
    config = {g: ranks for d in dumps for g, ranks in d.groups.items()}
    rows, said = [], []
    for g in sorted(index, key=lambda g: (len(g), g)):
        mine = index[g]
        desc = next(iter(mine.values()))[0].desc
        members = config.get(g, tuple(sorted(mine)))
        # a group's id is each rank's own (the ranks number the groups they are in): a rank
        # whose buffer holds none of its calls takes the one its peers agree on, if they do
        agreed = {e.pg_id for es in mine.values() for e in es if e.pg_id >= 0}
        ids = {r: {e.pg_id for e in mine.get(r, [])} or (agreed if len(agreed) == 1 else set())
               for r in members}
        last = {r: _last(by_rank[r], mine.get(r, []), ids[r]) for r in members if r in by_rank}
        absent = [r for r in members if r not in by_rank]
        calls = {r: {e.seq: e for e in mine.get(r, [])} for r in last}
        top = max(last.values(), default=0)
        ahead = [r for r, k in last.items() if k == top]
        behind = [r for r, k in last.items() if k < top]
        done = {r: _done(by_rank[r], mine.get(r, []), ids[r]) for r in last}
        ms = sorted(e.duration_ms for c in calls.values() for e in c.values()
                    if e.duration_ms is not None)
        rows.append({"group": g, "desc": desc, "members": list(members),
                     "dumps": sorted(last), "last_min": min(last.values(), default=0),
                     "last_max": top, "done_min": min(done.values(), default=0),
                     "done_max": max(done.values(), default=0), "behind": behind,
                     "absent": absent, "median_ms": ms[len(ms) // 2] if ms else None})
        desync = _desync(g, calls)
        if desync:
            said.append(desync)
        elif not behind and top and any(k < top for k in done.values()):
            open_ = sorted(r for r, k in done.items() if k < top)
            call = next((calls[r][top] for r in last if top in calls[r]), None)
            notes.append(f"group {g}: every member issued {call.what() if call else f'#{top}'}; "
                         f"{who(open_)} had not completed it when the dumps were taken"
                         + _states(calls, sorted(last), top))
        if behind:
            first = next((calls[r][top] for r in ahead if top in calls[r]), None)
            lows = {}
            for r in behind:
                e = calls[r].get(last[r])
                lows.setdefault(e.what() if e else f"#{last[r]}", []).append(r)
            where = next(iter(lows)) if len(lows) == 1 else \
                "; ".join(f"{who(rs)}: {w}" for w, rs in lows.items())
            said.append(f"group {g} ({desc or 'no description'}): {who(ahead)} issued "
                        f"{first.what() if first else f'#{top}'} and wait in it"
                        f"{_states(calls, ahead, top)}; {who(behind)} never issued it (last "
                        f"issued: {where})")
        if absent:
            said.append(f"group {g}: no dump of {who(absent)} (members by the group's "
                        "config): what they issued is not known")
    return rows, said


def _desync(g: str, calls: dict[int, dict[int, Entry]]) -> str:
    """The first place where the members' buffers hold different collectives at one sequence
    number ('' where there is none): after it, the rest of the group's calls are out of step
    too."""
    for seq in sorted(set().union(*(c.keys() for c in calls.values())) if calls else ()):
        seen: dict[tuple, list[int]] = {}
        for r, c in calls.items():
            if seq in c:
                e = c[seq]
                seen.setdefault((e.op or e.name, e.sizes, e.dtypes), []).append(r)
        if len(seen) > 1:
            parts = "; ".join(f"{who(rs)}: {calls[rs[0]][seq].what()}" for rs in seen.values())
            return (f"group {g} call #{seq}: the ranks issued different collectives at the same "
                    f"place (a desync): {parts}")
    return ""
