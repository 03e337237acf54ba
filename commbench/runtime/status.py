"""What each rank is doing right now, readable from outside while the rank is blocked.

Before every call the comm layer tells its :class:`Tracker` which op it enters, on which group and
with which sequence number; after the call, that it left. A tracker writes to a sink:

* :class:`SlotSink`, a small memory-mapped file per rank: the local world's driver reads every
  rank's slot when a call times out or a rank dies, and names who was where.
* :class:`MemorySink`, a plain attribute, read by the watchdog thread under a launcher.

Writing costs about a microsecond, so it stays on for timed runs.
"""

from __future__ import annotations

import mmap
import os
import struct

__all__ = ["MemorySink", "SlotSink", "Tracker", "read_slot"]

_SLOT = 512
_HEAD = struct.Struct("<qB")  # sequence number, state
IDLE, IN_TASK, IN_OP = 0, 1, 2
_STATES = {IDLE: "idle", IN_TASK: "in task", IN_OP: "in op"}


class MemorySink:
    def __init__(self) -> None:
        self.state, self.seq, self.text = IDLE, 0, "idle"

    def write(self, state: int, seq: int, text: str) -> None:
        self.state, self.seq, self.text = state, seq, text


class SlotSink:
    """One rank's slot: a file of 512 bytes, mapped into memory."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, _SLOT)
            self._mm = mmap.mmap(fd, _SLOT)
        finally:
            os.close(fd)
        self.write(IDLE, 0, "idle")

    def write(self, state: int, seq: int, text: str) -> None:
        raw = text.encode()[: _SLOT - _HEAD.size - 1]
        self._mm[: _HEAD.size] = _HEAD.pack(seq, state)
        self._mm[_HEAD.size : _HEAD.size + len(raw) + 1] = raw + b"\0"


def read_slot(path: str) -> tuple[str, int, str]:
    """(state name, sequence number, description) of a slot; ``("unknown", -1, ...)`` if unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read(_SLOT)
        seq, state = _HEAD.unpack_from(data)
        text = data[_HEAD.size :].split(b"\0", 1)[0].decode(errors="replace")
        return _STATES.get(state, "unknown"), seq, text
    except (OSError, struct.error):
        return "unknown", -1, "no status"


class Tracker:
    """Numbers the calls of one rank and publishes the current one to a sink."""

    def __init__(self, sink: MemorySink | SlotSink | None = None) -> None:
        self.sink = sink or MemorySink()
        self.seq = 0
        self.task = ""
        self._current = ""  # the op entered last, for progress()
        # the last group's text: a loop's calls share a group, and writing out 512 ranks on
        # every call cost 36 us of it (each call is timed back to back in a batch)
        self._group: tuple[int, ...] = ()
        self._group_text = "[]"

    def start_task(self, name: str) -> None:
        self.task = name
        self.sink.write(IN_TASK, self.seq, f"running {name}, no call yet")

    def end_task(self) -> None:
        self.sink.write(IDLE, self.seq, f"finished {self.task}")
        self.task = ""

    def enter(self, op: str, group: tuple[int, ...]) -> int:
        self.seq += 1
        if group is not self._group and group != self._group:
            self._group, self._group_text = group, str(list(group))
        self._current = f"(call #{self.seq}) on group {self._group_text}"
        self.sink.write(IN_OP, self.seq, f"{op} {self._current}")
        return self.seq

    def progress(self, op: str, sample: int, total: int) -> None:
        """Inside a timing loop, before sample ``sample``'s barrier (untimed): a rank stuck in
        the loop is named by the sample it reached (:func:`~commbench.runtime.errors.describe_hang`)."""
        self.sink.write(IN_OP, self.seq, f"{op}, sample {sample} of {total} {self._current}")

    def leave(self, op: str) -> None:
        """Out of the call ``op``; a rank blocked after it (in the wait of an asynchronous call,
        or in code of its own) is named by it: ``after all_reduce (call #3) on group [0, 1]``."""
        self.sink.write(IN_TASK, self.seq, f"running {self.task}, after {op} {self._current}")
