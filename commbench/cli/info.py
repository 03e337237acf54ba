"""``commbench info``: what this process would run on.

With no launcher it describes this machine. Under a launcher it also joins the MPI world (when
the launcher is an MPI one) and fails if the launcher's rank count and MPI's disagree, the classic
sign of mpi4py built against another MPI than the ``mpirun`` in use; rank 0 prints one line per
rank, as nccl-tests does.
"""

from __future__ import annotations

import os
import socket
import sys

from commbench.collectives.hierarchical import LOCAL
from commbench.runtime.launch import LaunchError, detect
from commbench.runtime.nodes import NodeLayout
from commbench.world.local import find_mpiexec


def _mpi_line(launcher: str | None) -> tuple[str, object]:
    # lazy: imports torch
    from commbench.world.context import import_mpi

    MPI = import_mpi(launcher)  # LaunchError: the launcher's MPI is not mpi4py's
    if MPI is None:
        return "unavailable (mpi4py or its MPI library cannot be loaded)", None
    lib = " ".join(MPI.Get_library_version().splitlines()[0].split())
    # lazy: imports mpi4py
    import mpi4py

    return f"{lib} (mpi4py {mpi4py.__version__}, mpiexec {find_mpiexec() or 'not found'})", MPI


def info() -> int:
    # lazy: imports torch
    import torch

    # lazy: imports torch
    import torch.distributed as dist

    try:
        launch = detect()
    except LaunchError as exc:  # a launcher whose world cannot be read
        print(f"commbench: error: {exc}", file=sys.stderr)
        return 2
    try:
        mpi_text, MPI = (_mpi_line(launch.launcher if launch.launched else None)
                         if launch.is_mpi or not launch.launched else ("not loaded", None))
    except LaunchError as exc:
        print(f"commbench: error: {exc}", file=sys.stderr)
        return 1
    size = launch.size
    rows = None
    if MPI is not None and launch.launched:
        comm = MPI.COMM_WORLD
        if comm.Get_size() != launch.size:
            print(f"commbench: error: {launch.launcher} says {launch.size} ranks "
                  f"({launch.source}) but MPI.COMM_WORLD has {comm.Get_size()}: mpi4py uses "
                  f"{mpi_text}, not the MPI of this launcher", file=sys.stderr)
            return 1
        rows = comm.gather((launch.rank, os.getpid(), socket.gethostname(), _device(launch),
                            launch.local_rank), 0)
    if launch.rank != 0:
        return 0
    nccl = "unavailable"
    if dist.is_nccl_available() and torch.cuda.is_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    elif dist.is_nccl_available():
        nccl = "built in, no CUDA device"
    lines = [
        f"launcher   : {launch.launcher}" + (f" ({launch.source})" if launch.source else ""),
        f"world size : {size}" + ("" if launch.launched else " (no launcher: `commbench run` "
                                  "spawns a local world, --np ranks)"),
        f"transports : gloo {'yes' if dist.is_gloo_available() else 'no'}; NCCL {nccl}; "
        f"MPI {mpi_text}",
        f"torch      : {torch.__version__} (CUDA {torch.version.cuda or 'none'})",
        f"python     : {sys.version.split()[0]}",
        f"devices    : {_devices()}",
    ]
    print("\n".join(f"# {line}" for line in lines))
    rows = rows or [(0, os.getpid(), socket.gethostname(), _device(launch), launch.local_rank)]
    if len(rows) == size:
        layout = NodeLayout(tuple(row[2] for row in sorted(rows)))
        own = layout.node_size()
        why = "one host" if len(layout.nodes) == 1 else "nodes not of adjacent ranks, as many each"
        print(f"# nodes      : {layout.describe()}; the hierarchical all-reduce runs on "
              + (f"these nodes ({own} ranks each)" if own else
                 f"nodes of {LOCAL} adjacent ranks ({why})"))
    for rank, pid, host, dev, local in rows:
        print(f"#  Rank {rank:2d} Pid {pid:7d} on {host:>12} local rank {local:2d} device {dev}")
    for line in shared_devices(rows):
        print(f"# warning    : {line}")
    return 0


def shared_devices(rows) -> list[str]:
    """A line for each GPU that two or more ranks of one host would bind (rows: rank, pid,
    host, device, local rank): they would share one device's memory and NCCL refuses two ranks
    of one communicator on one GPU."""
    users: dict[tuple[str, str], list[int]] = {}
    for rank, _, host, dev, _ in rows:
        if dev != "cpu":
            users.setdefault((host, dev), []).append(rank)
    return [f"ranks {', '.join(map(str, ranks))} of {host} share {dev}: give each rank its own "
            "GPU (one rank per GPU, local ranks 0..n-1 per host)"
            for (host, dev), ranks in sorted(users.items()) if len(ranks) > 1]


def _devices() -> str:
    # lazy: imports torch
    import torch

    if not torch.cuda.is_available():
        return f"cpu ({os.cpu_count()} cores)"
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return f"{len(names)} x " + ", ".join(sorted(set(names)))


def _device(launch) -> str:
    # lazy: imports torch
    import torch

    if torch.cuda.is_available():
        return f"cuda:{launch.local_rank % torch.cuda.device_count()}"
    return "cpu"


__all__ = ["LaunchError", "info", "shared_devices"]


def add_parser(sub) -> None:
    sub.add_parser("info", help="launcher, world, transports, versions, devices",
                   description="Example: commbench info; under a launcher: mpiexec -n 2 "
                   "commbench info")


def command(a) -> int:
    return info()
