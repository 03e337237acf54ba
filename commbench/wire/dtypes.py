"""The dtypes commbench speaks of by name, in one table (nccl-tests' ``-d`` names)."""

from __future__ import annotations

import torch

from commbench.names import DTYPE_NAMES, check_dtype

__all__ = ["DTYPES", "check_dtype"]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int8": torch.int8, "uint8": torch.uint8,
    "int32": torch.int32, "int64": torch.int64,
}
assert tuple(DTYPES) == DTYPE_NAMES, "commbench.names.DTYPE_NAMES lists the same dtypes"

