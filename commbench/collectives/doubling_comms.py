"""Recursive doubling and Rabenseifner's all-reduce from send/recv: the schedules of
:mod:`commbench.collectives.schedules` run through the comm layer.
Shapes: x [*] -> out [*], the same on every member."""

from __future__ import annotations

import torch

from commbench.collectives._p2p import flat, run_steps
from commbench.collectives.schedules import doubling_steps, rabenseifner_steps
from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["rabenseifner_all_reduce", "recursive_doubling_all_reduce"]


def recursive_doubling_all_reduce(comm: Comm, x: torch.Tensor, group: Group, *,
                                  op: str = "sum") -> torch.Tensor:
    buf = flat(x)
    with comm.ledger.scope("recursive_doubling"):
        run_steps(comm, buf, group, doubling_steps(group.size, group.index, buf.numel()), op)
    return buf.reshape(x.shape)


def rabenseifner_all_reduce(comm: Comm, x: torch.Tensor, group: Group, *,
                            op: str = "sum") -> torch.Tensor:
    buf = flat(x)
    with comm.ledger.scope("rabenseifner"):
        run_steps(comm, buf, group, rabenseifner_steps(group.size, group.index, buf.numel()), op)
    return buf.reshape(x.shape)
