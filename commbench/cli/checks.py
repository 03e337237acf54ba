"""Checks every command makes before a rank starts: where results go, how many ranks this host
can start, whether the largest buffers fit. Each failure is a :class:`UsageError` (exit code 2)
naming the value and the rule."""

from __future__ import annotations

import os
import sys
import tempfile

from commbench.cli.common import UsageError
from commbench.results.files import kind_of
from commbench.results.machine import check_label
from commbench.runtime.launch import LaunchError, detect, shared_gpu
from commbench.world.local import LocalWorld

__all__ = ["MAX_COUNT", "RANK_MB", "RANKS_PER_CORE", "WORKING_BYTES", "HostRefusal",
           "available_bytes", "check_memory", "memory_factor", "memory_need", "nccl_reserve",
           "check_np", "check_out", "check_world", "on_host", "PG_GRACE_S", "refused_together",
           "world_options", "world_size"]


class HostRefusal(UsageError):
    """A refusal read off this host or rank (its memory, its file system), which another rank
    of a launched world may not make: the ranks agree on it before anyone exits
    (:func:`commbench.cli.run.command`). Refusals of the arguments alone are the same on every
    rank and end each at once."""


# iterations, warm-up, batch, rounds, repeats at most: each timed call's time is kept (a
# typed -n 99999999999 would fill the host's memory before its first row)
MAX_COUNT = 1 << 20
PG_GRACE_S = 30.0  # seconds a launched world's process-group timeout runs past --timeout, so
# that commbench's watchdog names a hang (the op, the ranks) before torch's own timeout ends it


def refused_together(world, refusal: str, prints: bool) -> bool:
    """Every rank's host refusal ('' for none) learnt by every rank of a launched ``world``;
    when any refused, the printing rank names the first and all return True (then exit 2)."""

    reasons = world.agree(refusal)
    first = next(((r, why) for r, why in enumerate(reasons) if why), None)
    if first is not None and prints:
        print(f"commbench: error: rank {first[0]}: {first[1]}", file=sys.stderr)
    return first is not None


def on_host(a, check, *args) -> None:
    """Run a host check; under a launcher of more than one rank keep its refusal in
    ``a.host_refusal`` (the first one) instead of raising, so that every rank goes on to the
    same later checks and then to the agreement."""
    try:
        check(*args)
    except HostRefusal as exc:
        if not (getattr(a, "launcher", "") and getattr(a, "world_size", 1) > 1):
            raise
        if not getattr(a, "host_refusal", ""):
            a.host_refusal = str(exc)

# what a local world's rank holds (torch and its transports), with room, and the most ranks per
# core that still start in bounded time (docs/decisions.md: 8 ranks per core and 300 MB per rank)
RANK_MB = 300
RANKS_PER_CORE = 8


def world_options(p, *, np: int, timeout: float | None) -> None:
    """The options of every command that starts a world and writes results files."""
    p.add_argument("--np", type=int, default=np, help="ranks of the local world (no launcher)")
    p.add_argument("--launch", default="auto", choices=("auto", "mpi", "plain"),
                   help="how a local world starts its ranks (auto: mpiexec when there is one)")
    if timeout is not None:
        p.add_argument("--timeout", type=float, default=timeout, help="seconds before a call "
                       "counts as a hang")
    p.add_argument("--out", default="results", help="folder for the JSON and markdown tables")
    p.add_argument("--no-write", action="store_true", help="write no results files")
    p.add_argument("--label", default="", help="the machine class in results' file names "
                   "(default: this machine's, e.g. intel-xeon-2c or nvidia-h200-8gpu)")
    p.set_defaults(np_default=np)


