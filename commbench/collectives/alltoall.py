"""All-to-all from send/recv: pairwise exchange (any splits) and Bruck (equal blocks).

* pairwise: in step k = 1..P-1 member i sends its block for i+k and receives the block from i-k.
  Each member moves exactly its off-diagonal data, sum_j!=i of its splits: the least possible bytes,
  in P-1 steps. Uneven splits (all-to-allv) and empty blocks work; when only ``in_splits`` is
  given, the counts are exchanged first the same way (P-1 messages of one int64).
* Bruck (1997): rotate the blocks so that block j is the one for member i+j, then in step k send
  every block whose index has bit k set to member i + 2^k; after ceil(log2 P) steps block j holds
  what member i-j sent, and a last rotation puts it in place. About (P/2) log2 P blocks each way:
  more bytes, far fewer messages; the small-message algorithm.

Shapes: x [sum(in_splits), *] -> out [sum(out_splits), *]; Bruck needs x [P*b, *].
"""

from __future__ import annotations

import torch

from commbench.collectives._p2p import exchange, offsets
from commbench.collectives.algorithm import Algorithm
from commbench.runtime.group import Group
from commbench.wire.comm import Comm
from commbench.wire.ops import lg

__all__ = ["RECORDS", "bruck_all_to_all", "bruck_blocks_per_step", "pairwise_all_to_all"]


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


def bruck_blocks_per_step(n: int) -> list[int]:
    """Blocks each member sends in each Bruck step: indices 0..n-1 with bit k set."""
    out, k = [], 0
    while (1 << k) < n:
        out.append(sum(1 for j in range(n) if j >> k & 1))
        k += 1
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


def _pairwise_elements(n: int, i: int, count: int, in_splits=None, out_splits=None, row: int = 1,
                       **kw) -> tuple[int, int]:
    if in_splits is None or out_splits is None:
        raise ValueError("pairwise all_to_all needs in_splits and out_splits")
    return (sum(in_splits) - in_splits[i]) * row, (sum(out_splits) - out_splits[i]) * row


def _bruck_elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
    moved = sum(bruck_blocks_per_step(n)) * (count // n)
    return moved, moved


RECORDS = (
    Algorithm("all_to_all", "pairwise", pairwise_all_to_all, _pairwise_elements,
              lambda n, S: (n - 1, (n - 1) / n * S, 0.0),
              call=lambda fn, comm, x, group, root, redop, splits: fn(comm, x, group, splits, splits)),
    Algorithm("all_to_all", "bruck", bruck_all_to_all, _bruck_elements,
              lambda n, S: (lg(n), S / n * sum(bruck_blocks_per_step(n)), 0.0)),
)
