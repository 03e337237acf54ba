"""What a run across ranks can end with, besides a result from every rank."""

from __future__ import annotations

import pickle
import re
import traceback
from dataclasses import dataclass
from typing import Any

__all__ = ["CallTimeout", "Outcome", "RankDied", "RemoteError", "SPMDError", "describe_hang",
           "remote_error", "WorldError"]


@dataclass(frozen=True)
class RemoteError:
    """An exception raised on one rank: its type, message and formatted traceback."""

    rank: int
    type_name: str
    message: str
    traceback: str
    blob: bytes | None = None

    def exception(self) -> BaseException | None:
        """The original exception object, where it could be pickled."""
        try:
            return pickle.loads(self.blob) if self.blob else None
        except Exception:
            return None

    def __str__(self) -> str:
        return f"rank {self.rank} raised {self.type_name}: {self.message}"


def remote_error(rank: int, exc: BaseException) -> RemoteError:
    """Capture ``exc`` with its traceback (and the object itself, where it pickles)."""

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:
        blob = None
    return RemoteError(rank, type(exc).__name__, str(exc), text, blob)


@dataclass(frozen=True)
class Outcome:
    rank: int
    ok: bool
    value: Any = None
    error: RemoteError | None = None


class WorldError(RuntimeError):
    """Base of every failure of a run across ranks."""


class SPMDError(WorldError):
    """One or more ranks raised. ``failures`` holds each rank's exception and traceback."""

    def __init__(self, task: str, failures: list[RemoteError], note: str = "") -> None:
        self.task, self.failures = task, failures
        first = failures[0]
        ranks = [f.rank for f in failures]
        head = f"{task}: {len(failures)} rank(s) {ranks} raised; first: {first}"
        body = "\n".join(f"--- rank {f.rank} ---\n{f.traceback.rstrip()}" for f in failures)
        super().__init__(f"{head}{(chr(10) + note) if note else ''}\n{body}")


class CallTimeout(WorldError):
    """A run did not finish in time; the message names the pending op and the missing ranks."""


class RankDied(WorldError):
    """A rank's process ended during a run."""


_GROUP = re.compile(r"^(?P<op>.+?)(?:, sample (?P<sample>\d+) of (?P<total>\d+))? "
                    r"\(call #(?P<seq>\d+)\) on group \[(?P<ranks>[\d, ]*)\]$")


def describe_hang(statuses: dict[int, tuple[str, int, str]], processes: dict[int, str] | None = None
                  ) -> str:
    """Name each op that ranks are blocked in, who arrived and who did not.

    statuses: rank -> (state, call number, description) as :mod:`commbench.runtime.status`
    publishes it; inside a timing loop the description carries the sample each rank reached,
    and the ranks behind the furthest are the ones the others wait for. processes: rank -> its
    process's state (``stopped``, ``running``, ...), where the driver can read it.
    """
    processes = processes or {}
    waiting: dict[tuple[str, str], dict[int, int]] = {}
    groups: dict[tuple[str, str], list[int]] = {}
    for rank, (state, _, text) in sorted(statuses.items()):
        m = _GROUP.match(text)
        if state == "in op" and m:
            key = (m.group("op"), m.group("seq"))
            waiting.setdefault(key, {})[rank] = int(m.group("sample") or 0)
            groups[key] = [int(r) for r in m.group("ranks").split(",") if r.strip()]
    lines = []
    for (op, seq), samples in waiting.items():
        furthest = max(samples.values())
        arrived = [r for r, k in samples.items() if k == furthest]
        missing = [r for r in groups[(op, seq)] if r not in arrived]
        where = "; ".join(f"rank {r}: {_where(statuses.get(r), processes.get(r))}"
                          for r in missing)
        at = f", sample {furthest}" if furthest else ""
        head = f"{op} (call #{seq}{at}) on group {groups[(op, seq)]}: "
        lines.append(head + (f"ranks {arrived} arrived, ranks {missing} did not ({where})"
                             if missing else "every rank of the group reached it"))
    if not lines:
        lines = [f"rank {r}: {_where(st, None)}" for r, st in sorted(statuses.items())]
    if processes:
        lines.append("processes: " + ", ".join(f"rank {r} pid {p}" for r, p in
                                               sorted(processes.items())))
    return "\n".join(lines)


def _where(status: tuple[str, int, str] | None, process: str | None) -> str:
    text = status[2] if status else "unknown"
    return f"{text} [pid {process}]" if process else text
