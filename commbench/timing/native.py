"""The transports' own collectives, prepared for the timing loop of :mod:`commbench.collectives.measure`.

Each preparation allocates the buffers once and returns the bare transport call to time, a reset
that restores in-place inputs (run outside the timer), the first call through the checked comm
API, and how to read the result for ``#wrong``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

from commbench.ops import OPS, vsplits
from commbench.runtime.group import Group
from commbench.wire.buffers import like
from commbench.wire.comm import Comm

__all__ = ["PREPARE", "Prepared", "prepare_native", "restore"]


@dataclass
class Prepared:
    call: Callable[[], object]  # what the timer brackets
    reset: Callable[[], object]  # before each iteration, untimed
    first: Callable[[], object]  # once, through the checked comm API
    result: Callable[[], torch.Tensor | None]  # this rank's result after the last call
    vol: dict = field(default_factory=dict)  # extra arguments of the byte formula
    count: int = 0
    after: Callable[[list[float]], None] | None = None  # once after the loop, given the times



# One preparation per collective, named ``_prepare_<op>``: PREPARE finds them by that name.
# The transports' ``<op>_call`` methods bind their own function to the buffers once.
def _in_place(call, first, src, mine: bool, vol: dict) -> Prepared:
    """all-reduce, broadcast, reduce: ``call(out)`` on a copy of the input, restored each time;
    ``mine``: this rank holds a result (a reduce's root only)."""
    out = like(src, src.numel())
    out.copy_(src)
    return Prepared(call(out), restore(out, src), first, (lambda: out) if mine else (lambda: None),
                    vol)


def _prepare_all_reduce(comm, be, g, redop, root, src, count) -> Prepared:
    return _in_place(lambda out: be.all_reduce_call(out, g, redop),
                     lambda: comm.all_reduce(src, g, op=redop), src, True, {})


def _prepare_broadcast(comm, be, g, redop, root, src, count) -> Prepared:
    return _in_place(lambda out: be.broadcast_call(out, g, root),
                     lambda: comm.broadcast(src, g, root=root), src, True, {"root": root})


def _prepare_reduce(comm, be, g, redop, root, src, count) -> Prepared:
    return _in_place(lambda out: be.reduce_call(out, g, root, redop),
                     lambda: comm.reduce(src, g, root=root, op=redop), src, g.index == root,
                     {"root": root})


def _prepare_all_gather(comm, be, g, redop, root, src, count) -> Prepared:
    out = like(src, count * g.size)
    return Prepared(be.all_gather_call(out, src, g), _none, lambda: comm.all_gather(src, g),
                    lambda: out)


def _prepare_gather(comm, be, g, redop, root, src, count) -> Prepared:
    out = like(src, count * g.size) if g.index == root else None
    return Prepared(lambda: be.gather(out, src, g, root), _none,
                    lambda: comm.gather(src, g, root=root), lambda: out, {"root": root})


def _prepare_reduce_scatter(comm, be, g, redop, root, src, count) -> Prepared:
    out = like(src, count // g.size)
    return Prepared(be.reduce_scatter_call(out, src, g, redop), _none,
                    lambda: comm.reduce_scatter(src, g, op=redop), lambda: out)


def _prepare_all_to_all(comm, be, g, redop, root, src, count) -> Prepared:
    out, splits = like(src, count), [count // g.size] * g.size
    return Prepared(lambda: be.all_to_all(out, src, g, splits, splits), _none,
                    lambda: comm.all_to_all(src, g), lambda: out,
                    {"in_splits": splits, "out_splits": splits})


def _prepare_all_to_allv(comm, be, g, redop, root, src, count) -> Prepared:
    """Uneven counts per peer (:func:`commbench.ops.vsplits`): what this member sends each
    member, and receives from each."""
    m = vsplits(g.size, count)
    ins, outs = m[g.index], [m[j][g.index] for j in range(g.size)]
    out = like(src, sum(outs))
    return Prepared(lambda: be.all_to_all(out, src, g, outs, ins), _none,
                    lambda: comm.all_to_all(src, g, ins, outs), lambda: out,
                    {"in_splits": ins, "out_splits": outs})


def _prepare_barrier(comm, be, g, redop, root, src, count) -> Prepared:
    return Prepared(be.barrier_call(g), _none, lambda: comm.barrier(g), lambda: None)


def _prepare_scatter(comm, be, g, redop, root, src, count) -> Prepared:
    out = like(src, count // g.size)
    s = src if g.index == root else None
    return Prepared(lambda: be.scatter(out, s, g, root), _none,
                    lambda: comm.scatter(src if g.index == root else out, g, root=root),
                    lambda: out, {"root": root})


def _prepare_sendrecv(comm, be, g, redop, root, src, count) -> Prepared:
    out = like(src, count)
    return Prepared(lambda: _sendrecv(be, src, out, g), _none,
                    lambda: _checked_sendrecv(comm, src, g), lambda: out)


def _prepare_pingpong(comm, be, g, redop, root, src, count) -> Prepared:
    out = like(src, count)
    return Prepared(lambda: _pingpong(be, src, out, g), _none,
                    lambda: _checked_pingpong(comm, src, out, g), lambda: out)


def _none() -> None:
    return None


PREPARE = {name.removeprefix("_prepare_"): fn for name, fn in list(globals().items())
           if name.startswith("_prepare_")}


def prepare_native(comm: Comm, g: Group, op: str, redop: str, root: int, src: torch.Tensor,
                   count: int) -> Prepared:
    """The transport's own ``op`` on ``g``, its buffers allocated once (:data:`PREPARE`)."""
    if op not in PREPARE:
        raise ValueError(f"op {op!r}: not a collective commbench times")
    why = OPS[op].needs(g.size)
    if why:
        raise ValueError(f"{op}: {why}")
    return PREPARE[op](comm, comm.backend, g, redop, root, src, count)


def restore(out: torch.Tensor, src: torch.Tensor) -> Callable[[], object]:
    """Copy ``src`` over ``out``: through NumPy views on CPU (the cheapest call there is, so the
    untimed part of each iteration stays as short as a bare mpi4py loop's), else torch's copy."""
    if out.is_cuda:
        return lambda: out.copy_(src)
    # lazy: imports numpy
    import numpy as np

    raw = {torch.bfloat16: torch.int16, torch.bool: torch.uint8}.get(out.dtype, out.dtype)
    o, s = out.view(raw).numpy(), src.view(raw).numpy()
    return partial(np.copyto, o, s)


def _sendrecv(be, src, out, g) -> None:
    """Ring exchange: send to the next member, receive from the previous one; as one group call
    where the transport has them (NCCL: ``batch_isend_irecv``; posted alone, every rank's receive
    would wait for a send queued behind its peer's receive), MPI's receive-then-send otherwise."""
    n, i = g.size, g.index
    if n == 1:
        out.copy_(src)
        return
    batch = getattr(be, "batch", None)
    if batch is not None:
        for h in batch([(src, (i + 1) % n)], [(out, (i - 1) % n)], g, 7):
            h.wait()
        return
    req = be.irecv(out, g, (i - 1) % n, 7)
    be.send(src, g, (i + 1) % n, 7)
    req.wait()


def _checked_sendrecv(comm: Comm, src, g) -> None:
    n, i = g.size, g.index
    if n > 1:
        comm.exchange([(src, (i + 1) % n)], [(src, (i - 1) % n)], g, tag=7)


def _checked_pingpong(comm: Comm, src, out, g) -> None:
    """The round trip through the comm layer (checked, booked and recorded for NCCL's rules):
    a send and a receive each posted alone, in the order that completes on NCCL too."""
    if g.index == 0:
        comm.send(src, g, 1, tag=8)
        out.copy_(comm.recv(out, g, 1, tag=8))
    elif g.index == 1:
        out.copy_(comm.recv(out, g, 0, tag=8))
        comm.send(out, g, 0, tag=8)


def _pingpong(be, src, out, g) -> None:
    """Members 0 and 1 bounce the buffer once; the others wait (timed as a round trip)."""
    if g.index == 0:
        be.send(src, g, 1, 8)
        be.recv(out, g, 1, 8)
    elif g.index == 1:
        be.recv(out, g, 0, 8)
        be.send(out, g, 0, 8)
