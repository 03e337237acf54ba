"""The two-level all-reduce from the ring's pieces (record: :mod:`commbench.collectives.hierarchical`).
Shapes: x [*] -> out [*] on every rank; chunk [c_l] inside the node, c from split_sizes(S, L)."""

from __future__ import annotations

import torch

from commbench.collectives._p2p import flat
from commbench.collectives.ring_comms import ring_all_gather, ring_all_reduce, ring_reduce_scatter
from commbench.ops import split_sizes
from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["hierarchical_all_reduce"]


def hierarchical_all_reduce(comm: Comm, x: torch.Tensor, local: Group, cross: Group, *,
                            op: str = "sum") -> torch.Tensor:
    """``local``: this rank's node; ``cross``: the ranks with this rank's local index on every node."""
    buf = flat(x)
    counts = split_sizes(buf.numel(), local.size)
    inner = "sum" if op == "avg" else op
    with comm.ledger.scope("hierarchical_all_reduce"):
        mine = ring_reduce_scatter(comm, buf, local, op=inner, counts=counts)
        mine = ring_all_reduce(comm, mine, cross, op=inner)
        if op == "avg":
            mine.div_(local.size * cross.size)
        out = ring_all_gather(comm, mine, local, counts=counts)
    return out.reshape(x.shape)
