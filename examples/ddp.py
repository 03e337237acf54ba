"""torch's DistributedDataParallel: a four-layer MLP, its gradients all-reduced in buckets of
``--bucket-mb`` MB, two iterations. torch 2.13 cuts its first bucket at 1 MiB only when
``bucket_cap_mb`` is left at its default (``dist._DEFAULT_FIRST_BUCKET_BYTES``); given, the
first bucket takes the cap too. It rebuilds its buckets in the order the first iteration's
gradients arrived: the 4 KiB of 16 x 16 float32 weights here go in one all-reduce per
iteration under the 4.2 kB cap.

    commbench audit examples/ddp.py --np 2
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--bucket-mb", type=float, default=0.004)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--hidden", type=int, default=16)
    a = p.parse_args()
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    h = a.hidden
    model = torch.nn.Sequential(*[torch.nn.Linear(h, h, bias=False) for _ in range(4)])
    ddp = DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(a.steps):
        opt.zero_grad()
        ddp(torch.randn(8, h)).sum().backward()
        opt.step()
