"""How a compiled schedule waits for its MPI messages: spinning in MPI, or yielding the core.

``spin``: the request's own ``Wait``. MPICH busy-polls, calling ``sched_yield`` only every
``MPIR_CVAR_POLLS_BEFORE_YIELD`` (1000) polls. With a core per rank that is the fastest wait.

``yield``: ``Test``, and while the message is not there, give the core away (``sched_yield``)
before testing again. When the host has more ranks than cores, the rank a waiter needs is often
queued behind it on the same core; spinning a thousand polls first delays it (the figures that
decided it: docs/decisions.md).

The default, :func:`wait_mode`, yields only when the ranks on this host outnumber its cores;
``COMMBENCH_WAIT=spin|yield`` overrides it. A wait never ends by itself in either mode: a lost
message is the harness's hang timeout to report, as with ``Wait``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from functools import partial

from commbench.runtime.launch import detect

__all__ = ["WAIT_MODES", "checked", "rank_wait", "recorded", "waiter", "wait_mode"]
WAIT_MODES = ("spin", "yield")


def checked(mode: str, what: str = "wait") -> str:
    """``mode`` if it is one of :data:`WAIT_MODES`; else a ValueError naming ``what`` and the rule."""
    if mode not in WAIT_MODES:
        raise ValueError(f"{what}={mode!r}: must be one of {', '.join(WAIT_MODES)}")
    return mode


def wait_mode(env: Mapping[str, str] | None = None, cores: int | None = None) -> str:
    """``COMMBENCH_WAIT`` when set (checked), else ``yield`` when the launcher's ranks on this
    host exceed ``cores`` (default ``os.cpu_count()``), else ``spin``."""
    env = os.environ if env is None else env
    forced = env.get("COMMBENCH_WAIT", "")
    if forced:
        return checked(forced, "COMMBENCH_WAIT")
    cores = cores if cores is not None else (os.cpu_count() or 1)
    return "yield" if detect(env).local_size > cores else "spin"


def _yield_wait(test: Callable[[], bool], give: Callable[[], None]) -> None:
    while not test():
        give()


def waiter(req, mode: str) -> Callable[[], None]:
    """A zero-argument call that completes ``req`` (an MPI request) the ``mode`` way."""
    if checked(mode) == "spin":
        return req.Wait
    return partial(_yield_wait, req.Test, os.sched_yield)


def rank_wait(ctx) -> str:
    """This rank's :func:`wait_mode` (run on every rank: ``world.run(rank_wait)``)."""
    return wait_mode()


def recorded(world) -> str:
    """How the compiled schedules wait on ``world``'s ranks, for a results record's measurement
    (``compiled_wait``)."""
    modes = sorted(set(world.run(rank_wait)))
    return f"{', '.join(modes)} (the compiled schedules' MPI waits, commbench.collectives.compiled.waiting)"
