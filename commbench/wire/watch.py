"""Watch third-party code's torch.distributed calls and book them in a ledger.

``with watch(ledger): model(x).sum().backward()`` books every collective and point-to-point call
that torch's own tensor parallelism, FSDP2, DTensor, a Megatron or DeepSpeed layer makes, with the
same fields and byte conventions as commbench's comm layer (:mod:`commbench.wire.ops`).

How: a ``TorchDispatchMode``. Every torch.distributed entry point ends in one dispatcher op: the
c10d ops behind ``dist.all_reduce``, ``all_gather_into_tensor`` and the rest (``c10d.allreduce_``,
``c10d._allgather_base_``, ...), the functional collectives behind DTensor and funcol
(``_c10d_functional.all_reduce``, ...), and ``_dtensor.shard_dim_alltoall``. The mode sees the
outermost of them once; an op it runs is not dispatched to it again, so each call is booked once
whatever entry point it went through. An op on DTensors is handed to DTensor's own dispatch with
the mode still on (``NotImplemented``), so the collectives DTensor issues inside it (the
all-gather a ``Shard @ Shard`` matmul needs, loss_parallel's three all-reduces) are booked too.
``wait_tensor`` moves nothing and is not booked. The time booked is the host time of the call:
for async ops (NCCL, funcol) that is the launch, not the transfer.

Each entry also carries the reduction (sum, max, ...), the phase (backward while autograd runs
one, else as the library says: :func:`~commbench.wire.modules.library_phase`) and the issuing
module's qualified name (torch's ``ModuleTracker``: the innermost module active; a module's own
forward hooks, such as torch TP's redistribution of an output, run once it has left), and the
tensor's own bytes beside the modelled ones.

Calls made by commbench's own comm layer are booked by the comm layer and skipped here.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import sys
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from commbench.wire import steps
from commbench.wire.ledger import Ledger
from commbench.wire.modules import module_tracker, origin
from commbench.wire.ops import booked

__all__ = ["quiet", "watch"]

_QUIET: contextvars.ContextVar[bool] = contextvars.ContextVar("commbench_quiet", default=False)


class quiet:
    """Inside: the watcher ignores torch.distributed calls (the comm layer books its own)."""

    def __enter__(self) -> None:
        self._token = _QUIET.set(True)

    def __exit__(self, *exc) -> None:
        _QUIET.reset(self._token)


def _pg_of(arg):
    """A ProcessGroup from a c10d op's argument or a functional op's group name."""
    import torch.distributed.distributed_c10d as c10d

    if isinstance(arg, str):
        return c10d._resolve_process_group(arg)
    if isinstance(arg, torch.ScriptObject):  # c10d ops carry the group boxed
        return torch._C._distributed_c10d.ProcessGroup.unbox(arg)
    return arg


def _ranks(pg) -> tuple[int, ...]:
    import torch.distributed as dist

    try:
        return tuple(dist.get_process_group_ranks(pg))
    except (ValueError, KeyError, RuntimeError):
        return tuple(range(pg.size()))


def _numel(ts) -> int:
    if isinstance(ts, torch.Tensor):
        return ts.numel()
    return sum(_numel(t) for t in ts)


def _first(ts) -> torch.Tensor | None:
    """The first tensor in a (nested) list of tensors, or None."""
    if isinstance(ts, torch.Tensor):
        return ts
    if isinstance(ts, list | tuple):
        for t in ts:
            if (found := _first(t)) is not None:
                return found
    return None


# name -> (commbench op, function(args) -> (pg arg, count, extra volume kwargs))
_Rule = tuple[str, Callable[[dict], tuple]]
_RULES: dict[str, _Rule] = {
    "c10d.allreduce_": ("all_reduce", lambda a: (a["process_group"], _numel(a["tensors"]), {})),
    "c10d.allreduce_coalesced_": ("all_reduce",
                                  lambda a: (a["process_group"], _numel(a["tensors"]), {})),
    "c10d._allgather_base_": ("all_gather",
                              lambda a: (a["process_group"], a["input_tensor"].numel(), {})),
    "c10d.allgather_": ("all_gather",
                        lambda a: (a["process_group"], _numel(a["input_tensors"]), {})),
    "c10d.allgather_coalesced_": ("all_gather",
                                  lambda a: (a["process_group"], _numel(a["input_list"]), {})),
    "c10d.allgather_into_tensor_coalesced_": ("all_gather",
                                              lambda a: (a["process_group"], _numel(a["inputs"]),
                                                         {})),
    "c10d._reduce_scatter_base_": ("reduce_scatter",
                                   lambda a: (a["process_group"], a["input_tensor"].numel(), {})),
    "c10d.reduce_scatter_": ("reduce_scatter",
                             lambda a: (a["process_group"], _numel(a["input_tensors"]), {})),
    "c10d.reduce_scatter_tensor_coalesced_": ("reduce_scatter",
                                              lambda a: (a["process_group"], _numel(a["inputs"]),
                                                         {})),
    "c10d.alltoall_base_": ("all_to_all", lambda a: _a2a(a["process_group"], a["input"],
                                                         a["output"], a["input_split_sizes"],
                                                         a["output_split_sizes"])),
    "c10d.alltoall_": ("all_to_all", lambda a: _a2a_list(a)),
    "c10d.broadcast_": ("broadcast", lambda a: (a["process_group"], _numel(a["tensors"]),
                                                {"root": a["root_rank"]})),
    "c10d.reduce_": ("reduce", lambda a: (a["process_group"], _numel(a["tensors"]),
                                          {"root": a["root_rank"]})),
    "c10d.gather_": ("gather", lambda a: (a["process_group"], _numel(a["input_tensors"]),
                                          {"root": a["root_rank"]})),
    "c10d.scatter_": ("scatter", lambda a: (a["process_group"],
                                            _numel(a["output_tensors"]) * _pg_of(a["process_group"]).size(),
                                            {"root": a["root_rank"]})),
    "c10d.send": ("send", lambda a: (a["process_group"], _numel(a["tensors"]), {})),
    "c10d.recv_": ("recv", lambda a: (a["process_group"], _numel(a["tensors"]), {})),
    "c10d.recv_any_source_": ("recv", lambda a: (a["process_group"], _numel(a["tensors"]), {})),
    "c10d.barrier": ("barrier", lambda a: (a["process_group"], 0, {})),
    "_c10d_functional.all_reduce": ("all_reduce", lambda a: (a["group_name"], a["input"].numel(),
                                                             {})),
    "_c10d_functional.all_reduce_": ("all_reduce", lambda a: (a["group_name"],
                                                              a["input"].numel(), {})),
    "_c10d_functional.all_reduce_coalesced": ("all_reduce", lambda a: (a["group_name"],
                                                                       _numel(a["inputs"]), {})),
    "_c10d_functional.all_reduce_coalesced_": ("all_reduce", lambda a: (a["group_name"],
                                                                        _numel(a["inputs"]), {})),
    "_c10d_functional.all_gather_into_tensor": ("all_gather", lambda a: (a["group_name"],
                                                                         a["input"].numel(), {})),
    "_c10d_functional.all_gather_into_tensor_out": ("all_gather",
                                                    lambda a: (a["group_name"],
                                                               a["input"].numel(), {})),
    "_c10d_functional.all_gather_into_tensor_coalesced": ("all_gather",
                                                          lambda a: (a["group_name"],
                                                                     _numel(a["inputs"]), {})),
    "_c10d_functional.reduce_scatter_tensor": ("reduce_scatter",
                                               lambda a: (a["group_name"], a["input"].numel(), {})),
    "_c10d_functional.reduce_scatter_tensor_out": ("reduce_scatter",
                                                   lambda a: (a["group_name"],
                                                              a["input"].numel(), {})),
    "_c10d_functional.reduce_scatter_tensor_coalesced": ("reduce_scatter",
                                                         lambda a: (a["group_name"],
                                                                    _numel(a["inputs"]), {})),
    "_c10d_functional.all_to_all_single": ("all_to_all", lambda a: _a2a(
        a["group_name"], a["input"], None, a["input_split_sizes"], a["output_split_sizes"])),
    "_c10d_functional.broadcast": ("broadcast", lambda a: (a["group_name"], a["input"].numel(),
                                                           {"root": a["src"]})),
    "_c10d_functional.broadcast_": ("broadcast", lambda a: (a["group_name"], a["input"].numel(),
                                                            {"root": a["src"]})),
    "_c10d_functional.isend": ("send", lambda a: (a["group_name"], a["tensor"].numel(), {})),
    "_c10d_functional.irecv": ("recv", lambda a: (a["group_name"], a["tensor"].numel(), {})),
    "_dtensor.shard_dim_alltoall": ("all_to_all", lambda a: _a2a(a["group_name"], a["input"], None,
                                                                 [], [])),
}


def _a2a(pg_arg, inp, out, in_splits, out_splits) -> tuple:
    n, rows = _pg_of(pg_arg).size(), (inp.shape[0] if inp.dim() else 1)
    in_splits = [int(s) for s in in_splits] or [rows // n] * n
    out_splits = [int(s) for s in out_splits] or list(in_splits)
    row = math.prod(inp.shape[1:])
    return pg_arg, inp.numel(), {"in_splits": in_splits, "out_splits": out_splits, "row": row}


def _a2a_list(a: dict) -> tuple:
    ins, outs = a["input_tensors"], a["output_tensors"]
    return a["process_group"], _numel(ins), {"in_splits": [t.numel() for t in ins],
                                             "out_splits": [t.numel() for t in outs], "row": 1}


@functools.cache
def _redop_names() -> dict[int, str]:
    """c10d's reduction codes (RedOpType) by name: 0 sum, 1 avg, 2 product, 3 min, 4 max, ..."""
    import torch.distributed as dist

    return {int(v): k.lower() for k, v in dist.ReduceOp.RedOpType.__members__.items()}


