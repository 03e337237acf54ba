"""The one door to the wire: every collective and point-to-point call of commbench.

``Comm`` has one API over every transport (torch.distributed with gloo or NCCL, mpi4py); the
transport is chosen when the ``Comm`` is made, the group is passed to every call. Each call

1. checks its arguments on this rank and raises ``ValueError`` naming the value and the rule before
   anything is sent (a bad call never reaches the wire, so it cannot hang the others),
2. tells the tracker which op it enters (so a hang can be named from outside),
3. runs the transport's op and books an :class:`~commbench.wire.ledger.Entry` with its bytes
   (:func:`commbench.ops.booked`) and wall time.

Conventions: tensors are split and joined along dim 0; roots and peers are positions within the
group; inputs are never modified unless ``inplace=True`` is asked for; ``avg`` is a sum divided by
the group size (floating dtypes only), on every transport alike.
"""

from __future__ import annotations

import math
import time

import torch

from commbench.ops import booked
from commbench.runtime.board import Board
from commbench.runtime.debug import OP_CODES, agree, fingerprint, judge
from commbench.runtime.group import Group
from commbench.runtime.status import Tracker
from commbench.wire.checks import (
    OPS,
    check_device,
    check_group,
    check_index,
    check_redop,
    check_tensor,
    dtype_name,
    finish,
    rows,
    splits,
    work_buffer,
)
from commbench.wire.ledger import Ledger
from commbench.wire.p2p import PointToPoint
from commbench.wire.posts import Posts
from commbench.wire.transport import Work
from commbench.wire.transport.torch_backend import TorchBackend
from commbench.wire.watch import quiet

__all__ = ["OPS", "Comm", "Work"]


