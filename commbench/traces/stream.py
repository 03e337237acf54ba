"""Big JSON files read in one pass: the top-level object key by key and one array of it item by
item, in chunks, so that a file of several hundred MB never sits in memory whole (pure). Plain or
gzipped; a progress line on stderr for a big file."""

from __future__ import annotations

import gzip
import json
import os
import sys
from collections.abc import Callable, Iterator

from commbench.traces.calls import TraceError

__all__ = ["CHUNK", "PROGRESS_BYTES", "events", "progress_line"]

CHUNK = 1 << 20
PROGRESS_BYTES = 64 << 20  # a progress line on stderr every this many characters read


def _open(path: str):
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rt", encoding="utf-8") if magic == b"\x1f\x8b" else \
        open(path, encoding="utf-8")


class _Stream:
    """A text file read in chunks, with a position: JSON values decoded one at a time."""

    def __init__(self, f, path: str, progress: Callable[[int], None] | None) -> None:
        self.f, self.path, self.progress = f, path, progress
        self.buf, self.pos, self.eof, self.read_chars = "", 0, False, 0
        self.dec = json.JSONDecoder()

    def _more(self) -> bool:
        if self.eof:
            return False
        chunk = self.f.read(CHUNK)
        if not chunk:
            self.eof = True
            return False
        self.read_chars += len(chunk)
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        if self.progress is not None:
            self.progress(self.read_chars)
        return True

    def peek(self) -> str:
        """The next character that is not white space ('' at the end)."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                return ""

    def expect(self, char: str) -> None:
        if self.peek() != char:
            got = self.peek() or "the end of the file"
            raise TraceError(f"{self.path}: not a Kineto trace (a JSON object with traceEvents):"
                             f" expected {char!r}, found {got!r}")
        self.pos += 1

    def value(self):
        self.peek()
        while True:
            try:
                v, end = self.dec.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self._more():
                    continue
                raise TraceError(f"{self.path}: not valid JSON ({exc.msg} near character "
                                 f"{self.read_chars - len(self.buf) + exc.pos})") from None
            if end == len(self.buf) and not self.eof and isinstance(v, int | float):
                if self._more():  # a number cut by the chunk's end
                    continue
            self.pos = end
            return v


def events(path: str, top: dict, progress: Callable[[int], None] | None = None,
           key: str = "traceEvents") -> Iterator[dict]:
    """The items of the top-level array ``key`` one at a time (a Kineto trace's events, an
    execution trace's nodes); the other top-level keys land in ``top``."""
    try:
        f = _open(path)
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from None
    with f:
        s = _Stream(f, path, progress)
        try:
            s.expect("{")
        except UnicodeDecodeError:
            raise TraceError(f"{path}: not a Kineto trace (not text)") from None
        seen = False
        while s.peek() != "}":
            if not s.peek():
                raise TraceError(f"{path}: not a Kineto trace: the file ends inside its top-level "
                                 "object (cut short?)")
            if s.peek() == ",":
                s.pos += 1
            name = s.value()
            s.expect(":")
            if name == key:
                seen = True
                s.expect("[")
                while s.peek() != "]":
                    if s.peek() == ",":
                        s.pos += 1
                        continue
                    if not s.peek():
                        raise TraceError(f"{path}: {key} ends before its ']'")
                    e = s.value()
                    if isinstance(e, dict):
                        yield e
                s.pos += 1
            else:
                top[name] = s.value()
        if not seen:
            raise TraceError(f"{path}: not a Kineto trace (no traceEvents)" if key == "traceEvents"
                             else f"{path}: not an execution trace (no {key})")


def progress_line(path: str) -> Callable[[int], None]:
    total = max(os.path.getsize(path), 1)
    state = {"next": PROGRESS_BYTES}

    def say(chars: int) -> None:
        if chars >= state["next"]:
            state["next"] += PROGRESS_BYTES
            print(f"# analyze: {os.path.basename(path)}: {chars >> 20} MB read "
                  f"({os.path.basename(path)} is {total >> 20} MB on disk)", file=sys.stderr,
                  flush=True)
    return say
