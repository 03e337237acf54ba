"""The compiled all-reduce schedules' pieces: each algorithm's step list (kept in its own record,
:func:`~commbench.collectives.schedules.ring_steps` and the others, named by its record), how a
long MPI message is cut, and the deliberately broken variants every compiled schedule declares
(its records: :mod:`commbench.collectives`). Pure: no torch at import; :mod:`.schedule` binds a
step list to buffers and replays it.
"""

from __future__ import annotations

from dataclasses import replace

from commbench.collectives import doubling, ring, tree
from commbench.collectives.algorithm import BrokenAlgorithm, Step
from commbench.ops import split_sizes

__all__ = ["BROKEN", "CHUNKED", "SCHEDULES", "SPLIT", "pieces", "step_list"]

SCHEDULES = {r.name: r.steps for m in (tree, ring, doubling) for r in m.RECORDS if r.steps}
SPLIT = 4  # messages up to SPLIT * segment are split; longer ones go whole


def step_list(algo: str, n: int, i: int, count: int, split=split_sizes) -> list[Step]:
    """Member ``i``'s steps of ``algo`` for a vector of ``count`` elements in a group of ``n``,
    its blocks cut by ``split`` (count, parts) where the algorithm cuts any."""
    if algo not in SCHEDULES:
        raise ValueError(f"algo={algo!r}: must be one of {', '.join(SCHEDULES)}")
    return SCHEDULES[algo](n, i, count, split=split)


def pieces(lo: int, hi: int, seg: int) -> list[tuple[int, int]]:
    """Elements [lo, hi) as one range, or, when longer than ``seg`` (elements; 0: never) and at
    most ``SPLIT * seg``, as consecutive ranges of at most ``seg``."""
    if seg <= 0 or hi - lo <= seg or hi - lo > SPLIT * seg:
        return [(lo, hi)]
    return [(a, min(a + seg, hi)) for a in range(lo, hi, seg)]


# -- the broken parts (each replaces one of schedule.CompiledParts) ------------------------------
def miscombined_steps(algo: str, n: int, i: int, count: int, split) -> list[Step]:
    """Member 0 mis-handles its first received block: combined where it should overwrite, or
    overwritten where it should combine (a contribution lost or counted twice)."""
    out = step_list(algo, n, i, count, split)
    if i == 0:
        for k, s in enumerate(out):
            if s.recv and s.recv[1] > s.recv[0]:
                out[k] = replace(s, reduce=not s.reduce)
                break
    return out


def short_pieces(lo: int, hi: int, seg: int) -> list[tuple[int, int]]:
    """The last piece of a split message is never sent nor received."""
    out = pieces(lo, hi, seg)
    return out[:-1] if len(out) > 1 else out


def poisoned_scratch(buf, count: int):
    """Scratch filled with NaN: a dropped piece leaves what the scratch held, and uninitialised
    memory may still hold the very bytes a reference run just received (the allocator hands the
    same block back), so it must not pass for data."""
    # lazy: imports torch
    from commbench.wire.buffers import like

    out = like(buf, count)
    if out.dtype.is_floating_point:
        out.fill_(float("nan"))
    return out


def tiny_first_only(op: str, a, b):
    """A tiny reduction whose second element is never combined."""
    # lazy: imports numpy, torch
    from commbench.collectives.compiled.reduce import tiny_reducer

    return tiny_reducer(op, a[:1], b[:1])


BROKEN = (  # every compiled schedule's
    BrokenAlgorithm("miscombine", {"steps": miscombined_steps},
                    "member 0 combines a block it should overwrite, or the other way round"),
    BrokenAlgorithm("short_pieces", {"pieces": short_pieces, "scratch": poisoned_scratch},
                    "the last piece of a split MPI message is dropped"),
    BrokenAlgorithm("tiny_first_only", {"tiny": tiny_first_only},
                    "a two-element reduction combines only its first element"),
)
CHUNKED = BrokenAlgorithm(  # a schedule that cuts blocks:
    "off_by_one_chunk", {"split": ring.off_by_one_chunks},
                           "every member cuts the same wrong chunks: the sums hold, the bytes "
                           "do not")
