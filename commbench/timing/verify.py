"""Seeded inputs that every rank can compute, and the exact result each rank must receive.

As in nccl-tests' ``verifiable`` data, rank r's element k is a function of (seed, r, k) alone, so
each rank computes what it should receive without asking anyone, and a result is right or wrong
element by element (the ``#wrong`` column). Values are small integers, exact in every dtype used
(bfloat16 holds integers up to 256 exactly): for ``sum`` and ``avg`` in -4..4, for ``prod`` in
{1, 2} (at most 2**8 on 8 ranks), for ``min``/``max`` in -8..8. Sums are then exact in any order,
so the expected result is exact too, and a comparison with tolerance 0 is fair.
"""

from __future__ import annotations

import torch

__all__ = ["expected", "pattern", "wrong"]


def pattern(seed: int, rank: int, count: int, dtype: torch.dtype, redop: str = "sum",
            device: torch.device | str = "cpu") -> torch.Tensor:
    """Rank ``rank``'s input of ``count`` elements."""
    k = torch.arange(count, dtype=torch.int64)
    h = (k * 2654435761 + (rank + 1) * 40503 + seed * 69069) % 1000003  # a cheap hash of (seed,r,k)
    if redop == "prod":
        v = 1 + h % 2
    elif redop in ("min", "max"):
        v = h % 17 - 8
    else:
        v = h % 9 - 4
    if not dtype.is_floating_point and not dtype.is_signed:
        v = v.abs()
    return v.to(dtype).to(device)


def _reduce(parts: list[torch.Tensor], redop: str, dtype: torch.dtype) -> torch.Tensor:
    stack = torch.stack([p.to(torch.float64) for p in parts])
    if redop == "avg":  # the comm layer's avg: the exact sum in the dtype, divided in the dtype
        return stack.sum(0).to(dtype).div_(len(parts))
    if redop == "sum":
        out = stack.sum(0)
    elif redop == "prod":
        out = stack.prod(0)
    elif redop == "min":
        out = stack.min(0).values
    elif redop == "max":
        out = stack.max(0).values
    else:
        raise ValueError(f"redop {redop!r}: must be sum, prod, min, max or avg")
    if dtype.is_floating_point:
        return out.to(dtype)
    return out.to(torch.int64).to(dtype)  # integer overflow wraps as the transport's does


def expected(op: str, seed: int, rank: int, n: int, count: int, dtype: torch.dtype,
             redop: str = "sum", root: int = 0) -> torch.Tensor | None:
    """What ``rank`` must hold after ``op`` when every rank's input is :func:`pattern`.

    count: elements of each rank's input (for ``scatter``, of the root's whole buffer; for
    ``all_to_all``, of each rank's whole send buffer, split evenly).
    """
    def inp(r: int, c: int = count) -> torch.Tensor:
        return pattern(seed, r, c, dtype, redop)

    if op == "all_reduce":
        return _reduce([inp(r) for r in range(n)], redop, dtype)
    if op == "reduce":
        return _reduce([inp(r) for r in range(n)], redop, dtype) if rank == root else None
    if op == "reduce_scatter":
        block = count // n
        return _reduce([inp(r)[rank * block : (rank + 1) * block] for r in range(n)], redop, dtype)
    if op == "all_gather":
        return torch.cat([inp(r) for r in range(n)])
    if op == "gather":
        return torch.cat([inp(r) for r in range(n)]) if rank == root else None
    if op == "broadcast":
        return inp(root)
    if op == "scatter":
        block = count // n
        return inp(root)[rank * block : (rank + 1) * block]
    if op == "all_to_all":
        block = count // n
        return torch.cat([inp(r)[rank * block : (rank + 1) * block] for r in range(n)])
    if op == "sendrecv":
        return inp((rank - 1) % n)
    raise ValueError(f"op {op!r}: no expectation")


def wrong(got: torch.Tensor | None, want: torch.Tensor | None) -> int:
    """Number of elements that differ: NaN never equals, and a zero of the wrong sign differs
    (no exact result here is -0.0: the inputs are integers, whose float sums round to +0.0); a
    missing or misshapen result counts all."""
    if want is None:
        return 0 if got is None else 1
    if got is None or got.shape != want.shape:
        return max(want.numel(), 1)
    got = got.cpu()
    differ = got != want
    if got.dtype.is_floating_point:
        differ |= torch.signbit(got) != torch.signbit(want)
    return int(differ.sum().item())
