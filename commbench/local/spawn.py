"""Starting the ranks of a local world: where mpiexec is, parent-death signals, start-up logs."""

from __future__ import annotations

import os
import shutil
import signal
import sys

from commbench.errors import WorldError

__all__ = ["drain_fatal", "find_mpiexec", "log_tail", "mpi_usable", "parent_death_signal"]


def find_mpiexec() -> str | None:
    """The ``mpiexec`` beside this Python (the ``mpich`` wheel's), else the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec")


def mpi_usable() -> bool:
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None and find_mpiexec() is not None


try:  # resolved here, in the parent: preexec_fn runs between fork and exec and must stay tiny
    import ctypes

    _PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):
    _PRCTL = None


def parent_death_signal() -> None:
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the driver


def drain_fatal(pending: list) -> None:
    """Raise the first 'could not join' report among connections not yet read."""
    for c in pending:
        try:
            msg = c.recv() if c.poll(0.1) else None
            if msg and msg[0] == "fatal":
                raise WorldError(f"rank {msg[1]} could not join: {msg[2]}")
        except (EOFError, OSError):
            pass


def log_tail(folder: str | None, limit: int = 2000) -> str:
    """The end of every rank's log in ``folder``, for error messages."""
    if not folder:
        return ""
    texts = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".log"):
            with open(os.path.join(folder, name), "rb") as f:
                data = f.read().decode(errors="replace").strip()
            if data:
                texts.append(f"[{name}] {data[-limit:]}")
    return ("\n" + "\n".join(texts)) if texts else ""
