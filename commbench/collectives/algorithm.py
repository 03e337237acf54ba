"""One record per (collective, algorithm), as nccl-tests fills one ``struct testColl`` per
collective: everything the rest of commbench needs to run it, count it and price it.

* ``fn``: the algorithm in its own signature, named ``"module:attribute"`` under
  ``commbench.collectives`` (None: the transport's own collective); a record is pure data, so
  that listing and pricing the algorithms imports no torch, and its code is imported when it runs;
* ``elements(n, i, count, **kw)``: elements member ``i`` of ``n`` sends and receives in one call
  (count: elements of its input; all-gather: its block; kw: root, in/out splits, row);
* ``terms(n, S)``: steps, bytes sent and bytes reduced on its critical path for nccl-tests' size
  S, the alpha-beta model's terms (:mod:`commbench.costmodel.alphabeta`);
* ``steps(n, i, count, split)``: its schedule as a list of :class:`Step` (an all-reduce's), which
  its ``_compiled`` record replays on fixed buffers; ``compiled``: the algorithm whose steps
  a compiled record replays (:mod:`commbench.collectives.compiled`);
* ``parts``: a frozen dataclass of its swappable steps (named as ``fn`` is), passed to ``fn`` as
  ``parts=``; ``broken``: its deliberately broken variants (:class:`BrokenAlgorithm`: parts
  replaced, each named or given), which the property tests must catch, declared here as the
  patterns declare theirs;
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

from commbench.names import named
from commbench.ops import OPS

__all__ = ["Algorithm", "BrokenAlgorithm", "Step", "any_world", "resolve", "traffic"]


def resolve(part):
    """A part named ``"module:attribute"`` (under ``commbench.collectives``), or the part itself."""
    return named(part, "commbench.collectives") if isinstance(part, str) else part


@dataclass(frozen=True, slots=True)
class Step:
    """One step of one member of a schedule: send buf[send] to ``dst`` while receiving
    buf-sized ``recv`` from ``src``; ``reduce``: combine what came into buf[recv] (else it
    overwrites buf[recv]). ``avg``: no message, divide buf[avg] by the group size (op avg only).
    Ranges are element offsets into the flat vector buf [S].

    ``joint``: posted together with the next step, and so on along a run of joint steps ended
    by one that is not: every message of the run is started at once; then each step in order
    waits for its receive (all the run's sends after the first) and combines it. A run's
    combined receives land in distinct scratch blocks, ``slot`` 0, 1, ...; no step of a run may
    combine into what one of its sends reads before that send completes (the first's may: the
    sends are waited before it combines)."""

    send: tuple[int, int] | None = None
    dst: int = -1
    recv: tuple[int, int] | None = None
    src: int = -1
    reduce: bool = False
    avg: tuple[int, int] | None = None
    slot: int = 0
    joint: bool = False


def traffic(steps: list[Step]) -> tuple[int, int]:
    """(elements sent, elements received) by one member's ``steps``: an algorithm's bytes are
    counted from its schedule, not written a second time."""
    sent = sum(s.send[1] - s.send[0] for s in steps if s.send is not None)
    got = sum(s.recv[1] - s.recv[0] for s in steps if s.recv is not None)
    return sent, got


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
    """An algorithm run with ``parts`` in place of its own (``why`` says what goes wrong); each
    part a callable or its name, ``"module:attribute"``."""

    name: str
    parts: dict[str, Callable | str]
    why: str


@dataclass(frozen=True)
class Algorithm:
    """A collective's algorithm (module docstring)."""

    op: str
    name: str
    fn: Callable | str | None
    elements: Callable[..., tuple[int, int]]
    terms: Callable[[int, float], tuple[float, float, float]]
    steps: Callable[..., list[Step]] | None = None
    compiled: str = ""
    grid: Callable[..., str] | None = None
    needs: Callable[..., str] = any_world
    per_node: bool = False  # grid, needs and elements take ``local``: the world's ranks per node
    call: Callable | None = None  # (fn, comm, x, where, root, redop, splits): its own call
    parts: Any = None
    broken: tuple[BrokenAlgorithm, ...] = ()

    @property
    def function(self) -> Callable | None:
        """Its function, imported now (None: the transport's own collective)."""
        return resolve(self.fn)

    def parts_of(self, broken: str | None = None):
        """Its parts, or those of its broken variant named ``broken``."""
        parts = resolve(self.parts)
        if broken is None:
            return parts
        for b in self.broken:
            if b.name == broken:
                return replace(parts, **{k: resolve(v) for k, v in b.parts.items()})
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
        fn = self.function
        fn = fn if self.parts is None else partial(fn, parts=self.parts_of(broken))
        fn = partial(fn, algo=self.compiled) if self.compiled else fn
        fn = partial(fn, **options) if options else fn
        return lambda: call(fn, comm, x, where, root, redop, splits)
