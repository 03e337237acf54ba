"""Point-to-point calls of the comm layer: send, recv, isend, irecv and the grouped exchange.

:meth:`PointToPoint.exchange` is the one way commbench's schedules move data between ranks: the
messages of one step, sends and receives, posted as one group call. On NCCL that is one
``batch_isend_irecv`` (``ncclGroupStart/End``), the only form in which a rank may send and
receive at once without a deadlock; gloo and MPI post them as non-blocking calls side by side,
their fastest path. Every message is booked as an ``isend`` or ``irecv`` either way, and the
record of posts (:mod:`commbench.wire.posts`) marks them as one group on every transport.
"""

from __future__ import annotations

import contextlib
import time

import torch

from commbench.runtime.group import Group
from commbench.wire.checks import check_device, check_p2p, dtype_name
from commbench.wire.transport import Work
from commbench.wire.watch import quiet

__all__ = ["Exchange", "PointToPoint"]


class Exchange:
    """The handle of a posted exchange. ``wait()`` waits for every message, books them and
    returns the received tensors; ``received()`` waits for the receives only (the sends stay
    pending, their buffers untouched, until ``wait()``)."""

    def __init__(self, recvs: list, sends: list, outs: list[torch.Tensor],
                 book_recvs: list, book_sends: list) -> None:
        self._recvs, self._sends, self._outs = recvs, sends, outs
        self._book_recvs, self._book_sends = book_recvs, book_sends

    def received(self) -> list[torch.Tensor]:
        waited = time.perf_counter()
        for h in self._recvs:
            if h is not None:
                h.wait()
        for done in self._book_recvs:
            done(waited)
        self._recvs, self._book_recvs = [], []
        return self._outs

    def wait(self) -> list[torch.Tensor]:
        for h in self._sends:
            if h is not None:
                h.wait()
        for done in self._book_sends:  # sends booked first, as their waits came first
            done()
        self._sends, self._book_sends = [], []
        return self.received()


