"""Process groups and rank grids.

A :class:`Group` is a set of global ranks with the handles each transport needs (a torch
``ProcessGroup``, an MPI communicator). Roots and peers passed to the comm layer are positions
within the group (0..P-1), as MPI has them.

A rank grid is built from one description, ``"dp=2,tp=2"``: the ranks ``0..W-1`` laid out as an
array of that shape, the last axis varying fastest (so TP neighbours are adjacent ranks, as
Megatron and picotron lay them out). The group along a set of axes holds the ranks that differ only
in those axes: move the axes to the end and cut the array into rows (:func:`grid_groups`).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Grid", "Group", "grid_coords", "grid_groups", "parse_grid"]


@dataclass(frozen=True, eq=False)
class Group:
    """A process group as this rank sees it.

    ranks: global ranks, in group order. rank: this process's global rank.
    torch_pg / mpi_comm: the transport handles (None where a transport is absent, or for a rank
    outside the group). side_pg: a gloo group of the same ranks beside an NCCL one, for the
    harness's own traffic (agreements, outcomes), which stays off the benchmark's communicator.
    """

    ranks: tuple[int, ...]
    rank: int
    name: str = ""
    torch_pg: Any = field(default=None, repr=False)
    mpi_comm: Any = field(default=None, repr=False)
    side_pg: Any = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return len(self.ranks)

    @functools.cached_property  # each call asks; a scan of 512 ranks took 5 us
    def member(self) -> bool:
        return self.rank in self.ranks

    @functools.cached_property
    def index(self) -> int:
        """This rank's position in the group."""
        return self.ranks.index(self.rank)

    def __str__(self) -> str:
        label = f"{self.name} " if self.name else ""
        return f"{label}group {list(self.ranks)}"


def parse_grid(spec: str | dict[str, int]) -> dict[str, int]:
    """``"dp=2,tp=2"`` or ``{"dp": 2, "tp": 2}`` to an ordered dict of axis sizes."""
    if isinstance(spec, dict):
        items = list(spec.items())
    else:
        items = []
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, sep, size = part.partition("=")
            if not sep or not name.strip():
                raise ValueError(f"grid {spec!r}: each axis is written name=size, e.g. 'dp=2,tp=2'")
            try:
                items.append((name.strip(), int(size)))
            except ValueError:
                raise ValueError(f"grid axis {name.strip()}={size!r}: size must be an integer") from None
    dims: dict[str, int] = {}
    for name, size in items:
        if not name.isidentifier():
            raise ValueError(f"grid axis name {name!r}: must be an identifier")
        if name in dims:
            raise ValueError(f"grid axis {name!r} given twice")
        if size < 1:
            raise ValueError(f"grid axis {name}={size}: must be >= 1")
        dims[name] = size
    if not dims:
        raise ValueError(f"grid {spec!r}: no axes")
    return dims


def grid_coords(dims: dict[str, int], rank: int) -> dict[str, int]:
    """``rank``'s index along each axis of the grid ``dims`` (the last axis fastest)."""
    out, rest = {}, rank
    for name in reversed(list(dims)):
        rest, out[name] = divmod(rest, dims[name])
    return dict(reversed(out.items()))


def grid_groups(dims: dict[str, int], axes: tuple[str, ...]) -> list[tuple[int, ...]]:
    """All groups along ``axes`` of the grid ``dims``, each in row-major order of those axes."""
    names = list(dims)
    for a in axes:
        if a not in dims:
            raise ValueError(f"axis {a!r} is not in the grid {dims}")
    sizes = [dims[n] for n in names]
    strides = [math.prod(sizes[k + 1 :]) for k in range(len(sizes))]
    fixed = [n for n in names if n not in axes]
    groups = []
    for fixed_idx in itertools.product(*(range(dims[n]) for n in fixed)):
        base = sum(strides[names.index(n)] * v for n, v in zip(fixed, fixed_idx))
        members = []
        for free_idx in itertools.product(*(range(dims[a]) for a in axes)):
            members.append(base + sum(strides[names.index(a)] * v for a, v in zip(axes, free_idx)))
        groups.append(tuple(members))
    return groups


@dataclass(frozen=True, eq=False)
class Grid:
    """A rank grid as this rank sees it: its coordinates and its group along any axes."""

    dims: dict[str, int]
    rank: int
    groups: dict[tuple[str, ...], Group]

    @property
    def coords(self) -> dict[str, int]:
        return grid_coords(self.dims, self.rank)

    def group(self, *axes: str) -> Group:
        key = tuple(a for a in self.dims if a in axes)
        if len(key) != len(axes):
            raise KeyError(f"axes {axes} not all in the grid {self.dims}")
        try:
            return self.groups[key]
        except KeyError:
            raise KeyError(f"grid has no group over {axes}; built: {list(self.groups)}") from None

    def __getitem__(self, axis: str) -> Group:
        return self.group(*axis.split("_"))
