"""A launched rank that watches its own work: a dead rank says so in one line and exits 3.

Under a launcher (mpiexec, mpirun, srun, torchrun) the process the launcher started is the one
whose exit it reports, and a rank killed outright (the OOM killer, a segfault in a library,
``kill -9``) leaves no word of its own: hydra then kills the other ranks and prints its banner on
stdout, srun and torchrun their own summaries. So ``commbench run``/``audit``/``gpu-check``
under a launcher run their work in a child process with the same arguments and environment
(file descriptors too: the PMI's socket is one) and this process only waits for it:

* the child exits: its code is this process's code (it printed its own line, if any);
* the launcher signals this process (SIGTERM, SIGINT, ...): the signal is passed on and the
  child's code returned, with nothing added;
* the child is killed by a signal nobody passed on: one line on stderr naming the rank, its
  host and the signal, a notice posted to the world's TCP store (the child told this process
  its address), on which every other rank's watchdog ends its run with exit code 3 within
  :data:`POLL_S` seconds instead of waiting in a collective for its timeout, and exit code 3.

The waiting process imports neither torch nor MPI. Only the command line is supervised
(``commbench ...``, ``python -m commbench ...``; ``main(argv)`` called from Python is not).
``COMMBENCH_SUPERVISE=0`` turns it off.
"""

from __future__ import annotations

import datetime
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping

from commbench.runtime import shm
from commbench.runtime.launch import LaunchError, detect
from commbench.runtime.pdeathsig import parent_death_signal

__all__ = ["COMMANDS", "DEATH_KEY", "POLL_S", "SUPERVISED", "death_notice", "leave_hydra",
           "store_client", "supervise", "tell_segments", "tell_store", "wanted"]

SUPERVISED = "COMMBENCH_SUPERVISED"  # set in the child, so that it does the work itself
_ADDRESS_FD = "COMMBENCH_SUPERVISOR_FD"  # the pipe on which the child writes its store's address
DEATH_KEY = "commbench/dead"
POLL_S = 2.0  # how often a rank's watchdog looks for a death notice
COMMANDS = ("run", "audit", "replay", "gpu-check")
_PASSED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
           signal.SIGQUIT)


def wanted(argv: list[str], env: Mapping[str, str] | None = None) -> bool:
    """Whether this command line, in this environment, runs supervised: a command that runs
    ranks, under a launcher, not already the child, not a rank of a local world, not off."""

    env = os.environ if env is None else env
    cmd = next((a for a in argv if not a.startswith("-")), None)
    if cmd not in COMMANDS or any(a in ("-h", "--help") for a in argv):
        return False
    if env.get(SUPERVISED) or env.get("COMMBENCH_WORKER") or env.get("COMMBENCH_SUPERVISE") == "0":
        return False
    try:
        return detect(env).launched
    except LaunchError:  # the child refuses it, in its one line
        return False


def supervise(argv: list[str]) -> int:
    """Run ``python -m commbench *argv`` as a child and wait for it (see the module's text)."""

    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_inheritable(write_end, True)  # pipes are close-on-exec by default (PEP 446)

    # the child dies with this process: a launcher that kills it (torchrun's SIGKILL after its
    # grace) leaves no orphan working on
    child = subprocess.Popen([sys.executable, "-m", "commbench", *argv], close_fds=False,
                             env=dict(os.environ, **{SUPERVISED: "1", _ADDRESS_FD: str(write_end)}),
                             preexec_fn=parent_death_signal)
    os.close(write_end)
    passed: list[int] = []

    def pass_on(signum, frame) -> None:
        passed.append(signum)
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for s in _PASSED:
        signal.signal(s, pass_on)
    code = child.wait()  # a signal's handler runs and the wait goes on (PEP 475)
    address, segments = _told(read_end)
    if code != 0:  # killed, or a failure that ends without MPI_Finalize: MPICH's file stays
        shm.remove(segments)
    if code >= 0:
        return code
    signum = -code
    if signum in passed:
        return 128 + signum
    info = detect()
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    host = socket.gethostname()
    print(f"commbench: rank {info.rank} of {info.size} (host {host}, pid {child.pid}) died: "
          f"killed by {name}; the job cannot finish", file=sys.stderr, flush=True)
    if address is not None and _post_death(address, {"rank": info.rank, "host": host,
                                                     "signal": name}):
        # stay until the others have read it and left on their own, quietly: a launcher that
        # saw this rank leave first would signal them (torchrun: SIGTERM), and each would say so

        time.sleep(POLL_S + 1.0)
    leave_hydra(info.launcher)
    return 3