def check_world(a) -> None:
    """The checks of :func:`world_options`, before any rank starts; ``a`` gains
    ``world_size``, ``ranks_here`` and ``launcher`` ('' without one)."""

    if getattr(a, "timeout", None) is not None and not a.timeout > 0:
        raise UsageError(f"--timeout {a.timeout}: must be > 0")
    try:
        check_label(a.label)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if a.np < 1:
        raise UsageError(f"--np {a.np}: must be >= 1")

    try:
        a.world_size, a.ranks_here, a.launcher = world_size(a.np)
    except LaunchError as exc:  # a launcher whose world cannot be read: before any rank starts
        raise UsageError(str(exc)) from None
    check_backend(bool(a.launcher))
    check_gpus(bool(a.launcher))
    if a.launcher and a.np not in (a.np_default, a.world_size):
        raise UsageError(f"--np {a.np}: the launcher ({a.launcher}) started {a.world_size} ranks; "
                         "drop --np or launch that many")
    if not a.launcher:
        check_np(a.np)
    if not a.no_write:
        on_host(a, check_out, a.out)


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def check_out(path: str, flag: str = "--out") -> None:
    """``path`` is a folder this process can write: made if missing, and a file written and
    removed there (a permission bit says nothing of /proc, a read-only mount or a full disk)."""

    if os.path.exists(path) and not os.path.isdir(path):
        raise HostRefusal(f"{flag} {path}: exists and is not a folder; give a folder")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".commbench-check-"):
            pass
    except OSError as exc:
        raise HostRefusal(f"{flag} {path}: cannot be written ({exc.strerror or exc}); give "
                          "another folder") from None


def check_file(path: str, flag: str) -> None:
    """``path`` is a file this process can write (its folder exists or can be created)."""

    what = kind_of(path)
    if what == "a folder":
        raise HostRefusal(f"{flag} {path}: is a folder; give a file name")
    if what not in ("", "a regular file"):
        raise HostRefusal(f"{flag} {path}: is {what}; give a regular file's name (commbench "
                          "writes it whole, through a temporary file beside it)")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise HostRefusal(f"{flag} {path}: this user cannot write it")
    check_out(os.path.dirname(os.path.abspath(path)), flag)


def check_backend(launched: bool, env=None) -> None:
    """``COMMBENCH_BACKEND`` (the torch backend of launched ranks) refused in one line where it
    cannot hold: an unknown name; ``nccl`` without a CUDA GPU (before: a ZeroDivisionError on
    every rank under mpiexec); any backend in a local world, which runs gloo and MPI itself
    (before: ignored without a word)."""
    env = os.environ if env is None else env
    value = env.get("COMMBENCH_BACKEND", "")
    if not value:
        return
    if value not in ("gloo", "nccl", "mpi"):
        raise UsageError(f"COMMBENCH_BACKEND={value!r}: must be gloo, nccl or mpi")
    if not launched:
        raise UsageError(f"COMMBENCH_BACKEND={value}: a local world runs gloo and MPI (--transport "
                         "chooses); the variable sets launched ranks' backend: unset it, or "
                         "launch with mpirun, srun or torchrun")
    if value == "nccl":
        # lazy: imports torch
        import torch

        if not torch.cuda.is_available():
            raise UsageError("COMMBENCH_BACKEND=nccl: NCCL needs a CUDA GPU, and torch sees none "
                             "on this host (torch.cuda.is_available() is False)")


def check_gpus(launched: bool, env=None, gpus: int | None = None) -> None:
    """Launched ranks that would run NCCL (``COMMBENCH_BACKEND=nccl``, or unset on a host with
    CUDA) refused in one line, before any rank starts, when their host has fewer GPUs than
    ranks (:func:`commbench.runtime.launch.shared_gpu`)."""

    env = os.environ if env is None else env
    if not launched or env.get("COMMBENCH_BACKEND", "nccl") != "nccl":
        return
    if gpus is None:
        # lazy: imports torch
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    why = shared_gpu(detect(env), gpus) if gpus else ""
    if why:
        raise UsageError(why)


def world_size(np: int) -> tuple[int, int, str]:
    """(ranks of the world, ranks on this host, the launcher's name or '') as they will be,
    before any rank starts."""

    info = detect()
    if info.launched:
        return info.size, info.local_size or 1, info.launcher
    return np, np, ""


