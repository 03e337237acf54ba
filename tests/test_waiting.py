"""How compiled schedules wait for MPI messages: the mode chosen from ranks per core, the
test-and-yield loop completing a request only once it is complete, bad settings refused.

That a yielding wait gives the same results as MPI's own is the bitwise property of
``test_schedule.py`` (``wait`` drawn there); here, the loop and the choice, without a world.
"""

from __future__ import annotations

import types

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from commbench.collectives.compiled import waiting
from commbench.collectives.compiled.waiting import wait_mode, waiter

pytestmark = [pytest.mark.collectives]


class _Pending:
    """An MPI request stand-in that completes on its ``after``-th Test (0: already complete)."""

    def __init__(self, after: int) -> None:
        self.after, self.tests, self.gives = after, 0, 0

    def Test(self) -> bool:  # noqa: N802 (mpi4py's name)
        self.tests += 1
        return self.tests > self.after

    def Wait(self) -> None:  # noqa: N802
        self.tests = self.after + 1

    @property
    def complete(self) -> bool:
        return self.tests > self.after


def _finish(req: _Pending, wait_loop) -> None:
    """Run ``wait_loop`` (the module's or a broken one) on ``req``, counting the yields."""
    def give() -> None:
        req.gives += 1

    wait_loop(req.Test, give)


def _one_test(test, give) -> None:
    """A broken wait: tests once, yields once, and returns whether or not the message is there."""
    test()
    give()


def loop_faults(wait_loop, after: int) -> list[str]:
    req = _Pending(after)
    _finish(req, wait_loop)
    out = []
    if not req.complete:
        out.append(f"returned after {req.tests} tests; the request completes on test {after + 1}")
    if req.tests != after + 1 or req.gives != after:
        out.append(f"{req.tests} tests and {req.gives} yields for a request pending {after}")
    return out


@given(after=st.integers(0, 50))
def test_a_yielding_wait_returns_exactly_when_the_request_completes(after):
    assert loop_faults(waiting._yield_wait, after) == []


def test_the_wait_check_catches_a_wait_that_gives_up():
    assert loop_faults(_one_test, 3)
    assert loop_faults(_one_test, 0)  # complete at once, yet it yielded: wasted, caught too


def test_waiter_binds_each_mode():
    req = _Pending(2)
    assert waiter(req, "spin") == req.Wait
    done = waiter(req, "yield")
    done()
    assert req.complete and req.tests == 3
    with pytest.raises(ValueError, match=r"wait='busy': must be one of spin, yield"):
        waiter(req, "busy")


def _mpich(local: int) -> dict[str, str]:
    return {"PMI_RANK": "0", "PMI_SIZE": str(2 * local), "MPI_LOCALRANKID": "0",
            "MPI_LOCALNRANKS": str(local)}


def mode_faults(rule, pairs) -> list[str]:
    """Where ``rule(env, cores)`` departs from: yield exactly when a host's ranks outnumber its
    cores."""
    return [f"{n} ranks on {c} cores: {got}" for n, c in pairs
            if (got := rule(_mpich(n), c)) != ("yield" if n > c else "spin")]


@given(local=st.integers(1, 64), cores=st.integers(1, 64))
def test_the_default_yields_exactly_when_ranks_outnumber_cores(local, cores):
    assert mode_faults(wait_mode, [(local, cores)]) == []


def test_the_mode_check_catches_the_comparison_turned_around():
    def turned(env, cores):  # broken: yields when the cores outnumber the ranks
        return "yield" if waiting.detect(env).local_size < cores else "spin"

    def off_by_one(env, cores):  # broken: yields with a core per rank
        return "yield" if waiting.detect(env).local_size >= cores else "spin"

    grid = [(n, c) for n in (1, 2, 4) for c in (1, 2, 4)]
    assert mode_faults(turned, grid) and mode_faults(off_by_one, grid)


def test_no_launcher_means_one_rank_here_and_spinning():
    assert wait_mode({}, 1) == "spin"


@pytest.mark.parametrize("mode", ["spin", "yield"])
def test_the_environment_overrides_the_default(mode):
    assert wait_mode({**_mpich(8), "COMMBENCH_WAIT": mode}, 2) == mode
    assert wait_mode({"COMMBENCH_WAIT": mode}, 64) == mode


def test_a_bad_setting_is_refused_before_any_message(monkeypatch):
    from commbench.collectives.compiled.schedule import Compiled

    with pytest.raises(ValueError, match=r"COMMBENCH_WAIT='poll': must be one of spin, yield"):
        wait_mode({"COMMBENCH_WAIT": "poll"}, 2)
    mpi = types.SimpleNamespace(transport="mpi")
    with pytest.raises(ValueError, match=r"ring_compiled: wait='poll': must be one of spin, yield"):
        Compiled(mpi, torch.zeros(4), None, [], "sum", "ring_compiled", wait="poll")
    monkeypatch.setenv("COMMBENCH_WAIT", "poll")
    with pytest.raises(ValueError, match=r"COMMBENCH_WAIT='poll'"):
        Compiled(mpi, torch.zeros(4), None, [], "sum", "ring_compiled")
    gloo = types.SimpleNamespace(transport="gloo")  # not MPI: the setting is not read
    assert Compiled(gloo, torch.zeros(4), None, [], "sum", "ring_compiled").wait == "spin"


@pytest.mark.world(sizes=[2, 4])
def test_the_ranks_of_a_local_mpi_world_count_themselves(world):
    """mpiexec tells each rank how many share its host; the studies record what they chose."""
    import os

    from commbench.collectives.compiled.waiting import rank_wait, recorded

    if "mpi" not in world.transports:
        pytest.skip("the local world has no MPI")
    want = "yield" if world.size > (os.cpu_count() or 1) else "spin"
    assert world.run(rank_wait) == [want] * world.size
    assert recorded(world).startswith(f"{want} (")
