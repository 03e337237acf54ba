"""Bus bandwidth: nccl-tests' size convention and busbw factor per collective (pure).

``algbw = size / time`` and ``busbw = algbw * factor``, in GB/s (1e9 bytes). ``size`` is what
nccl-tests prints in its size column: one rank's buffer for all-reduce, broadcast, reduce and
send/recv; the whole input (reduce-scatter) or whole output (all-gather, gather) for the split
collectives; one rank's total send for all-to-all and scatter.

The factor rescales algbw to the bandwidth each rank's link must carry under a flat topology built
from point-to-point transfers (nccl-tests' doc/PERFORMANCE.md):

* all-reduce 2(n-1)/n: every element needs n-1 reductions and n-1 copies spread over n links;
* reduce-scatter, all-gather, all-to-all, gather, scatter (n-1)/n: one of the two halves, or 1/n
  of the data stays local;
* broadcast, reduce, send/recv 1: everything passes the root's (or the one) link.

busbw can exceed a link's peak where an algorithm is not built from point-to-point (NVLS, CollNet,
Tree on two nodes), and it counts one direction.
"""

from __future__ import annotations

from commbench.ops import OPS

__all__ = ["algbw", "busbw", "factor"]


def factor(op: str, n: int) -> float:
    """nccl-tests' bus factor of ``op`` at ``n`` ranks (:attr:`commbench.ops.Op.bus`)."""
    record = OPS.get(op)
    if record is None or record.bus is None:
        known = ", ".join(o.name for o in OPS.values() if o.bus is not None)
        raise ValueError(f"op {op!r}: no busbw factor; known: {known}")
    if n < 1:
        raise ValueError(f"n={n}: must be >= 1")
    return record.bus(n)


def algbw(size_bytes: int, seconds: float) -> float:
    return size_bytes / seconds / 1e9 if seconds > 0 else 0.0


def busbw(op: str, n: int, size_bytes: int, seconds: float) -> float:
    return algbw(size_bytes, seconds) * factor(op, n)
