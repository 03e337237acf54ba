"""Which launcher started this process, and what it says about the world.

One function, :func:`detect`, reads the environment of torchrun, Open MPI (``mpirun``), MPICH's
Hydra (``mpiexec``, Intel MPI's too), MVAPICH, PMIx and Slurm (``srun``: plain, ``--mpi=pmi2``,
``--mpi=pmix``; under the last two the PMI names the rank and Slurm the local rank and size)
and returns a :class:`LaunchInfo`. It is pure: it
reads a mapping and touches no network, so every launcher is tested from a dictionary.

When the launcher gives no rendezvous address (``mpirun``, ``srun``), :func:`rendezvous` picks one:
``MASTER_ADDR``/``MASTER_PORT`` if set, else rank 0's host and a free port, broadcast over MPI when
MPI is there, else the first host of the Slurm node list and a port derived from the job id.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["LaunchError", "LaunchInfo", "detect", "first_slurm_host", "rendezvous", "shared_gpu",
           "tasks_per_node"]


class LaunchError(RuntimeError):
    """The launcher and the world disagree, or the environment is malformed."""


@dataclass(frozen=True, slots=True)
class LaunchInfo:
    """What the launcher told this process.

    launcher: ``torchrun``, ``openmpi``, ``mpich``, ``mvapich``, ``pmix``, ``slurm`` or ``none``.
    rank/size: this process's rank in the world and the world size.
    local_rank/local_size: the same within this host (used to bind a GPU).
    node: this host's index among the job's hosts (the launcher's, or rank // local_size where
    the launcher gives none and fills hosts rank by rank).
    master_addr/master_port: rendezvous for torch.distributed, when the launcher gives one.
    source: the variables the values came from, for error messages.
    """

    launcher: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    master_addr: str | None = None
    master_port: int | None = None
    source: str = ""
    node: int = 0

    def device(self, count: int) -> int:
        """The CUDA device this rank binds among ``count`` on its host."""
        return self.local_rank % count if count > 0 else 0

    @property
    def launched(self) -> bool:
        return self.launcher != "none"

    @property
    def is_mpi(self) -> bool:
        return self.launcher in ("openmpi", "mpich", "mvapich", "pmix")


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise LaunchError(f"{name} is not set")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise LaunchError(f"{name}={raw!r}: must be an integer") from None
    if value < 0:
        raise LaunchError(f"{name}={raw!r}: must be >= 0")
    return value


def _port(env: Mapping[str, str]) -> int | None:
    if not env.get("MASTER_PORT"):
        return None
    port = _int(env, "MASTER_PORT")
    if not 0 < port < 65536:
        raise LaunchError(f"MASTER_PORT={port}: must be in 1..65535")
    return port


def tasks_per_node(text: str) -> list[int]:
    """Slurm's compressed count per node: ``4(x2)`` is [4, 4], ``3,2(x2)`` is [3, 2, 2]."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise LaunchError(f"SLURM_STEP_TASKS_PER_NODE={text!r}: cannot read {part!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def _slurm_local(env: Mapping[str, str]) -> tuple[int, int, int] | None:
    """(local rank, local size, node) from Slurm's step variables, or None outside a step."""
    if "SLURM_LOCALID" not in env or not env.get("SLURM_STEP_ID", "").isdigit():
        return None
    node = _int(env, "SLURM_NODEID", 0)
    per = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    counts = tasks_per_node(per) if per else []
    local = _int(env, "SLURM_LOCALID")
    if counts and node >= len(counts):
        raise LaunchError(f"SLURM_NODEID={node} but SLURM_STEP_TASKS_PER_NODE={per!r} lists "
                          f"{len(counts)} nodes")
    size = counts[node] if counts else 0
    if size and local >= size:
        raise LaunchError(f"SLURM_LOCALID={local} is not below this node's {size} tasks ({per})")
    return local, size, node


