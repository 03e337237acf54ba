"""Seeded inputs that every rank can compute, and the exact result each rank must receive.

As in nccl-tests' ``verifiable`` data, rank r's element k is a function of (seed, r, k) alone, so
each rank computes what it should receive without asking anyone, and a result is right or wrong
element by element (the ``#wrong`` column). Values are small integers, exact in every dtype used
(bfloat16 holds integers up to 256 exactly): for ``sum`` and ``avg`` in -4..4, for ``prod`` in
{1, 2} (at most 2**8 on 8 ranks), for ``min``/``max`` in -8..8. Sums are then exact in any order,
so the expected result is exact too, and a comparison with tolerance 0 is fair.

Inputs and expected results are made on the rank's device and compared there; a reduction's
expected value is folded rank by rank in place (:func:`_reduced`), a few buffers of the result's
size whatever the world size.
"""

from __future__ import annotations

import functools

import torch

from commbench.ops import OPS

__all__ = ["expected", "seeded", "wrong"]


_P = 1000003  # the hash's modulus: element k's value repeats with period _P in k


def _hashed(seed: int, rank: int, k: torch.Tensor, redop: str) -> torch.Tensor:
    """The values of elements ``k`` (int64, consumed) of rank ``rank``: a cheap hash of (seed,
    rank, k) brought into the redop's range. k is taken modulo ``_P`` first (the same hash, and
    no int64 overflow past 3.4e9 elements, where a direct product would disagree with the
    repeated period)."""
    h = k.remainder_(_P).mul_(2654435761).add_((rank + 1) * 40503 + seed * 69069).remainder_(_P)
    if redop == "prod":
        return h.remainder_(2).add_(1)
    if redop in ("min", "max"):
        return h.remainder_(17).sub_(8)
    return h.remainder_(9).sub_(4)


@functools.lru_cache(maxsize=16)
def _period(seed: int, rank: int, redop: str, device: str) -> torch.Tensor:
    """One period (``_P`` elements) of rank ``rank``'s values, int8 on ``device``; kept for the
    next buffer of the same rank (16 at most: 16 MB)."""
    k = torch.arange(_P, dtype=torch.int64, device=device)
    return _hashed(seed, rank, k, redop).to(torch.int8)


def _values(seed: int, rank: int, lo: int, hi: int, dtype: torch.dtype, redop: str,
            device) -> torch.Tensor:
    """Rank ``rank``'s elements lo..hi-1 as integers on ``device`` (int64, or int8 for a range
    longer than the hash's period: that period repeated, the same values without hashing every
    element; a 64 MiB buffer took seconds per rank)."""
    if hi - lo <= _P:
        v = _hashed(seed, rank, torch.arange(lo, hi, dtype=torch.int64, device=device), redop)
    else:
        one = _period(seed, rank, redop, str(torch.device(device)))
        start = lo % _P
        reps = -(-(start + hi - lo) // _P)
        v = one.repeat(reps)[start:start + hi - lo]
    if not dtype.is_floating_point and not dtype.is_signed:
        v = v.abs_()
    return v


def seeded(seed: int, rank: int, count: int, dtype: torch.dtype, redop: str = "sum",
            device: torch.device | str = "cpu") -> torch.Tensor:
    """Rank ``rank``'s input of ``count`` elements, made on ``device``."""
    return _values(seed, rank, 0, count, dtype, redop, device).to(dtype)


_FOLD = {"sum": torch.Tensor.add_, "avg": torch.Tensor.add_, "prod": torch.Tensor.mul_,
         "min": lambda a, b: torch.minimum(a, b, out=a), "max": lambda a, b: torch.maximum(a, b, out=a)}


def _reduced(seed: int, n: int, lo: int, hi: int, dtype: torch.dtype, redop: str,
             device) -> torch.Tensor:
    """Every rank's elements lo..hi-1 reduced, exactly: folded rank by rank in int64 on the
    device, so memory stays at a few buffers of the block whatever the world size (as nccl-tests
    computes its expected values on the GPU)."""
    if redop not in _FOLD:
        raise ValueError(f"redop {redop!r}: must be sum, prod, min, max or avg")
    acc = _values(seed, 0, lo, hi, dtype, redop, device).to(torch.int64)
    for r in range(1, n):
        _FOLD[redop](acc, _values(seed, r, lo, hi, dtype, redop, device))
    out = acc.to(dtype)  # exact integers; integer overflow wraps as the transport's does
    return out.div_(n) if redop == "avg" else out  # avg: the exact sum, divided in the dtype


def expected(op: str, seed: int, rank: int, n: int, count: int, dtype: torch.dtype,
             redop: str = "sum", root: int = 0,
             device: torch.device | str = "cpu") -> torch.Tensor | None:
    """What ``rank`` must hold after ``op`` when every rank's input is :func:`seeded`, made on
    ``device``.

    count: elements of each rank's input (for ``scatter``, of the root's whole buffer; for
    ``all_to_all``, of each rank's whole send buffer, split evenly). The parts a rank receives
    are its op's record's (:attr:`commbench.ops.Op.expected`).
    """
    record = OPS.get(op)
    if record is None or record.expected is None:
        raise ValueError(f"op {op!r}: no expectation")
    segments = record.expected(rank, n, count, root)
    if segments is None:
        return None
    parts = [_reduced(seed, n, lo, hi, dtype, redop, device) if kind == "reduced" else
             _values(seed, r, lo, hi, dtype, redop, device).to(dtype)
             for kind, r, lo, hi in segments]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def wrong(got: torch.Tensor | None, want: torch.Tensor | None) -> int:
    """Number of elements that differ: NaN never equals, and a zero of the wrong sign differs
    (no exact result here is -0.0: the inputs are integers, whose float sums round to +0.0); a
    missing or misshapen result counts all."""
    if want is None:
        return 0 if got is None else 1
    if got is None or got.shape != want.shape:
        return max(want.numel(), 1)
    want = want.to(got.device)  # compared where the result is (the rank's device)
    differ = got != want
    if got.dtype.is_floating_point:
        differ |= torch.signbit(got) != torch.signbit(want)
    return int(differ.sum().item())
