"""FSDP2 (torch's fully_shard): one training step of a two-layer MLP, parameters sharded over
every rank, gathered for forward and again for backward (``--no-reshard``: kept gathered after
forward, ``reshard_after_forward=False``, so backward gathers nothing), gradients
reduce-scattered.

    commbench audit examples/fsdp2.py --np 2
    commbench audit examples/fsdp2.py --np 2 -- --no-reshard
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

if __name__ == "__main__":
    reshard = "--no-reshard" not in sys.argv[1:]
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    for layer in (model[0], model[2]):
        fully_shard(layer, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
