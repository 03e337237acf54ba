"""Buffers for the timing loop and the algorithms' steps."""

from __future__ import annotations

import torch


def like(src: torch.Tensor, count: int) -> torch.Tensor:
    """An empty 1-D buffer of ``count`` elements like ``src``. On CPU its memory comes from NumPy,
    which advises the kernel to back large arrays with huge pages, as it does for a bare mpi4py
    loop's arrays; torch's allocator does not, which costs TLB misses from a few MiB on and would
    show up as harness overhead."""
    if src.is_cuda:
        return src.new_empty(count)
    # lazy: imports numpy
    import numpy as np

    raw = {torch.bfloat16: torch.int16, torch.bool: torch.uint8}.get(src.dtype, src.dtype)
    arr = np.empty(count, dtype=torch.empty((), dtype=raw, device="cpu").numpy().dtype)
    return torch.from_numpy(arr).view(src.dtype)
