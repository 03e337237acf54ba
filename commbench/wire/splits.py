"""Making a group under NCCL, as torch does it: a sequence of ``ncclCommSplit`` calls on the
default communicator, one per rank per group, which must line up on every rank.

torch's ``new_group`` (``_new_group_with_tag`` in ``torch/distributed/distributed_c10d.py``, torch
2.3 to 2.13), when the default group is bound to a device (``init_process_group(device_id=...)``,
eager initialisation; commbench's own mode):

* a rank that is **not a member** of the new group calls ``perform_nocolor_split`` on the default
  group's NCCL backend: an ``ncclCommSplit`` with ``NCCL_SPLIT_NOCOLOR``, whatever backend the new
  group asked for;
* a **member of a new NCCL group** splits with the group's colour (``_process_group_color`` of its
  ranks) while the group is made (``eager_connect_single_device``);
* a **member of a new gloo group** calls no split at all.

``ncclCommSplit`` is collective over the parent: the k-th split of every rank is one call, and
the ranks that pass one colour in it form that colour's communicator. So every rank must make the
same number of splits, and in the k-th, the ranks sharing a colour must be exactly the group that
colour stands for. A member of a gloo group beside non-members breaks both: the non-members make
one split more, and every later split pairs with the wrong one (one-rank communicators, or a hang
in ``ncclCommSplit``). Without a bound device (lazy initialisation) nothing splits at creation:
each group's communicator is made by its members at its first use.

commbench makes a gloo group beside every NCCL group for its own traffic; its members make the
no-colour split the non-members make (:attr:`Creation.balanced`), so the splits line up by rule.
Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Creation", "check", "split_calls"]

_MAX = 8


@dataclass(frozen=True)
class Creation:
    """One ``new_group`` call of one rank: the group's global ranks and its backend ("nccl" or
    "gloo"); ``balanced``: a member of a gloo group also makes the no-colour split."""

    ranks: tuple[int, ...]
    backend: str
    balanced: bool = False


def split_calls(rank: int, creations: list[Creation], mode: str = "eager"
                ) -> list[tuple[int, ...] | None]:
    """The ``ncclCommSplit`` calls ``rank`` makes for its ``creations``: per call, the group its
    colour stands for, None for no colour (module docstring)."""
    if mode == "lazy":
        return []
    out: list[tuple[int, ...] | None] = []
    for c in creations:
        if rank not in c.ranks:
            out.append(None)
        elif c.backend == "nccl":
            out.append(tuple(c.ranks))
        elif c.balanced:
            out.append(None)
    return out


def check(creations: list[list[Creation]], mode: str = "eager") -> list[str]:
    """What goes wrong making these groups under NCCL: ``creations[r]`` is rank r's
    ``new_group`` calls in order; empty when every split lines up."""
    calls = [split_calls(r, c, mode) for r, c in enumerate(creations)]
    problems = []
    counts = {len(c) for c in calls}
    for k in range(max((len(c) for c in calls), default=0)):
        here = {r: c[k] for r, c in enumerate(calls) if k < len(c)}
        colours: dict[tuple[int, ...], list[int]] = {}
        for r, g in here.items():
            if g is not None:
                colours.setdefault(g, []).append(r)
        for g, got in colours.items():
            if tuple(got) != g:
                missing = sorted(set(g) - set(got))
                doing = ", ".join(_doing(r, calls[r][k]) for r in missing if k < len(calls[r]))
                problems.append(
                    f"ncclCommSplit {k}: ranks {got} pass the colour of group {list(g)}, which "
                    f"they would then hold without ranks {missing} ({doing or 'no split'})")
        if problems:
            break
    if len(counts) > 1:
        by = {r: len(c) for r, c in enumerate(calls)}
        low = min(by.values())
        waiting = [r for r, n in by.items() if n > low][:_MAX]
        made = ", ".join(f"rank {r}: {n}" for r, n in list(by.items())[:_MAX])
        problems.append(f"ncclCommSplit hangs: ranks make different numbers of splits of the "
                        f"default communicator ({made}); ranks {waiting} wait in split {low} for "
                        "ranks that never call it")
    return problems[:_MAX]


def _doing(rank: int, g: tuple[int, ...] | None) -> str:
    return f"rank {rank} splits with no colour" if g is None else \
        f"rank {rank} passes the colour of group {list(g)}"
