"""The local world: N CPU ranks spawned once and kept, with no launcher needed.

``LocalWorld(4).run(fn, *args)`` runs ``fn(ctx, *args)`` on every rank and returns the list of
results, rank by rank; a rank that raises makes it raise :class:`~commbench.runtime.errors.SPMDError` with
every failing rank's traceback. No call blocks forever:

* a call that outlives its timeout raises :class:`~commbench.runtime.errors.CallTimeout`, naming the op
  each blocked rank is in and the ranks of that group that never arrived (read from the per-rank
  status slots of :mod:`commbench.runtime.status`);
* a rank whose process ends raises :class:`~commbench.runtime.errors.RankDied` as soon as its connection
  closes (well under the 10 s bound), naming it and what the others were doing;
* a rank that raised while others wait for it in a collective ends the call after ``grace_s``;
* a rank whose process stays stopped (SIGSTOP: the kernel's state ``T``) for ``stopped_s``
  (a quarter of the call's limit, at most 10 s) ends the call then, naming it and its state,
  instead of at the call's timeout (a rank stopped by a debugger, state ``t``, is left to its
  debugger).

After any of these the world is torn down (at once: the ranks still there are held in the
call and could not read a request to leave), and the next call spawns a fresh one. Ranks are
started with ``mpiexec`` when mpi4py and an ``mpiexec`` are there (transports gloo and MPI), else
as plain processes (gloo only), each forked from a process that imported torch once
(:mod:`.zygote`). Every process is killed when the world is closed, when the driver
exits, or when the driver dies (the ranks watch its connection and their parent).
"""

from __future__ import annotations

import atexit
import os
import pickle
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import Listener, wait

from commbench.runtime import crashlog, shm
from commbench.runtime.errors import Outcome, SPMDError, WorldError
from commbench.runtime.pdeathsig import parent_death_signal
from commbench.world.local import spawn
from commbench.world.local.failures import FailureReports
from commbench.world.local.spawn import find_mpiexec, mpi_usable

__all__ = ["LocalWorld", "find_mpiexec"]

_LIVE: weakref.WeakSet = weakref.WeakSet()


