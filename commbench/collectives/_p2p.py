"""Building blocks shared by the algorithms: a paired exchange and the local reduction."""

from __future__ import annotations

import torch

from commbench.comm import Comm
from commbench.group import Group

__all__ = ["combine", "exchange", "finish_avg", "flat", "offsets", "pg_batched", "pg_pair"]

TAG = 7001  # algorithms use their own tag, apart from user point-to-point traffic


def exchange(comm: Comm, send: torch.Tensor | None, dst: int | None, recv_like: torch.Tensor | None,
             src: int | None, group: Group) -> torch.Tensor | None:
    """Send ``send`` to ``dst`` while receiving a tensor shaped like ``recv_like`` from ``src``.

    Both sides are posted before either waits, so a ring or a pairwise exchange cannot deadlock.
    Either half may be None. Empty tensors are not sent (both ends know the sizes).
    """
    rx = None
    if recv_like is not None and src is not None and recv_like.numel():
        rx = comm.irecv(recv_like, group, src, tag=TAG)
    tx = None
    if send is not None and dst is not None and send.numel():
        tx = comm.isend(send, group, dst, tag=TAG)
    if tx is not None:
        tx.wait()
    if rx is not None:
        return rx.wait()
    return None if recv_like is None else recv_like.new_empty(recv_like.shape)


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


def offsets(counts: list[int]) -> list[int]:
    """Start of each block and the end: [0, c0, c0+c1, ..., sum(counts)]."""
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def pg_pair(pg, send, dst: int, recv, src: int) -> None:
    """A process group's own receive and send posted together (gloo), then both waited."""
    rx = pg.recv(recv, src, TAG) if recv is not None else None
    tx = pg.send(send, dst, TAG) if send is not None else None
    if tx is not None:
        tx.wait()
    if rx is not None:
        rx.wait()


def pg_batched(pg, send, dst: int, recv, src: int) -> None:
    """The same pair as one ``batch_isend_irecv`` (NCCL needs the two grouped)."""
    import torch.distributed as dist

    ops = []
    if recv is not None:
        ops.append(dist.P2POp(dist.irecv, recv, group=pg, group_peer=src, tag=TAG))
    if send is not None:
        ops.append(dist.P2POp(dist.isend, send, group=pg, group_peer=dst, tag=TAG))
    for w in dist.batch_isend_irecv(ops) if ops else []:
        w.wait()
