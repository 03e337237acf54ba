"""The launcher world: the same ``run`` API as the local world, for a process a launcher started.

Under ``mpiexec -n 4 python -m pytest`` (or torchrun, srun) every rank runs the test; ``run(fn)``
calls ``fn(ctx, ...)`` on this rank, then all-gathers every rank's outcome, so every rank returns
the same list, or raises the same :class:`~commbench.runtime.errors.SPMDError`: one verdict everywhere, which
keeps hypothesis shrinking in step on all ranks.

A watchdog thread bounds each call. When it fires, each blocked rank posts what it is doing to the
torch store (a connection apart from the blocked collective), reads the others' posts for a few
seconds, prints which op hung and which ranks never arrived, and aborts the job (``MPI_Abort`` or
exit code 124) so the launcher takes every rank down instead of hanging.

With ``stop_on_raise`` (the audit: a user's script), a rank whose task raises prints its
traceback, posts a notice to the store and, like every rank that sees the notice, leaves with
exit code 3 if the task has not ended a poll later: its peers are then waiting in a collective
the raising rank will never join, and would wait until the timeout.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import sys
import threading
import time
import traceback
from typing import NoReturn

import torch.distributed as dist

from commbench.runtime import supervise
from commbench.runtime.errors import Outcome, SPMDError, describe_hang, remote_error
from commbench.world.context import Context

__all__ = ["LauncherWorld"]


RAISED_KEY = "commbench/raised/{task}"  # a rank's raised task: [rank, its error's last line]


class LauncherWorld:
    def __init__(self, ctx: Context, timeout_s: float | None = 300.0, *,
                 stop_on_raise: bool = False) -> None:
        self.ctx, self.timeout_s, self.stop_on_raise = ctx, timeout_s, stop_on_raise
        self.size, self.transports, self.launch = ctx.size, ctx.transports, ctx.launcher
        self._task = 0
        self._store = None  # a client of the world's store, for dead ranks' notices

    def start(self) -> LauncherWorld:
        return self

    @property
    def alive(self) -> bool:
        return True

    def close(self) -> None:
        # see Context.close; no timeout (the audit's default) waits as long as a bounded one
        limit = 30.0 if self.timeout_s is None else min(self.timeout_s, 30.0)
        self.ctx.close(together_s=limit)

    def run(self, fn, *args, timeout: float | None = None, **kwargs) -> list:
        outcomes = self.outcomes(fn, *args, timeout=timeout, **kwargs)
        failures = [o.error for o in outcomes if not o.ok]
        if failures:
            raise SPMDError(getattr(fn, "__qualname__", repr(fn)), failures)
        return [o.value for o in outcomes]

    def outcomes(self, fn, *args, timeout: float | None = None, **kwargs) -> list[Outcome]:
        ctx = self.ctx
        self._task += 1
        name = getattr(fn, "__qualname__", repr(fn))
        done = threading.Event()
        limit = self.timeout_s if timeout is None else timeout  # None: no watchdog
        dog = threading.Thread(target=self._watchdog, args=(done, limit, name, self._task),
                               daemon=True)
        dog.start()
        ctx.ledger.clear()
        ctx.tracker.start_task(name)
        try:
            try:
                mine = Outcome(ctx.rank, True, fn(ctx, *args, **kwargs))
                pickle.dumps(mine)
            except BaseException as exc:  # reported to every rank, re-raised by run()
                self._if_a_rank_died(exc)
                mine = Outcome(ctx.rank, False, None, remote_error(ctx.rank, exc))
                if self.stop_on_raise:
                    self._post_raised(name, exc)
            ctx.tracker.end_task()
            ctx.tracker.enter("gather of the task's results", ctx.world.ranks)
            try:
                everyone = self.agree(mine)
            except Exception as exc:  # noqa: BLE001 - a peer lost here too: see _if_a_rank_died
                self._if_a_rank_died(exc)
                raise
            ctx.tracker.leave("gather of the task's results")
        finally:  # the task's watchdog ends with it, also when an error leaves from here
            done.set()
            # Wait for it: its thread holds this world (a bound method) until it ends. Left to
            # a daemon thread, the last reference could go there, at exit, while the main thread
            # finalizes: the process groups' destructor then runs in a thread Python kills on
            # its way back to the GIL, and gloo's run ends in std::terminate ("terminate called
            # without an active exception"), now and then, under mpiexec on a loaded machine.
            dog.join()
        return everyone

    def agree(self, obj) -> list:
        """Every rank's ``obj``, on every rank, over the harness's channel (refusals, checks)."""
        return self.ctx.gather_objects(obj)

    def _watchdog(self, done: threading.Event, limit: float | None, name: str, task: int) -> None:
        if self._wait(done, limit, name):
            return
        ctx = self.ctx
        sink = ctx.tracker.sink
        statuses = {ctx.rank: ("in op" if sink.state == 2 else "in task", sink.seq, sink.text)}
        try:
            store = dist.distributed_c10d._get_default_store()
            # plain JSON, never pickle: whoever can write to a launcher's store must not be able
            # to make a rank run code
            store.set(f"commbench/hang/{task}/{ctx.rank}", json.dumps(statuses[ctx.rank]))
            store.set_timeout(datetime.timedelta(seconds=5))
            for r in range(ctx.size):
                if r != ctx.rank:
                    try:
                        statuses[r] = _status(store.get(f"commbench/hang/{task}/{r}"))
                    except Exception:
                        statuses[r] = ("unknown", -1, "did not answer (process stuck or gone)")
        except Exception:
            pass
        print(f"[rank {ctx.rank}] commbench: {name} timed out after {limit:.0f} s\n"
              + describe_hang(statuses), file=sys.stderr, flush=True)
        abort_nccl(ctx)
        if ctx.mpi is not None:
            ctx.mpi.Abort(124)
        os._exit(124)

    def _wait(self, done: threading.Event, limit: float | None, name: str) -> bool:
        """Wait for the task to end (True) or ``limit`` seconds to pass (False), looking every
        :data:`~commbench.runtime.supervise.POLL_S` seconds for a dead rank's notice in the
        world's store: one there ends this rank at once with exit code 3 (the dead rank's
        supervisor said the line; a collective here would wait for it until its timeout)."""
        deadline = None if limit is None else time.monotonic() + limit
        unreachable = 0
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if done.wait(supervise.POLL_S if left is None else min(left, supervise.POLL_S)):
                return True
            seen = self._dead_rank()
            if seen:
                self._leave()
            if self.stop_on_raise:
                raised = self._raised()
                if raised is not None and not done.wait(supervise.POLL_S):
                    rank, line = raised
                    self._leave(f"[rank {rank}] commbench: {name} stopped: rank {rank} of "
                                f"{self.ctx.size} raised {line} (its traceback is in the log)"
                                if rank == self.ctx.rank else "")
                if done.is_set():
                    return True
            # unreachable twice in a row, a poll apart (once may be rank 0 leaving as this task
            # ends here): rank 0, the store's host, is gone, and rank 1 says so
            unreachable = unreachable + 1 if seen is None else 0
            if unreachable >= 2:
                self._leave(f"[rank {self.ctx.rank}] commbench: {name} stopped: rank 0, the "
                            "host of the world's store, is gone" if self.ctx.rank == 1 else "")

    def _post_raised(self, name: str, exc: BaseException) -> None:
        """This rank's task raised: its traceback to the log (stderr), a notice to the store."""

        last = (traceback.format_exception_only(exc)[-1].strip() or type(exc).__name__)[:300]
        print(f"[rank {self.ctx.rank}] commbench: {name} raised on rank {self.ctx.rank}:\n"
              + "".join(traceback.format_exception(exc)), file=sys.stderr, flush=True)
        try:
            self._client().set(RAISED_KEY.format(task=self._task),
                               json.dumps([self.ctx.rank, last]))
        except Exception:  # noqa: BLE001 - no store: the timeout still ends the task
            pass

    def _raised(self) -> tuple[int, str] | None:
        """(rank, its error's last line) of a rank whose task raised, from the store."""
        key = RAISED_KEY.format(task=self._task)
        try:
            store = self._client()
            if not store.check([key]):
                return None
            rank, line = json.loads(store.get(key).decode("utf-8", errors="replace"))
            return int(rank), str(line)
        except Exception:  # noqa: BLE001 - unreadable or out of reach: nothing seen
            return None

    def _client(self):
        if self._store is None:
            if self.ctx.store_address is None:
                raise ConnectionError("no store address")
            self._store = supervise.store_client(self.ctx.store_address)
        return self._store

    def _if_a_rank_died(self, exc: BaseException) -> None:
        """After ``exc``, a transport's word for a lost peer: if a dead rank's notice comes
        within a few seconds (its supervisor posts it), leave quietly as :meth:`_leave` does.
        After an interruption (torchrun signals every rank once one has left) only a notice
        already there counts."""
        if isinstance(exc, KeyboardInterrupt):  # the launcher's SIGTERM after the dead rank left
            if self._dead_rank():
                self._leave()
            return
        if not _peer_lost(exc):
            return
        until = time.monotonic() + 3 * supervise.POLL_S
        while time.monotonic() < until:
            if self._dead_rank():
                self._leave()
            time.sleep(0.5)

    def _dead_rank(self) -> bool | None:
        """Whether the world's store holds a dead rank's notice; None: the store is out of
        reach."""
        try:
            if self._store is None and self.ctx.store_address is None:
                return False
            return supervise.death_notice(self._client()) is not None
        except Exception:  # noqa: BLE001 - whatever the store raises, it is out of reach
            self._store = None
            return None

    def _leave(self, line: str = "") -> NoReturn:
        """End this rank with exit code 3 after a rank died (its supervisor said the line)."""
        if line:
            print(line, file=sys.stderr, flush=True)
        abort_nccl(self.ctx)
        if not supervise.leave_hydra(self.ctx.launcher) and self.ctx.mpi is not None:
            self.ctx.mpi.Abort(3)  # the launcher takes every rank down
        os._exit(3)