def check_np(np: int, flag: str = "--np") -> None:
    """A local world of ``np`` ranks is one this host can start in reasonable time and memory."""
    if np < 1:
        raise UsageError(f"{flag} {np}: must be >= 1")
    cores = os.cpu_count() or 1
    limit = RANKS_PER_CORE * cores
    if np > limit:
        raise UsageError(f"{flag} {np}: a local world on this host's {cores} cores takes at most "
                         f"{limit} ranks ({RANKS_PER_CORE} per core; each rank's start-up costs "
                         "~1.5 s of CPU); use a launcher across hosts for more")
    avail = available_bytes()
    if avail is not None and np * RANK_MB * (1 << 20) > avail:
        raise UsageError(f"{flag} {np}: {np} ranks x {RANK_MB} MB each = "
                         f"{_gib(np * RANK_MB * (1 << 20))}; this host has {_gib(avail)} "
                         "available (MemAvailable)")


# what a GPU torch can use leaves on a Linux host before torch is asked: the NVIDIA driver's
# /proc entry and control node, ROCm's kernel driver node, WSL2's GPU paravirtualisation node
GPU_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def no_gpu_driver(paths: tuple[str, ...] = GPU_DRIVER_PATHS) -> bool:
    """True where torch cannot see a GPU, known without importing torch (a second of a
    core): Linux with none of ``paths`` (no driver a CUDA or ROCm device would need), or
    macOS (no CUDA build of torch). False means only that torch must be asked."""
    if sys.platform == "darwin":
        return True
    return sys.platform.startswith("linux") and not any(os.path.exists(p) for p in paths)


def device_free_bytes() -> int | None:
    """Free memory of the GPU this rank binds (``torch.cuda.mem_get_info``), or None without
    CUDA (then the buffers live in host memory). On a host without a GPU driver, None without
    asking torch: the check runs before the ranks start, and torch is imported while they do."""
    if no_gpu_driver():
        return None
    try:
        # lazy: imports torch
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None

    return int(torch.cuda.mem_get_info(detect().device(torch.cuda.device_count()))[0])


# what a rank's series holds on the host beyond its buffers, whatever the size: the largest
# intercept of the peaks in results/memory_* (suites/memory_bench.py), rounded up;
# tests/test_memory_table.py holds the check to the table (docs/decisions.md: the memory check)
WORKING_BYTES = 288 << 20


def memory_factor(itemsize: int, check: bool) -> float:
    """Bytes a rank holds per byte of the size: the sweep's 4 buffers (input, output, a copy
    for in-place resets, the timed buffer), the input pattern's 3 int64 temporaries, and with
    ``check`` the expected result folded in int64 (one more); float32 with ``check``: 12."""
    wide = 8 / itemsize  # bytes of an int64 element per byte of the dtype
    return 4 + wide * (3 + (1 if check else 0))


def memory_need(largest: int, itemsize: int, check: bool) -> int:
    """Host bytes one rank needs for a sweep up to ``largest`` (the check's arithmetic)."""
    return int(WORKING_BYTES + largest * memory_factor(itemsize, check))


# NCCL's own device memory per rank, which torch.cuda.mem_get_info does not yet show before
# the first collective (the CUDA context already does): a communicator's buffers are per
# channel and per connection (NCCL_BUFFSIZE 4 MiB for Simple, LL128's 4.7 MiB and LL's 0.5 MiB
# each; src/init.cc's DEFAULT_*BUFFSIZE), about 1 GiB on an 8-GPU node (NVIDIA/nccl#864: 1.6 GB
# after one communicator's first all-reduce, the context included); point-to-point connects
# each peer on up to 32 channels, 1.06 -> 4.34 GB on an H100 at the first all-to-all
# (NVIDIA/nccl#1685). commbench's algorithms are built from send/recv, so a sweep pays both.
NCCL_COLLECTIVE_BYTES = 1 << 30
NCCL_P2P_BYTES = 3_280_000_000


