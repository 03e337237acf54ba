"""The local world's fork server: torch is imported once, and each rank is forked from that
warm process instead of importing torch for itself (two seconds of a core per rank, and a test
session starts a few hundred ranks: docs/decisions.md).

A rank is still started as it always was, as a process of its own (``python -m
commbench.world.local.worker``) by the driver or by ``mpiexec``, so the launcher's view does not
change. That process, the rank's *stand-in*, hands its standard streams, MPI's PMI socket, its
environment, working folder and arguments to the zygote over a Unix socket; the zygote forks, and
the child becomes the rank with exactly those. The stand-in then waits and ends with the rank's
exit status (a rank killed by a signal ends its stand-in by the same signal), and passes on the
signals it is sent; the rank says hello with its own pid, so the world watches and kills the rank
itself. When the stand-in dies (``mpiexec`` or the world killed it), the zygote kills its rank.

Nothing is shared that a fresh process would not have: the zygote only imports torch (no thread
pool, no process group, no MPI), the child takes the stand-in's environment before importing
anything of commbench's own, and a zygote is used only where the variables torch reads while it
is imported (``TORCH_*``, ``OMP_*``, ``PYTHON*``, ...) and the interpreter are the rank's own;
anything else, or a zygote that cannot be reached, and the stand-in becomes the rank itself, as
before. ``COMMBENCH_ZYGOTE=0`` turns it off.
"""

from __future__ import annotations

import atexit
import fcntl
import importlib
import json
import os
import random
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

from commbench.runtime import crashlog
from commbench.runtime.pdeathsig import parent_death_signal

__all__ = ["Zygote", "address_for", "run_through"]

ENV = "COMMBENCH_ZYGOTE"
# what torch (and the C libraries it loads) may read while it is imported: a zygote serves only
# ranks whose values of these are its own
IMPORT_TIME_ENV = ("TORCH_", "PYTORCH_", "OMP_", "MKL_", "KMP_", "GOMP_", "GLOO_", "NCCL_",
                   "CUDA_", "LD_", "PYTHON", "TORCHINDUCTOR_", "TRITON_")
_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGCONT", "SIGTSTP")


def supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(socket, "send_fds") and \
        os.environ.get(ENV) != "0"


def _import_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV)}


# -- the driver's side -----------------------------------------------------------------------
class Zygote:
    """A zygote this process started: its folder (mode 0700: the socket, what it was started
    with, its log) and its process. It dies with this process, and with :meth:`close`."""

    def __init__(self, env: dict[str, str]) -> None:
        self.folder = tempfile.mkdtemp(prefix=crashlog.world_prefix() + "zygote-")
        self.path = os.path.join(self.folder, "socket")
        with open(os.path.join(self.folder, "started-with.json"), "w") as f:
            json.dump({"executable": sys.executable, "env": _import_env(env)}, f)

        pre = parent_death_signal if threading.current_thread() is threading.main_thread() \
            else None
        with open(os.path.join(self.folder, "zygote.log"), "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "commbench.world.local.zygote", self.folder],
                env={k: v for k, v in env.items() if k != ENV}, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=pre)
        deadline = time.monotonic() + 30.0  # the socket is bound before torch is imported
        while not os.path.exists(self.path) and self.proc.poll() is None and \
                time.monotonic() < deadline:
            time.sleep(0.005)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None and os.path.exists(self.path)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

        shutil.rmtree(self.folder, ignore_errors=True)


_OWN: dict[str, Zygote] = {}  # this process's zygotes, by the variables they imported with


def own(env: dict[str, str]) -> Zygote | None:
    """This process's zygote for ranks of environment ``env``, started (without waiting for
    its import) on first use. One per set of import-time variables: a zygote is never closed
    while this process runs, since its ranks die with it."""
    key = json.dumps(_import_env(env), sort_keys=True)
    z = _OWN.get(key)
    if z is not None and z.alive:
        return z
    if z is not None:
        _OWN.pop(key).close()
    try:
        z = Zygote(env)
    except OSError:
        return None
    if not z.alive:
        z.close()
        return None
    if not _OWN:
        atexit.register(_close_own)
    _OWN[key] = z
    return z


