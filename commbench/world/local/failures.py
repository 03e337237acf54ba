"""How a local world says what went wrong: a call past its limit, a rank that died in a call
or between calls, a failure that left the others waiting. Each names the op, the ranks and
what every rank was doing (the status slots of :mod:`commbench.runtime.status` and the
kernel's process states), tears the world down, and raises; the next call starts a fresh one.
"""

from __future__ import annotations

import os

from commbench.runtime.errors import CallTimeout, RankDied, SPMDError, describe_hang
from commbench.runtime.status import read_slot
from commbench.world.local import spawn

__all__ = ["FailureReports"]


class FailureReports:
    """The reports of :class:`~commbench.world.local.world.LocalWorld` (its ``_dir``,
    ``_procs``, ``_pids``, ``launch``, ``size``, ``grace_s`` and ``close``)."""

    def _statuses(self) -> dict[int, tuple[str, int, str]]:
        assert self._dir is not None
        return {r: read_slot(os.path.join(self._dir, f"rank{r}")) for r in range(self.size)}

    def _processes(self) -> dict[int, str]:
        """rank -> its process's state as the kernel reports it (stopped, sleeping, ...)."""
        names = {"R": "running", "S": "sleeping", "D": "in uninterruptible wait",
                 "T": "stopped (SIGSTOP?)", "t": "stopped by a debugger", "Z": "dead (zombie)"}
        states = {r: (pid, spawn.process_state(pid)) for r, pid in self._pids.items()}
        return {r: f"{pid} {names.get(st, st)}" for r, (pid, st) in states.items() if st}

    def _fail_timeout(self, name, timeout, results, failed, waited, graced=False) -> None:
        statuses, processes = self._statuses(), self._processes()
        self.close()
        if failed:
            when = f"the first failure's grace of {self.grace_s:g} s" if graced else \
                f"the call's limit of {timeout:g} s"
            raise SPMDError(name, failed, note=f"the other ranks were then stuck (waited out "
                            f"{when}):\n" + describe_hang(statuses, processes))
        raise CallTimeout(f"{name} timed out after {waited:.1f} s (limit {timeout:.1f} s) on a "
                          f"world of {self.size}; finished: {sorted(results)}\n"
                          + describe_hang(statuses, processes))

    def _fail_stopped(self, name: str, ranks: list[int], results) -> None:
        statuses, processes, pids = self._statuses(), self._processes(), dict(self._pids)
        self.close()
        who = ", ".join(f"rank {r} (pid {pids.get(r, '?')})" for r in ranks)
        raise CallTimeout(f"{name}: {who} stopped (SIGSTOP: the kernel's state T) for "
                          f"{self.stopped_s:g} s or more, its peers waiting for it; finished: "
                          f"{sorted(results)}; the "
                          "world is torn down and the next call starts a fresh one\n"
                          + describe_hang(statuses, processes))

    def _fail_death(self, name: str, rank: int, results) -> None:
        statuses = self._statuses()
        codes = {i: p.poll() for i, p in enumerate(self._procs)}
        logs = spawn.log_tail(self._dir, 600)
        self.close()
        others = "\n".join(f"rank {r}: {t}" for r, (_, _, t) in sorted(statuses.items())
                           if r != rank)
        code = codes.get(rank if self.launch == "plain" else 0)
        how = f" (exit code {code})" if code is not None else ""
        raise RankDied(f"{name}: rank {rank} died{how} while {statuses[rank][2]}; the world is "
                       f"torn down and the next call starts a fresh one.\n{others}{logs}")

    def _idle_dead(self) -> tuple[list[int], int | None]:
        """(the ranks found dead between calls, the exit code where one is known): under
        mpiexec every rank that is gone (the launcher ends the others once one dies, so which
        went first cannot be told apart); rank 0 where mpiexec alone says so."""
        if self.launch == "plain":
            for r, proc in enumerate(self._procs):
                if proc.poll() is not None:
                    return [r], proc.poll()
        gone = [r for r, pid in sorted(self._pids.items()) if not spawn.running(pid)]
        if gone:
            return gone, None
        return [0], self._procs[0].poll() if self._procs else None

    def _fail_idle_death(self, name: str) -> None:
        """A rank died while the world waited for its next call: say so, never start another
        world in its place unasked (a sweep would go on with a replaced rank)."""
        ranks, code = self._idle_dead()
        logs = spawn.log_tail(self._dir, 600) if self._dir else ""
        self.close()
        how = f" (exit code {code})" if code is not None else ""
        who = f"rank {ranks[0]}" if len(ranks) == 1 else \
            f"ranks {', '.join(map(str, ranks))} (mpiexec ends the others once one dies)"
        raise RankDied(f"{name}: {who} died{how} between calls, before this one started; "
                       f"the world is torn down and the next call starts a fresh one.{logs}")
