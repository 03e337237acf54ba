"""Which torch.distributed call a dispatcher op is, for the watcher (:mod:`commbench.wire.watch`):
the collective its record names it for (``Names.dispatch`` in :mod:`commbench.ops`), and its
group, element count and volume arguments (the root, an all-to-all's splits) read off the op's
arguments by their names, which c10d's and the functional ops' schemas share; and the
reduction's name off a boxed ``ReduceOp``.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from commbench.ops import OPS

__all__ = ["OP_OF", "first_tensor", "pg_of", "ranks_of", "read", "redop_name"]


def pg_of(arg):
    """A ProcessGroup from a c10d op's argument or a functional op's group name."""
    if isinstance(arg, str):
        return c10d._resolve_process_group(arg)
    if isinstance(arg, torch.ScriptObject):  # c10d ops carry the group boxed
        return torch._C._distributed_c10d.ProcessGroup.unbox(arg)
    return arg


def ranks_of(pg) -> tuple[int, ...]:
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


def _dispatched() -> dict[str, str]:
    return {name: o.name for o in OPS.values() for name in o.names.dispatch}


# dispatcher op -> commbench's collective (the records' Names.dispatch)
OP_OF: dict[str, str] = _dispatched()
# where a dispatcher op keeps the tensors whose elements are booked, first match wins: c10d's
# (tensors, input_tensor(s), input_list, inputs) and the functional ops' (input, inputs, tensor)
_INPUTS = ("tensors", "input_tensor", "input_tensors", "input_list", "inputs", "input", "tensor")


def read(name: str, a: dict) -> tuple[str, object, int, dict] | None:
    """(commbench's op, the group argument, elements booked, volume kwargs) of dispatcher op
    ``name`` called with arguments ``a`` (by name), None when it is no collective. The group is
    a c10d op's ``process_group`` or a functional op's ``group_name``; the elements are this
    rank's input (a scatter's: its block times the group, as the comm layer books the root's
    buffer); the root is ``root_rank`` or ``src``; an all-to-all's splits are read in rows."""
    op = OP_OF.get(name)
    if op is None:
        return None
    record = OPS[op]
    pg_arg = a["process_group"] if "process_group" in a else a["group_name"]
    if record.split:
        if "input_tensors" in a:  # the list form: one tensor per member
            ins, outs = a["input_tensors"], a["output_tensors"]
            return op, pg_arg, _numel(ins), {"in_splits": [t.numel() for t in ins],
                                             "out_splits": [t.numel() for t in outs], "row": 1}
        return (op, *_a2a(pg_arg, a["input"], a.get("input_split_sizes") or [],
                          a.get("output_split_sizes") or []))
    if record.input == "none":
        count = 0
    elif record.rooted and record.input == "blocks":  # scatter: this rank's block x members
        count = _numel(a["output_tensors"]) * pg_of(pg_arg).size()
    else:
        count = _numel(a[next(k for k in _INPUTS if k in a)])
    root = a.get("root_rank", a.get("src")) if record.rooted else None
    return op, pg_arg, count, {} if root is None else {"root": root}


def _a2a(pg_arg, inp, in_splits, out_splits) -> tuple:
    n, rows = pg_of(pg_arg).size(), (inp.shape[0] if inp.dim() else 1)
    in_splits = [int(s) for s in in_splits] or [rows // n] * n
    out_splits = [int(s) for s in out_splits] or list(in_splits)
    row = math.prod(inp.shape[1:])
    return pg_arg, inp.numel(), {"in_splits": in_splits, "out_splits": out_splits, "row": row}


@functools.cache
def _redop_names() -> dict[int, str]:
    """c10d's reduction codes (RedOpType) by name: 0 sum, 1 avg, 2 product, 3 min, 4 max, ..."""
    return {int(v): k.lower() for k, v in dist.ReduceOp.RedOpType.__members__.items()}


def redop_name(value) -> str:
    """A reduction's name from a c10d op's boxed ReduceOp or a functional op's string."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.lower()
    try:  # a boxed ReduceOp (torch.ScriptObject): its code through its one method
        code = int(value._get_method("op")())
    except (AttributeError, RuntimeError) as exc:  # a torch whose ReduceOp boxes otherwise
        return f"unreadable ({type(exc).__name__})"
    return _redop_names().get(code, f"code {code}")
