"""Sets of ranks written for a reader of a job of any size (pure): ``0-511`` rather than 512
numbers, the ranks of a data-parallel group of a tensor-parallel job as ``0-504:8``."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["LISTED", "rank_list", "ranks_text", "who"]

LISTED = 16  # a set of at most this many ranks is written out whole, as a list


def ranks_text(ranks: Iterable[int]) -> str:
    """Ranks as a reader scans them: runs of consecutive ranks as ``a-b`` (``0-127``,
    ``0,2,4``, ``0-3,8-11``), and the ranks, where four or more of them step evenly
    (a data-parallel group of a tensor-parallel job: every 8th rank), as ``a-b:step``
    (Slurm's notation: ``0-504:8``), less one or two where it lacks them (``5-509:8 less
    301``)."""
    rs = sorted(set(ranks))
    if len(rs) >= 4 and len({b - a for a, b in zip(rs, rs[1:])}) == 1 and rs[1] - rs[0] > 1:
        return f"{rs[0]}-{rs[-1]}:{rs[1] - rs[0]}"
    gaps = _stride_gaps(rs)
    if gaps:  # a strided group less a rank or two (the one a hung group waits for)
        return f"{rs[0]}-{rs[-1]}:{gaps[0]} less {','.join(map(str, gaps[1]))}"
    out, run = [], []
    for r in rs:
        if run and r != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)))
            run = []
        run.append(r)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)))
    return ",".join(out)


def _stride_gaps(rs: list[int]) -> tuple[int, list[int]] | None:
    """(step, the ranks missing) where ``rs`` (sorted) is every step-th rank from its first to
    its last (step >= 2, 8 ranks or more) less one or two of them; else None."""
    if len(rs) < 8:
        return None
    step = min(b - a for a, b in zip(rs, rs[1:]))
    if step < 2 or any((r - rs[0]) % step for r in rs):
        return None
    missing = sorted(set(range(rs[0], rs[-1] + 1, step)) - set(rs))
    return (step, missing) if 0 < len(missing) <= 2 else None


def rank_list(ranks: Iterable[int]) -> str:
    """A set of ranks in a message: a list as Python writes it where it is short (``[0, 2]``),
    else its ranges and its size (``[0-510] (511 ranks)``)."""
    rs = sorted(set(ranks))
    return str(rs) if len(rs) <= LISTED else f"[{ranks_text(rs)}] ({len(rs)} ranks)"


def who(ranks: Iterable[int], listed: bool = True) -> str:
    """The subject of a sentence about ranks: ``rank 2``, ``ranks [0, 1, 3]``, ``ranks [0-510]
    (511 ranks)``; without the list's brackets and count where ``listed`` is false
    (``ranks 256-511``)."""
    rs = sorted(set(ranks))
    if len(rs) == 1:
        return f"rank {rs[0]}"
    return f"ranks {rank_list(rs)}" if listed else f"ranks {ranks_text(rs)}"
