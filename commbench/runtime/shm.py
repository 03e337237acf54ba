"""MPICH's shared-memory segments of a local world, removed when the world ends, and of a
launched rank that ends without MPI_Finalize, removed by its supervisor.

Each rank of an MPI world maps one ``/dev/shm/mpich_shm_*`` file that MPICH unlinks only in
``MPI_Finalize``. A local world's ranks end with ``os._exit`` (and a killed rank ends without
a word), so every world left its segment behind: about 2.6 MB of the host's memory each, 1,306
of them (3.4 GB) after a day of test runs here. Every rank has mapped the segment by the time
it said hello, so removing the file afterwards takes nothing from a running rank (the mapping
stays); the driver removes the segments its ranks map before it stops them, and a rank whose
driver vanished removes its own. Under a launcher (mpiexec) a rank that is killed, or that ends
a failed run with MPI_Abort, leaves the node's segment just the same: each supervised rank names
its segments to its supervisor (:mod:`commbench.runtime.supervise`), which removes them when
the rank ends with a failure.
"""

from __future__ import annotations

import os

__all__ = ["mapped_segments", "remove"]

PREFIX = "/dev/shm/mpich_shm_"


def mapped_segments(pids) -> set[str]:
    """The MPICH segments the processes ``pids`` map (none where /proc cannot say)."""
    out: set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                out |= {line.split(None, 5)[5].strip() for line in f
                        if PREFIX in line and len(line.split(None, 5)) == 6}
        except OSError:
            continue
    return {p.removesuffix(" (deleted)") for p in out if not p.endswith(" (deleted)")}


def remove(paths) -> None:
    """Unlink each segment file (one already gone is fine)."""
    for path in paths:
        if path.startswith(PREFIX):
            try:
                os.unlink(path)
            except OSError:
                pass
