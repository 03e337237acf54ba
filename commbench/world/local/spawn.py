"""Starting the ranks of a local world: where mpiexec is, parent-death signals, the ranks'
connections up to ready, start-up logs."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

from commbench.rankset import rank_list
from commbench.runtime.errors import WorldError

__all__ = ["accept_ranks", "drain_fatal", "find_mpiexec", "launcher", "log_tail", "mpi_usable",
           "open_mpi_version", "worker_env"]


def find_mpiexec() -> str | None:
    """The ``mpiexec`` beside this Python (the ``mpich`` wheel's), else the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec")


def local_mpiexec() -> str | None:
    """The launcher of a local world's MPI ranks: MPICH's ``mpiexec.gforker`` where it is there
    (it forks the ranks of one host and listens on no network address; hydra's ``mpiexec``
    keeps a control socket open on every interface), else :func:`find_mpiexec`."""
    mpiexec = find_mpiexec()
    if mpiexec:
        gforker = os.path.join(os.path.dirname(os.path.realpath(mpiexec)), "mpiexec.gforker")
        if os.access(gforker, os.X_OK):
            return gforker
    return mpiexec


@functools.cache
def open_mpi_version(mpiexec: str) -> tuple[int, ...] | None:
    """Open MPI's version where ``mpiexec`` is Open MPI's (``mpiexec (OpenRTE) 4.1.4``,
    ``mpiexec (Open MPI) 5.0.7``), else None (MPICH's hydra, gforker, anything else)."""
    try:
        said = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=20,
                              stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"\((?:OpenRTE|Open MPI)\) (\d+)\.(\d+)", said)
    return (int(m.group(1)), int(m.group(2))) if m else None


def launcher(size: int) -> tuple[list[str], dict[str, str]]:
    """A local world's mpiexec command for ``size`` ranks (before the ranks' command), and what
    it adds to their environment. Open MPI's refuses to start more ranks than the host has
    cores, and to start any as root (a container's user, on most GPU machines) unless told:
    the ranks of a local world are this user's own processes on this host, so it is told
    (``--oversubscribe``; 5.x: ``--map-by :OVERSUBSCRIBE``; Open MPI's two variables for
    root). MPICH's starts either as it is."""
    mpiexec = local_mpiexec()
    if mpiexec is None:
        raise WorldError("no mpiexec here: install the mpi extra (pip install 'commbench[mpi]')")
    mpich = os.path.basename(mpiexec) in ("mpiexec.gforker", "mpiexec.hydra")
    version = None if mpich else open_mpi_version(mpiexec)
    if version is None:
        return [mpiexec, "-n", str(size)], {}
    spread = ["--oversubscribe"] if version < (5,) else ["--map-by", ":OVERSUBSCRIBE"]
    env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} \
        if os.geteuid() == 0 else {}
    return [mpiexec, "-n", str(size), *spread], env


def mpi_usable() -> bool:
    return importlib.util.find_spec("mpi4py") is not None and find_mpiexec() is not None


def worker_env(key: bytes) -> dict[str, str]:
    """The ranks' environment: the driver's, with the connection key, its import path and its
    ``__main__`` script (for functions defined there), minus any launcher's variables."""

    env = dict(os.environ, COMMBENCH_AUTHKEY=key.hex(), PYTHONUNBUFFERED="1", COMMBENCH_WORKER="1",
               COMMBENCH_SYS_PATH=json.dumps([p for p in sys.path if p]),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               # every socket of a rank on the loopback interface: nobody off this host can
               # reach it (gloo binds the address the host name resolves to by default, MPICH's
               # UCX and libfabric transports every interface)
               GLOO_SOCKET_IFNAME="lo", UCX_NET_DEVICES="lo", FI_TCP_IFACE="lo")
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file and main_file.endswith(".py"):
        env["COMMBENCH_MAIN_FILE"] = os.path.abspath(main_file)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return env


MPI_INIT_FAILED = "Fatal error in internal_Init_thread"  # MPICH's words when MPI_Init fails


class InitFailed(WorldError):
    """A rank's ``MPI_Init`` failed inside MPICH, or mpiexec signalled a rank before it said
    hello: before any task ran, so nothing is lost by starting the world again (MPICH 5's UCX
    start-up fails now and then with "Message truncated" in its first all-gather; gforker now
    and then quits a rank of a world started right after one it tore down; docs/decisions.md)."""


