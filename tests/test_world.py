"""The local world: results and exceptions from every rank, hangs and dead ranks bounded, no orphans.

Hangs and kills tear a world down, so those tests use worlds of their own and leave the session's
worlds alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import types

import pytest

from commbench.collectives.measure import placement
from commbench.runtime.errors import CallTimeout, RankDied, SPMDError
from commbench.world.local import LocalWorld
from commbench.world.local.spawn import mpi_usable

pytestmark = pytest.mark.foundation
local = pytest.mark.local
LAUNCHES = ["plain", pytest.param("mpi", marks=pytest.mark.skipif(
    not mpi_usable(), reason="mpi4py or mpiexec is not installed"))]


def _identity(ctx, tag):
    return (ctx.rank, ctx.size, tag, os.getpid())


def _raise_on_odd(ctx):
    if ctx.rank % 2:
        raise ValueError(f"odd rank {ctx.rank} refuses")
    return ctx.rank


def _barrier_on_rank0(ctx):
    if ctx.rank == 0:
        ctx.comm().barrier(ctx.world)


def _all_reduce_but_one_dies(ctx, victim):
    import torch

    if ctx.rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    return ctx.comm().all_reduce(torch.ones(4), ctx.world).tolist()


def _raise_then_others_wait(ctx):
    if ctx.rank == 1:
        raise RuntimeError("rank 1 gives up before the all-reduce")
    import torch

    ctx.comm().all_reduce(torch.ones(1), ctx.world)


@pytest.mark.world(sizes=[1, 2, 3, 4])
def test_results_from_every_rank(world):
    out = world.run(_identity, "t")
    assert [o[:3] for o in out] == [(r, world.size, "t") for r in range(world.size)]
    assert len({o[3] for o in out}) == world.size  # one process per rank


@pytest.mark.world(sizes=[2, 3, 4])
def test_exceptions_from_every_failing_rank(world):
    with pytest.raises(SPMDError) as info:
        world.run(_raise_on_odd)
    failures = info.value.failures
    assert [f.rank for f in failures] == list(range(1, world.size, 2))
    assert all(f.type_name == "ValueError" and "_raise_on_odd" in f.traceback for f in failures)
    assert isinstance(failures[0].exception(), ValueError)
    outcomes = world.outcomes(_raise_on_odd)
    assert [o.ok for o in outcomes] == [r % 2 == 0 for r in range(world.size)]
    assert world.run(_identity, "after")[0][2] == "after"  # the world survives a raise


def _thread_affinities(ctx):
    """Each rank's thread masks bound, then freed (then bound again, as the world started)."""
    if ctx.affinity is None:
        return None
    masks = []
    for bound in (True, False, True):
        ctx.affinity(bound)
        masks.append({frozenset(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")})
    ctx.affinity(ctx.size <= len(next(iter(masks[1]))))  # as it started: sharing ranks free
    return ctx.rank, masks


@pytest.mark.world(sizes=[2, 4])
def test_affinity_binds_and_frees_every_thread_of_a_rank(world):
    """Rank r binds to core r mod C, also when ranks outnumber the cores (they share)."""
    cores = sorted(os.sched_getaffinity(0))
    if not isinstance(world, LocalWorld) or os.environ.get("COMMBENCH_BIND") == "0":
        pytest.skip("a launcher binds its own ranks; COMMBENCH_BIND=0 binds none")
    results = world.run(_thread_affinities)
    for rank, (bound, free, again) in results:
        assert bound == {frozenset({cores[rank % len(cores)]})}, bound  # its core, every thread
        assert free == {frozenset(cores)} and again == bound
    expected = [cores[r % len(cores)] for r in range(world.size)]
    assert placement(world) == f"MPI series: rank r on core {expected}[r]; gloo series free"


@local
def test_unpicklable_function_is_refused_before_sending():
    w = LocalWorld(2)
    with pytest.raises(TypeError, match="module level"):
        w.run(lambda ctx: 0)
    assert not w.alive  # nothing was started for it


@local
def test_a_start_s_own_work_runs_once_the_ranks_processes_exist():
    """``start(meanwhile=...)`` runs the driver's own work (commbench.cli.checks.start_world:
    its import of torch) after the ranks' processes are made, before they are waited for."""
    w = LocalWorld(1, launch="plain")
    seen = []
    try:
        w.start(meanwhile=lambda: seen.append((len(w._procs), w.alive)))
        assert seen == [(1, False)] and w.alive
        w.start(meanwhile=lambda: seen.append("again"))  # alive: no start, no work
        assert seen == [(1, False)]
    finally:
        w.close()


@local
def test_planted_hang_names_op_and_missing_ranks():
    with LocalWorld(3) as w:
        pids = list(w.pids.values())
        with pytest.raises(CallTimeout) as info:
            w.run(_barrier_on_rank0, timeout=3.0)
        msg = str(info.value)
        assert "_barrier_on_rank0 timed out" in msg
        assert "barrier (call #1) on group [0, 1, 2]: ranks [0] arrived, ranks [1, 2] did not" in msg
        assert "rank 1: finished _barrier_on_rank0" in msg
        assert not any(_alive(p) for p in pids), "a timed-out world left processes behind"


@local
@pytest.mark.parametrize("launch", LAUNCHES)
def test_killed_rank_fails_fast_and_next_call_works(launch):
    """Noticed by the death itself (RankDied), not by the call's timeout (CallTimeout)."""
    with LocalWorld(2, launch=launch, timeout_s=600) as w:
        with pytest.raises(RankDied) as info:
            w.run(_all_reduce_but_one_dies, 1)
        assert "rank 1 died" in str(info.value) and "_all_reduce_but_one_dies" in str(info.value)
        assert w.run(_all_reduce_but_one_dies, -1) == [[2.0] * 4] * 2  # a fresh world
        assert w.starts == 2


@local
@pytest.mark.parametrize("launch", LAUNCHES)
def test_a_rank_killed_between_calls_is_named_not_replaced(launch):
    """A sweep between two rows must not go on with a fresh rank in a dead one's place."""
    with LocalWorld(2, launch=launch) as w:
        pids = w.run(_pid)
        os.kill(pids[1], signal.SIGKILL)
        while _alive(pids[1]):
            time.sleep(0.01)
        # under mpiexec the launcher ends rank 0 once rank 1 is gone: which of the two the
        # world finds dead depends on timing, so it names every one it finds
        with pytest.raises(RankDied, match=r"rank 1 died.* between calls" if launch == "plain"
                           else r"(rank 1|ranks 0, 1 \(mpiexec ends the others once one "
                                r"dies\)) died.* between calls"):
            w.run(_pid)
        assert len(w.run(_pid)) == 2 and w.starts == 2  # asked again: a fresh world


@local
@pytest.mark.skipif(not mpi_usable(), reason="needs mpiexec and mpi4py")
def test_an_mpi_world_leaves_no_shared_memory_behind():
    """MPICH unlinks its segment only in MPI_Finalize, which the ranks never reach: the world
    removes the segments its ranks map when it closes, after a killed rank too, and when every
    rank is gone before it closes (noted at start: a dead process's maps say nothing)."""
    from commbench.runtime import shm

    for kill in ([], [1], [0, 1]):
        w = LocalWorld(2, launch="mpi").start()
        segments = shm.mapped_segments(w.pids.values())
        assert segments and all(os.path.exists(s) for s in segments)
        for r in kill:
            os.kill(w.pids[r], signal.SIGKILL)
        while len(kill) == 2 and any(_alive(p) for p in w.pids.values()):
            time.sleep(0.01)
        w.close()
        assert not any(os.path.exists(s) for s in segments), (kill, segments)


@local
def test_a_raise_does_not_leave_the_others_waiting_forever():
    """Ended by the grace after the first failure, not by the call's limit (the note says
    which: no clock in the verdict)."""
    with LocalWorld(2, launch="plain", grace_s=1.0) as w:
        with pytest.raises(SPMDError) as info:
            w.run(_raise_then_others_wait, timeout=300)
        msg = str(info.value)
        assert "waited out the first failure's grace of 1 s" in msg, msg
        assert "rank 1 gives up" in msg and "all_reduce (call #1) on group [0, 1]" in msg


DRIVER = textwrap.dedent("""
    import os, sys
    from commbench.world.local import LocalWorld
    w = LocalWorld(2, launch=sys.argv[1]).start()
    print(" ".join(str(p) for p in w.pids.values()), flush=True)
    os._exit(0)  # no atexit, no close: the ranks must notice on their own
""")


@local
def test_no_rank_outlives_a_driver_that_vanishes(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    launches = ["plain", "mpi"] if mpi_usable() else ["plain"]
    drivers = [subprocess.Popen([sys.executable, str(script), launch], stdout=subprocess.PIPE,
                                text=True) for launch in launches]
    pids = []
    for d in drivers:
        out, _ = d.communicate(timeout=120)
        assert d.returncode == 0
        pids += [int(p) for p in out.split()]
    assert len(pids) == 2 * len(launches)
    deadline = time.monotonic() + 120  # a bound for "never", not a speed
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), "ranks outlived their driver"


def _pid(ctx) -> int:
    return os.getpid()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes; reap it if it is ours
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@local
def test_start_up_keeps_its_deadline_with_a_rank_that_connects_and_never_speaks():
    """Under MPI a rank says hello only after MPI_Init, which waits for every rank: start-up must
    not wait on a connected rank's first message past ``start_timeout_s`` (it once blocked for
    ever on one, while the rank it waited for never got its connection accepted)."""
    import threading
    from multiprocessing.connection import Client, Listener

    from commbench.runtime.errors import WorldError
    from commbench.world.local.spawn import accept_ranks

    key = b"k" * 16
    listener = Listener(("127.0.0.1", 0), authkey=key)
    silent = []
    threading.Thread(target=lambda: silent.append(Client(listener.address, authkey=key)),
                     daemon=True).start()
    failed: list[Exception] = []

    def start() -> None:
        try:
            accept_ranks(listener, [], 2, 1.0, None, {})
        except WorldError as exc:
            failed.append(exc)

    starter = threading.Thread(target=start, daemon=True)
    starter.start()
    starter.join(20)
    listener.close()
    assert not starter.is_alive(), "start-up waited past its deadline"
    assert "only ranks [] were ready after 1 s (0 said hello, 1 connected silent)" in str(failed[0])


def _accept_from_a_rank_that_dies(folder, log_text: str):
    """accept_ranks against one rank that connects and closes without a hello, its log saying
    ``log_text``: the exception it raises."""
    import threading
    from multiprocessing.connection import Client, Listener

    from commbench.runtime.errors import WorldError
    from commbench.world.local.spawn import accept_ranks

    (folder / "ranks.log").write_text(log_text)
    key = b"k" * 16
    listener = Listener(("127.0.0.1", 0), authkey=key)
    # the handshake needs the listener accepting, which accept_ranks does
    threading.Thread(target=lambda: Client(listener.address, authkey=key).close(),
                     daemon=True).start()
    try:
        accept_ranks(listener, [], 2, 20.0, str(folder), {})
    except WorldError as exc:
        return exc
    finally:
        listener.close()
    raise AssertionError("accept_ranks returned with a rank that closed its connection")


@local
def test_a_failed_mpi_init_is_told_apart_from_any_other_dead_rank(tmp_path):
    from commbench.world.local.spawn import InitFailed

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    mpich = ("Abort(609895822) on node 0: Fatal error in internal_Init_thread: Message "
             "truncated, error stack:\nMPIDIG_recv_type_init(74): Message from rank 1 truncated")
    init = _accept_from_a_rank_that_dies(tmp_path / "a", mpich)
    other = _accept_from_a_rank_that_dies(tmp_path / "b", "Segmentation fault")
    assert isinstance(init, InitFailed) and "Message truncated" in str(init)
    assert not isinstance(other, InitFailed) and "Segmentation fault" in str(other)


def test_a_start_whose_mpi_init_failed_is_tried_once_more_and_only_once(monkeypatch, capsys):
    from commbench.world.local.spawn import InitFailed

    tries: list[int] = []

    def fails(times: int):
        def _start(self, meanwhile=None):
            tries.append(1)
            if len(tries) <= times:
                raise InitFailed("local world of 2: ...\nMessage from rank 1 truncated")
            return self
        return _start

    world = LocalWorld(2, launch="plain")
    world.launch = "mpi"  # the retry is for MPICH's start-up only
    monkeypatch.setattr(LocalWorld, "_start", fails(1))
    assert world.start() is world and len(tries) == 2
    assert "MPI_Init failed inside MPICH (Message from rank 1 truncated)" in capsys.readouterr().err
    tries.clear()
    monkeypatch.setattr(LocalWorld, "_start", fails(2))
    with pytest.raises(InitFailed):
        world.start()
    assert len(tries) == 2
    tries.clear()
    world.launch = "plain"
    with pytest.raises(InitFailed):
        world.start()
    assert len(tries) == 1


def _unsorted_group(ctx):
    try:
        ctx.group(tuple(reversed(range(ctx.size))))
    except ValueError as exc:
        return str(exc)
    return ""


@pytest.mark.world(min_size=2)
def test_a_group_s_ranks_out_of_order_are_refused_before_any_collective(world):
    """torch sorts a new group's ranks, MPI's split keeps the order given: a group listed out of
    order would number its members two ways."""
    said = world.run(_unsorted_group)
    assert all("ranks must be in ascending order" in s for s in said)
    assert all(s == said[0] for s in said)


def test_a_stopped_rank_is_named_after_a_quarter_of_the_call_s_limit_at_most_10_s():
    assert [LocalWorld(2, timeout_s=t).stopped_s for t in (120.0, 40.0, 20.0, 2.0)] == \
        [10.0, 10.0, 5.0, 0.5]
    assert LocalWorld(2, timeout_s=20.0, stopped_s=1.0).stopped_s == 1.0


class _Clock:
    """A fake ``time`` for the world module: sleeping moves it on, nothing waits."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def _held_world(monkeypatch) -> tuple[LocalWorld, list]:
    """A world of two ranks that never leave by themselves, and when its kill comes, by a fake
    clock."""
    import commbench.world.local.world as module

    clock, killed = _Clock(), []
    monkeypatch.setattr(module, "time", clock)
    monkeypatch.setattr(module.spawn, "running", lambda pid: not killed)
    w = LocalWorld(2)
    w._pids = {0: -1, 1: -1}
    w._procs = [types.SimpleNamespace(poll=lambda: 0 if killed else None) for _ in range(2)]
    w._conns = {r: types.SimpleNamespace(send=lambda msg: None, close=lambda: None)
                for r in range(2)}
    monkeypatch.setattr(w, "_kill", lambda: killed.append(clock.now))
    return w, killed


def test_ranks_held_in_a_call_are_killed_without_waiting_for_them_to_leave(monkeypatch):
    """A close asks each rank to leave and gives them 2 s before it kills them. Ranks closed
    in the middle of a call (it timed out, a rank is stopped or died in it, the driver was
    interrupted) cannot read the request before the call ends, so they are killed at once and
    the failure named up to 2 s sooner. Each failure is raised while the world collects a
    call's answers, as here."""
    from commbench.world.local import failures

    w, killed = _held_world(monkeypatch)
    w.close()
    assert killed == [pytest.approx(2.0, abs=0.05)]  # between calls: the polite wait
    monkeypatch.setattr(failures, "describe_hang", lambda *a: "")
    held = {0: ("op", 1, "in f"), 1: ("op", 1, "in f")}
    for how, error in (("interrupt", KeyboardInterrupt), ("timeout", CallTimeout),
                       ("stopped", CallTimeout), ("death", RankDied)):
        w, killed = _held_world(monkeypatch)
        monkeypatch.setattr(w, "_statuses", lambda: held)
        monkeypatch.setattr(w, "_processes", dict)

        def collect(task, name, timeout, w=w, how=how):
            if how == "interrupt":
                raise KeyboardInterrupt
            if how == "timeout":
                w._fail_timeout(name, timeout, {}, [], timeout)
            if how == "stopped":
                w._fail_stopped(name, [1], {})
            w._fail_death(name, 1, {})

        monkeypatch.setattr(w, "_collect", collect)
        with pytest.raises(error):
            w.run(_pid)
        if how == "interrupt":
            w.close()  # as a driver does once interrupted
        assert killed == [0.0], how


@pytest.mark.parametrize(("said", "euid", "spread", "env"), [
    ("mpiexec (OpenRTE) 4.1.4", 0, ["--oversubscribe"],
     {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}),
    ("mpiexec (Open MPI) 5.0.7", 1000, ["--map-by", ":OVERSUBSCRIBE"], {}),
    ("HYDRA build details:\n    Version: 5.0.2", 0, [], {}),
])
def test_a_local_world_starts_open_mpi_s_ranks_on_few_cores_and_as_root(tmp_path, monkeypatch,
                                                                        said, euid, spread, env):
    """Open MPI's mpiexec (a GPU container's, where the user is root) refuses more ranks than
    cores and any rank as root unless told; the local world's ranks are told. MPICH's mpiexec
    is left as it is. An H200 machine's gpu-check failed on this before."""
    from commbench.world.local import spawn

    fake = tmp_path / "mpiexec"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' '{said}'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(spawn, "local_mpiexec", lambda: str(fake))
    monkeypatch.setattr(spawn.os, "geteuid", lambda: euid)
    spawn.open_mpi_version.cache_clear()
    assert spawn.launcher(4) == ([str(fake), "-n", "4", *spread], env)


class _CountedRanks(tuple):
    """A group's ranks that count how often they are written out."""

    writes = 0

    def __iter__(self):
        type(self).writes += 1
        return super().__iter__()


def test_the_status_writes_a_group_out_once_for_a_loop_of_its_calls():
    """Each call publishes 'op (call #N) on group [...]'; a loop's calls share their group, and
    writing 512 ranks out on every call cost 36 us a call (in a batch, timed). The text is the
    same; the group is written out once while it stays the same."""
    from commbench.runtime.status import MemorySink, Tracker

    sink = MemorySink()
    t = Tracker(sink)
    group = _CountedRanks(range(512))
    for _ in range(100):
        t.enter("all_reduce", group)
        t.leave("all_reduce")
    assert _CountedRanks.writes == 1
    t.enter("all_reduce", group)
    assert sink.text == f"all_reduce (call #101) on group {list(range(512))}"
    t.enter("barrier", (0, 1, 2))  # another group: its own text
    assert sink.text == "barrier (call #102) on group [0, 1, 2]"
