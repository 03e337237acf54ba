"""Megatron-style tensor and sequence parallelism with torch's own API: one training step of a
block (column-parallel up, row-parallel down, sequence-parallel LayerNorm) on every rank.

    commbench audit examples/torch_tp_sp.py --np 2      # or: torchrun --nproc-per-node 2 ...
"""

import torch
import torch.distributed as dist
from torch.distributed.tensor import Shard, init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

if __name__ == "__main__":
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    h = 8
    block = torch.nn.ModuleDict({"norm": torch.nn.LayerNorm(h), "up": torch.nn.Linear(h, 4 * h),
                                 "down": torch.nn.Linear(4 * h, h)})
    parallelize_module(block, mesh, {
        "norm": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1))})
    x = torch.randn(2, 4 * mesh.size(), h)  # [b, s, h]; every rank holds the same batch
    y = block["down"](torch.relu(block["up"](block["norm"](x))))
    y.full_tensor().sum().backward() if hasattr(y, "full_tensor") else y.sum().backward()
