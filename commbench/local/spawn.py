"""Starting the ranks of a local world: where mpiexec is, parent-death signals, start-up logs."""

from __future__ import annotations

import os
import shutil
import signal
import sys

from commbench.errors import WorldError

__all__ = ["drain_fatal", "find_mpiexec", "log_tail", "mpi_usable", "parent_death_signal",
           "worker_env"]


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


def worker_env(key: bytes) -> dict[str, str]:
    """The ranks' environment: the driver's, with the connection key, its import path and its
    ``__main__`` script (for functions defined there), minus any launcher's variables."""
    import json

    env = dict(os.environ, COMMBENCH_AUTHKEY=key.hex(), PYTHONUNBUFFERED="1", COMMBENCH_WORKER="1",
               COMMBENCH_SYS_PATH=json.dumps([p for p in sys.path if p]),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file and main_file.endswith(".py"):
        env["COMMBENCH_MAIN_FILE"] = os.path.abspath(main_file)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return env


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
