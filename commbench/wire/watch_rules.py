"""Which torch.distributed call a dispatcher op is, for the watcher (:mod:`commbench.wire.watch`):
per c10d and functional op, commbench's name for the collective and how to read its group,
element count and volume arguments (the root, an all-to-all's splits) off the op's arguments;
and the reduction's name off a boxed ``ReduceOp``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

__all__ = ["RULES", "first_tensor", "pg_of", "ranks_of", "redop_name"]


def pg_of(arg):
    """A ProcessGroup from a c10d op's argument or a functional op's group name."""
    import torch.distributed.distributed_c10d as c10d

    if isinstance(arg, str):
        return c10d._resolve_process_group(arg)
    if isinstance(arg, torch.ScriptObject):  # c10d ops carry the group boxed
        return torch._C._distributed_c10d.ProcessGroup.unbox(arg)
    return arg


def ranks_of(pg) -> tuple[int, ...]:
    import torch.distributed as dist

    try:
        return tuple(dist.get_process_group_ranks(pg))
    except (ValueError, KeyError, RuntimeError):
        return tuple(range(pg.size()))


def _numel(ts) -> int:
    if isinstance(ts, torch.Tensor):
        return ts.numel()
    return sum(_numel(t) for t in ts)


def first_tensor(ts) -> torch.Tensor | None:
    """The first tensor in a (nested) list of tensors, or None."""
    if isinstance(ts, torch.Tensor):
        return ts
    if isinstance(ts, list | tuple):
        for t in ts:
            if (found := first_tensor(t)) is not None:
                return found
    return None


# name -> (commbench op, function(args) -> (pg arg, count, extra volume kwargs))
_Rule = tuple[str, Callable[[dict], tuple]]
RULES: dict[str, _Rule] = {
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
                                            _numel(a["output_tensors"]) * pg_of(a["process_group"]).size(),
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
    n, rows = pg_of(pg_arg).size(), (inp.shape[0] if inp.dim() else 1)
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


def redop_name(value) -> str:
    """A reduction's name from a c10d op's boxed ReduceOp or a functional op's string."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.lower()
    try:
        return _redop_names().get(int(value._get_method("op")()), "")
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return ""