def _close_own() -> None:
    while _OWN:
        _OWN.popitem()[1].close()


def compatible(path: str | None, env: dict[str, str]) -> bool:
    """Whether the zygote listening at ``path`` can serve ranks of environment ``env``."""
    if not path or not os.path.exists(path):
        return False
    try:
        with open(os.path.join(os.path.dirname(path), "started-with.json")) as f:
            started = json.load(f)
    except (OSError, ValueError):
        return False
    return started.get("executable") == sys.executable and \
        started.get("env") == _import_env(env)


def address_for(env: dict[str, str]) -> str | None:
    """The socket of a zygote for ranks of environment ``env``: the one this process was given
    (``COMMBENCH_ZYGOTE``, e.g. a test session's) where it fits, else this process's own; None
    where forking is unavailable or turned off."""
    if not supported():
        return None
    given = os.environ.get(ENV)
    if compatible(given, env):
        return given
    z = own(env)
    return z.path if z is not None and compatible(z.path, env) else None


# -- the stand-in's side ---------------------------------------------------------------------
def run_through(path: str, entry: str, argv: list[str]) -> int | None:
    """Have the zygote at ``path`` fork a process that runs ``entry`` (``module:function``) on
    ``argv`` with this process's streams, environment and folder; wait for it and return its
    exit status (negative: the signal that ended it). None when nothing was forked (no zygote
    there): the caller then does the work itself."""
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
    except OSError:
        return None
    targets = [0, 1, 2]
    pmi = os.environ.get("PMI_FD", "")
    if pmi.isdigit():
        targets.append(int(pmi))
    body = json.dumps({"entry": entry, "argv0": sys.argv[0], "argv": argv, "env": dict(os.environ),
                       "cwd": os.getcwd(), "targets": targets}).encode()
    try:
        socket.send_fds(s, [struct.pack("!I", len(body))], targets)
        s.sendall(body)
        replies = s.makefile("rb")
        first = replies.readline().split()
    except OSError:
        return None
    if len(first) != 2 or first[0] != b"pid":
        return None
    pid = int(first[1])

    def forward(signum, _frame) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for name in _SIGNALS:
        signal.signal(getattr(signal, name), forward)
    try:
        last = replies.readline().split()
    except OSError:
        last = []
    code = int(last[1]) if len(last) == 2 and last[0] == b"exit" else -signal.SIGKILL
    if code < 0:  # end as the rank ended
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


# -- the zygote ------------------------------------------------------------------------------
def _read_request(c: socket.socket) -> dict | None:
    """A stand-in's request with the descriptors it sent, or None (those closed) where it is
    incomplete or malformed."""
    c.settimeout(10.0)
    fds: list[int] = []
    req = None
    try:
        head, fds, _, _ = socket.recv_fds(c, 4, 8)
        (n,) = struct.unpack("!I", head)
        body = b""
        while len(body) < n:
            chunk = c.recv(n - len(body))
            if not chunk:
                break
            body += chunk
        req = json.loads(body)
    except (OSError, ValueError, struct.error):
        req = None
    finally:
        c.settimeout(None)
    if not isinstance(req, dict) or len(fds) != len(req.get("targets", ())):
        for fd in fds:
            os.close(fd)
        return None
    req["fds"] = fds
    return req


