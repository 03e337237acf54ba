"""A world of threads in one process: a transport for checking schedules at any world size.

Starting 8 torch ranks costs seconds; a schedule's posts do not need processes. :func:`run_threads`
runs an SPMD function on ``n`` threads, each with a :class:`ThreadContext` whose comm moves
tensors through in-memory mailboxes (messages buffered and matched by pair, tag and order, as
gloo matches them) and records every post (:mod:`commbench.wire.posts`). It carries point to
point only, which is all the algorithms built from send/recv use; the records then go to
:func:`commbench.wire.nccl_rules.check`.
"""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from collections.abc import Callable

import torch

from commbench.runtime.group import Grid, Group, grid_groups, parse_grid
from commbench.runtime.status import Tracker
from commbench.wire.comm import Comm
from commbench.wire.ledger import Ledger
from commbench.wire.posts import Posts

__all__ = ["ThreadBackend", "ThreadContext", "run_threads"]


class _Box:
    """Messages in flight: one queue per (communicator, src, dst, tag)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._queues: dict[tuple, queue.Queue] = defaultdict(queue.Queue)

    def q(self, key: tuple) -> queue.Queue:
        with self._lock:
            return self._queues[key]


class _Sent:
    def wait(self) -> None:
        return None


class _Receiving:
    def __init__(self, box: _Box, key: tuple, out: torch.Tensor) -> None:
        self.box, self.key, self.out = box, key, out

    def wait(self) -> None:
        try:
            got = self.box.q(self.key).get(timeout=self.box.timeout_s)
        except queue.Empty:
            raise TimeoutError(f"thread world: no message {self.key} within "
                               f"{self.box.timeout_s:.0f} s") from None
        self.out.copy_(got.reshape(self.out.shape))


class ThreadBackend:
    """Point to point between the threads of one world (module docstring)."""

    name = "threads"

    def __init__(self, box: _Box) -> None:
        self.box = box

    @staticmethod
    def unsupported(op: str, dtype: torch.dtype) -> str | None:
        return "the thread world has no collectives of its own"

    def _key(self, group: Group, src: int, dst: int, tag: int) -> tuple:
        return (group.ranks, group.ranks[src], group.ranks[dst], tag)

    def isend(self, x, group: Group, peer: int, tag: int) -> _Sent:
        self.box.q(self._key(group, group.index, peer, tag)).put(x.detach().clone())
        return _Sent()

    def irecv(self, out, group: Group, peer: int, tag: int) -> _Receiving:
        return _Receiving(self.box, self._key(group, peer, group.index, tag), out)

    def send(self, x, group: Group, peer: int, tag: int) -> None:
        self.isend(x, group, peer, tag)

    def recv(self, out, group: Group, peer: int, tag: int) -> None:
        self.irecv(out, group, peer, tag).wait()

    def batch(self, sends, recvs, group: Group, tag: int) -> list:
        return ([self.irecv(t, group, p, tag) for t, p in recvs]
                + [self.isend(t, group, p, tag) for t, p in sends])


class _PG:
    """The two calls of a process group the compiled schedules use: ``send([t], dst, tag)`` and
    ``recv([t], src, tag)``, positions in the group."""

    def __init__(self, backend: ThreadBackend, group: Group) -> None:
        self.backend, self.group = backend, group

    def send(self, tensors, dst: int, tag: int) -> _Sent:
        return self.backend.isend(tensors[0], self.group, dst, tag)

    def recv(self, tensors, src: int, tag: int) -> _Receiving:
        return self.backend.irecv(tensors[0], self.group, src, tag)


class ThreadContext:
    """The parts of :class:`~commbench.world.context.Context` an algorithm uses, on a thread."""

    def __init__(self, rank: int, size: int, box: _Box) -> None:
        self.rank, self.size = rank, size
        self.ledger, self.tracker = Ledger(), Tracker()
        self.posts = Posts(rank)
        self.node_size: int | None = None
        self.device = torch.device("cpu")
        self.backend = ThreadBackend(box)
        self._comm = Comm(self.backend, self.ledger, self.tracker, device=self.device)
        self._comm.posts = self.posts
        self.world = self._group(tuple(range(size)), "world")
        self.transports = ("threads",)

    def _group(self, ranks: tuple[int, ...], name: str) -> Group:
        g = Group(ranks, self.rank, name)
        return Group(ranks, self.rank, name, _PG(self.backend, g))

    def comm(self, transport: str | None = None) -> Comm:
        return self._comm

    def group(self, ranks, name: str = "") -> Group:
        return self._group(tuple(ranks), name)

    def grid(self, spec, combos: tuple = ()) -> Grid:
        dims = parse_grid(spec)
        built = {}
        for axes in [(a,) for a in dims]:
            mine = next(g for g in grid_groups(dims, axes) if self.rank in g)
            built[axes] = self._group(mine, "_".join(axes))
        return Grid(dims, self.rank, built)


def run_threads(n: int, fn: Callable, *args, timeout_s: float = 60.0) -> list:
    """``fn(ctx, *args)`` on ``n`` threads of one world; every rank's result, in rank order.
    A rank's exception is raised here once every thread has ended."""
    box = _Box(timeout_s)
    ctxs = [ThreadContext(r, n, box) for r in range(n)]
    results: list = [None] * n
    errors: list = [None] * n

    def body(r: int) -> None:
        try:
            results[r] = fn(ctxs[r], *args)
        except BaseException as exc:  # re-raised in the caller's thread
            errors[r] = exc

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 5)
    for r, exc in enumerate(errors):
        if exc is not None:
            raise RuntimeError(f"thread world of {n}: rank {r} failed: {exc!r}") from exc
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"thread world of {n}: a rank did not finish within {timeout_s:.0f} s")
    return results
