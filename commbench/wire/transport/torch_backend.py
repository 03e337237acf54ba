"""torch.distributed as a transport: gloo on CPU, NCCL on GPU."""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist

from commbench.runtime.group import Group

__all__ = ["TorchBackend"]

# torch 2.13 renamed the tensor forms (`*_into_tensor`, `*_tensor`) to `*_single`.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

_OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX}
class TorchBackend:
    def __init__(self, name: str) -> None:
        self.name = name  # "gloo" or "nccl": the process groups' backend

    def unsupported(self, op: str, dtype: torch.dtype) -> str | None:
        if dtype == torch.bool or dtype.is_complex:
            return "reductions take real numeric dtypes"
        if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            return f"{self.name} has no float8 reductions (torch 2.13 moves float8 as bytes only)"
        return None

    # -- zero-argument calls on fixed buffers, for timing loops: torch's function bound at once
    def barrier_call(self, group: Group):
        return partial(dist.barrier, group=group.torch_pg)

    def all_reduce_call(self, buf, group: Group, op: str):
        return partial(dist.all_reduce, buf, _OPS[op], group=group.torch_pg)

    def all_gather_call(self, out, x, group: Group):
        return partial(_ALL_GATHER, out, x, group=group.torch_pg)

    def reduce_scatter_call(self, out, x, group: Group, op: str):
        return partial(_REDUCE_SCATTER, out, x, _OPS[op], group=group.torch_pg)

    def broadcast_call(self, buf, group: Group, root: int):
        return partial(dist.broadcast, buf, group=group.torch_pg, group_src=root)

    def reduce_call(self, buf, group: Group, root: int, op: str):
        return partial(self.reduce, buf, group, root, op)

    def all_reduce(self, buf, group: Group, op: str) -> None:
        dist.all_reduce(buf, _OPS[op], group=group.torch_pg)

    def all_reduce_async(self, buf, group: Group, op: str):
        return dist.all_reduce(buf, _OPS[op], group=group.torch_pg, async_op=True)

    def all_gather_async(self, out, x, group: Group):
        return _ALL_GATHER(out, x, group=group.torch_pg, async_op=True)

    def all_gather(self, out, x, group: Group) -> None:
        _ALL_GATHER(out, x, group=group.torch_pg)

    def reduce_scatter(self, out, x, group: Group, op: str) -> None:
        _REDUCE_SCATTER(out, x, _OPS[op], group=group.torch_pg)

    def all_to_all(self, out, x, group: Group, out_splits, in_splits) -> None:
        dist.all_to_all_single(out, x, out_splits, in_splits, group=group.torch_pg)

    def broadcast(self, buf, group: Group, root: int) -> None:
        dist.broadcast(buf, group=group.torch_pg, group_src=root)

    def reduce(self, buf, group: Group, root: int, op: str) -> None:
        dist.reduce(buf, op=_OPS[op], group=group.torch_pg, group_dst=root)

    def gather(self, out, x, group: Group, root: int) -> None:
        if x.numel() == 0:
            return  # every member's block is empty (blocks have one shape): nothing moves
        chunks = list(out.chunk(group.size)) if out is not None else None
        dist.gather(x, chunks, group=group.torch_pg, group_dst=root)  # chunks are views of out

    def scatter(self, out, src, group: Group, root: int) -> None:
        chunks = list(src.chunk(group.size)) if src is not None else None
        if out.numel() == 0:
            return
        dist.scatter(out, chunks, group=group.torch_pg, group_src=root)

    def send(self, x, group: Group, peer: int, tag: int) -> None:
        dist.send(x, group=group.torch_pg, group_dst=peer, tag=tag)

    def recv(self, out, group: Group, peer: int, tag: int) -> None:
        dist.recv(out, group=group.torch_pg, group_src=peer, tag=tag)

    def isend(self, x, group: Group, peer: int, tag: int):
        return dist.isend(x, group=group.torch_pg, group_dst=peer, tag=tag)

    def irecv(self, out, group: Group, peer: int, tag: int):
        return dist.irecv(out, group=group.torch_pg, group_src=peer, tag=tag)

    def batch(self, sends, recvs, group: Group, tag: int) -> list:
        """Post ``recvs`` [(tensor, peer)] and ``sends`` [(tensor, peer)] together; their
        handles. NCCL: one ``batch_isend_irecv`` (a group call: the only deadlock-free way to send
        and receive at once); gloo: non-blocking calls side by side."""
        pg = group.torch_pg
        if self.name == "nccl":
            ops = [dist.P2POp(dist.irecv, t, group=pg, group_peer=p, tag=tag) for t, p in recvs]
            ops += [dist.P2POp(dist.isend, t, group=pg, group_peer=p, tag=tag) for t, p in sends]
            return dist.batch_isend_irecv(ops) if ops else []
        return ([dist.irecv(t, group=pg, group_src=p, tag=tag) for t, p in recvs]
                + [dist.isend(t, group=pg, group_dst=p, tag=tag) for t, p in sends])

    def barrier(self, group: Group) -> None:
        dist.barrier(group=group.torch_pg)