class Comm(PointToPoint):
    """Collectives and point-to-point over one transport, each call booked in ``ledger``.

    ``device``: where every tensor handed to this transport must live (NCCL: the rank's GPU;
    None: anywhere the transport takes). ``posts``: the record of posts, when one is attached
    (:mod:`commbench.wire.posts`). Debug mode's agreement runs on the group's side gloo group
    when it has one (``Group.side_pg``, made beside every group of an NCCL world): harness
    traffic stays off the benchmark's communicator.
    """

    def __init__(self, backend, ledger: Ledger, tracker: Tracker | None = None, *,
                 debug: bool = False, device: torch.device | None = None,
                 board: Board | None = None) -> None:
        self.backend = backend
        self.transport: str = backend.name
        self.ledger = ledger
        self.tracker = tracker or Tracker()
        self.debug = debug  # members agree on each call before it starts (commbench.runtime.debug)
        self.device = device
        self.board = board  # a local world's shared memory for the agreement, else a collective
        self.posts: Posts | None = None

    # -- booking ------------------------------------------------------------------------------
    def _run(self, op: str, group: Group, dtype: torch.dtype, count: int, fn, redop: str = "",
             same_count: bool = True, peer: int = -1, tag: int = 0, **vol):
        tracker = self.tracker
        tracker.enter(op, group.ranks)
        if self.debug and op in OP_CODES:
            self._agree(group, fingerprint(op, dtype, count if same_count else -1, redop,
                                           vol.get("root", 0), group.ranks))
        posted = self._post(op, group, dtype, count if same_count else -1, peer, vol, tag)
        t0 = time.perf_counter()
        with quiet():
            result = fn()
        seconds = time.perf_counter() - t0
        if posted >= 0:
            self.posts.wait(posted)
        tracker.leave(op)
        itemsize = dtype.itemsize
        sent, recv = booked(op, group.size, group.index, count, itemsize, **vol)
        self.ledger.record(op, group.ranks, self.transport, dtype_name(dtype), count, sent, recv,
                           seconds, axis=group.name, start=t0,
                           peer=group.ranks[peer] if op in ("send", "recv") else -1)
        return result

    def _agree(self, group: Group, fp: list[int]) -> None:
        """Debug mode's agreement: through the board on one host, else an all-gather (on the
        harness's side group when there is one)."""
        if self.board is not None:
            judge(group, fp, self.board.rows(group.ranks, fp))
            return
        with quiet():  # harness traffic: neither booked nor seen by a watcher
            if group.side_pg is not None and self.transport == "nccl":
                side = Group(group.ranks, group.rank, group.name, group.side_pg)
                agree(TorchBackend("gloo"), side, fp, torch.device("cpu"))
            else:
                agree(self.backend, group, fp, self.device)

    def _post(self, op: str, group: Group, dtype: torch.dtype, count: int, peer: int,
              vol: dict, tag: int = 0) -> int:
        if self.posts is None:
            return -1
        if op in ("send", "recv"):
            return self._post_p2p(op, group, peer, count, dtype, tag)
        name = f"{op}@{vol['root']}" if "root" in vol else op
        return self.posts.post("coll", name, group.ranks, dtype=dtype_name(dtype), count=count)

    # -- collectives --------------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor, group: Group, *, op: str = "sum",
                   inplace: bool = False) -> torch.Tensor:
        """Reduce ``x`` over ``group``; every member gets the result. x, out [*]."""
        check_group(group, "all_reduce")
        check_tensor(x, "all_reduce")
        check_device(x, self.device, "all_reduce")
        check_redop(self.backend, "all_reduce", op, x.dtype)
        buf = work_buffer(x, inplace)
        self._run("all_reduce", group, x.dtype, x.numel(),
                  lambda: self.backend.all_reduce(buf, group, "sum" if op == "avg" else op), op)
        if op == "avg":
            buf.div_(group.size)
        return finish(x, buf, inplace)

    def all_reduce_async(self, x: torch.Tensor, group: Group, *, op: str = "sum") -> Work:
        """Start an all-reduce of ``x`` in place; ``wait()`` returns it reduced (``avg`` not
        offered: divide after the wait)."""
        check_group(group, "all_reduce")
        check_tensor(x, "all_reduce")
        check_device(x, self.device, "all_reduce")
        check_redop(self.backend, "all_reduce", op, x.dtype)
        if op == "avg" or not x.is_contiguous():
            raise ValueError("all_reduce_async: x must be contiguous and op not 'avg'")
        return self._async("all_reduce", group, x, x, op,
                           lambda: self.backend.all_reduce_async(x, group, op))

    def all_gather_async(self, x: torch.Tensor, group: Group) -> Work:
        """Start an all-gather of ``x`` [d, *] -> [P*d, *]; ``wait()`` returns the result."""
        check_group(group, "all_gather")
        check_tensor(x, "all_gather")
        check_device(x, self.device, "all_gather")
        x = x.contiguous()
        out = x.new_empty((group.size * rows(x), *x.shape[1:]))
        return self._async("all_gather", group, x, out, "",
                           lambda: self.backend.all_gather_async(out, x, group))

    def _async(self, op: str, group: Group, x: torch.Tensor, out: torch.Tensor, redop: str,
               start) -> Work:
        """Post a non-blocking collective; it is booked at ``wait``, its time from the post."""
        if self.debug:
            self._agree(group, fingerprint(op, x.dtype, x.numel(), redop, 0, group.ranks))
        posted = self._post(op, group, x.dtype, x.numel(), -1, {})
        t0 = time.perf_counter()
        with quiet():
            handle = start()
        sent, recv = booked(op, group.size, group.index, x.numel(), x.element_size())
        ledger, transport, posts = self.ledger, self.transport, self.posts

        def done() -> None:
            if posted >= 0:
                posts.wait(posted)
            ledger.record(op, group.ranks, transport, dtype_name(x.dtype), x.numel(), sent, recv,
                          time.perf_counter() - t0, axis=group.name, start=t0)

        return Work(handle, out, done)

    def all_gather(self, x: torch.Tensor, group: Group) -> torch.Tensor:
        """Concatenate every member's ``x`` along dim 0. x [d, *] -> out [P*d, *]."""
        check_group(group, "all_gather")
        check_tensor(x, "all_gather")
        check_device(x, self.device, "all_gather")
        x = x.contiguous()
        out = x.new_empty((group.size * rows(x), *x.shape[1:]))
        self._run("all_gather", group, x.dtype, x.numel(),
                  lambda: self.backend.all_gather(out, x, group))
        return out

    def reduce_scatter(self, x: torch.Tensor, group: Group, *, op: str = "sum") -> torch.Tensor:
        """Reduce ``x`` over ``group``; member i keeps block i of dim 0. x [P*d, *] -> out [d, *]."""
        check_group(group, "reduce_scatter")
        check_tensor(x, "reduce_scatter")
        check_device(x, self.device, "reduce_scatter")
        check_redop(self.backend, "reduce_scatter", op, x.dtype)
        if x.dim() == 0 or x.shape[0] % group.size:
            raise ValueError(f"reduce_scatter: dim 0 of x ({rows(x) if x.dim() else 'scalar'}) "
                             f"must be a multiple of the group size {group.size}")
        x = x.contiguous()
        out = x.new_empty((x.shape[0] // group.size, *x.shape[1:]))
        self._run("reduce_scatter", group, x.dtype, x.numel(),
                  lambda: self.backend.reduce_scatter(out, x, group, "sum" if op == "avg" else op),
                  op)
        if op == "avg":
            out.div_(group.size)
        return out

    def all_to_all(self, x: torch.Tensor, group: Group, in_splits: list[int] | None = None,
                   out_splits: list[int] | None = None) -> torch.Tensor:
        """Member i sends rows ``in_splits[j]`` of ``x`` to member j.

        x [sum(in_splits), *] -> out [sum(out_splits), *]. Without splits, dim 0 is cut in P
        equal blocks. With ``in_splits`` but no ``out_splits``, the counts are exchanged first
        (one all-to-all of P int64 values, booked like any other call).
        """
        check_group(group, "all_to_all")
        check_tensor(x, "all_to_all")
        check_device(x, self.device, "all_to_all")
        n, nrows = group.size, rows(x)
        if in_splits is None:
            if out_splits is not None:
                raise ValueError("all_to_all: out_splits given without in_splits")
            if nrows % n:
                raise ValueError(f"all_to_all: dim 0 of x ({nrows}) must be a multiple of the group "
                                 f"size {n}, or give in_splits")
            in_splits = out_splits = [nrows // n] * n
        in_splits = splits(in_splits, n, "in_splits")
        if sum(in_splits) != nrows:
            raise ValueError(f"all_to_all: in_splits {in_splits} sum to {sum(in_splits)}, "
                             f"but dim 0 of x is {nrows}")
        if out_splits is None:
            counts = torch.tensor(in_splits, dtype=torch.int64, device=x.device)
            out_splits = self.all_to_all(counts, group).tolist()
        out_splits = splits(out_splits, n, "out_splits")
        x = x.contiguous()
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        row = math.prod(x.shape[1:])
        self._run("all_to_all", group, x.dtype, x.numel(),
                  lambda: self.backend.all_to_all(out, x, group, out_splits, in_splits),
                  same_count=False, in_splits=in_splits, out_splits=out_splits, row=row)
        return out

    def broadcast(self, x: torch.Tensor, group: Group, *, root: int = 0,
                  inplace: bool = False) -> torch.Tensor:
        """Every member gets the root's ``x``; other members pass a tensor of the same shape."""
        check_group(group, "broadcast")
        check_tensor(x, "broadcast")
        check_device(x, self.device, "broadcast")
        check_index(root, group, "broadcast", "root")
        buf = work_buffer(x, inplace)
        self._run("broadcast", group, x.dtype, x.numel(),
                  lambda: self.backend.broadcast(buf, group, root), root=root)
        return finish(x, buf, inplace)

    def reduce(self, x: torch.Tensor, group: Group, *, root: int = 0,
               op: str = "sum") -> torch.Tensor | None:
        """Reduce ``x`` onto the root; the root gets the result, the others None."""
        check_group(group, "reduce")
        check_tensor(x, "reduce")
        check_device(x, self.device, "reduce")
        check_index(root, group, "reduce", "root")
        check_redop(self.backend, "reduce", op, x.dtype)
        buf = x.detach().clone().contiguous()
        self._run("reduce", group, x.dtype, x.numel(),
                  lambda: self.backend.reduce(buf, group, root, "sum" if op == "avg" else op), op,
                  root=root)
        if group.index != root:
            return None
        return buf.div_(group.size) if op == "avg" else buf

    def gather(self, x: torch.Tensor, group: Group, *, root: int = 0) -> torch.Tensor | None:
        """The root gets every member's ``x`` along dim 0. x [d, *] -> out [P*d, *] on the root."""
        check_group(group, "gather")
        check_tensor(x, "gather")
        check_device(x, self.device, "gather")
        check_index(root, group, "gather", "root")
        x = x.contiguous()
        out = x.new_empty((group.size * rows(x), *x.shape[1:])) if group.index == root else None
        self._run("gather", group, x.dtype, x.numel(),
                  lambda: self.backend.gather(out, x, group, root), root=root)
        return out

    def scatter(self, x: torch.Tensor, group: Group, *, root: int = 0) -> torch.Tensor:
        """Member i gets block i of the root's ``x`` [P*d, *]; the others pass a [d, *] template."""
        check_group(group, "scatter")
        check_tensor(x, "scatter")
        check_device(x, self.device, "scatter")
        check_index(root, group, "scatter", "root")
        n = group.size
        if group.index == root:
            if x.dim() == 0 or x.shape[0] % n:
                raise ValueError(f"scatter: dim 0 of the root's x ({rows(x)}) must be a multiple "
                                 f"of the group size {n}")
            src = x.contiguous()
            out = x.new_empty((x.shape[0] // n, *x.shape[1:]))
        else:
            src, out = None, x.new_empty(x.shape)
        self._run("scatter", group, x.dtype, out.numel() * n,
                  lambda: self.backend.scatter(out, src, group, root), root=root)
        return out

    def barrier(self, group: Group) -> None:
        check_group(group, "barrier")
        self._run("barrier", group, torch.uint8, 0, lambda: self.backend.barrier(group))
