"""Which of commbench's commands reads a file, told from its first bytes: so that a file given
to the wrong command is refused with the one that reads it (``commbench import`` of a profiler
trace: "it is a profiler trace: commbench analyze reads it")."""

from __future__ import annotations

import gzip
import os
import re
import zlib

from commbench.traces.flight import is_dump

__all__ = ["hint", "reader_of"]

HEAD = 1 << 16  # bytes looked at
# a line as nccl-tests, rccl-tests or OSU print it (markdown may have taken the '#')
# (the white space before and after the '#' is matched so that no run of it can be split two
# ways: a file of long blank runs is scanned in linear time, not quadratic)
_LOG = re.compile(rb"^[ \t]*(?:#[ \t]*)?(?:size\s+count\s+type\b|(?:nccl|rccl)-tests version\b|"
                  rb"nThread \d+ nGpus \d|OSU MPI|Collective test concluded: \w+_perf)", re.M)
# a line of a job's own log that commbench analyze reads (commbench/traces/joblog.py)
_JOB = re.compile(rb"Watchdog caught collective operation timeout| NCCL WARN |"
                  rb"detected by watchdog at work|Timeout at NCCL work|watchdog got stuck")


def _head(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD)
    except OSError:
        return b""
    if head[:2] == b"\x1f\x8b":  # gzipped: its first bytes unpacked
        try:
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, HEAD)
        except (zlib.error, gzip.BadGzipFile):
            return b""
    return head


def reader_of(path: str) -> tuple[str, str]:
    """(what the file is, the command that reads it), or ('', '') where its first bytes say
    neither."""
    if is_dump(path):
        return "a flight recorder dump", "commbench analyze"
    text = _head(path).lstrip()
    if text[:1] == b"{":
        if b'"traceEvents"' in text:
            return "a profiler (Kineto) trace", "commbench analyze"
        if b'"nodes"' in text and b'"schema"' in text:
            return "an execution trace", "commbench replay"
        if b'"commbench.results' in text:
            return "a commbench results file", "commbench compare"
        if b'"results"' in text and b'"config"' in text:
            return "nccl-tests' JSON output", "commbench import"
        return "", ""
    if _LOG.search(text):
        return "an nccl-tests, rccl-tests or OSU log", "commbench import"
    if _JOB.search(text):
        return "a job's log (torch's NCCL watchdog, NCCL's warnings)", "commbench analyze"
    return "", ""


def hint(paths: list[str], here: str, said: str = "") -> str:
    """`` (X is a Y: Z reads it)`` for the first of ``paths`` that another command reads, to end
    the refusal ``said`` with; '' where none is, or where the refusal names that command."""
    for p in paths:
        if os.path.isfile(p):
            what, reader = reader_of(p)
            if reader and reader != here and reader.split()[-1] not in said:
                return f" ({os.path.basename(p)} is {what}: {reader} reads it)"
    return ""
