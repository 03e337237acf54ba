"""A long study's finished pieces, saved after each one, so that an interruption keeps them.

The model, versus and pattern studies measure for minutes and write their table at the end.
Each measures in pieces (a row of a config, a size, a job of a pass): ``Pieces`` keeps every
finished piece in ``<stem>.partial.jsonl``, one JSON line each after a line of the settings,
appended and flushed as it finishes (a study of thousands of pieces writes each once, not the
whole file again), and a run given ``--resume`` takes the pieces from that file, if it was
measured with the same settings, instead of measuring them again; a last line cut short by a
kill is left out. The complete table written, the partial file is removed.

    pieces = Pieces(stem + ".partial.jsonl", settings, resume=a.resume, emit=emit, world=world)
    row = pieces.get(key)
    if row is None:
        row = measure()
        pieces.put(key, row)
    ...
    pieces.finish()

Under a launcher rank 0 reads the file and every rank takes its pieces (so every rank skips the
same ones); rank 0 alone writes (``path=None`` elsewhere).
"""

from __future__ import annotations

import json
import os

from commbench.results import records as res
from commbench.results.files import RESULTS_LIMIT, FileRefused, read_text

__all__ = ["Pieces", "or_none", "study_pieces"]

SCHEMA = "commbench.pieces/1"


class Pieces:
    def __init__(self, path: str | None, settings: dict, *, resume: bool = False, emit=print,
                 world=None, read_path: str | None = None) -> None:
        """``path``: where to write (None: on a rank that does not write, or with --no-write);
        ``read_path``: where --resume reads (default ``path``); ``settings``: what must match
        for pieces to be taken (JSON values)."""
        self.path, self.settings, self._begun = path, settings, False
        read_path = read_path or path
        found = _read(read_path, settings) if resume and read_path else {}
        agree = getattr(world, "agree", None)
        if agree is not None:  # a launched world: rank 0's file for every rank
            found = agree(found)[0]
        if isinstance(found, str):  # the refusal, made the same on every rank
            raise ValueError(found)
        self.done: dict[str, object] = dict(found)
        if self.done:
            emit(f"# resuming {read_path}: {len(self.done)} finished pieces kept")

    def get(self, key: str):
        return self.done.get(key)

    def put(self, key: str, value) -> None:
        self.done[key] = value
        if not self.path:
            return
        if not self._begun:  # the settings line and every piece so far, once; then appended
            res.write_atomic(self.path, "".join(
                [_line({"schema": SCHEMA, "settings": self.settings})]
                + [_line({"key": k, "value": v}) for k, v in self.done.items()]))
            self._begun = True
            return
        with open(self.path, "a") as f:
            f.write(_line({"key": key, "value": value}))

    def finish(self) -> None:
        """The study's table is written: its partial file goes."""
        if self.path and os.path.exists(self.path):
            os.remove(self.path)


def _line(obj) -> str:
    return json.dumps(obj) + "\n"


def or_none(pieces: Pieces | None) -> Pieces:
    """``pieces``, or pieces kept nowhere (a study called without any)."""
    return pieces if pieces is not None else Pieces(None, {})


def _parsed(line: str):
    try:
        return json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return None


def _read(path: str, settings: dict) -> dict | str:
    """The pieces in ``path`` ({} when there is none), or the refusal's text when it was
    measured with other settings or is not a pieces file."""

    if not os.path.exists(path):
        return {}
    try:
        lines = read_text(path, "partial results", RESULTS_LIMIT).splitlines()
    except FileRefused as exc:
        return f"--resume: {exc}"
    head = _parsed(lines[0]) if lines else None
    if not isinstance(head, dict) or head.get("schema") != SCHEMA:
        return f"--resume: {path} is not a file of finished pieces ({SCHEMA})"
    old = head.get("settings") or {}
    diff = [f"{k} {old.get(k)!r} -> {settings.get(k)!r}" for k in sorted(set(old) | set(settings))
            if old.get(k) != settings.get(k)]
    if diff:
        return f"--resume: {path} was measured otherwise: {'; '.join(diff)}"
    pieces = {}
    for k, line in enumerate(lines[1:], 2):
        piece = _parsed(line)
        if not (isinstance(piece, dict) and isinstance(piece.get("key"), str) and "value" in piece):
            if k == len(lines):  # cut short by a kill while it was written: measured again
                break
            return f"--resume: {path} line {k} is not a finished piece"
        pieces[piece["key"]] = piece["value"]
    return pieces


def study_pieces(world, stem: str, emit, *, write: bool, resume: bool, prints: bool,
                 **settings) -> Pieces:
    """The pieces of the study whose table is ``stem`` (``results/versus_<hw>-gloo-x4``):
    ``<stem>.partial.jsonl``, written by the printing rank when ``write``, taken back when
    ``resume``; ``settings`` (with the world's size) must match to be taken, the ranks'
    ``binding`` aside (where threads ran is recorded, not chosen)."""
    path = stem + ".partial.jsonl"
    settings = {"ranks": world.size, **{k: v for k, v in settings.items() if k != "binding"}}
    return Pieces(path if write and prints else None, settings,
                  resume=resume, emit=emit, world=world, read_path=path if prints else None)
