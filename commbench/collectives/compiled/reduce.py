"""In-place reductions of the compiled schedules: ``target op= got`` as one bound call.

On CPU tensors of the dtypes NumPy reduces exactly as torch does, a NumPy ufunc with its output
positional (a keyword costs ~0.15 us; NumPy deprecates it for min and max), or, for a float sum
or product of at most :data:`TINY` elements, Python float operations (:func:`tiny_reducer`);
else torch's op with ``out=``. float16 and bfloat16 go to torch: their NumPy forms round
differently or do not exist.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

__all__ = ["TINY", "reducer", "tiny_reducer"]

_NP_OPS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
           "max": np.maximum}
_TORCH_OPS = {"sum": torch.add, "avg": torch.add, "prod": torch.mul, "min": torch.minimum,
              "max": torch.maximum}
_NP_EXACT = (torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32,
             torch.int64)
TINY = 2  # elements: a sum or product this short is combined by :func:`tiny_reducer`


def tiny_reducer(op: str, a: np.ndarray, b: np.ndarray):
    """``a op= b`` for float32 / float64 vectors of at most :data:`TINY` elements (op sum, avg or
    prod), as Python float operations on memoryviews, unrolled; None for anything else.

    Right after an MPI exchange a NumPy ufunc call costs several times what this does, which at
    8 B is the difference between losing and winning against MPI's own (docs/decisions.md).
    The same bits as NumPy: a float32 sum or product of two float32 values computed in double
    and rounded once to float32 (the memoryview's store is a C cast) is the correctly rounded
    float32 result, as double carries more than 2 x 24 + 2 bits; out of range it is +-inf."""
    if op not in ("sum", "avg", "prod") or a.dtype not in (np.float32, np.float64) or not (
            0 < a.size <= TINY) or a.shape != b.shape:
        return None
    x, y = memoryview(a), memoryview(b)
    if a.size == 1:
        def add() -> None:
            x[0] += y[0]

        def mul() -> None:
            x[0] *= y[0]
    else:
        def add() -> None:
            x[0] += y[0]
            x[1] += y[1]

        def mul() -> None:
            x[0] *= y[0]
            x[1] *= y[1]
    return mul if op == "prod" else add


def reducer(op: str, target: torch.Tensor, got: torch.Tensor, tiny=tiny_reducer):
    """A zero-argument call doing ``target op= got`` in place (``avg`` sums; the average is
    divided once at the end); ``tiny``: the reduction of a few elements (:func:`tiny_reducer`)."""
    if target.device.type == "cpu" and target.dtype in _NP_EXACT:
        a, b = target.numpy(), got.numpy()
        return tiny(op, a, b) or (partial(_NP_OPS[op], a, b, out=a) if op in ("min", "max")
                                  else partial(_NP_OPS[op], a, b, a))
    return partial(_TORCH_OPS[op], target, got, out=target)
