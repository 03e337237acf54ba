"""What a run across ranks can end with, besides a result from every rank."""

from __future__ import annotations

import pickle
import re
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
    import traceback

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


_GROUP = re.compile(r"^(?P<op>.+?) \(call #(?P<seq>\d+)\) on group \[(?P<ranks>[\d, ]*)\]$")


def describe_hang(statuses: dict[int, tuple[str, int, str]]) -> str:
    """Name each op that ranks are blocked in, who arrived and who did not.

    statuses: rank -> (state, call number, description) as :mod:`commbench.runtime.status` publishes it.
    """
    waiting: dict[str, list[int]] = {}
    groups: dict[str, list[int]] = {}
    for rank, (state, _, text) in sorted(statuses.items()):
        m = _GROUP.match(text)
        if state == "in op" and m:
            waiting.setdefault(text, []).append(rank)
            groups[text] = [int(r) for r in m.group("ranks").split(",") if r.strip()]
    lines = []
    for text, arrived in waiting.items():
        missing = [r for r in groups[text] if r not in arrived]
        where = "; ".join(f"rank {r}: {statuses[r][2]}" if r in statuses else f"rank {r}: unknown"
                          for r in missing)
        lines.append(f"{text}: ranks {arrived} arrived, ranks {missing} did not"
                     + (f" ({where})" if where else ""))
    if not lines:
        lines = [f"rank {r}: {text}" for r, (_, _, text) in sorted(statuses.items())]
    return "\n".join(lines)
