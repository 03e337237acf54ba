"""Input files read with a bound: from regular files only, at most a stated size, JSON no deeper
than Python can parse, each refusal one line naming the file and the rule.

A topology given as ``/dev/zero`` grew to 15.8 GB before the kernel killed it (or another user's
process); a FIFO waited for ever. Here the file is opened without blocking, checked to be a
regular file and no larger than ``limit`` on the open descriptor, then read to at most
``limit`` bytes.
"""

from __future__ import annotations

import json
import os
import stat

__all__ = ["RESULTS_LIMIT", "TOPOLOGY_LIMIT", "FileRefused", "kind", "kind_of", "read_bytes",
           "read_json", "read_text"]

TOPOLOGY_LIMIT = 16 << 20  # bytes: an NCCL topology dump of a large node is a few hundred KB
RESULTS_LIMIT = 64 << 20  # bytes: a sweep of 8 B .. 8 GiB over every algorithm is a few MB


class FileRefused(ValueError):
    """An input file that is not read: not a regular file, too large, or not valid."""


def kind(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, in the words a refusal uses."""
    return ("a regular file" if stat.S_ISREG(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a folder"
            if stat.S_ISDIR(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "not a regular file")


def kind_of(path: str) -> str:
    """:func:`kind` of the file at ``path`` (links followed), '' where there is none."""
    try:
        return kind(os.stat(path).st_mode)
    except OSError:
        return ""


def read_text(path: str, what: str, limit: int) -> str:
    """The text of ``path``, a ``what`` (e.g. "topology"), refused unless it is a regular file
    of at most ``limit`` bytes."""
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileRefused(f"{path}: not UTF-8 text (byte {exc.start}); not a {what} file") from None


def read_bytes(path: str, what: str, limit: int) -> bytes:
    """The bytes of ``path``, a ``what``, refused unless it is a regular file of at most
    ``limit`` bytes (a FIFO is not waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise FileRefused(f"{path}: no such file (a {what} file was asked for)") from None
    except OSError as exc:
        raise FileRefused(f"{path}: cannot open this {what} file ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"{path}: is {kind(st.st_mode)}; a {what} file must be a regular "
                              "file")
        if st.st_size > limit:
            raise FileRefused(f"{path}: {st.st_size} B, more than the {limit} B a {what} "
                              "file may have")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise FileRefused(f"{path}: grew past the {limit} B a {what} file may have while being read")
    return data


def read_json(path: str, what: str, limit: int):
    """:func:`read_text`, parsed as JSON; invalid or too deeply nested JSON refused."""
    text = read_text(path, what, limit)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FileRefused(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}; "
                          f"truncated or corrupt {what} file?)") from None
    except RecursionError:
        raise FileRefused(f"{path}: JSON nested too deeply to be a {what} file") from None