def _become_rank(req: dict, close: list[socket.socket]) -> None:
    """In the forked child: take the stand-in's streams, environment, folder and arguments, and
    run the rank. Never returns."""
    code = 1
    try:
        for s in close:
            s.close()
        os.setsid()

        floor = max(req["targets"]) + 1
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, floor) for fd in req["fds"]]
        for fd in req["fds"]:
            os.close(fd)
        for target, fd in zip(req["targets"], moved):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        sys.path[0] = req["cwd"]  # as ``python -m`` in that folder would have it
        sys.argv = [req["argv0"], *req["argv"]]

        random.seed()  # the zygote's state is every child's: draw afresh, as a new process does

        module, name = req["entry"].split(":")
        code = getattr(importlib.import_module(module), name)(req["argv"])
        code = code if isinstance(code, int) else 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        # what a process that ends on its own runs at exit, which os._exit skips (a rank ends
        # by an os._exit of its own before this: worker.py finalizes MPI itself)
        atexit._run_exitfuncs()
        _finalize_mpi()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _finalize_mpi() -> None:
    """MPI_Finalize where mpi4py initialised MPI and would finalize it at exit: from a C exit
    hook, which ``os._exit`` skips. MPICH unlinks the ``/dev/shm`` segment of a singleton
    MPI_Init (``commbench info`` makes one) only there: without it, each such command forked
    here left a megabyte of the host's memory behind."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return
    try:
        if mpi.Is_initialized() and not mpi.Is_finalized() and \
                sys.modules["mpi4py"].rc.finalize in (None, True):
            mpi.Finalize()
    except Exception:  # noqa: BLE001 - an exit never fails on its way out
        pass


def serve(folder: str) -> None:
    """Listen at ``folder``/socket, import torch, then fork a rank for each stand-in that asks,
    until the process that started this one is gone."""
    parent = os.getppid()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    try:
        srv.bind(os.path.join(folder, "socket"))
    finally:
        os.umask(old)
    srv.listen(256)  # stand-ins that connect now wait in the queue until torch is in
    # lazy: imports torch
    import torch  # noqa: F401  (the point of it all)

    # lazy: imports torch
    import torch.distributed  # noqa: F401

    ranks: dict[socket.socket, int | None] = {}  # a stand-in's connection -> its rank's pid
    by_pid: dict[int, socket.socket] = {}
    # a child that ends wakes the loop at once (its stand-in waits for its status); otherwise
    # it wakes once a second, to see whether the process that started it is still there
    woken, wake = socket.socketpair()
    woken.setblocking(False)
    wake.setblocking(False)
    signal.set_wakeup_fd(wake.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while os.getppid() == parent:
        readable, _, _ = select.select([srv, woken, *ranks], [], [], 1.0)
        for s in readable:
            if s is woken:
                while True:
                    try:
                        woken.recv(4096)
                    except BlockingIOError:
                        break
            elif s is srv:
                ranks[srv.accept()[0]] = None
            elif ranks[s] is None:
                req = _read_request(s)
                if req is None:  # dropped: the stand-in does the work itself
                    del ranks[s]
                    s.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    _become_rank(req, [srv, woken, wake, *ranks])
                for fd in req["fds"]:
                    os.close(fd)
                ranks[s], by_pid[pid] = pid, s
                _send(s, f"pid {pid}\n")
            elif not s.recv(64):  # the stand-in is gone: so is its rank
                pid = ranks.pop(s)
                by_pid.pop(pid, None)
                _kill(pid)
                s.close()
        while True:  # every child that ended, those whose stand-in went first included
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            s = by_pid.pop(pid, None)
            if s is not None:
                _send(s, f"exit {os.waitstatus_to_exitcode(status)}\n")
                ranks.pop(s, None)
                s.close()
    for pid in by_pid:
        _kill(pid)


def _send(s: socket.socket, line: str) -> None:
    try:
        s.sendall(line.encode())
    except OSError:
        pass


def _kill(pid: int | None) -> None:
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(argv: list[str]) -> None:
    """``FOLDER``: serve as the zygote of that folder. ``--through SOCKET module:function
    ARGS...``: run ``function(ARGS)`` forked from the zygote at SOCKET as this process (tests
    run the command line so: ``commbench.cli.main:main``), or here where that zygote was
    started with other import-time variables than this process has, or is gone."""
    if argv[:1] != ["--through"]:
        serve(argv[0])
        return
    path, entry, *rest = argv[1:]
    if compatible(path, dict(os.environ)):
        code = run_through(path, entry, rest)
        if code is not None:
            sys.exit(code)

    module, name = entry.split(":")
    sys.argv = [entry, *rest]
    sys.exit(getattr(importlib.import_module(module), name)(rest))


if __name__ == "__main__":
    main(sys.argv[1:])
