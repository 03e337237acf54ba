"""Big JSON files read in one pass: the top-level object key by key and one array of it item by
item, in chunks, so that a file of several hundred MB never sits in memory whole (pure). Plain or
gzipped; a progress line on stderr for a big file.

Bounded: a file is read up to ``limit`` characters (:data:`LIMIT` unless raised: ``--max-size``),
a gzipped one that decompresses to more than :data:`RATIO` times its size is no trace (real
traces compress 5 to 50 times; a gzip bomb thousands of times) and is refused once
:data:`BOMB_CHARS` are read, and a value nested deeper than Python's parser takes is refused:
each in one line."""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
from collections.abc import Callable, Iterator

from commbench.traces.calls import TraceError

__all__ = ["BOMB_CHARS", "CHUNK", "HEAD", "LIMIT", "PROGRESS_BYTES", "RATIO", "REST", "Wanted",
           "events", "open_text", "progress_line", "whole"]

CHUNK = 1 << 20
PROGRESS_BYTES = 64 << 20  # a progress line on stderr every this many characters read
LIMIT = 16 << 30  # characters read from one file at most, unless raised
RATIO = 1000  # a gzipped file decompressing to more than this many times its size is no trace
BOMB_CHARS = 64 << 20  # ... judged once this many characters are read
_BLANK = re.compile(r"[ \t\r\n]*")
_SEPARATORS = re.compile(r"[ \t\r\n,]*")
Wanted = Callable[[list[str]], list]  # items' texts -> whether each may be needed, or HEAD
HEAD = 2  # wanted: the item's keys before its "args" suffice (the rest: :func:`whole`)
REST = "\x00"  # the key under which a HEAD item keeps its text
_REST = '"\\u0000": 0}'  # closes a HEAD item's keys with that key
_ARGS = '"args": {'  # where a HEAD item's keys end
_SCAN = json.JSONDecoder().scan_once  # one text, known to be one item: decoded whole


def open_text(path: str, errors: str = "strict"):
    """``path`` as text, gunzipped where it is gzipped (``errors``: how undecodable bytes are
    met; a job's log, which may hold anything, replaces them)."""
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rt", encoding="utf-8", errors=errors) if magic == b"\x1f\x8b" else \
        open(path, encoding="utf-8", errors=errors)


class _Stream:
    """A text file read in chunks, with a position: JSON values decoded one at a time."""

    def __init__(self, f, path: str, progress: Callable[[int], None] | None,
                 limit: int = LIMIT) -> None:
        self.f, self.path, self.progress, self.limit = f, path, progress, limit
        self.buf, self.pos, self.eof, self.read_chars = "", 0, False, 0
        self.dec = json.JSONDecoder()
        self.disk = os.path.getsize(path)
        self.gzipped = isinstance(getattr(f, "buffer", None), gzip.GzipFile)

    def _more(self) -> bool:
        if self.eof:
            return False
        chunk = self.f.read(CHUNK)
        if not chunk:
            self.eof = True
            return False
        self.read_chars += len(chunk)
        if self.read_chars > self.limit:
            raise TraceError(f"{self.path}: more than {self.limit / 2**30:g} GiB of text: give "
                             "--max-size GB to read a larger trace")
        if self.gzipped and self.read_chars > BOMB_CHARS and \
                self.read_chars > RATIO * max(self.disk, 1):
            raise TraceError(f"{self.path}: decompresses to more than {RATIO} times its "
                             f"{self.disk} bytes: not a profiler trace (a gzip bomb?)")
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        if self.progress is not None:
            self.progress(self.read_chars)
        return True

    def peek(self) -> str:
        """The next character that is not white space ('' at the end)."""
        while True:
            self.pos = _BLANK.match(self.buf, self.pos).end()
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
            except RecursionError:
                raise TraceError(f"{self.path}: a JSON value nested deeper than "
                                 f"{sys.getrecursionlimit()} levels: not a trace") from None
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


