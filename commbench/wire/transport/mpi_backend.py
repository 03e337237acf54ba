"""mpi4py as a transport.

CPU tensors are passed to MPI as NumPy views of their own memory (zero copy). bfloat16 has no
NumPy or MPI type: it moves as raw 16-bit words, and reductions on it are refused. CUDA tensors
are staged through host memory (no CUDA-aware MPI is assumed), which the timing then includes.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from commbench.runtime.group import Group

__all__ = ["MPIBackend"]

_RAW = {torch.bfloat16: torch.int16, torch.bool: torch.uint8}


def _np(t: torch.Tensor):
    if t.dtype in _RAW:
        t = t.view(_RAW[t.dtype])
    return t.numpy()


class MPIBackend:
    name = "mpi"

    def __init__(self) -> None:
        # lazy: imports mpi4py
        from mpi4py import MPI

        self.MPI = MPI
        self._ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}

    @staticmethod
    def unsupported(op: str, dtype: torch.dtype) -> str | None:
        if dtype in _RAW or dtype.is_complex or not (dtype.is_floating_point or _is_int(dtype)):
            return "MPI has no reduction for this dtype"
        if dtype.is_floating_point and dtype.itemsize == 1:
            return "MPI has no float8 type"
        return None

    # -- zero-argument calls on fixed buffers, for timing loops. On CPU the NumPy views and
    # the MPI handles are made here, once, so a timed call costs what a bare mpi4py call costs;
    # a CUDA buffer is staged through the host by the ordinary method on every call.
    def barrier_call(self, group: Group):
        return group.mpi_comm.Barrier

    def all_reduce_call(self, buf, group: Group, op: str):
        if buf.is_cuda:
            return partial(self.all_reduce, buf, group, op)
        return partial(group.mpi_comm.Allreduce, self.MPI.IN_PLACE, _np(buf), self._ops[op])

    def all_gather_call(self, out, x, group: Group):
        if out.is_cuda or x.is_cuda:
            return partial(self.all_gather, out, x, group)
        return partial(group.mpi_comm.Allgather, _np(x), _np(out))

    def reduce_scatter_call(self, out, x, group: Group, op: str):
        if out.is_cuda or x.is_cuda:
            return partial(self.reduce_scatter, out, x, group, op)
        return partial(group.mpi_comm.Reduce_scatter_block, _np(x), _np(out), self._ops[op])

    def broadcast_call(self, buf, group: Group, root: int):
        if buf.is_cuda:
            return partial(self.broadcast, buf, group, root)
        return partial(group.mpi_comm.Bcast, _np(buf), root=root)

    def reduce_call(self, buf, group: Group, root: int, op: str):
        return partial(self.reduce, buf, group, root, op)

    def _staged(self, *ts):
        """Host views of the tensors (CUDA tensors copied), and a function to copy back."""
        hosts = [None if t is None else (t.cpu() if t.is_cuda else t) for t in ts]

        def back() -> None:
            for t, h in zip(ts, hosts):
                if t is not None and t.is_cuda:
                    t.copy_(h)

        return hosts, back

    def all_reduce(self, buf, group: Group, op: str) -> None:
        (h,), back = self._staged(buf)
        group.mpi_comm.Allreduce(self.MPI.IN_PLACE, _np(h), self._ops[op])
        back()

    def all_reduce_async(self, buf, group: Group, op: str):
        (h,), back = self._staged(buf)
        req = group.mpi_comm.Iallreduce(self.MPI.IN_PLACE, _np(h), self._ops[op])
        return _Request(req, h, back)

    def all_gather_async(self, out, x, group: Group):
        (o, i), back = self._staged(out, x)
        return _Request(group.mpi_comm.Iallgather(_np(i), _np(o)), (o, i), back)

    def all_gather(self, out, x, group: Group) -> None:
        (o, i), back = self._staged(out, x)
        group.mpi_comm.Allgather(_np(i), _np(o))
        back()

    def reduce_scatter(self, out, x, group: Group, op: str) -> None:
        (o, i), back = self._staged(out, x)
        group.mpi_comm.Reduce_scatter_block(_np(i), _np(o), self._ops[op])
        back()

    def all_to_all(self, out, x, group: Group, out_splits, in_splits) -> None:
        (o, i), back = self._staged(out, x)
        row = math.prod(i.shape[1:])
        sc = [s * row for s in in_splits]
        rc = [s * row for s in out_splits]
        group.mpi_comm.Alltoallv([_np(i), (sc, _displs(sc))], [_np(o), (rc, _displs(rc))])
        back()

    def broadcast(self, buf, group: Group, root: int) -> None:
        (h,), back = self._staged(buf)
        group.mpi_comm.Bcast(_np(h), root=root)
        back()

    def reduce(self, buf, group: Group, root: int, op: str) -> None:
        (h,), back = self._staged(buf)
        comm = group.mpi_comm
        if comm.Get_rank() == root:
            comm.Reduce(self.MPI.IN_PLACE, _np(h), self._ops[op], root=root)
        else:
            comm.Reduce(_np(h), None, self._ops[op], root=root)
        back()

    def gather(self, out, x, group: Group, root: int) -> None:
        (o, i), back = self._staged(out, x)
        group.mpi_comm.Gather(_np(i), None if o is None else _np(o), root=root)
        back()

    def scatter(self, out, src, group: Group, root: int) -> None:
        (o, s), back = self._staged(out, src)
        group.mpi_comm.Scatter(None if s is None else _np(s), _np(o), root=root)
        back()

    def send(self, x, group: Group, peer: int, tag: int) -> None:
        (h,), _ = self._staged(x)
        group.mpi_comm.Send(_np(h), dest=peer, tag=tag)

    def recv(self, out, group: Group, peer: int, tag: int) -> None:
        (h,), back = self._staged(out)
        group.mpi_comm.Recv(_np(h), source=peer, tag=tag)
        back()

    def isend(self, x, group: Group, peer: int, tag: int):
        if not x.is_cuda:  # the common case, kept short: it is on every message of an algorithm
            return _Request(group.mpi_comm.Isend(_np(x), dest=peer, tag=tag), x, None)
        (h,), _ = self._staged(x)
        return _Request(group.mpi_comm.Isend(_np(h), dest=peer, tag=tag), h, None)

    def irecv(self, out, group: Group, peer: int, tag: int):
        if not out.is_cuda:
            return _Request(group.mpi_comm.Irecv(_np(out), source=peer, tag=tag), out, None)
        (h,), back = self._staged(out)
        return _Request(group.mpi_comm.Irecv(_np(h), source=peer, tag=tag), h, back)

    def barrier(self, group: Group) -> None:
        group.mpi_comm.Barrier()


class _Request:
    """An MPI request that keeps its buffer alive until ``wait``."""

    def __init__(self, req, buf, back) -> None:
        self._req, self._buf, self._back = req, buf, back

    def wait(self) -> None:
        self._req.Wait()
        if self._back is not None:
            self._back()
        self._buf = None


def _displs(counts: list[int]) -> list[int]:
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out


def _is_int(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool
