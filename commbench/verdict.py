"""A judge's verdict: the list of problems it found ([] when none), which must be read.

A test that calls a judge and drops its answer passes by doing nothing. A :class:`Verdict` is a
list that notes when it is read (compared, tested for truth, measured, iterated, indexed,
searched); inside a test run by pytest, the plugin collects the verdicts each test makes
(:func:`collecting`) and fails a test that left one unread (:func:`unread`). Outside pytest it
is a plain list.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager

__all__ = ["Verdict", "collecting", "unread"]

_OPEN: contextvars.ContextVar[list | None] = contextvars.ContextVar("commbench_verdicts",
                                                                    default=None)


class Verdict(list):
    """Problems, one line each; reading it in any way marks it read."""

    def __init__(self, problems=(), what: str = "a judge") -> None:
        super().__init__(problems)
        self.what, self.read = what, False
        made = _OPEN.get()
        if made is not None:
            made.append(self)

    def _mark(self) -> None:
        self.read = True


def _reading(name: str):
    base = getattr(list, name)

    def method(self, *args, **kwargs):
        self._mark()
        return base(self, *args, **kwargs)

    method.__name__ = name
    return method


for _name in ("__eq__", "__ne__", "__bool__", "__len__", "__iter__", "__getitem__",
              "__contains__", "__add__", "__radd__", "__iadd__", "index", "count", "copy"):
    if hasattr(list, _name):
        setattr(Verdict, _name, _reading(_name))
Verdict.__hash__ = None  # a list: unhashable (truth testing goes through __len__)


@contextmanager
def collecting():
    """Collect the verdicts made inside the block; yields the list they land in."""
    made: list[Verdict] = []
    token = _OPEN.set(made)
    try:
        yield made
    finally:
        _OPEN.reset(token)


def unread(made: list[Verdict]) -> list[str]:
    """What each unread verdict of ``made`` came from."""
    return [v.what for v in made if not v.read]
