"""A job's traces: the files of one folder (or those named) read and checked as one job (pure).

A folder is one job, or a sample of one (two ranks of a 128-rank job are a normal thing to
share): no rank twice, every rank inside ``distributedInfo.world_size``, and a group name means
the same ranks in every file. Where no file states the world size (a trace of a job's rank 1
alone, without it), the world is taken as at least the ranks of the files and of the groups
they name, and the output says so. The ranks present are named in the output; a call whose
group has members without a file gets no cross-rank figures. A single file is analysed on its
own.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from commbench.rankset import rank_list
from commbench.results.files import kind_of
from commbench.results.machine import cores
from commbench.traces.calls import MAX_WORLD, TraceError
from commbench.traces.kineto import RankTrace, read
from commbench.traces.stream import LIMIT

__all__ = ["PARALLEL_BYTES", "files", "load", "read_all"]

PARALLEL_BYTES = 4 << 20  # files of a job larger than this together are read in parallel


def _alone() -> bool:
    """Whether this process may fork workers: on Linux, with no thread but its own (a fork
    copies one thread and every lock: a lock another thread held stays held in the child, and
    a worker that takes it never returns; seen in a test session, whose process has threads)."""
    try:
        return "fork" in multiprocessing.get_all_start_methods() and \
            len(os.listdir("/proc/self/task")) == 1
    except OSError:  # no /proc: not Linux
        return False


def read_all(paths: list[str], progress: bool = True, limit: int = LIMIT,
             workers: int | None = None, world: int = 0) -> list[RankTrace]:
    """Every file's trace, in order: read in parallel by forked processes, one file each at a
    time, where there are several files, cores to spare, bytes enough to pay for the fork and
    no other thread in this process (``workers``: how many; None: as many as cores and files
    allow); else one after another. A worker's error (TraceError, one line) is the caller's.
    ``world``: the job's world size where a trace does not state it (:func:`read`)."""
    n = min(len(paths), cores()) if workers is None else workers
    if workers is None and sum(os.path.getsize(p) for p in paths) < PARALLEL_BYTES:
        n = 1
    if n < 2 or not _alone():
        return [read(p, progress, limit, world) for p in paths]
    # the executor forks its workers before it starts its own threads; a worker that dies
    # (killed, out of memory) breaks the pool at once instead of leaving its file unread
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork")) as pool:
        try:
            packed = list(pool.map(_packed, paths, [progress] * len(paths),
                                   [limit] * len(paths), [world] * len(paths)))
        except BrokenProcessPool:
            raise TraceError(f"a worker reading {len(paths)} trace files ended without a "
                             "result (killed, or out of memory?); nothing was read") from None
    out = []
    for i, blob in enumerate(packed):  # each pickle dropped once unpacked
        packed[i] = b""
        out.append(pickle.loads(blob))
    return out


def _packed(path: str, progress: bool, limit: int, world: int) -> bytes:
    """A worker's rank, pickled. The workers' ranks stay so in this process until the last is
    read: a rank's pickle is a quarter of its calls' memory, and the process holds the ranks
    read first while the workers are at their peak with the last (the tree's peak)."""
    return pickle.dumps(read(path, progress, limit, world), protocol=pickle.HIGHEST_PROTOCOL)


def files(names: list[str]) -> tuple[list[str], bool]:
    """The trace files ``names`` stand for (a folder: its ``*.json[.gz]``), and whether a
    folder was given (a folder is a whole job)."""
    out, folder = [], False
    for name in names:
        if os.path.isdir(name):
            folder = True
            found = sorted(os.path.join(name, f) for f in os.listdir(name)
                           if f.endswith((".json", ".json.gz")))
            if not found:
                raise TraceError(f"{name}: no trace files (*.json, *.json.gz) in the folder")
            out += found
        elif os.path.isfile(name):
            out.append(name)
        elif kind_of(name):
            raise TraceError(f"{name}: is {kind_of(name)}; a trace must be a regular file or a "
                             "folder of them")
        else:
            raise TraceError(f"{name}: no such file or folder")
    return out, folder or len(out) > 1


def load(names: list[str], progress: bool = True, limit: int = LIMIT, world: int = 0
         ) -> list[RankTrace]:
    """Every rank's trace, checked as one job (TraceError: one line naming what is wrong).
    ``world``: the job's world size, given where its traces do not state it; a trace that
    states another is an error."""
    paths, _ = files(names)
    traces = read_all(paths, progress, limit, world=world)
    stated = sorted({t.world_size for t in traces if t.world_stated and t.world_size})
    if world > 0 and stated and stated != [world]:
        raise TraceError(f"--world {world}: the traces state world_size {stated} "
                         "(distributedInfo); give it only where they state none")
    if len(traces) == 1 and traces[0].rank < 0:
        traces[0].rank = 0
        for c in traces[0].calls:
            c.rank = 0
    by_rank: dict[int, RankTrace] = {}
    for t in traces:
        if t.rank < 0:
            raise TraceError(f"{t.path}: no distributedInfo.rank: cannot tell which rank it is")
        if t.rank in by_rank:
            raise TraceError(f"{t.path} and {by_rank[t.rank].path} are both rank {t.rank}")
        by_rank[t.rank] = t
    sizes = {t.world_size for t in traces if t.world_size}
    if len(sizes) > 1:
        raise TraceError(f"the traces disagree on world_size: {sorted(sizes)}")
    if sizes:
        world = sizes.pop()
    else:  # no trace states the world: it holds at least the ranks these files are
        named = [r for t in traces for g in (*t.groups.values(), *(c.group for c in t.calls))
                 for r in g]  # and the ranks their groups name
        world = max(len(traces), max(by_rank) + 1, max(named, default=-1) + 1)
        for t in traces:
            t.world_size, t.world_stated = world, False
    if world > MAX_WORLD:  # ranks its groups name, a world inferred from them
        raise TraceError(f"world_size {world}: a job of at most {MAX_WORLD} ranks is read")
    bad = sorted(r for r in by_rank if not 0 <= r < world)
    if bad:
        raise TraceError(f"ranks {rank_list(bad)}: outside world_size {world} ({by_rank[bad[0]].path})")
    if not stated:  # a world given or inferred: the groups the traces name lie inside it
        top = max((r for t in traces for c in t.calls for r in c.group), default=-1)
        if top >= world:
            raise TraceError(f"world_size {world}: the traces' groups name rank {top}")
    _same_groups(traces)
    return [by_rank[r] for r in sorted(by_rank)]


def _same_groups(traces: list[RankTrace]) -> None:
    seen: dict[str, tuple[tuple[int, ...], str]] = {}
    for t in traces:
        named = dict(t.groups)
        for c in t.calls:
            if c.group_name:
                if named.get(c.group_name, c.group) != c.group:
                    raise TraceError(f"{t.path}: group {c.group_name!r} is ranks "
                                     f"{list(named[c.group_name])} in distributedInfo and "
                                     f"{list(c.group)} in a {c.name} call")
                named[c.group_name] = c.group
        for name, ranks in named.items():
            if name in seen and seen[name][0] != ranks:
                raise TraceError(f"group {name!r}: ranks {list(seen[name][0])} in "
                                 f"{seen[name][1]} and {list(ranks)} in {t.path}")
            seen.setdefault(name, (ranks, t.path))