def _redop(value) -> str:
    """A reduction's name from a c10d op's boxed ReduceOp or a functional op's string."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.lower()
    try:
        return _redop_names().get(int(value._get_method("op")()), "")
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return ""


class watch(TorchDispatchMode):
    """Book torch.distributed calls made inside the ``with`` block into ``ledger``."""

    def __init__(self, ledger: Ledger, transport: str | None = None) -> None:
        super().__init__()
        self.ledger, self.transport = ledger, transport
        self.works: list[tuple] = []  # (entry, c10d Work) of the calls on CUDA tensors
        self._modules = module_tracker()

    def __enter__(self):
        self._modules.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._modules.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = f"{func.namespace}.{func._schema.name.split('::')[1]}"
        rule = _RULES.get(name)
        if rule is None and any(t.__name__ == "DTensor" for t in types):
            # a tensor subclass's op (DTensor's): let its own dispatch run with this mode still
            # on, so that the collectives it issues inside reach the watcher
            return NotImplemented
        if rule is None or _QUIET.get():
            return func(*args, **kwargs)
        named = {arg.name: (args[i] if i < len(args) else kwargs.get(arg.name, arg.default_value))
                 for i, arg in enumerate(func._schema.arguments)}
        op, extract = rule
        pg_arg, count, vol = extract(named)
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        seconds = time.perf_counter() - t0
        pg = _pg_of(pg_arg)
        first = None if op == "barrier" else _first(list(named.values()))
        dtype = first.dtype if first is not None else torch.uint8
        sent, recv = booked(op, pg.size(), pg.rank(), count, dtype.itemsize, **vol)
        phase, module = origin(self._modules, op, sys._getframe(1))
        end = named.get("dst", named.get("src")) if op in ("send", "recv") else None
        peer = _ranks(pg)[end] if isinstance(end, int) and 0 <= end < pg.size() else -1
        n, row = steps.current(), vol.get("row", 1)  # an all-to-all's splits in elements:
        splits = tuple(tuple(int(s) * row for s in vol[k]) for k in ("in_splits", "out_splits")) \
            if "in_splits" in vol else ()
        with self.ledger.scope(f"step {n}") if n else contextlib.nullcontext():
            entry = self.ledger.record(op, _ranks(pg), self.transport or _backend(pg),
                                       str(dtype).removeprefix("torch."), count, sent, recv,
                                       seconds, source="torch",
                                       redop=_redop(named.get("reduce_op")), phase=phase,
                                       module=module, nbytes=count * dtype.itemsize, start=t0,
                                       peer=peer, splits=splits)
        if first is not None and first.is_cuda:
            work = _work_of(out)
            if work is not None:
                self.works.append((entry, work))
        return out

    def device_times(self) -> dict[int, float]:
        """id(entry) -> the seconds its collective ran on the GPU, for the c10d calls on CUDA
        tensors booked so far: NCCL's own start and end events, recorded when the process
        group was made with ``TORCH_NCCL_ENABLE_TIMING=1`` (``commbench audit`` sets it).
        Waits for the device. Functional collectives (DTensor's) return no work: none."""
        if self.works and torch.cuda.is_available():
            torch.cuda.synchronize()
        out = {}
        for entry, work in self.works:
            try:
                out[id(entry)] = work._get_duration() / 1e3  # milliseconds
            except (RuntimeError, AttributeError, ValueError):  # no timing, or not a GPU work
                continue
        return out


def _work_of(out):
    """The c10d Work a c10d op returned (its last output, a script object), or None."""
    items = out if isinstance(out, tuple | list) else (out,)
    for x in reversed(items):
        if isinstance(x, torch.ScriptObject):
            try:
                from torch._C._distributed_c10d import Work

                return Work.unbox(x)
            except (ImportError, RuntimeError, TypeError, AttributeError):
                return None
    return None


def _backend(pg) -> str:
    import torch.distributed as dist

    try:
        return str(dist.get_backend(pg))
    except (ValueError, RuntimeError):
        return "torch"