class LocalWorld(FailureReports):
    """N ranks on this machine. ``launch``: ``"auto"``, ``"mpi"`` (mpiexec) or ``"plain"``."""

    def __init__(self, size: int, *, launch: str = "auto", backend: str = "gloo",
                 timeout_s: float = 120.0, start_timeout_s: float = 90.0,
                 grace_s: float = 2.0, stopped_s: float | None = None) -> None:
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"size={size!r}: must be an integer >= 1")
        if launch not in ("auto", "mpi", "plain"):
            raise ValueError(f"launch={launch!r}: must be auto, mpi or plain")
        if launch == "mpi" and not mpi_usable():
            raise WorldError("launch='mpi' but mpi4py or mpiexec is missing "
                             "(pip install 'commbench[mpi]' brings both)")
        self.size, self.backend = size, backend
        self.launch = ("mpi" if mpi_usable() else "plain") if launch == "auto" else launch
        self.timeout_s, self.start_timeout_s, self.grace_s = timeout_s, start_timeout_s, grace_s
        self.stopped_s = min(10.0, timeout_s / 4) if stopped_s is None else stopped_s
        self.transports: tuple[str, ...] = ()
        self.starts = 0
        self._procs: list[subprocess.Popen] = []
        self._conns: dict[int, object] = {}
        self._pids: dict[int, int] = {}
        self._segments: set[str] = set()  # the ranks' MPICH segments, as mapped at start
        self._in_call = False  # a task sent and not yet answered by every rank
        self._dir: str | None = None
        self._task, self._lock = 0, threading.Lock()  # task numbers; one call at a time

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return bool(self._conns) and all(p.poll() is None for p in self._procs) and \
            all(spawn.running(pid) for pid in self._pids.values())

    def start(self, meanwhile: Callable[[], object] | None = None) -> LocalWorld:
        """Start the ranks (a no-op while they are alive). Under ``mpiexec`` a start whose
        ``MPI_Init`` failed inside MPICH is tried once more, saying so on stderr.
        ``meanwhile``: work of this process's own done once the ranks' processes exist and
        before they are waited for, while they start on the other cores (each start calls it)."""
        if self.alive:
            return self
        try:
            return self._start(meanwhile)
        except spawn.InitFailed as exc:
            if self.launch != "mpi":
                raise
            first = str(exc).splitlines()[-1] if str(exc) else ""
            print(f"commbench: local world of {self.size}: MPI_Init failed inside MPICH "
                  f"({first.strip()[:160]}); starting the world once more", file=sys.stderr)
            return self._start(meanwhile)

    def _start(self, meanwhile: Callable[[], object] | None = None) -> LocalWorld:
        if os.environ.get("COMMBENCH_WORKER"):
            raise WorldError("a rank of a local world cannot start another local world (a script "
                             "whose functions run on the ranks needs an `if __name__ == "
                             "'__main__':` guard, as with multiprocessing)")
        self.close()
        key = secrets.token_bytes(16)
        crashlog.remove_stale_worlds()  # those of drivers killed before they could close
        self._dir = tempfile.mkdtemp(prefix=crashlog.world_prefix())
        # every rank connects at once: with the default backlog of 1, a connection that found
        # the queue full stayed open on the rank's side only, its rank waiting for ever
        listener = Listener(("127.0.0.1", 0), authkey=key, backlog=max(128, self.size))
        # the ranks' rendezvous store: a file in the world's own folder (mkdtemp: mode 0700), so
        # no other user and no other host can read or write it (a TCPStore listens on every
        # interface, unauthenticated, and ranks create their process groups through it)
        store_path = os.path.join(self._dir, "store")
        address = f"127.0.0.1:{listener.address[1]}"
        env = spawn.worker_env(key)
        # lazy: python -m runs it (its package must not import it first)
        from commbench.world.local import zygote

        forks = zygote.address_for(env)  # where torch is imported once for every rank
        env[zygote.ENV] = forks or "0"
        cmd = [sys.executable, "-m", "commbench.world.local.worker", "--address", address,
               "--store", store_path, "--size", str(self.size),
               "--status-dir", self._dir, "--backend", self.backend]
        main_thread = threading.current_thread() is threading.main_thread()
        pre = parent_death_signal if main_thread else None
        if self.launch == "mpi":
            argv, more = spawn.launcher(self.size)
            log = open(os.path.join(self._dir, "ranks.log"), "wb")
            self._procs = [subprocess.Popen([*argv, *cmd, "--mpi"],
                                            env={**env, **more}, stdout=log,
                                            stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=pre)]
        else:
            self._procs = []
            for r in range(self.size):
                log = open(os.path.join(self._dir, f"rank{r}.log"), "wb")
                self._procs.append(subprocess.Popen(
                    [*cmd, "--rank", str(r)], env=env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=pre))
        _LIVE.add(self)
        try:
            if meanwhile is not None:  # the ranks connect and start meanwhile; the deadline
                meanwhile()            # below counts from its end
            self._conns, self.transports = spawn.accept_ranks(
                listener, self._procs, self.size, self.start_timeout_s, self._dir, self._pids)
        except BaseException:
            self.close()
            raise
        finally:
            listener.close()
        # the MPICH segments, noted while every rank lives: a rank killed before the world
        # closes can no longer say which it mapped
        self._segments = shm.mapped_segments(self._pids.values())
        self.starts += 1
        return self

    def close(self) -> None:
        """Stop every rank (killing any that do not leave at once) and remove the temp files
        and the ranks' MPICH segments (:mod:`shm`). Ranks closed in the middle of a call (it
        timed out, a rank is stopped or died in it, the driver was interrupted) are held in it
        and read no request to leave before it ends: they are killed without waiting for them."""
        segments = self._segments | shm.mapped_segments(self._pids.values())
        for c in self._conns.values():
            try:
                c.send(("exit",))
            except OSError:
                pass
        # until every rank has left: mpiexec.gforker, which outlives its ranks by up to a second
        # when they do not leave at the same moment (it sleeps a second between its rounds of
        # reaping), is then killed with the rest, having nothing left to do
        deadline = time.monotonic() + (0.0 if self._in_call else 2.0)
        while time.monotonic() < deadline and any(p.poll() is None for p in self._procs) and \
                self._a_rank_runs():
            time.sleep(0.01)
        self._kill()
        for c in self._conns.values():
            c.close()
        shm.remove(segments)
        self._conns, self._procs, self._pids, self._segments = {}, [], {}, set()
        self._in_call = False
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        _LIVE.discard(self)

    def _kill(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for pid in self._pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        # a killed rank that was busy (polling in MPI_Finalize, say) takes a moment to be gone;
        # close() returns once none runs, so no caller sees a rank outlive its world (where
        # /proc tells: elsewhere spawn.running says yes to every pid)
        deadline = time.monotonic() + 5.0
        while os.path.isdir("/proc") and time.monotonic() < deadline and self._a_rank_runs():
            time.sleep(0.01)

    def _a_rank_runs(self) -> bool:
        return any(spawn.running(pid) for pid in self._pids.values())

    def __enter__(self) -> LocalWorld:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pids(self) -> dict[int, int]:
        return dict(self._pids)

    # -- running ------------------------------------------------------------------------------
    def run(self, fn, *args, timeout: float | None = None, **kwargs) -> list:
        """``fn(ctx, *args, **kwargs)`` on every rank; the results in rank order."""
        outcomes = self.outcomes(fn, *args, timeout=timeout, **kwargs)
        failures = [o.error for o in outcomes if not o.ok]
        if failures:
            raise SPMDError(_name(fn), failures)
        return [o.value for o in outcomes]

    def outcomes(self, fn, *args, timeout: float | None = None, **kwargs) -> list[Outcome]:
        """Like :meth:`run`, but each rank's result or exception, without raising for them."""
        try:
            payload = pickle.dumps((fn, args, kwargs))
        except Exception as exc:
            raise TypeError(f"cannot send {_name(fn)} to the ranks: {exc} (SPMD functions must "
                            "be defined at module level, their arguments picklable)") from None
        with self._lock:
            if not self._procs:
                self.start()
            elif not self.alive:  # started, not closed, and a rank is gone
                self._fail_idle_death(_name(fn))
            self._task += 1
            task = self._task
            self._in_call = True  # until every rank answered: an interrupt leaves it set
            for c in self._conns.values():
                c.send(("task", task, payload))
            out = self._collect(task, _name(fn), self.timeout_s if timeout is None else timeout)
            self._in_call = False
            return out

    def _collect(self, task: int, name: str, timeout: float) -> list[Outcome]:
        results: dict[int, Outcome] = {}
        start = time.monotonic()
        deadline = start + timeout
        by_conn = {c: r for r, c in self._conns.items()}
        stopped: dict[int, float] = {}  # rank -> when its process was first seen stopped
        while len(results) < self.size:
            pending = [c for c, r in by_conn.items() if r not in results]
            now = time.monotonic()
            self._watch_stopped(stopped, now, name, results)
            failed = [o.error for o in results.values() if not o.ok]
            if failed:
                deadline = min(deadline, self._first_failure_at + self.grace_s)
            if now >= deadline:
                graced = bool(failed) and self._first_failure_at + self.grace_s < start + timeout
                self._fail_timeout(name, timeout, results, failed, now - start, graced)
            for c in wait(pending, timeout=min(0.5, max(0.0, deadline - now))):
                rank = by_conn[c]
                try:
                    msg = c.recv()
                except (EOFError, OSError):
                    self._fail_death(name, rank, results)
                _, tid, r, ok, data = msg
                if tid != task:
                    continue
                if ok:
                    results[r] = Outcome(r, True, pickle.loads(data))
                else:
                    if not any(not o.ok for o in results.values()):
                        self._first_failure_at = time.monotonic()
                    results[r] = Outcome(r, False, None, data)
        return [results[r] for r in range(self.size)]


    def _watch_stopped(self, stopped: dict[int, float], now: float, name: str, results) -> None:
        """Note each rank whose process is stopped (state ``T``) and fail the call once one
        has been for ``stopped_s``: its peers would wait for it until the call's limit."""
        for r, pid in self._pids.items():
            if spawn.process_state(pid) == "T":
                stopped.setdefault(r, now)
            else:
                stopped.pop(r, None)
        late = sorted(r for r, t in stopped.items() if now - t >= self.stopped_s)
        if late:
            self._fail_stopped(name, late, results)


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


@atexit.register
def _close_all() -> None:
    for world in list(_LIVE):
        world.close()