def leave_hydra(launcher: str, timeout_s: float = 5.0) -> bool:
    """Tell a hydra-family launcher (MPICH's mpiexec, Intel MPI's) that this rank finished, on
    its PMI socket, before leaving with a failure's exit code. Hydra kills every other rank with
    SIGKILL when a rank leaves without it, and its exit code is the bitwise OR of every rank's
    wait status: the job would end with 9 whatever the ranks said. Finalized, every rank leaves
    on its own with 3 and so does the job. True when the launcher acknowledged; False (nothing
    done) under any other launcher."""

    fd = os.environ.get("PMI_FD", "")
    if launcher != "mpich" or "SLURM_STEP_ID" in os.environ or not fd.isdigit():
        return False
    try:
        os.write(int(fd), b"cmd=finalize\n")
        ready, _, _ = select.select([int(fd)], [], [], timeout_s)
        return bool(ready) and os.read(int(fd), 256).startswith(b"cmd=finalize_ack")
    except OSError:
        return False


def tell_store(host: str, port: int) -> None:
    """In a supervised child: give the supervisor the world's store address (a no-op else)."""
    fd = os.environ.get(_ADDRESS_FD, "")
    if fd.isdigit():
        try:
            os.write(int(fd), f"{host} {port}\n".encode())
        except OSError:
            pass


def tell_segments() -> None:
    """In a supervised child whose MPI is initialised: name the MPICH segments this rank maps,
    which its supervisor removes if the rank ends with a failure (a no-op else)."""
    fd = os.environ.get(_ADDRESS_FD, "")
    if fd.isdigit():
        try:
            for path in sorted(shm.mapped_segments([os.getpid()])):
                os.write(int(fd), f"shm {path}\n".encode())
        except OSError:
            pass


def _told(fd: int) -> tuple[tuple[str, int] | None, list[str]]:
    """What the child wrote on the pipe: the last store address it gave, and its segments."""
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        data += chunk
    address, segments = None, []
    for line in data.decode(errors="replace").splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "shm":
            segments.append(words[1])
        elif len(words) == 2 and words[1].isdigit():
            address = (words[0], int(words[1]))
    return address, segments


def store_client(address: tuple[str, int]):
    """A client of the TCP store at ``address``; raises ConnectionError at once when nothing
    listens there (torch's own client retries for its whole timeout, logging each try)."""

    with socket.create_connection(address, timeout=5.0):
        pass
    # lazy: imports torch
    import torch.distributed as dist

    return dist.TCPStore(address[0], address[1], is_master=False,
                         timeout=datetime.timedelta(seconds=10), wait_for_workers=False)


def _post_death(address: tuple[str, int], notice: dict) -> bool:
    """Post ``notice`` (JSON, never pickle) under :data:`DEATH_KEY` in the store at ``address``;
    False when the store cannot be reached (its host, rank 0, is the one that died)."""

    try:
        store_client(address).set(DEATH_KEY, json.dumps(notice))
        return True
    except Exception:  # noqa: BLE001 - the line above was said; the others time out instead
        return False


def death_notice(store) -> str | None:
    """The line a dead rank's notice in ``store`` makes (None: no rank died). Raises what the
    store raises when it cannot be reached."""

    if not store.check([DEATH_KEY]):
        return None
    try:
        value = json.loads(store.get(DEATH_KEY).decode("utf-8", errors="replace"))
        return (f"rank {int(value['rank'])} (host {str(value['host'])[:100]}) died: killed by "
                f"{str(value['signal'])[:20]}")
    except (ValueError, KeyError, TypeError):
        return "a rank died (its notice could not be read)"
