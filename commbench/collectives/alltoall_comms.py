"""Pairwise and Bruck all-to-all from send/recv (records: :mod:`commbench.collectives.alltoall`).
Shapes: x [sum(in_splits), *] -> out [sum(out_splits), *]; Bruck needs x [P*b, *]."""

from __future__ import annotations

import torch

from commbench.collectives._p2p import exchange
from commbench.ops import offsets
from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["bruck_all_to_all", "pairwise_all_to_all"]


def pairwise_all_to_all(comm: Comm, x: torch.Tensor, group: Group,
                        in_splits: list[int] | None = None,
                        out_splits: list[int] | None = None) -> torch.Tensor:
    n, i = group.size, group.index
    rows = x.shape[0] if x.dim() else 1
    if in_splits is None:
        if rows % n:
            raise ValueError(f"pairwise_all_to_all: dim 0 of x ({rows}) must be a multiple of the "
                             f"group size {n}, or give in_splits")
        in_splits = out_splits = [rows // n] * n
    if len(in_splits) != n or sum(in_splits) != rows or min(in_splits, default=0) < 0:
        raise ValueError(f"pairwise_all_to_all: in_splits {in_splits} do not split {rows} rows "
                         f"among {n} members")
    x = x.contiguous()
    with comm.ledger.scope("pairwise_all_to_all"):
        if out_splits is None:
            counts = torch.tensor(in_splits, dtype=torch.int64, device=x.device)
            got = [int(in_splits[i])] * n
            for k in range(1, n):
                dst, src = (i + k) % n, (i - k) % n
                got[src] = int(exchange(comm, counts[dst:dst + 1], dst, counts[:1], src,
                                        group).item())
            out_splits = got
        io, oo = offsets(in_splits), offsets(out_splits)
        out = x.new_empty((oo[-1], *x.shape[1:]))
        out[oo[i]:oo[i + 1]] = x[io[i]:io[i + 1]]
        for k in range(1, n):
            dst, src = (i + k) % n, (i - k) % n
            got = exchange(comm, x[io[dst]:io[dst + 1]], dst, out[oo[src]:oo[src + 1]], src, group)
            out[oo[src]:oo[src + 1]] = got
    return out


def bruck_all_to_all(comm: Comm, x: torch.Tensor, group: Group) -> torch.Tensor:
    n, i = group.size, group.index
    rows = x.shape[0] if x.dim() else 1
    if rows % n:
        raise ValueError(f"bruck_all_to_all: dim 0 of x ({rows}) must be a multiple of the group "
                         f"size {n}; Bruck moves equal blocks (use pairwise for uneven splits)")
    blocks = list(x.contiguous().chunk(n) if rows else [x] * n)
    tmp = [blocks[(i + j) % n].clone() for j in range(n)]  # tmp[j]: block for member i+j
    with comm.ledger.scope("bruck_all_to_all"):
        k = 0
        while (1 << k) < n:
            d = 1 << k
            idx = [j for j in range(n) if j >> k & 1]
            send = torch.cat([tmp[j] for j in idx])
            got = exchange(comm, send, (i + d) % n, send, (i - d) % n, group)
            for j, part in zip(idx, got.chunk(len(idx)) if got.numel() else [send[:0]] * len(idx)):
                tmp[j] = part.clone()
            k += 1
    # tmp[j] now holds what member i - j sent to member i
    return torch.cat([tmp[(i - src) % n] for src in range(n)])