def _objects(s: _Stream, key: str, wanted: Wanted | None = None) -> Iterator[dict]:
    """The objects of the array whose '[' was just read, up to its ']'. Where ``wanted`` is
    given and the array is laid out one item to a line or more (:func:`_by_line`), an item
    whose text ``wanted`` leaves out is skipped undecoded; every other item is decoded."""
    if wanted is not None:
        yield from _by_line(s, key, wanted)
    else:
        yield from _exact(s, key)


def _exact(s: _Stream, key: str) -> Iterator[dict]:
    """Every item decoded (the hot loop: one C scan per item, separators skipped by one
    match; an item cut by the chunk's end is scanned again with the next chunk)."""
    scan, skip = s.dec.scan_once, _SEPARATORS.match
    buf, pos = s.buf, s.pos
    while True:
        pos = skip(buf, pos).end()
        if pos == len(buf):
            s.buf, s.pos = buf, pos
            if not s._more():
                raise TraceError(f"{s.path}: {key} ends before its ']'")
            buf, pos = s.buf, s.pos
            continue
        if buf[pos] == "]":
            s.buf, s.pos = buf, pos + 1
            return
        try:
            v, pos_next = scan(buf, pos)
        except RecursionError:
            raise TraceError(f"{s.path}: a JSON value nested deeper than "
                             f"{sys.getrecursionlimit()} levels: not a trace") from None
        except (StopIteration, ValueError) as exc:  # cut by the chunk's end, or not JSON
            s.buf, s.pos = buf, pos
            if s._more():
                buf, pos = s.buf, s.pos
                continue
            at = s.read_chars - len(buf) + getattr(exc, "pos", pos)
            raise TraceError(f"{s.path}: not valid JSON ({getattr(exc, 'msg', 'no value')} "
                             f"near character {at})") from None
        pos = pos_next
        if type(v) is dict:
            yield v


def _by_line(s: _Stream, key: str, wanted: Wanted) -> Iterator[dict]:
    """The items of an array written as a profiler writes one: each item opens on a line of its
    own, at the indentation of the first (Kineto's writer: two spaces; one item a line: none).
    Such an array is cut into items' texts by one ``str.split`` per chunk at the first two
    items' separator (``},``, a line break, that indentation, ``{``): a line break cannot lie
    inside a JSON string. A text ``wanted`` leaves out is skipped where :func:`_skippable`
    finds it whole items; every other text is decoded in one C call, and must be one item (a
    text marked :data:`HEAD` only up to its arguments, where :func:`_head` proves it one).
    Whatever does not fit (a compact array on one line, a text that is not one item, an item
    longer than :data:`CHUNK` twice over, the array's last item and its end) is read by
    :func:`_exact` from there on, so that the items read are the same either way."""
    space = ""  # the white space before the first item, consumed as it is read
    while True:
        lead = _BLANK.match(s.buf, s.pos)
        space += lead.group()
        s.pos = lead.end()
        if s.pos < len(s.buf) or len(space) > 4096 or not s._more():
            break
    if "\n" not in space or s.pos == len(s.buf) or s.buf[s.pos] != "{" or len(space) > 4096:
        yield from _exact(s, key)
        return
    indent = space.rsplit("\n", 1)[1]
    s.buf, s.pos = s.buf[s.pos:], 0
    first = None  # the first two items' separator, as written: every item's, where it is one
    while first is None and len(s.buf) <= 2 * CHUNK:
        first = re.search(r"\},[ \t]*\r?\n" + re.escape(indent) + r"\{", s.buf)
        if first is None and not s._more():
            break
    if first is None:
        yield from _exact(s, key)
        return
    sep = first.group()
    skippable = _skippable
    scan = s.dec.scan_once
    s.buf = s.buf[1:]  # the items' texts are split without their braces
    while True:
        parts = s.buf.split(sep)
        n = len(parts) - 1  # parts: the items, and the unfinished rest
        texts = parts[:n]
        flags = wanted(texts)
        # the texts to look at: those that may be needed, and those whose braces are not all
        # keys' values (:func:`_skippable`'s first test, made here on every other text at once)
        for i in [i for i, (t, w) in enumerate(zip(texts, flags))
                  if w or t.count("{") != t.count(": {")]:
            text = texts[i]
            if not flags[i] and skippable(text):
                continue  # one item or more, all of the array's: none needed
            if flags[i] == HEAD and (cut := _head(text)) > 0:
                item = "{" + text[:cut] + _REST  # the keys before its arguments
                try:
                    v, end = scan(item, 0)
                    if end == len(item):
                        v[REST] = text
                        yield v
                        continue
                except (StopIteration, ValueError, RecursionError):
                    pass  # not members before it: decoded whole
            item = "{" + text + "}"
            try:
                v, end = scan(item, 0)
                if end != len(item):
                    raise ValueError("more than one item")
            except (StopIteration, ValueError, RecursionError):
                s.buf, s.pos = "{" + sep.join(parts[i:]), 0
                yield from _exact(s, key)
                return
            if type(v) is dict:
                yield v
        s.buf, s.pos = parts[n], 0
        if len(s.buf) > 2 * CHUNK or not s._more():
            s.buf = "{" + s.buf
            yield from _exact(s, key)
            return


