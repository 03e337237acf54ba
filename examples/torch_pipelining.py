"""torch's pipelining: a four-layer MLP cut into one stage per rank, four micro-batches through
GPipe (``--schedule gpipe``, the default) or 1F1B (``--schedule 1f1b``): activations sent
forward stage to stage, their gradients sent back.

    commbench audit examples/torch_pipelining.py --np 2
    commbench audit examples/torch_pipelining.py --np 4 -- --schedule 1f1b
"""

import argparse

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--hidden", type=int, default=16)
    a = p.parse_args()
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    layers = torch.nn.Sequential(torch.nn.Linear(a.hidden, a.hidden), torch.nn.ReLU())
    stage = PipelineStage(layers, rank, size, torch.device("cpu"))
    kind = ScheduleGPipe if a.schedule == "gpipe" else Schedule1F1B
    schedule = kind(stage, a.microbatches, loss_fn=lambda out, target: out.pow(2).mean())
    x = torch.randn(a.batch, a.hidden)
    if rank == 0:
        schedule.step(x)
    elif rank == size - 1:
        schedule.step(target=torch.zeros(a.batch, a.hidden))
    else:
        schedule.step()