def _make(launcher: str, env: Mapping[str, str], rank: str, size: str, lrank: str | None,
          lsize: str | None, source: str, node: str | None = None) -> LaunchInfo:
    r, n = _int(env, rank), _int(env, size)
    if n < 1:
        raise LaunchError(f"{size}={n}: the world must have at least one rank")
    if r >= n:
        raise LaunchError(f"{rank}={r} is not below {size}={n}")
    slurm = _slurm_local(env)
    if lrank and lrank in env:
        lr = _int(env, lrank)
        ln = _int(env, lsize, 0) if lsize else 0
        nd = _int(env, node, -1) if node else -1
    elif slurm is not None:  # srun --mpi=pmi2/pmix: the PMI gives no local rank, Slurm does
        lr, ln, nd = slurm
        source += " + SLURM_LOCALID"
    else:
        lr, ln, nd = 0, 0, -1
    if not ln and slurm is not None:
        ln = slurm[1]
    if nd < 0:
        nd = slurm[2] if slurm is not None else (r // ln if ln else 0)
    if ln and lr >= ln:
        raise LaunchError(f"local rank {lr} is not below the local size {ln} ({source})")
    return LaunchInfo(launcher, r, n, lr, ln or max(lr + 1, 1), env.get("MASTER_ADDR") or None,
                      _port(env), source, nd)


def detect(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Read the launcher's variables from ``env`` (default: ``os.environ``).

    torchrun wins when several are present (torchrun under srun sets both, and its values are the
    ones that describe the processes). Slurm counts only inside a job step (``SLURM_STEP_ID``
    numeric), since a batch script's shell also carries ``SLURM_PROCID=0``.
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return _make("torchrun", env, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                     "RANK/WORLD_SIZE", "GROUP_RANK")
    if "OMPI_COMM_WORLD_RANK" in env:
        return _make("openmpi", env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                     "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE")
    if "MV2_COMM_WORLD_RANK" in env:
        return _make("mvapich", env, "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",
                     "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE",
                     "MV2_COMM_WORLD_RANK/MV2_COMM_WORLD_SIZE")
    if "PMI_RANK" in env:
        return _make("mpich", env, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
                     "PMI_RANK/PMI_SIZE")
    if "PMI_PORT" in env or "PMI_ID" in env:  # Hydra's -pmi-port mode: a PMI server, no numbers
        raise LaunchError("MPICH's mpiexec in -pmi-port mode (PMI_PORT/PMI_ID set, no "
                          "PMI_RANK/PMI_SIZE): the world's ranks cannot be read before MPI "
                          "starts, and each process would take itself for a world of one; "
                          "launch without -pmi-port")
    slurm_step = "SLURM_PROCID" in env and env.get("SLURM_STEP_ID", "").isdigit()
    size_var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    if "PMIX_RANK" in env and ("PMIX_SIZE" in env or slurm_step):
        return _make("pmix", env, "PMIX_RANK", "PMIX_SIZE" if "PMIX_SIZE" in env else size_var,
                     "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE", "PMIX_RANK")
    if slurm_step:
        return _make("slurm", env, "SLURM_PROCID", size_var, "SLURM_LOCALID", None,
                     f"SLURM_PROCID/{size_var}", "SLURM_NODEID")
    return LaunchInfo("none", 0, 1, 0, 1, env.get("MASTER_ADDR") or None, _port(env), "")


_NODELIST = re.compile(r"^([^\[,]+)(?:\[([^\]]+)\])?")


def shared_gpu(info: LaunchInfo, gpus: int) -> str:
    """Why this rank cannot have a GPU of its own ('' when it can): more ranks on its host than
    GPUs, so that ``local_rank % gpus`` binds two of them to one device, which NCCL refuses for
    two ranks of one communicator (``ncclInvalidUsage``: duplicate GPU) and which would split one
    device's memory. Every rank of such a host finds it before any collective."""
    local = info.local_size or 1
    if gpus < 1 or local <= gpus:
        return ""
    dev = info.local_rank % gpus
    sharing = [lr for lr in range(local) if lr % gpus == dev]
    return (f"rank {info.rank} (local rank {info.local_rank} of {local} on this host) would "
            f"share cuda:{dev} with local ranks {', '.join(map(str, sharing[:8]))}: the host has "
            f"{gpus} GPU(s) for {local} ranks, and NCCL refuses two ranks of one communicator on "
            f"one GPU; start at most {gpus} ranks per host")


def first_slurm_host(nodelist: str) -> str:
    """First host of a Slurm node list: ``gpu[003-010,12],cpu1`` gives ``gpu003``."""
    m = _NODELIST.match(nodelist.strip())
    if not m or not m.group(1):
        raise LaunchError(f"SLURM_JOB_NODELIST={nodelist!r}: cannot read a host name from it")
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def rendezvous(info: LaunchInfo, env: Mapping[str, str] | None = None,
               mpi_comm=None) -> tuple[str, int]:
    """Address and port for torch.distributed's TCP store, agreed by every rank."""
    env = os.environ if env is None else env
    if info.master_addr and info.master_port:
        return info.master_addr, info.master_port
    if mpi_comm is not None:
        mine = (socket.gethostname(), free_port()) if mpi_comm.Get_rank() == 0 else None
        addr, port = mpi_comm.bcast(mine, root=0)
        return info.master_addr or addr, info.master_port or port
    if info.launcher == "slurm":
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise LaunchError("srun without SLURM_JOB_NODELIST: set MASTER_ADDR and MASTER_PORT")
        job = _int(env, "SLURM_JOB_ID", 0)
        return info.master_addr or first_slurm_host(nodelist), info.master_port or 20000 + job % 20000
    if info.size == 1:
        return "127.0.0.1", free_port()
    raise LaunchError(f"{info.launcher} started {info.size} ranks but gives no rendezvous address: "
                      "set MASTER_ADDR and MASTER_PORT, or install mpi4py for this MPI")
