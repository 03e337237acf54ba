"""Building blocks shared by the algorithms: a paired exchange and the local reduction."""

from __future__ import annotations

import torch

from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["combine", "exchange", "finish_avg", "flat", "pg_run", "run_steps"]

TAG = 7001  # algorithms use their own tag, apart from user point-to-point traffic


def exchange(comm: Comm, send: torch.Tensor | None, dst: int | None, recv_like: torch.Tensor | None,
             src: int | None, group: Group) -> torch.Tensor | None:
    """Send ``send`` to ``dst`` while receiving a tensor shaped like ``recv_like`` from ``src``.

    Both halves are one group call (:meth:`Comm.exchange`: NCCL's ``batch_isend_irecv``), so a
    ring or a pairwise exchange cannot deadlock on any transport. Either half may be None.
    Empty tensors are not sent (both ends know the sizes).
    """
    sends = [(send, dst)] if send is not None and dst is not None else []
    recvs = [(recv_like, src)] if recv_like is not None and src is not None else []
    got = comm.exchange(sends, recvs, group, tag=TAG)
    if recvs:
        return got[0]
    return None if recv_like is None else recv_like.new_empty(recv_like.shape)


def run_steps(comm: Comm, buf: torch.Tensor, group: Group, steps, op: str = "sum") -> None:
    """Member ``group.index``'s schedule (:class:`~commbench.collectives.algorithm.Step` list)
    run in place on the flat ``buf`` through the comm layer, one exchange per step in order (a
    run of joint steps one after another: the same messages, each booked and checked). The
    compiled replay runs the same lists on fixed buffers (:mod:`.compiled.schedule`)."""
    for s in steps:
        if s.avg is not None:
            finish_avg(buf[s.avg[0]:s.avg[1]], op, group.size)
            continue
        send = buf[s.send[0]:s.send[1]] if s.send is not None else None
        into = buf[s.recv[0]:s.recv[1]] if s.recv is not None else None
        got = exchange(comm, send, s.dst if send is not None else None, into,
                       s.src if into is not None else None, group)
        if into is not None:
            into.copy_(combine(got, into, op) if s.reduce else got)


def combine(a: torch.Tensor, b: torch.Tensor, op: str) -> torch.Tensor:
    """a (op) b elementwise; ``avg`` sums here and divides once at the end (:func:`finish_avg`)."""
    if op in ("sum", "avg"):
        return a + b
    if op == "prod":
        return a * b
    if op == "min":
        return torch.minimum(a, b)
    if op == "max":
        return torch.maximum(a, b)
    raise ValueError(f"op={op!r}: must be one of sum, prod, min, max, avg")


def finish_avg(x: torch.Tensor, op: str, n: int) -> torch.Tensor:
    return x.div_(n) if op == "avg" else x


def flat(x: torch.Tensor) -> torch.Tensor:
    return x.detach().reshape(-1).clone()


def pg_run(pg, recvs: list, sends: list, after: list) -> None:
    """A process group's own receives and sends (gloo) posted together: ``recvs`` [(tensor,
    src)], ``sends`` [(tensor, dst)]. Then each receive is waited in order and followed by its
    ``after`` call (None: nothing); every send is waited right after the first receive."""
    rx = [pg.recv([t], src, TAG) for t, src in recvs]
    tx = [pg.send([t], dst, TAG) for t, dst in sends]
    if not rx:
        for w in tx:
            w.wait()
    for k, w in enumerate(rx):
        w.wait()
        if k == 0:
            for t in tx:
                t.wait()
        if after[k] is not None:
            after[k]()
