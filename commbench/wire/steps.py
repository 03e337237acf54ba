"""The training step a call belongs to, as a script marks it (``commbench.audit.step()``).

The watcher books each call made inside a marked step with the scope ``step N`` (N from 1, in
the order the script enters them, per rank); calls outside any step are the script's set-up.
``commbench audit --step N [--steps K]`` compares only those steps with a layout. A script that
steps torch's profiler is marked by it too, where it marks nothing itself: its
``ProfilerStep#k`` is step k + 1 (:func:`profiler_steps`, which the audit turns on).
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools

__all__ = ["current", "profiler_steps", "restart", "step", "step_of"]

_STEP: contextvars.ContextVar[int] = contextvars.ContextVar("commbench_step", default=0)
_NUMBERS = [itertools.count(1)]
_PROFILER = [0]  # the profiler's step in progress, + 1 (0: none)


def restart() -> None:
    """Number the next step 1 (each audited script counts its own)."""
    _NUMBERS[0] = itertools.count(1)


def current() -> int:
    """The step being run (0: none): the script's own mark, else its profiler's."""
    return _STEP.get() or _PROFILER[0]


@contextlib.contextmanager
def profiler_steps():
    """While it lasts, torch's profiler marks steps: ``start`` opens ProfilerStep#0,
    each ``step()`` the next, ``stop`` ends the last."""
    # lazy: imports torch
    from torch.profiler import profile

    start, step_, stop = profile.start, profile.step, profile.stop

    def started(self) -> None:
        start(self)
        _PROFILER[0] = self.step_num + 1

    def stepped(self) -> None:
        step_(self)
        _PROFILER[0] = self.step_num + 1

    def stopped(self) -> None:
        _PROFILER[0] = 0
        stop(self)

    profile.start, profile.step, profile.stop = started, stepped, stopped
    try:
        yield
    finally:
        profile.start, profile.step, profile.stop = start, step_, stop
        _PROFILER[0] = 0


def step_of(scope: str) -> int:
    """The step a booked scope names (0: set-up, outside any step)."""
    for part in scope.split("/"):
        if part.startswith("step ") and part[5:].isdigit():
            return int(part[5:])
    return 0


class step(contextlib.ContextDecorator):
    """Marks one training step: ``with commbench.audit.step(): ...`` around it, or
    ``@commbench.audit.step()`` on the function that runs it; each entry is the next step."""

    def __enter__(self) -> int:
        n = next(_NUMBERS[0])
        self._tokens = [*getattr(self, "_tokens", []), _STEP.set(n)]
        return n

    def __exit__(self, *exc) -> None:
        _STEP.reset(self._tokens.pop())
