"""A script that runs on gloo and hangs on NCCL: ``commbench audit examples/nccl_hang.py --np 2
--nccl`` finds it on a CPU.

Rank 0 sends to rank 1 without waiting and then all-reduces; rank 1 all-reduces and then
receives. gloo buffers the message, so it completes. With ``device_id`` given to
``init_process_group`` (eager init), NCCL runs the send on the group's own communicator, queued
before rank 0's all-reduce, while rank 1's receive is queued behind its own all-reduce: each
waits for the other.
"""

import os

import torch
import torch.distributed as dist

local = int(os.environ.get("LOCAL_RANK", "0"))
cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo",
                        device_id=torch.device("cuda", local) if cuda else None)
rank = dist.get_rank()
x = torch.ones(4, device="cuda" if cuda else "cpu")
if rank == 0:
    work = dist.isend(x, 1)
    dist.all_reduce(x)
    work.wait()
elif rank == 1:
    dist.all_reduce(x)
    dist.recv(x, 0)
else:
    dist.all_reduce(x)
dist.destroy_process_group()
