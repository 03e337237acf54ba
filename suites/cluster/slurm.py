"""A one-host Slurm for the cluster check: munged, slurmctld and slurmd on localhost, from
Debian's ``slurm-wlm`` (installed when missing), with every file in a temporary folder.

``cluster()`` starts the daemons, waits until the node is idle, yields ``srun``'s command line
and stops them again, also when a check fails. Nothing is written outside the folder; the
system's munge key (made by the package) is read, not changed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["cluster", "leftovers"]

PREFIX = "commbench-slurm-"
PORTS = (16817, 16818)  # slurmctld, slurmd: away from the defaults of a real installation


def install() -> None:
    if shutil.which("slurmctld") and shutil.which("munged"):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"], check=True, env=env,
                   capture_output=True)


def _conf(d: Path, host: str) -> str:
    return "\n".join([
        "ClusterName=commbench", f"SlurmctldHost={host}(127.0.0.1)",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge",
        f"AuthInfo=socket={d}/munge.socket", f"SlurmctldPort={PORTS[0]}", f"SlurmdPort={PORTS[1]}",
        f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool",
        f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/slurmd.pid",
        f"SlurmctldLogFile={d}/slurmctld.log", f"SlurmdLogFile={d}/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "MpiDefault=none",
        "ReturnToService=2", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "SchedulerType=sched/builtin",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN",
        f"PartitionName=check Nodes={host} Default=YES MaxTime=INFINITE State=UP "
        "OverSubscribe=FORCE", ""])


def _pids(d: Path) -> list[int]:
    out = []
    for f in ("munged.pid", "slurmctld.pid", "slurmd.pid"):
        with contextlib.suppress(OSError, ValueError):
            out.append(int((d / f).read_text().split()[0]))
    return out


def _stop(d: Path) -> None:
    for pid in _pids(d):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.time() + 10
    while time.time() < deadline and any(Path(f"/proc/{p}").exists() for p in _pids(d)):
        time.sleep(0.2)
    for pid in _pids(d):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def cluster(ranks: int = 4) -> Iterator[list[str]]:
    """The daemons up; yields ``env SLURM_CONF=... srun -n RANKS -O --mpi=pmi2``."""
    install()
    d = Path(tempfile.mkdtemp(prefix=PREFIX))
    host = os.uname()[1].split(".")[0]
    try:
        for sub in ("state", "spool"):
            (d / sub).mkdir()
        (d / "slurm.conf").write_text(_conf(d, host))
        env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
        subprocess.run(["munged", "--force", f"--socket={d}/munge.socket",
                        f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                        f"--seed-file={d}/munged.seed"], check=True, capture_output=True)
        subprocess.run(["slurmctld", "-f", str(d / "slurm.conf")], check=True, env=env,
                       capture_output=True)
        subprocess.run(["slurmd", "-f", str(d / "slurm.conf")], check=True, env=env,
                       capture_output=True)
        deadline = time.time() + 60
        state = ""
        while time.time() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                                   text=True).stdout.strip()
            if state == "idle":
                break
            time.sleep(1)
        else:
            logs = "".join((d / f).read_text()[-300:] for f in ("slurmctld.log", "slurmd.log")
                           if (d / f).exists())
            raise RuntimeError(f"the Slurm node is {state or 'not up'} after 60 s: {logs}")
        yield ["env", f"SLURM_CONF={d}/slurm.conf", "srun", "-n", str(ranks), "-O",
               "--mpi=pmi2"]
    finally:
        _stop(d)


def leftovers() -> list[str]:
    left = [str(p) for p in Path(tempfile.gettempdir()).glob(PREFIX + "*")]
    for name in ("munged", "slurmctld", "slurmd"):
        r = subprocess.run(["pgrep", "-f", f"{name}.*{PREFIX}"], capture_output=True, text=True)
        left += [f"{name} pid {p}" for p in r.stdout.split()]
    return left
