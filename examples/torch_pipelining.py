"""torch's pipelining: the transformer-shaped layers of examples/layers.py cut into one stage per
rank, ``--micro-batches`` micro-batches through GPipe (``--schedule gpipe``, the default) or
1F1B (``--schedule 1f1b``), or two stages per rank (rank and rank + ranks) through interleaved
1F1B (``--schedule interleaved``): each micro-batch's activations x [b, s, h] sent forward
stage to stage, their gradients sent back. ``--steps`` steps, each marked for the audit's ``--step``.

    commbench audit examples/torch_pipelining.py --np 2
    commbench audit examples/torch_pipelining.py --np 4 -- --schedule 1f1b
    commbench audit examples/torch_pipelining.py --np 2 --step 2 --layout grad-norm=0,pp=2,layers=2,\\
hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,micro-batches=4,loss=none,act-bytes=4 -- --steps 2

The first step also sends each stage's shapes ahead (torch infers them at run time): compare
from the second.
"""

import argparse

import torch
import torch.distributed as dist
from layers import Layer, shape_args  # examples/layers.py
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

try:
    import commbench

    step = commbench.audit.step  # marks the step for commbench audit --step
except ImportError:  # without commbench
    from contextlib import nullcontext as step

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--schedule", choices=("gpipe", "1f1b", "interleaved"), default="gpipe")
    shape_args(p)
    p.set_defaults(layers=0)  # 0: one layer per stage
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--extra", action="store_true", help="one all-reduce no layout makes")
    a = p.parse_args()
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    chunks = 2 if a.schedule == "interleaved" else 1  # stages per rank: rank, rank + size
    stages = size * chunks
    layers = a.layers or stages
    if layers % stages:
        p.error(f"--layers {layers}: must be a multiple of the {stages} stages")
    torch.manual_seed(rank)
    parts = [torch.nn.Sequential(*[Layer(a.hidden, a.ffn) for _ in range(layers // stages)])
             for _ in range(chunks)]
    mine = [PipelineStage(part, rank + k * size, stages, torch.device("cpu"))
            for k, part in enumerate(parts)]
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}.get(a.schedule)
    loss = lambda out, target: out.pow(2).mean()  # noqa: E731
    schedule = (kind(mine[0], a.micro_batches, loss_fn=loss) if kind else
                ScheduleInterleaved1F1B(mine, a.micro_batches, loss_fn=loss))
    rows = a.batch * a.micro_batches  # x [b m, s, h], cut into m micro-batches of b
    for _ in range(a.steps):
        with step():
            if rank == 0:
                schedule.step(torch.randn(rows, a.seq, a.hidden))
            elif rank == size - 1:
                schedule.step(target=torch.zeros(rows, a.seq, a.hidden))
            else:
                schedule.step()
            if a.extra:
                dist.all_reduce(torch.ones(8))