def nccl_reserve(ranks: int) -> int:
    """Device bytes NCCL takes on each rank of a world of ``ranks`` for a sweep's collectives
    and point-to-point connections (none in a world of one: no peer to connect)."""
    return 0 if ranks <= 1 else NCCL_COLLECTIVE_BYTES + NCCL_P2P_BYTES


def check_memory(largest: int, itemsize: int, ranks_here: int, ranks: int, check: bool,
                 flag: str = "-e") -> None:
    """The largest size's buffers fit where they will live: on this rank's GPU when there is one
    (one rank per GPU: :func:`memory_factor` x the size, and NCCL's own buffers,
    :func:`nccl_reserve`), else in this host's memory for every rank of the host
    (:func:`memory_need` each)."""
    factor = memory_factor(itemsize, check)
    what = f"4 buffers, {4 if check else 3} int64 temporaries"
    free = device_free_bytes()
    if free is not None:
        nccl = nccl_reserve(ranks)
        need = largest * factor + nccl
        if need > free:
            raise HostRefusal(f"{flag}: {largest} B x {factor:g} ({what}) + {_gib(nccl)} NCCL's "
                              f"buffers = {_gib(need)}; this rank's GPU has {_gib(free)} free "
                              "(torch.cuda.mem_get_info); lower -e")
        return
    avail = available_bytes()
    if avail is None:
        return
    need = ranks_here * memory_need(largest, itemsize, check)
    if need > avail:
        raise HostRefusal(f"{flag}: {ranks_here} rank(s) on this host x ({largest} B x "
                          f"{factor:g} ({what}) + {WORKING_BYTES >> 20} MiB working) = "
                          f"{_gib(need)}; this host has {_gib(avail)} "
                          "available (MemAvailable); lower -e" + (" or give -c 0" if check else ""))


def start_world(world, prints: bool) -> None:
    """Start ``world``; a local world that is not up yet says so first, at once, since its
    ranks take seconds to start (a launcher's ranks are already running). Once its ranks'
    processes exist, and while they start on the other cores, this process imports torch:
    every command that starts ranks needs it next, and nothing before this point imports it."""

    if not isinstance(world, LocalWorld) or world.alive:
        world.start()
        return
    if prints:
        print(f"# starting {world.size} local rank(s) ({world.launch}): a few seconds",
              flush=True)
    world.start(meanwhile=_import_torch)


def _import_torch() -> None:
    try:
        # lazy: imports torch
        import torch  # noqa: F401  (while a local world's ranks start: start_world)
    except ImportError:  # the command's own import says so, as it would without this
        pass


def open_world(a, *, local_timeout_s: float = 120.0, stop_on_raise: bool = False,
               pg_backend: str | None = None):
    """(the world a command runs on, whether this process prints), for every command that
    starts ranks, once :func:`check_world` has passed: under a launcher its ranks (rank 0
    prints; ``--timeout`` bounds each call, torch's own process-group timeout a little longer;
    ``stop_on_raise``: a rank that raises ends the run at once; ``pg_backend``: the string
    given to ``init_process_group``), else a local world of ``--np`` ranks (``--timeout``, or
    ``local_timeout_s`` where the command has none or it is left unset)."""
    timeout = getattr(a, "timeout", None)
    if a.launcher:
        # lazy: imports torch
        from commbench.world.context import Context

        # lazy: imports torch
        from commbench.world.spmd import LauncherWorld

        kw = {"pg_backend": pg_backend} if pg_backend else {}
        if timeout is not None:
            kw["timeout_s"] = timeout + PG_GRACE_S
        world = LauncherWorld(Context.from_launcher(**kw), timeout_s=timeout,
                              stop_on_raise=stop_on_raise)
        return world, detect().rank == 0

    return LocalWorld(a.np, launch=a.launch,
                      timeout_s=timeout if timeout is not None else local_timeout_s), True


def max_chars(gb: float) -> int:
    """``--max-size GB`` as characters, refused unless > 0."""
    if not gb > 0:
        raise UsageError(f"--max-size {gb}: must be > 0 (GiB of text read from one trace)")
    return int(gb * 2**30)
