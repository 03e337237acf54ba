"""Three ranks, each mistake on its own line, all of which run on gloo: a gloo group of two made
beside an NCCL one (split counts differ under eager init), a bitwise reduction NCCL does not
have, and a ring of messages each posted alone (a circular wait for connections). With
``good``: the same ring as one batch_isend_irecv, and every group NCCL."""

import sys

import torch
import torch.distributed as dist

good = sys.argv[1:] == ["good"]
dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
pair = dist.new_group([0, 1], backend=None if good else "gloo")
other = dist.new_group([0, 2])
x = torch.ones(4, dtype=torch.int32)
if not good:
    dist.all_reduce(x, op=dist.ReduceOp.BAND)
y = torch.ones(4)
got = torch.empty(4)
if good:
    ops = [dist.P2POp(dist.irecv, got, (rank - 1) % size), dist.P2POp(dist.isend, y, (rank + 1) % size)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
else:
    rx = dist.irecv(got, (rank - 1) % size)
    tx = dist.isend(y, (rank + 1) % size)
    tx.wait()
    rx.wait()
dist.all_reduce(y)
