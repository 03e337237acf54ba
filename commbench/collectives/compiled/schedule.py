"""The all-reduce step lists (each algorithm's ``steps``, :mod:`steps`), compiled once onto fixed
buffers and replayed.

:mod:`ring` and :mod:`doubling` are the readable reference: each message goes through the comm
layer, which checks, tracks and books it, and each step allocates its result. That costs tens of
microseconds per step in Python, more than MPI's own small all-reduce takes. Here the same
schedules (the same blocks, peers and order of operations, so bitwise the same results) are
written as data, :class:`Step`, and :class:`Compiled` binds them to one flat buffer and a scratch
block:

* MPI: one persistent send and receive request per step (``Send_init`` / ``Recv_init`` on NumPy
  views made once), replayed by each request's ``Start`` then its wait (``Wait``, or, with more
  ranks than cores on the host, ``Test`` and yield the core: :mod:`waiting`); reductions in place
  (:mod:`reduce`: NumPy ufuncs, Python floats for 2 elements, torch for float16 and bfloat16).
* torch.distributed: the process group's own ``send`` / ``recv`` on fixed tensor views (gloo), or
  one ``batch_isend_irecv`` per step (NCCL, which needs the pair grouped); reductions in place.
  A run of joint steps (:class:`Step`) is posted together.

Over MPI a message of more than ``segment`` bytes (default :data:`MPI_SEGMENT`) and at most
``SPLIT`` times that goes as pieces of at most ``segment`` bytes, all started together: pieces
within MPICH's eager limit arrive sooner than one message past it (docs/decisions.md). Pieces
between the same pair keep their order (MPI's non-overtaking rule), so the same bytes land in
the same places.

The ledger still sees every message: :meth:`Compiled.book` records each one (same op names and
bytes as the reference path; a split message as its pieces) after the call, outside any timed
region.

Shapes: buf [S] flat, this rank's vector, reduced in place; scratch [slots * longest combined
block] (one slot unless a run of joint steps combines several receives).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from commbench.collectives._p2p import TAG, flat, pg_run
from commbench.collectives.algorithm import Step
from commbench.collectives.compiled.reduce import reducer, tiny_reducer
from commbench.collectives.compiled.steps import SPLIT, pieces, step_list
from commbench.collectives.compiled.waiting import checked, wait_mode, waiter
from commbench.ops import split_sizes
from commbench.runtime.group import Group
from commbench.wire.buffers import like
from commbench.wire.checks import check_op, dtype_name
from commbench.wire.transport.mpi_backend import _np
from commbench.wire.watch import quiet

__all__ = ["COMPILED", "Compiled", "CompiledParts", "MPI_SEGMENT", "SPLIT", "compiled_all_reduce",
           "pieces"]
MPI_SEGMENT = 4096  # bytes: MPICH's eager messages on this machine class (see above)


@dataclass(frozen=True)
class CompiledParts:
    """A compiled schedule's swappable pieces: its steps (``steps(algo, n, i, count, split)``),
    how they cut the buffer, how a message is cut for MPI, its scratch, its tiny reduction, how
    an MPI request is waited for (``waiter(req, mode)``)."""

    steps: Callable = step_list
    split: Callable[[int, int], list[int]] = split_sizes
    pieces: Callable[[int, int, int], list[tuple[int, int]]] = pieces
    scratch: Callable = like
    tiny: Callable = tiny_reducer
    waiter: Callable = waiter


COMPILED = CompiledParts()


class Compiled:
    """``steps`` bound to ``buf`` on ``comm``'s transport: :meth:`run` replays them in place."""

    def __init__(self, comm, buf: torch.Tensor, group: Group, steps: list[Step], op: str,
                 name: str, segment: int | None = None, wait: str | None = None,
                 parts: CompiledParts = COMPILED) -> None:
        check_op(name, op, buf.dtype)  # reduced here, not by the transport: any dtype it moves
        if comm.transport == "mpi" and buf.is_cuda:
            raise ValueError(f"{name}: compiled schedules over MPI take CPU tensors, got {buf.device}")
        if buf.dim() != 1 or not buf.is_contiguous():
            raise ValueError(f"{name}: the buffer must be flat and contiguous, got {tuple(buf.shape)}")
        self.comm, self.buf, self.group, self.name, self.steps = comm, buf, group, name, steps
        self.parts = parts
        reduced = [s for s in steps if s.reduce and s.recv]
        self._block = max((s.recv[1] - s.recv[0] for s in reduced), default=0)
        slots = 1 + max((s.slot for s in reduced), default=0)
        self.scratch = parts.scratch(buf, self._block * slots)  # NumPy-backed on CPU, like buf
        self._reqs: list = []
        self._mpi = comm.transport == "mpi"
        if segment is None:
            segment = MPI_SEGMENT if self._mpi else 0
        if segment < 0:
            raise ValueError(f"{name}: segment={segment}: must be >= 0 bytes (0: whole messages)")
        self._seg = max(1, segment // buf.element_size()) if self._mpi and segment else 0
        self.wait = checked(wait, f"{name}: wait") if wait is not None else (
            wait_mode() if self._mpi else "spin")
        self._messages = _messages(steps, self._seg, parts.pieces)  # booked per call, computed once
        self._runs: list[tuple[list, list]] = []  # per group call: (recvs, sends) [(t, peer)]
        self._ops = self._bind(op)

    # -- binding --------------------------------------------------------------------------------
    def _views(self, step: Step):
        """(send view, receive view, combine target) of a step as tensors; None where absent."""
        buf = self.buf
        send = buf[step.send[0]:step.send[1]] if step.send and step.send[1] > step.send[0] else None
        recv = target = None
        if step.recv and step.recv[1] > step.recv[0]:
            target = buf[step.recv[0]:step.recv[1]]
            lo = step.slot * self._block
            recv = self.scratch[lo:lo + target.numel()] if step.reduce else target
        return send, recv, (target if step.reduce else None)

    def _averager(self, lo: int, hi: int, op: str):
        view, n = self.buf[lo:hi], self.group.size
        return partial(view.div_, n) if op == "avg" and hi > lo else None

    def _bind(self, op: str) -> list:
        """The schedule as a flat list of zero-argument calls: messages, reductions, averages;
        a run of joint steps (:class:`Step`) bound as one."""
        ops, run = [], []
        bind = self._mpi_run if self._mpi else self._torch_run
        for step in self.steps:
            if step.avg:
                ops += bind(run, op) if run else []
                ops.append(self._averager(*step.avg, op))
                run = []
                continue
            run.append(step)
            if not step.joint:
                ops += bind(run, op)
                run = []
        ops += bind(run, op) if run else []
        return [f for f in ops if f is not None]

    def _parts(self, run: list[Step], op: str):
        """Per step of a run: (step, send view, receive view, reducer or None)."""
        out = []
        for step in run:
            send, recv, target = self._views(step)
            out.append((step, send, recv,
                        None if target is None else reducer(op, target, recv, self.parts.tiny)))
        return out

    def _mpi_run(self, run: list[Step], op: str) -> list:
        """Persistent requests, each started, then per step its receive's completion and its
        reduction (every send completed after the first receive); freed by :meth:`close`.

        Bound ``Start`` / ``Wait`` per request rather than ``Startall`` / ``Waitall`` on a list:
        fewer Python calls per step, which matters at small sizes (docs/decisions.md).
        Waiting on a receive first cannot stall a send: MPI progresses every pending request
        inside any wait or test. ``self.wait`` picks the wait (:func:`waiting.waiter`)."""

        c, recvs, sends, after, posted = self.group.mpi_comm, [], [], [], ([], [])
        cut = self.parts.pieces
        for step, send, recv, red in self._parts(run, op):
            rp = [(recv[a:b], step.src) for a, b in cut(0, recv.numel(), self._seg)] \
                if recv is not None else []
            sp = [(send[a:b], step.dst) for a, b in cut(0, send.numel(), self._seg)] \
                if send is not None else []
            recvs.append([c.Recv_init(_np(t), source=src, tag=TAG) for t, src in rp])
            sends += [c.Send_init(_np(t), dest=dst, tag=TAG) for t, dst in sp]
            posted[0].extend(rp)
            posted[1].extend(sp)
            after.append(red)
        self._runs.append(posted)
        self._reqs += [r for rs in recvs for r in rs] + sends
        ops = [r.Start for rs in recvs for r in rs] + [r.Start for r in sends]
        done = partial(self.parts.waiter, mode=self.wait)
        for k, rs in enumerate(recvs):
            ops += [done(r) for r in rs] + ([done(r) for r in sends] if k == 0 else []) + [after[k]]
        return ops

    def _torch_run(self, run: list[Step], op: str) -> list:
        """The process group's own send/recv, posted together (gloo); one batch_isend_irecv for
        the run, then its reductions (NCCL, which needs the messages grouped)."""
        parts = self._parts(run, op)
        recvs = [(r, s.src) for s, _, r, _ in parts if r is not None]
        sends = [(t, s.dst) for s, t, _, _ in parts if t is not None]
        after = [red for _, _, r, red in parts if r is not None]
        if not recvs and not sends:
            return []
        self._runs.append((recvs, sends))
        if self.comm.transport == "nccl":
            return [partial(_batched, self.comm.backend, self.group, recvs, sends)] + after
        return [partial(pg_run, self.group.torch_pg, recvs, sends, after)]

    # -- use ------------------------------------------------------------------------------------
    def run(self) -> None:
        """Replay the schedule once on ``buf`` (nothing booked, nothing allocated)."""
        if self.comm.posts is not None:
            self._record(self.comm.posts)
        if self._mpi:
            for f in self._ops:
                f()
        else:
            with quiet():  # booked by :meth:`book`, not by a watcher
                for f in self._ops:
                    f()

    def _record(self, posts) -> None:
        """One call's posts (:mod:`commbench.wire.posts`): each run of steps one group call, as
        both transports post it (one ``batch_isend_irecv`` on NCCL), waited before the next."""
        ranks = self.group.ranks
        for recvs, sends in self._runs:
            with posts.group():
                ids = [posts.post(kind, kind, ranks, peer=ranks[p], count=t.numel(),
                                  nbytes=t.numel() * t.element_size(), dtype=dtype_name(t.dtype))
                       for kind, pairs in (("recv", recvs), ("send", sends)) for t, p in pairs]
            for i in ids:
                posts.wait(i)

    def messages(self) -> list[tuple[str, int]]:
        """("isend" | "irecv", elements) for every message of one call, in order."""
        return list(self._messages)

    def book(self, seconds: float = 0.0) -> None:
        """Book one call's messages, as the comm layer books each; the call's time split evenly."""
        msgs, ledger, g = self._messages, self.comm.ledger, self.group
        size, dtype = self.buf.element_size(), dtype_name(self.buf.dtype)
        with ledger.scope(self.name):
            for kind, count in msgs:
                nbytes = count * size
                sent, recv = (nbytes, 0) if kind == "isend" else (0, nbytes)
                ledger.record(kind, g.ranks, self.comm.transport, dtype, count, sent, recv,
                              seconds / max(len(msgs), 1), axis=g.name)

    def close(self) -> None:
        """Free the persistent requests (MPI); the object cannot run afterwards."""
        for req in self._reqs:
            req.Free()
        self._reqs, self._ops = [], []

    def __enter__(self) -> Compiled:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _batched(backend, group: Group, recvs: list, sends: list) -> None:
    """One group call of the run's messages (the backend's ``batch_isend_irecv``), all waited."""
    for w in backend.batch(sends, recvs, group, TAG):
        w.wait()


def _messages(steps: list[Step], seg: int = 0, cut=pieces) -> list[tuple[str, int]]:
    out = []
    for s in steps:
        if s.recv and s.recv[1] > s.recv[0]:
            out += [("irecv", b - a) for a, b in cut(*s.recv, seg)]
        if s.send and s.send[1] > s.send[0]:
            out += [("isend", b - a) for a, b in cut(*s.send, seg)]
    return out


def compiled_all_reduce(comm, x: torch.Tensor, group: Group, *, op: str = "sum",
                        algo: str = "ring", segment: int | None = None,
                        wait: str | None = None, parts: CompiledParts = COMPILED) -> torch.Tensor:
    """``algo``'s all-reduce compiled and run once: ``x`` [*] -> same shape, on every member
    (``segment``, ``wait``: see :class:`Compiled`)."""

    buf = flat(x)
    steps = parts.steps(algo, group.size, group.index, buf.numel(), parts.split)
    name = f"{algo}_compiled"
    with Compiled(comm, buf, group, steps, op, name, segment, wait, parts) as c:
        comm.tracker.enter(f"all_reduce/{name}", group.ranks)
        t0 = time.perf_counter()
        c.run()
        c.book(time.perf_counter() - t0)
        comm.tracker.leave(f"all_reduce/{name}")
    return buf.reshape(x.shape)