def _peer_lost(exc: BaseException) -> bool:
    """Whether ``exc`` reads as a transport's word for a peer that went away."""
    text = str(exc)
    return any(w in text for w in ("Connection reset by peer", "Connection closed by peer",
                                   "remote process exited", "Broken pipe"))


def _status(raw: bytes) -> tuple:
    """A rank's hang status as posted to the store: (state, seq, text), checked field by field."""
    value = json.loads(raw.decode("utf-8", errors="replace"))
    if not (isinstance(value, list) and len(value) == 3 and isinstance(value[0], str)
            and isinstance(value[1], int) and isinstance(value[2], str)):
        raise ValueError(f"a hang status must be [state, seq, text], got {value!r:.80}")
    return value[0][:40], value[1], value[2][:500]


def abort_nccl(ctx) -> None:
    """Abort this rank's NCCL communicators before it exits on a hang: their kernels may be
    spinning on the GPU, waiting for a peer that will never post (ncclCommAbort frees them and
    the peers' matching calls fail instead of hanging)."""
    if ctx.backend != "nccl":
        return
    try:
        dist.distributed_c10d._abort_process_group()  # every group of this rank
    except Exception as exc:  # noqa: BLE001 - exiting anyway; say why the abort failed
        print(f"[rank {ctx.rank}] commbench: aborting NCCL failed: {exc}", file=sys.stderr)