_ITEM_OBJECT = re.compile(r"[\[,][ \t\r\n]*\{")  # an object opens as an array's item


def _head(text: str) -> int:
    """Where a :data:`HEAD` item's keys end (its ``"args"``), or -1 where the text is not
    proved one item without decoding it whole. Proved so: the keys before it decode as one
    object's members (the caller's decoding checks that), and no object opens after the
    arguments' own brace, as the next item would."""
    cut = text.find(_ARGS)
    return cut if cut > 0 and text.find("{", cut + len(_ARGS)) < 0 else -1


def whole(item: dict, path: str = "") -> dict:
    """An item the stream decoded only up to its arguments (``wanted``'s :data:`HEAD`) decoded
    whole (TraceError naming ``path`` where the rest is no JSON); any other item as it is."""
    text = item.get(REST)
    if not isinstance(text, str):
        return item
    try:
        v, end = _SCAN("{" + text + "}", 0)
    except (StopIteration, ValueError, RecursionError):
        v, end = None, -1
    if type(v) is not dict or end != len(text) + 2:
        raise TraceError(f"{path}: not valid JSON (an event: {text[:80]!r})")
    return v


def _skippable(text: str) -> bool:
    """Whether the text between two separators (the items' braces split off) is the array's
    items and nothing else. A separator (``},`` and ``{`` around a line break) is a comma
    between two objects of an array. Take the first one met anywhere but between the array's
    own items: it closes an object that is an item of another array (inside an item, or past
    the array's end), so that object opens after ``[`` or ``,`` and white space; no separator
    lies between that opening and it (it is the first), so both lie in one text, and every text
    before it is whole items. A text in which no object opens as an array's item is therefore
    whole items. Most texts hold objects only as keys' values (``"args": {``): counted so,
    such a text needs no search. A string can add such an opening, never hide one: a text
    holding one in a string is decoded too, and is read alike."""
    return text.count("{") == text.count(": {") or _ITEM_OBJECT.search(text) is None


def events(path: str, top: dict, progress: Callable[[int], None] | None = None,
           key: str = "traceEvents", limit: int = LIMIT,
           wanted: Wanted | None = None) -> Iterator[dict]:
    """The items of the top-level array ``key`` one at a time (a Kineto trace's events, an
    execution trace's nodes); the other top-level keys land in ``top``; at most ``limit``
    characters read. ``wanted``: given items' texts (their JSON as written), whether each may
    be an item the caller needs (one test of a whole chunk's texts); the items it leaves out
    may be skipped undecoded (:func:`_by_line`)."""
    try:
        f = open_text(path)
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from None
    with f:
        s = _Stream(f, path, progress, limit)
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
                yield from _objects(s, key, wanted)
            elif key == "traceEvents" and name == "nodes" and "schema" in top:
                # an execution trace's nodes: refused before they are decoded (they may be GBs)
                raise TraceError(f"{path}: an execution trace (schema {top['schema']!r}), not a "
                                 "Kineto trace: commbench replay reads execution traces, "
                                 "analyze the profiler's Kineto traces")
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
