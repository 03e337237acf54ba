"""A rank of the local world: joins the world once, then runs the driver's SPMD tasks.

Started by :class:`commbench.world.local.world.LocalWorld` as ``python -m commbench.world.local.worker``,
directly (gloo only) or under ``mpiexec`` (gloo and MPI). Two threads:

* the control thread reads the driver's connection and queues tasks; when the connection closes
  (the driver exited or gave the world up) it ends the process at once, even if the main thread is
  blocked inside a collective, so no rank outlives its driver;
* the main thread runs each task, ``fn(ctx, *args, **kwargs)``, and sends back its result or its
  exception with the traceback. Each task starts with an empty ledger.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import io
import json
import os
import pickle
import queue
import runpy
import select
import signal
import sys
import threading
import types
from multiprocessing.connection import Client

from commbench.runtime import shm
from commbench.runtime.board import Board
from commbench.runtime.errors import remote_error
from commbench.runtime.status import SlotSink, Tracker
from commbench.world.local.zygote import run_through


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (no-op elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class _Unpickler(pickle.Unpickler):
    """Finds functions of the driver's ``__main__`` script (the worker's own is this module)."""

    _main = None

    def find_class(self, module: str, name: str):
        path = os.environ.get("COMMBENCH_MAIN_FILE")
        if module == "__main__" and path:
            if _Unpickler._main is None:
                mod = types.ModuleType("__commbench_main__")
                mod.__dict__.update(runpy.run_path(path, run_name="__commbench_main__"))
                _Unpickler._main = mod
            return getattr(_Unpickler._main, name)
        return super().find_class(module, name)


def main(argv: list[str] | None = None) -> None:
    """A rank's process: where the world gave it a zygote (:mod:`.zygote`), the rank's
    stand-in, which has the rank forked there and ends as it ends; else the rank itself."""
    argv = sys.argv[1:] if argv is None else argv
    path = os.environ.get("COMMBENCH_ZYGOTE", "")
    if path not in ("", "0"):
        code = run_through(path, "commbench.world.local.worker:rank_main", argv)
        if code is not None:
            sys.stdout.flush()
            os._exit(code)
    rank_main(argv)


def rank_main(argv: list[str]) -> None:
    """Join the world and serve the driver's tasks (in a process of its own or forked by the
    zygote)."""

    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--store", required=True, help="the rendezvous FileStore's path")
    p.add_argument("--rank", type=int, default=-1)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--status-dir", required=True)
    p.add_argument("--backend", default="gloo")
    p.add_argument("--mpi", action="store_true")
    a = p.parse_args(argv)
    _die_with_parent()
    if a.mpi and "PMI_RANK" in os.environ and "MPI_LOCALRANKID" not in os.environ:
        # a local world's ranks share one host; gforker, which starts them, says only the rank
        os.environ["MPI_LOCALRANKID"] = os.environ["PMI_RANK"]
        os.environ["MPI_LOCALNRANKS"] = os.environ.get("PMI_SIZE", str(a.size))
    for entry in reversed(json.loads(os.environ.get("COMMBENCH_SYS_PATH", "[]"))):
        if entry not in sys.path:
            sys.path.insert(0, entry)

    host, port = a.address.rsplit(":", 1)
    conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ["COMMBENCH_AUTHKEY"]))
    rank = a.rank
    try:
        mpi_comm = None
        if a.mpi:
            # lazy: imports mpi4py
            from mpi4py import MPI

            mpi_comm = MPI.COMM_WORLD
            rank = mpi_comm.Get_rank()
            if mpi_comm.Get_size() != a.size:
                raise RuntimeError(
                    f"mpiexec was asked for {a.size} ranks but MPI.COMM_WORLD has "
                    f"{mpi_comm.Get_size()}: mpi4py uses "
                    f"{MPI.Get_library_version().splitlines()[0].strip()!r}, not this mpiexec's MPI")
        affinity = _bind(rank, a.size)
        conn.send(("hello", rank, os.getpid()))
        ctx = _join(a, rank, mpi_comm)
        ctx.affinity = affinity
    except BaseException as exc:  # report why this rank could not join, then leave
        conn.send(("fatal", rank, remote_error(rank, exc)))
        conn.close()
        os._exit(1)
    conn.send(("ready", rank, ctx.transports))
    _serve(conn, ctx, rank)


def _bind(rank: int, size: int):
    """Pin rank r to core r mod C of the C cores this process may use (as ``mpirun --bind-to
    core`` does, round-robin when oversubscribed): without it the scheduler moves busy-polling
    ranks around and timings shift from run to run. With more ranks than cores, ranks share a
    core, and a waiting rank's ``sched_yield`` hands it to a rank on that core (the noise it
    removed: docs/decisions.md). ``COMMBENCH_BIND=0`` leaves the ranks free.
    Returns ``affinity(bound)``, which binds every thread of this rank to its core or frees
    them to all cores (None: nothing to switch)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if os.environ.get("COMMBENCH_BIND", "1") == "0" or not cores:
        return None
    core = cores[rank % len(cores)]
    if size <= len(cores):  # start bound; sharing ranks start free (bound for MPI series only)
        os.sched_setaffinity(0, {core})

    def affinity(bound: bool) -> None:
        mask = {core} if bound else set(cores)
        for tid in os.listdir("/proc/self/task"):  # every thread, gloo's own included
            try:
                os.sched_setaffinity(int(tid), mask)
            except OSError:  # a thread that ended meanwhile
                pass

    affinity.core = core  # type: ignore[attr-defined]  # for commbench.collectives.measure.placement
    return affinity