def _start_failed(what: str, folder: str | None) -> WorldError:
    """``what`` with the ranks' log tail: an :class:`InitFailed` when MPICH's MPI_Init failed."""
    tail = log_tail(folder)
    return (InitFailed if MPI_INIT_FAILED in tail else WorldError)(what + tail)


def accept_ranks(listener, procs: list, size: int, timeout_s: float, folder: str | None,
                 pids: dict[int, int]) -> tuple[dict[int, object], tuple[str, ...]]:
    """Each rank's connection, by rank, once all ``size`` ranks said hello and then ready, and
    their transports; ``pids`` filled as hellos come (for killing on failure). Raises
    :class:`WorldError` when a rank reports it could not join, a process in ``procs`` ends, or
    ``timeout_s`` passes. Nothing here waits on one rank: under MPI a rank says hello only
    after ``MPI_Init``, which waits for every rank."""
    joining = _Joining(listener, procs, size, folder, pids)
    deadline = time.monotonic() + timeout_s
    while len(joining.ready) < size:
        if time.monotonic() > deadline:
            raise WorldError(f"local world of {size}: only ranks {rank_list(joining.ready)} were "
                             f"ready after {timeout_s:.0f} s ({len(joining.conns)} said hello, "
                             f"{len(joining.silent)} connected silent){log_tail(folder)}")
        joining.check_processes()
        joining.read_hellos()
        joining.read_ready()
        if not joining.conns:
            time.sleep(0.05)
    return joining.conns, joining.transports


class _Joining:
    """A local world's ranks joining: connections accepted in the background (``pending``),
    then each rank's hello (rank, pid) and its ready (its transports), read without waiting on
    any one rank."""

    def __init__(self, listener, procs: list, size: int, folder: str | None,
                 pids: dict[int, int]) -> None:
        self.procs, self.size, self.folder, self.pids = procs, size, folder, pids
        self.pending: list = []
        self.silent: list = []  # accepted, no hello yet
        self.conns: dict[int, object] = {}
        self.ready: set[int] = set()
        self.transports: tuple[str, ...] = ()
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener) -> None:
        for _ in range(self.size):
            try:
                self.pending.append(listener.accept())
            except OSError:
                return

    def check_processes(self) -> None:
        """A rank process that ended during start-up fails the start (its 'could not join'
        report first, when it sent one)."""
        for p in self.procs:
            if p.poll() is not None:
                time.sleep(0.2)  # let a last message arrive before blaming the process
                drain_fatal(self.silent + self.pending)
                raise _start_failed(f"local world of {self.size}: a rank process exited with "
                                    f"code {p.returncode} during start-up", self.folder)

    def read_hellos(self) -> None:
        self.silent += self.pending
        self.pending.clear()
        for c in [c for c in self.silent if c.poll(0)]:
            self.silent.remove(c)
            try:
                kind, rank, detail = c.recv()
            except EOFError:  # a rank died between connecting and saying hello: say why
                raise self._closed_before_hello() from None
            if kind == "fatal":
                raise WorldError(f"rank {rank} could not join: {detail}")
            if kind != "hello":
                raise WorldError(f"local world: unexpected first message {kind!r}")
            self.conns[rank], self.pids[rank] = c, detail

    def _closed_before_hello(self) -> WorldError:
        for p in self.procs:  # its last words reach the log through mpiexec: let them
            try:
                p.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass
        err = _start_failed(f"local world of {self.size}: a rank closed its connection before "
                            "saying hello", self.folder)
        if "signaled with" in str(err):  # mpiexec ended it (MPICH's start-up): no task ran,
            err = InitFailed(str(err))   # so the start is tried once more
        return err

    def read_ready(self) -> None:
        for rank, c in list(self.conns.items()):
            if rank not in self.ready and c.poll(0.05):
                msg = c.recv()
                if msg[0] == "fatal":
                    raise WorldError(f"rank {rank} could not join: {msg[2]}")
                self.transports = tuple(msg[2])
                self.ready.add(rank)


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


def process_state(pid: int) -> str | None:
    """The kernel's state letter of process ``pid`` (``R``, ``S``, ``Z``, ...; None when it is
    gone or there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not); where there is no /proc (macOS) the
    ranks' own processes (``poll``) are all that can say, so yes."""
    if not os.path.isdir("/proc"):
        return True
    return process_state(pid) not in (None, "Z")
