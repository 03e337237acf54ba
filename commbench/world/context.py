"""One rank's view of the world: transports, groups, grids, comms, ledger and tracker.

A :class:`Context` is made once per process, either from a launcher's environment
(:meth:`Context.from_launcher`, under torchrun, mpirun, mpiexec or srun) or by a worker of the
local world (:mod:`commbench.world.local.worker`). SPMD functions receive it as their first argument;
nothing about groups or ledgers lives in a global.

Transports: the torch.distributed backend (``"gloo"`` on CPU, ``"nccl"`` when CUDA is present, or
``COMMBENCH_BACKEND``) and ``"mpi"`` when an MPI world exists. Group creation is collective over
the whole world: every rank calls :meth:`Context.group` and :meth:`Context.grid` with the same
arguments in the same order, as torch's ``new_group`` requires.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.distributed as dist

from commbench.runtime import supervise
from commbench.runtime.board import Board
from commbench.runtime.group import Grid, Group, grid_groups, parse_grid
from commbench.runtime.launch import LaunchError, LaunchInfo, detect, rendezvous, shared_gpu
from commbench.runtime.nodes import NodeLayout
from commbench.runtime.status import Tracker
from commbench.wire.comm import Comm
from commbench.wire.ledger import Ledger
from commbench.wire.splits import Creation
from commbench.wire.transport.mpi_backend import MPIBackend
from commbench.wire.transport.torch_backend import TorchBackend

__all__ = ["Context", "default_backend", "import_mpi", "mpi_mismatch"]


def default_backend() -> str:
    env = os.environ.get("COMMBENCH_BACKEND")
    if env:
        if env not in ("gloo", "nccl", "mpi"):
            raise LaunchError(f"COMMBENCH_BACKEND={env!r}: must be gloo, nccl or mpi")
        return env
    return "nccl" if torch.cuda.is_available() else "gloo"


def mpi_mismatch(launcher: str, library: str) -> str | None:
    """Why the MPI library mpi4py loads cannot join the world of ``launcher``, or None.

    Open MPI's mpirun speaks PMIx, which the MPICH family (MPICH, Intel MPI, MVAPICH) does not:
    such a rank aborts inside MPI_Init; MPICH's mpiexec under an Open MPI library gives every
    rank a world of one. Both are caught here, before MPI_Init, from the library's version."""
    openmpi = "Open MPI" in library
    if (launcher == "openmpi" and not openmpi) or (launcher == "mpich" and openmpi):
        first = " ".join(library.splitlines()[0].split()) if library else "an unknown MPI"
        runner = {"openmpi": "Open MPI's mpirun",
                  "mpich": "a PMI launcher (MPICH's mpiexec, srun --mpi=pmi2)"}[launcher]
        return (f"{runner} started this rank but mpi4py loads {first!r}: use the mpiexec of that "
                "MPI, or install mpi4py with the MPI of this launcher (README: switching MPI)")
    return None


def import_mpi(launcher: str | None = None):
    """``mpi4py.MPI``, initialised, or None when mpi4py or its MPI library is missing. With the
    ``launcher`` that started this rank, a library of another MPI raises :class:`LaunchError`
    before MPI_Init (:func:`mpi_mismatch`)."""
    try:
        # lazy: imports mpi4py
        import mpi4py

        if "mpi4py.MPI" not in sys.modules:
            mpi4py.rc.initialize = False
            mpi4py.rc.finalize = True
        # lazy: imports mpi4py
        from mpi4py import MPI
    except (ImportError, RuntimeError, OSError):
        return None
    if not MPI.Is_initialized():
        why = mpi_mismatch(launcher, MPI.Get_library_version()) if launcher else None
        if why:
            raise LaunchError(why)
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    return MPI