def _join(a, rank: int, mpi_comm):
    # lazy: imports torch
    import torch.distributed as dist

    # lazy: imports torch
    from commbench.world.context import Context

    os.environ["COMMBENCH_STORE_PATH"] = a.store
    store = dist.FileStore(a.store, a.size)
    if a.backend != "mpi":
        kwargs = {}
        if a.backend == "nccl":
            # lazy: imports torch
            import torch

            kwargs["device_id"] = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(kwargs["device_id"])
        dist.init_process_group(a.backend, store=dist.PrefixStore("commbench", store), rank=rank,
                                world_size=a.size, timeout=datetime.timedelta(hours=1), **kwargs)
    tracker = Tracker(SlotSink(os.path.join(a.status_dir, f"rank{rank}")))
    return Context(rank=rank, size=a.size, local_rank=rank, launcher="local",
                   backend=a.backend if a.backend != "mpi" else None, mpi_comm=mpi_comm,
                   tracker=tracker, torch_ready=a.backend != "mpi",
                   board=Board(a.status_dir, rank))


def _serve(conn, ctx, rank: int) -> None:
    tasks: queue.Queue = queue.Queue()

    def control() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                shm.remove(shm.mapped_segments([os.getpid()]))  # no driver left to do it
                os._exit(0)  # the driver is gone: never outlive it
            if msg[0] == "exit":
                tasks.put(None)
                return
            tasks.put(msg)

    threading.Thread(target=control, name="commbench-control", daemon=True).start()
    while (msg := tasks.get()) is not None:
        _, task_id, payload = msg
        try:
            fn, args, kwargs = _Unpickler(io.BytesIO(payload)).load()
            name = getattr(fn, "__qualname__", repr(fn))
        except BaseException as exc:
            conn.send(("result", task_id, rank, False, remote_error(rank, exc)))
            continue
        ctx.ledger.clear()
        ctx.tracker.start_task(name)
        try:
            value = fn(ctx, *args, **kwargs)
            reply = ("result", task_id, rank, True, pickle.dumps(value))
        except BaseException as exc:
            reply = ("result", task_id, rank, False, remote_error(rank, exc))
        ctx.tracker.end_task()
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            conn.send(("result", task_id, rank, False, remote_error(rank, exc)))
    ctx.close()
    if ctx.mpi is not None:
        _leave_mpi()
    conn.close()
    os._exit(0)


def _leave_mpi(wait_s: float = 1.0) -> None:
    """Finalize MPI and tell the process manager this rank is done, as a normal exit would.

    MPICH's PMI client sends PMI-1's ``cmd=finalize`` from a C ``atexit`` handler, which
    ``os._exit`` skips; the process manager (gforker) then takes the rank for one that died and
    waits about a second per rank before it ends, so every closed world cost two seconds more
    (measured). The rank sends it itself where the manager gave it a PMI socket (``PMI_FD``), and
    waits at most ``wait_s`` for the acknowledgement: a library that had already sent it gets
    none, and the rank leaves all the same."""

    # lazy: imports mpi4py
    from mpi4py import MPI

    if not MPI.Is_finalized():
        MPI.Finalize()
    fd = os.environ.get("PMI_FD", "")
    if not fd.isdigit():
        return
    try:
        os.write(int(fd), b"cmd=finalize\n")
        if select.select([int(fd)], [], [], wait_s)[0]:
            os.read(int(fd), 64)
    except OSError:
        pass


if __name__ == "__main__":
    main()
