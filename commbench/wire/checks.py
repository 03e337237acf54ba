"""Argument checks of the comm layer: each raises naming the value and the rule, on the calling
rank, before anything is sent; and small helpers shared by the comm layer's calls."""

from __future__ import annotations

import torch

from commbench.runtime.group import Group

OPS = ("sum", "prod", "min", "max", "avg")


def check_group(group: Group, op: str) -> None:
    if not isinstance(group, Group):
        raise TypeError(f"{op}: group must be a commbench Group, got {type(group).__name__}")
    if not group.member:
        raise ValueError(f"{op}: rank {group.rank} is not in {group}")


def check_tensor(x, op: str, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")


def check_device(x: torch.Tensor, device: torch.device | None, op: str) -> None:
    """NCCL's rule: every tensor handed to the transport lives on the group's device."""
    if device is not None and x.device != device:
        raise ValueError(f"{op}: a tensor on {x.device} handed to a transport whose tensors live "
                         f"on {device} (NCCL takes tensors on the rank's own GPU only)")


def check_op(op: str, red: str, dtype: torch.dtype) -> None:
    """``red`` is a reduction commbench knows and can apply to ``dtype``."""
    if red not in OPS:
        raise ValueError(f"{op}: op={red!r}: must be one of {', '.join(OPS)}")
    if red == "avg" and not dtype.is_floating_point:
        raise ValueError(f"{op}: op='avg' with dtype {dtype}: avg needs a floating dtype")


def check_redop(backend, op: str, red: str, dtype: torch.dtype) -> None:
    """:func:`check_op`, and the transport can reduce ``dtype`` itself."""
    check_op(op, red, dtype)
    reason = backend.unsupported(red, dtype)
    if reason:
        raise ValueError(f"{op}: {red} on {dtype} over {backend.name}: {reason}")


def check_index(value: int, group: Group, op: str, name: str) -> None:
    if not isinstance(value, int) or not 0 <= value < group.size:
        raise ValueError(f"{op}: {name}={value!r}: must be a position in 0..{group.size - 1}"
                         f" of {group}")


def check_p2p(op: str, x, group: Group, peer: int) -> None:
    check_group(group, op)
    check_tensor(x, op)
    check_index(peer, group, op, "peer")
    if peer == group.index:
        raise ValueError(f"{op}: peer={peer} is this rank's own position in {group}")

def rows(x: torch.Tensor) -> int:
    return x.shape[0] if x.dim() else 1


def splits(splits, n: int, name: str) -> list[int]:
    splits = [int(s) for s in splits]
    if len(splits) != n:
        raise ValueError(f"all_to_all: {name} has {len(splits)} entries, the group has {n} members")
    if any(s < 0 for s in splits):
        raise ValueError(f"all_to_all: {name}={splits}: counts must be >= 0")
    return splits


def work_buffer(x: torch.Tensor, inplace: bool) -> torch.Tensor:
    if inplace and x.is_contiguous():
        return x
    return x.detach().clone(memory_format=torch.contiguous_format)


def finish(x: torch.Tensor, buf: torch.Tensor, inplace: bool) -> torch.Tensor:
    if inplace and buf is not x:
        x.copy_(buf)
        return x
    return buf


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
