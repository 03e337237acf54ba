"""The ledger: every collective and point-to-point call, with its bytes and its time.

An :class:`Entry` is one call on one rank: the op, the group (its global ranks, and its axis
name), the transport,
dtype, element count, the bytes this rank sent and received (see :mod:`commbench.ops` for how a
native collective is booked) and the wall time of the call on this rank (on NCCL the time to
enqueue it: the call returns before the GPU runs it). The comm layer writes
entries; :mod:`commbench.wire.watch` writes them for third-party code that calls torch.distributed.

A ledger belongs to one rank's context; nothing here is global. ``capture()`` returns the entries
recorded inside a ``with`` block, ``scope(name)`` labels them (an algorithm built from
send/recv books each of its messages under its own name).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from tabulate import tabulate

__all__ = ["Capture", "Entry", "Ledger", "summarize", "summary_table"]


class Entry(NamedTuple):
    """One call on one rank (a NamedTuple: booking sits on the hot path of every message)."""

    op: str
    group: tuple[int, ...]
    transport: str
    dtype: str
    count: int
    sent: int
    recv: int
    seconds: float
    scope: str = ""
    source: str = "commbench"  # or "torch" for calls seen by the watcher
    axis: str = ""  # the group's name: its grid axis (tp, dp, ...), "world", or "" (watcher)
    redop: str = ""  # sum, max, avg, ... for reductions (watcher)
    phase: str = ""  # forward, backward or optimizer (the watcher: modules.library_phase)
    module: str = ""  # the innermost module active, by qualified name (watcher)
    nbytes: int = 0  # the tensor's own bytes, beside the modelled sent/recv (watcher)
    start: float = 0.0  # time.perf_counter() when the call began (watcher), for a timeline
    device_seconds: float = 0.0  # the collective's own time on the GPU (watcher, NCCL timing)
    peer: int = -1  # a point-to-point call's other end, a global rank; -1: none
    splits: tuple = ()  # an all-to-all's (elements to each member, from each member) (watcher)
    line: str = ""  # where an audited script issued it, "file.py:LINE" (watcher, given the script)
    batch: int = -1  # the batch_isend_irecv call a message belongs to (watcher); -1: alone
    pg: str = ""  # the process group's own name (watcher): two groups of the same ranks apart
    api: str = ""  # the object collective it is a part of (all_gather_object, ...; watcher)
    carries: tuple = ()  # (module, elements) whose parameters or gradients its buffer holds

    def as_dict(self) -> dict:
        d = self._asdict()
        d["group"] = list(self.group)
        d["splits"] = [list(s) for s in self.splits]
        return d


@dataclass(eq=False)  # identity: nested captures with equal contents are still different
class Capture:
    """The entries recorded while a ``with ledger.capture()`` block ran."""

    entries: list[Entry] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return sum(e.sent for e in self.entries)

    @property
    def recv(self) -> int:
        return sum(e.recv for e in self.entries)

    def ops(self) -> list[str]:
        return [e.op for e in self.entries]

    def by(self, *keys: str) -> dict[tuple, dict[str, int]]:
        return summarize(self.entries, keys)


class Ledger:
    """Append-only list of :class:`Entry`, with nested captures and scopes."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._captures: list[Capture] = []
        self._scopes: list[str] = []

    def record(self, op: str, group: tuple[int, ...], transport: str, dtype: str, count: int,
               sent: int, recv: int, seconds: float, source: str = "commbench",
               axis: str = "", **more) -> Entry:
        """Book one call; ``more``: redop, phase, module, nbytes, start (what the watcher
        knows)."""
        entry = Entry(op, group, transport, dtype, count, sent, recv, seconds,
                      "/".join(self._scopes) if self._scopes else "", source, axis, **more)
        self.entries.append(entry)
        for cap in self._captures:
            cap.entries.append(entry)
        return entry

    @contextlib.contextmanager
    def capture(self) -> Iterator[Capture]:
        cap = Capture()
        self._captures.append(cap)
        try:
            yield cap
        finally:
            self._captures.remove(cap)

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        self._scopes.append(name)
        try:
            yield
        finally:
            self._scopes.pop()

    def clear(self) -> None:
        self.entries.clear()

    def table(self, keys: tuple[str, ...] = ("group", "op")) -> str:
        return summary_table(self.entries, keys)


def summarize(entries: Iterable[Entry], keys: tuple[str, ...] = ("group", "op")
              ) -> dict[tuple, dict[str, int | float]]:
    """Totals of calls, elements, bytes sent/received and seconds, grouped by ``keys``."""
    out: dict[tuple, dict[str, int | float]] = {}
    for e in entries:
        k = tuple(getattr(e, key) for key in keys)
        row = out.setdefault(k, {"calls": 0, "count": 0, "sent": 0, "recv": 0, "seconds": 0.0})
        row["calls"] += 1
        row["count"] += e.count
        row["sent"] += e.sent
        row["recv"] += e.recv
        row["seconds"] += e.seconds
    return out


def summary_table(entries: Iterable[Entry], keys: tuple[str, ...] = ("group", "op")) -> str:
    rows = []
    for k, v in sorted(summarize(entries, keys).items(), key=lambda kv: str(kv[0])):
        rows.append([*(_fmt(x) for x in k), v["calls"], v["count"], v["sent"], v["recv"],
                     f"{v['seconds'] * 1e6:.1f}"])
    return tabulate(rows, headers=[*keys, "calls", "elements", "sent(B)", "recv(B)", "time(us)"],
                    tablefmt="github")


def _fmt(x: object) -> str:
    if isinstance(x, tuple):
        return "[" + ",".join(map(str, x)) + "]"
    return str(x)
