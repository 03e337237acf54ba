"""``commbench`` run as a user runs it, a process of its own (its streams, its exit status, the
signals it is sent), but forked from a zygote of this test session that has torch imported
(:mod:`commbench.world.local.zygote`) instead of an interpreter that imports torch again for
every command. Tests of what a fresh interpreter does (what a command imports, a launcher's
ranks, a driver's own processes) start one themselves."""

from __future__ import annotations

import os
import sys

from commbench.world.local import zygote


def commbench(*args: str, env: dict[str, str] | None = None) -> list[str]:
    """The command line that runs ``commbench *args`` in environment ``env`` (default: this
    process's)."""
    z = zygote.own(dict(os.environ if env is None else env)) if zygote.supported() else None
    if z is None:
        return [sys.executable, "-m", "commbench", *args]
    return [sys.executable, "-m", "commbench.world.local.zygote", "--through", z.path,
            "commbench.cli.main:main", *args]
