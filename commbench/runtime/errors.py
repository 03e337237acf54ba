"""What a run across ranks can end with, besides a result from every rank."""

from __future__ import annotations

import pickle
import re
import traceback
from dataclasses import dataclass
from typing import Any

from commbench.rankset import LISTED, rank_list, who

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
        head = (f"{task}: {len(failures)} rank(s) {rank_list(f.rank for f in failures)} raised; "
                f"first: {first}")
        # ranks that raised alike (a big job's usually do) share one traceback
        alike = _alike(failures, lambda f: f.traceback.rstrip())
        body = "\n".join(f"--- {who([f.rank for f in fs], listed=False)} ---\n{text}"
                         for text, fs in alike.items())
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
    lines, behind = [], []
    for (op, seq), samples in waiting.items():
        furthest = max(samples.values())
        arrived = [r for r, k in samples.items() if k == furthest]
        missing = [r for r in groups[(op, seq)] if r not in arrived]
        behind += missing
        where = _wheres(missing, statuses, processes)
        at = f", sample {furthest}" if furthest else ""
        head = f"{op} (call #{seq}{at}) on group {rank_list(groups[(op, seq)])}: "
        lines.append(head + (f"ranks {rank_list(arrived)} arrived, ranks {rank_list(missing)} did "
                             f"not ({where})" if missing else "every rank of the group reached it"))
    if not lines:
        lines = [f"{who(rs, listed=False)}: {text}" for text, rs in
                 _alike(sorted(statuses), lambda r: _where(statuses[r], None)).items()]
    if processes:
        # a big job's: those of the first ranks the others wait for, enough to attach to
        named = sorted(processes) if len(processes) <= LISTED else \
            [r for r in sorted(set(behind)) if r in processes][:LISTED]
        lines.append("processes: " + ", ".join(f"rank {r} pid {processes[r]}" for r in named)
                     + ("" if len(named) == len(processes) else
                        f" (the first {len(named)} of the ranks that did not arrive; "
                        f"{len(processes)} processes)"))
    return "\n".join(lines)


def _alike(items, text) -> dict[str, list]:
    """The items (ranks, failures) by what ``text`` says of each, in order of first mention."""
    out: dict[str, list] = {}
    for x in items:
        out.setdefault(text(x), []).append(x)
    return out


def _wheres(missing: list[int], statuses, processes) -> str:
    """Where each missing rank is; at a big job's scale the ranks in the same place together
    (``ranks 256-511: running _stall, no call yet``), each with its own pid where known."""
    if len(missing) <= LISTED:
        return "; ".join(f"rank {r}: {_where(statuses.get(r), processes.get(r))}" for r in missing)
    alike = _alike(missing, lambda r: _where(statuses.get(r), None))
    return "; ".join(f"{who(rs, listed=False)}: {text}" for text, rs in alike.items())


def _where(status: tuple[str, int, str] | None, process: str | None) -> str:
    text = status[2] if status else "unknown"
    return f"{text} [pid {process}]" if process else text