def _no_colour_split() -> None:
    """The no-colour ``ncclCommSplit`` that torch's ``new_group`` makes on every non-member of a
    new group, made here by a member of a new gloo group, which torch leaves out: without it the
    non-members make one split more and every later group's split pairs with the wrong one
    (:mod:`commbench.wire.splits`). Only under eager init (a device bound to the default group),
    where torch splits at all."""
    default = dist.distributed_c10d._get_default_group()
    device = getattr(default, "bound_device_id", None)
    if device is None:
        return
    backend = default._get_backend(device)
    while hasattr(backend, "wrapped_pg"):  # TORCH_DISTRIBUTED_DEBUG's wrapper
        backend = backend.wrapped_pg
    if getattr(backend, "supports_splitting", False):
        backend.perform_nocolor_split(device)


class Context:
    def __init__(self, *, rank: int, size: int, local_rank: int = 0, launcher: str = "none",
                 backend: str | None = None, mpi_comm=None, tracker: Tracker | None = None,
                 torch_ready: bool = True, debug: bool | None = None,
                 board: Board | None = None) -> None:
        self.rank, self.size, self.local_rank, self.launcher = rank, size, local_rank, launcher
        # debug: members check that they agree on every collective first (commbench.runtime.debug)
        self.debug = os.environ.get("COMMBENCH_DEBUG") == "1" if debug is None else debug
        self.backend = backend if torch_ready else None
        self.mpi = mpi_comm
        self.tracker = tracker or Tracker()
        self.board = board  # ranks on one host: debug mode agrees through it (runtime.board)
        self.ledger = Ledger()
        # local worlds: affinity(bound) binds this rank's threads to its core or frees them
        self.affinity: Callable[[bool], None] | None = None
        # ranks per node when the world spans hosts of as many adjacent ranks each (else None:
        # one host, where algorithms that follow nodes take nodes of 2 ranks)
        self.node_size: int | None = None
        # the launcher world's TCP store, (host, port): a dead rank's notice is read there
        self.store_address: tuple[str, int] | None = None
        self.device = torch.device("cpu")
        if self.backend == "nccl":
            self.device = torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
        self._groups: dict[tuple[int, ...], Group] = {}
        self._comms: dict[str, Comm] = {}
        # every new_group this rank calls, as an NCCL world would call them (wire/splits.py)
        self.creations: list[Creation] = [Creation(tuple(range(size)), "gloo")]
        side = dist.new_group(backend="gloo") if self.backend == "nccl" else None
        self.world = Group(tuple(range(size)), rank, "world",
                           dist.group.WORLD if self.backend else None, mpi_comm, side)
        self._groups[self.world.ranks] = self.world

    # -- construction from a launcher ---------------------------------------------------------
    @classmethod
    def from_launcher(cls, backend: str | None = None, *, use_mpi: bool | None = None,
                      timeout_s: float = 600.0, info: LaunchInfo | None = None,
                      pg_backend: str | None = None) -> Context:
        """Join the world that torchrun, mpirun/mpiexec or srun started. ``pg_backend``: the
        string given to ``init_process_group`` when it differs from ``backend`` (the audit's
        ``cpu:gloo,cuda:nccl``, so that a script's CPU collectives find gloo beside NCCL)."""
        info = info or detect()
        MPI = None
        if use_mpi or (use_mpi is None and info.is_mpi):
            MPI = import_mpi(info.launcher if info.launched else None)
            if MPI is None and use_mpi:
                raise LaunchError("use_mpi=True but mpi4py or its MPI library cannot be loaded")
        mpi_comm = MPI.COMM_WORLD if MPI else None
        if MPI is not None:
            supervise.tell_segments()  # removed by the supervisor if this rank dies or aborts
        if mpi_comm is not None and info.launched and mpi_comm.Get_size() != info.size:
            raise LaunchError(
                f"{info.launcher} says {info.size} ranks ({info.source}) but MPI.COMM_WORLD has "
                f"{mpi_comm.Get_size()}: mpi4py is linked against "
                f"{MPI.Get_library_version().splitlines()[0].strip()!r}, not the MPI of this "
                "launcher. Rebuild mpi4py for it (pip install --no-binary mpi4py mpi4py) or use "
                "the matching mpiexec.")
        backend = backend or default_backend()
        torch_ready = backend != "mpi"
        store_address = None
        if torch_ready and not dist.is_initialized():
            addr, port = rendezvous(info, mpi_comm=mpi_comm)

            supervise.tell_store(addr, port)  # where a dead rank's supervisor posts its death
            store_address = (addr, port)
            kwargs = {}
            if backend == "nccl":
                why = shared_gpu(info, torch.cuda.device_count())
                if why:
                    raise LaunchError(why)
                torch.cuda.set_device(info.local_rank % torch.cuda.device_count())
                kwargs["device_id"] = torch.device("cuda", torch.cuda.current_device())
            dist.init_process_group(pg_backend or backend, init_method=f"tcp://{addr}:{port}",
                                    rank=info.rank,
                                    world_size=info.size,
                                    timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
        if torch_ready and dist.get_world_size() != info.size:
            raise LaunchError(f"{info.launcher} says {info.size} ranks but torch.distributed "
                              f"formed a world of {dist.get_world_size()}")
        ctx = cls(rank=info.rank, size=info.size, local_rank=info.local_rank,
                  launcher=info.launcher, backend=backend if torch_ready else None,
                  mpi_comm=mpi_comm, torch_ready=torch_ready)
        ctx.node_size = ctx.nodes().node_size() if info.size > 1 else None
        ctx.store_address = store_address
        return ctx

    def nodes(self):
        """Every rank's host, gathered (collective over the world): a
        :class:`~commbench.runtime.nodes.NodeLayout`."""

        return NodeLayout(tuple(self.gather_objects(socket.gethostname())))

    def gather_objects(self, obj) -> list:
        """Every rank's picklable ``obj`` in rank order, over the harness's channel: MPI when
        the world has it, else the world's side gloo group on NCCL, else the gloo world; never
        the benchmark's NCCL communicator (a harness call there would sit in its stream's order
        and, after one rank failed alone, mismatch the collectives of the others)."""
        if self.mpi is not None:
            return self.mpi.allgather(obj)
        if not self.backend:
            return [obj]
        out: list = [None] * self.size
        dist.all_gather_object(out, obj, group=self.world.side_pg)  # None: the gloo world
        return out

    # -- transports ---------------------------------------------------------------------------
    @property
    def transports(self) -> tuple[str, ...]:
        return tuple(t for t in (self.backend, "mpi" if self.mpi is not None else None) if t)

    def comm(self, transport: str | None = None) -> Comm:
        """The comm over ``transport`` (default: the first of :attr:`transports`)."""
        transport = transport or self.transports[0]
        if transport not in self.transports:
            raise ValueError(f"transport {transport!r}: this world has {list(self.transports)}")
        if transport not in self._comms:
            if transport == "mpi":
                backend = MPIBackend()
            else:
                backend = TorchBackend(transport)
            device = None if transport == "mpi" else self.device  # MPI stages CUDA tensors
            self._comms[transport] = Comm(backend, self.ledger, self.tracker, debug=self.debug,
                                          device=device, board=self.board)
        return self._comms[transport]

    # -- groups -------------------------------------------------------------------------------
    def group(self, ranks, name: str = "") -> Group:
        """The group of global ``ranks`` (collective over the world on first use, then cached)."""
        key = self._check_ranks(ranks)
        if key not in self._groups:
            self._make_groups([key], {key: name})
        g = self._groups[key]
        return g if not name or g.name == name else replace(g, name=name)

    def grid(self, spec: str | dict[str, int], combos: tuple[tuple[str, ...], ...] = ()) -> Grid:
        """Groups along every axis of ``spec`` (and along each tuple of axes in ``combos``)."""
        dims = parse_grid(spec)
        total = 1
        for v in dims.values():
            total *= v
        if total != self.size:
            raise ValueError(f"grid {dims}: the axes multiply to {total}, the world has {self.size}")
        built: dict[tuple[str, ...], Group] = {}
        for axes in [(a,) for a in dims] + [tuple(a for a in dims if a in c) for c in combos]:
            groups = grid_groups(dims, axes)
            self._make_groups(groups, {g: "_".join(axes) for g in groups})
            mine = next(g for g in groups if self.rank in g)
            g = self._groups[mine]
            built[axes] = replace(g, name="_".join(axes))
        return Grid(dims, self.rank, built)

    def _check_ranks(self, ranks) -> tuple[int, ...]:
        key = tuple(int(r) for r in ranks)
        if not key:
            raise ValueError("group: no ranks given")
        if len(set(key)) != len(key):
            raise ValueError(f"group {list(key)}: a rank appears twice")
        bad = [r for r in key if not 0 <= r < self.size]
        if bad:
            raise ValueError(f"group {list(key)}: ranks {bad} are outside the world 0..{self.size - 1}")
        if list(key) != sorted(key):
            # torch's new_group sorts a group's ranks (its members' positions are their order),
            # MPI's split would keep the order given: they would disagree on every position
            raise ValueError(f"group {list(key)}: ranks must be in ascending order, as torch "
                             f"numbers a group's members: give {sorted(key)}")
        return key

    def _make_groups(self, groups: list[tuple[int, ...]], names: dict) -> None:
        """Create every group in ``groups`` on every rank (skipping cached ones), in one order."""
        todo = [g for g in groups if g not in self._groups]
        mpi_sub = {}
        if self.mpi is not None and todo:
            MPI = import_mpi()
            # One split per call: groups of one call are disjoint or identical by construction
            # (a grid's groups along one set of axes partition the world).
            if _disjoint(todo):
                color = next((k for k, g in enumerate(todo) if self.rank in g), MPI.UNDEFINED)
                key = todo[color].index(self.rank) if color != MPI.UNDEFINED else 0
                sub = self.mpi.Split(color, key)
                if color != MPI.UNDEFINED:
                    mpi_sub[todo[color]] = sub
            else:
                for g in todo:
                    color = 0 if self.rank in g else MPI.UNDEFINED
                    sub = self.mpi.Split(color, g.index(self.rank) if self.rank in g else 0)
                    if self.rank in g:
                        mpi_sub[g] = sub
        for g in todo:
            pg = side = None
            if g != self.world.ranks:
                self.creations.append(Creation(g, "nccl"))
            self.creations.append(Creation(g, "gloo", balanced=True))
            if self.backend:
                pg = dist.group.WORLD if g == self.world.ranks else dist.new_group(list(g))
            if self.backend == "nccl":  # the harness's traffic goes beside it, over gloo
                side = dist.new_group(list(g), backend="gloo")
                if self.rank in g:
                    _no_colour_split()
            inside = self.rank in g
            self._groups[g] = Group(g, self.rank, names.get(g, ""), pg if inside else None,
                                    mpi_sub.get(g), side if inside else None)

    def close(self, together_s: float = 0.0) -> None:
        """Destroy the process group. ``together_s`` > 0 (gloo): first wait up to that long
        for every rank to arrive, so that none closes connections another still holds; under
        mpiexec a rank whose peer left first aborted at exit about every second run
        (std::terminate from gloo's teardown). A rank that does not come is named on stderr."""
        if not (self.backend and dist.is_initialized()):
            return
        if together_s > 0 and self.backend == "gloo" and self.size > 1:
            try:
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=together_s))
            except RuntimeError as exc:
                print(f"commbench: rank {self.rank}: closing without the others: "
                      f"{str(exc).splitlines()[0]}", file=sys.stderr)
        dist.destroy_process_group()


def _disjoint(groups: list[tuple[int, ...]]) -> bool:
    seen: set[int] = set()
    for g in groups:
        if seen & set(g):
            return False
        seen |= set(g)
    return True
