"""The compiled schedules' deliberately broken variants, declared on their records
(:mod:`commbench.collectives`): each replaces one of :class:`~.schedule.CompiledParts`, and the
property tests must catch every one."""

from __future__ import annotations

from dataclasses import replace

import torch

from commbench.collectives.algorithm import BrokenAlgorithm
from commbench.collectives.compiled.reduce import tiny_reducer
from commbench.collectives.compiled.schedule import pieces
from commbench.collectives.compiled.steps import Step, step_list
from commbench.collectives.ring import off_by_one_chunks
from commbench.wire.buffers import like

__all__ = ["broken_of"]


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


def poisoned_scratch(buf: torch.Tensor, count: int) -> torch.Tensor:
    """Scratch filled with NaN: a dropped piece leaves what the scratch held, and uninitialised
    memory may still hold the very bytes a reference run just received (the allocator hands the
    same block back), so it must not pass for data."""
    out = like(buf, count)
    if out.dtype.is_floating_point:
        out.fill_(float("nan"))
    return out


def tiny_first_only(op: str, a, b):
    """A tiny reduction whose second element is never combined."""
    return tiny_reducer(op, a[:1], b[:1])


_ANY = (
    BrokenAlgorithm("miscombine", {"steps": miscombined_steps},
                    "member 0 combines a block it should overwrite, or the other way round"),
    BrokenAlgorithm("short_pieces", {"pieces": short_pieces, "scratch": poisoned_scratch},
                    "the last piece of a split MPI message is dropped"),
    BrokenAlgorithm("tiny_first_only", {"tiny": tiny_first_only},
                    "a two-element reduction combines only its first element"),
)
_CHUNKED = BrokenAlgorithm("off_by_one_chunk", {"split": off_by_one_chunks},
                           "every member cuts the same wrong chunks: the sums hold, the bytes "
                           "do not")


def broken_of(algo: str) -> tuple[BrokenAlgorithm, ...]:
    """The broken variants of ``algo``'s compiled schedule (chunks: those that cut blocks)."""
    return _ANY + ((_CHUNKED,) if algo in ("ring", "rabenseifner") else ())