class PointToPoint:
    """Mixed into :class:`~commbench.wire.comm.Comm` (its ``backend``, ``ledger``, ``posts``)."""

    def send(self, x: torch.Tensor, group: Group, peer: int, *, tag: int = 0) -> None:
        check_p2p("send", x, group, peer)
        check_device(x, self.device, "send")
        x = x.contiguous()
        self._run("send", group, x.dtype, x.numel(),
                  lambda: self.backend.send(x, group, peer, tag), peer=peer, tag=tag)

    def recv(self, x: torch.Tensor, group: Group, peer: int, *, tag: int = 0) -> torch.Tensor:
        """Receive into a new tensor shaped like ``x`` (x is only a template)."""
        check_p2p("recv", x, group, peer)
        check_device(x, self.device, "recv")
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        self._run("recv", group, x.dtype, x.numel(),
                  lambda: self.backend.recv(out, group, peer, tag), peer=peer, tag=tag)
        return out

    def isend(self, x: torch.Tensor, group: Group, peer: int, *, tag: int = 0) -> Work:
        """A message posted alone: on NCCL it runs on the pair's own communicator, and a rank
        that also receives in the same step must use :meth:`exchange` instead."""
        check_p2p("isend", x, group, peer)
        check_device(x, self.device, "isend")
        return self._start("isend", x.contiguous(), group, peer, tag)

    def irecv(self, x: torch.Tensor, group: Group, peer: int, *, tag: int = 0) -> Work:
        check_p2p("irecv", x, group, peer)
        check_device(x, self.device, "irecv")
        return self._start("irecv", torch.empty_like(x, memory_format=torch.contiguous_format),
                           group, peer, tag)

    def _start(self, op: str, buf: torch.Tensor, group: Group, peer: int, tag: int) -> Work:
        """Post a non-blocking op; it is booked at ``wait``, its time runs from the post."""
        t0 = time.perf_counter()
        posted = self._post_p2p(op, group, peer, buf.numel(), buf.dtype, tag)
        with quiet():
            handle = getattr(self.backend, op)(buf, group, peer, tag)
        return Work(handle, buf, self._booker(op, group, buf, t0, posted, peer))

    def exchange(self, sends: list[tuple[torch.Tensor, int]],
                 recvs: list[tuple[torch.Tensor, int]], group: Group, *,
                 tag: int = 0) -> list[torch.Tensor]:
        """Post every message of one step as one group call and wait for all of them.

        sends: (tensor, peer) pairs; recvs: (template, peer) pairs, each received into a new
        tensor shaped like its template (returned in order). Empty tensors are not sent: both
        ends know the sizes. Peers are positions in ``group``.
        """
        return self.start_exchange(sends, recvs, group, tag=tag).wait()

    def start_exchange(self, sends: list[tuple[torch.Tensor, int]],
                       recvs: list[tuple[torch.Tensor, int]], group: Group, *,
                       tag: int = 0, recv_op: str = "irecv") -> Exchange:
        """:meth:`exchange` without the wait: ``.wait()`` on the handle returns the received
        tensors (compute may run in between, as ring attention overlaps its hops). ``recv_op``:
        the name the receives are booked under ("recv" where the caller waits at once, so that
        a trace counts the wait as idle)."""
        for t, peer in sends + recvs:
            check_p2p("exchange", t, group, peer)
            check_device(t, self.device, "exchange")
        outs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t, _ in recvs]
        rx = [(o, p) for o, (_, p) in zip(outs, recvs) if o.numel()]
        tx = [(t.contiguous(), p) for t, p in sends if t.numel()]
        if not rx and not tx:
            return Exchange([], [], outs, [], [])
        t0 = time.perf_counter()
        with self._grouped():
            posted = [self._post_p2p("irecv", group, p, o.numel(), o.dtype, tag) for o, p in rx]
            posted += [self._post_p2p("isend", group, p, t.numel(), t.dtype, tag) for t, p in tx]
        batch = getattr(self.backend, "batch", None)
        with quiet():
            if batch is not None:
                handles = batch(tx, rx, group, tag)
            else:  # MPI: non-blocking calls side by side, one group in effect
                handles = [self.backend.irecv(o, group, p, tag) for o, p in rx]
                handles += [self.backend.isend(t, group, p, tag) for t, p in tx]
        return Exchange(handles[:len(rx)], handles[len(rx):], outs,
                        [self._booker(recv_op, group, o, t0, k, p)
                         for (o, p), k in zip(rx, posted)],
                        [self._booker("isend", group, t, t0, k, p)
                         for (t, p), k in zip(tx, posted[len(rx):])])

    # -- helpers ----------------------------------------------------------------------------
    def _grouped(self):
        return self.posts.group() if self.posts is not None else contextlib.nullcontext()

    def _post_p2p(self, op: str, group: Group, peer: int, count: int, dtype: torch.dtype,
                  tag: int) -> int:
        """Record one message (:mod:`commbench.wire.posts`); -1 when no record is attached."""
        if self.posts is None:
            return -1
        return self.posts.post("send" if op in ("send", "isend") else "recv", op, group.ranks,
                               peer=group.ranks[peer], nbytes=count * dtype.itemsize,
                               dtype=dtype_name(dtype), count=count, tag=tag)

    def _booker(self, op: str, group: Group, buf: torch.Tensor, t0: float, posted: int,
                peer: int):
        """Books the message at its wait; ``peer``: its other end's position in ``group``."""
        nbytes = buf.numel() * buf.element_size()
        sent, recv = (nbytes, 0) if op == "isend" else (0, nbytes)  # ops.booked's p2p rule
        ledger, transport, posts = self.ledger, self.transport, self.posts

        def done(waited: float | None = None) -> None:
            if posts is not None and posted >= 0:
                posts.wait(posted)
            # a blocking receive ("recv") is booked from its wait: the time between the post and
            # the wait may be computation (a prefetched receive)
            start = waited if op == "recv" and waited is not None else t0
            ledger.record(op, group.ranks, transport, dtype_name(buf.dtype), buf.numel(), sent,
                          recv, time.perf_counter() - start, axis=group.name, start=start,
                          peer=group.ranks[peer])

        return done
