"""The training step a call belongs to, as a script marks it (``commbench.audit.step()``).

The watcher books each call made inside a marked step with the scope ``step N`` (N from 1, in
the order the script enters them, per rank); calls outside any step are the script's set-up.
``commbench audit --step N [--steps K]`` compares only those steps with a layout.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools

__all__ = ["current", "restart", "step", "step_of"]

_STEP: contextvars.ContextVar[int] = contextvars.ContextVar("commbench_step", default=0)
_NUMBERS = [itertools.count(1)]


def restart() -> None:
    """Number the next step 1 (each audited script counts its own)."""
    _NUMBERS[0] = itertools.count(1)


def current() -> int:
    """The step being run (0: none)."""
    return _STEP.get()


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
