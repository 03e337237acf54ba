"""One record per (collective, algorithm), as nccl-tests fills one ``struct testColl`` per
collective: everything the rest of commbench needs to run it, count it and price it.

* ``fn``: the algorithm in its own signature (None: the transport's own collective);
* ``elements(n, i, count, **kw)``: elements member ``i`` of ``n`` sends and receives in one call
  (count: elements of its input; all-gather: its block; kw: root, in/out splits, row);
* ``terms(n, S)``: steps, bytes sent and bytes reduced on its critical path for nccl-tests' size
  S, the alpha-beta model's terms (:mod:`commbench.costmodel.alphabeta`);
* ``compiled``: the step list (:mod:`commbench.collectives.compiled.steps`) it replays, if any;
* ``parts``: a frozen dataclass of its swappable steps, passed to ``fn`` as ``parts=``;
  ``broken``: its deliberately broken variants (:class:`BrokenAlgorithm`: parts replaced),
  which the property tests must catch, declared here as the patterns declare theirs;
* ``grid(n)``: the rank grid it runs on (the hierarchical all-reduce: its nodes); ``needs(n)``:
  why a world of ``n`` ranks cannot run it ('' when it can); with ``per_node``, these and
  ``elements`` also take ``local``, the ranks per node of the world (``Context.node_size``).

:meth:`Algorithm.bind` calls any of them the same way, so no caller asks which one it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from commbench.wire.ops import OPS

__all__ = ["Algorithm", "BrokenAlgorithm", "any_world"]


def any_world(n: int) -> str:
    return ""


def _call(op: str, fn, comm, x, where, root: int, redop: str, splits):
    """The uniform call of an algorithm of ``op`` built on one group: a root and a reduction
    where its record takes them."""
    record, kw = OPS[op], {}
    if record.rooted:
        kw["root"] = root
    if record.reduces:
        kw["op"] = redop
    return fn(comm, x, where, **kw)


@dataclass(frozen=True)
class BrokenAlgorithm:
    """An algorithm run with ``parts`` in place of its own (``why`` says what goes wrong)."""

    name: str
    parts: dict[str, Callable]
    why: str


@dataclass(frozen=True)
class Algorithm:
    """A collective's algorithm (module docstring)."""

    op: str
    name: str
    fn: Callable | None
    elements: Callable[..., tuple[int, int]]
    terms: Callable[[int, float], tuple[float, float, float]]
    compiled: str = ""
    grid: Callable[..., str] | None = None
    needs: Callable[..., str] = any_world
    per_node: bool = False  # grid, needs and elements take ``local``: the world's ranks per node
    call: Callable | None = None  # (fn, comm, x, where, root, redop, splits): its own call
    parts: Any = None
    broken: tuple[BrokenAlgorithm, ...] = ()

    def parts_of(self, broken: str | None = None):
        """Its parts, or those of its broken variant named ``broken``."""
        if broken is None:
            return self.parts
        for b in self.broken:
            if b.name == broken:
                return replace(self.parts, **b.parts)
        known = ", ".join(b.name for b in self.broken) or "none"
        raise ValueError(f"broken={broken!r}: {self.op}/{self.name} declares {known}")

    def bytes(self, n: int, i: int, count: int, itemsize: int, **kw) -> tuple[int, int]:
        """(bytes sent, bytes received) by member ``i`` of ``n`` in one call."""
        if not 0 <= i < n:
            raise ValueError(f"member index {i}: must be in 0..{n - 1}")
        sent, recv = self.elements(n, i, count, **kw)
        return sent * itemsize, recv * itemsize

    def node_kw(self, ctx) -> dict:
        """``{"local": ranks per node}`` for an algorithm that follows the world's nodes."""
        return {"local": getattr(ctx, "node_size", None)} if self.per_node else {}

    def cost(self, n: int, size: float) -> tuple[float, float, float]:
        """The alpha-beta terms of one call on ``n`` ranks; nothing moves on one."""
        return (0.0, 0.0, 0.0) if n == 1 else self.terms(n, float(size))

    def bind(self, ctx, comm, x, *, root: int = 0, redop: str = "sum", splits=None,
             broken: str | None = None, **options):
        """A no-argument call of this algorithm on ``ctx``'s world (or its grid); with
        ``broken``, of that broken variant; ``options`` go to its function (a compiled
        schedule's ``segment`` and ``wait``)."""
        if self.fn is None:
            raise ValueError(f"{self.op}/{self.name}: the transport's own collective has no "
                             "algorithm to bind (timing.native prepares it)")
        kw = self.node_kw(ctx)
        why = self.needs(ctx.size, **kw)
        if why:
            raise ValueError(f"{self.op}/{self.name}: {why}")
        where = ctx.grid(self.grid(ctx.size, **kw)) if self.grid is not None else ctx.world
        call = self.call or partial(_call, self.op)
        fn = self.fn if self.parts is None else partial(self.fn, parts=self.parts_of(broken))
        fn = partial(fn, **options) if options else fn
        return lambda: call(fn, comm, x, where, root, redop, splits)
