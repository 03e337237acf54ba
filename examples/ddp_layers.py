"""torch's DistributedDataParallel on the transformer-shaped layers of examples/layers.py, its
gradients all-reduced in buckets of ``--bucket-mb`` MB, ``--steps`` steps of
``--micro-batches`` micro-batches each, each step marked for the audit's ``--step``: from the
third step on, the buckets DDP rebuilt after the first (the second broadcasts their order), the
calls of ``predict layout --impl torch-ddp``. With ``--tp T``: torch's tensor parallelism inside
each layer on a (dp, tp) mesh (examples/layers.py's ``tp_mesh``; ``--sp`` adds sequence
parallelism), DDP over the mesh's dp dim on each rank's local shards (torch's
``_pre_dp_module_transform``), the calls of ``tp=T`` (``tp=T,sp``).

    commbench audit examples/ddp_layers.py --np 2 --step 3 --layout impl=torch-ddp,dp=2,\\
layers=2,hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,micro-batches=1,loss=none,bucket-mb=0.004
"""

import argparse
from contextlib import nullcontext

import torch
import torch.distributed as dist
from layers import Layer, shape_args, tp_mesh  # examples/layers.py
from torch.nn.parallel import DistributedDataParallel

try:
    import commbench

    step = commbench.audit.step  # marks the step for commbench audit --step
except ImportError:  # without commbench
    from contextlib import nullcontext as step

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    shape_args(p)
    p.add_argument("--bucket-mb", type=float, default=0.004, help="bucket_cap_mb (0: torch's "
                   "default, 25 MiB with a first bucket of 1 MiB)")
    p.add_argument("--no-sync", action="store_true",
                   help="accumulate the micro-batches under no_sync(), the last one synced")
    p.add_argument("--find-unused", action="store_true", help="find_unused_parameters=True")
    p.add_argument("--static-graph", action="store_true", help="static_graph=True")
    p.add_argument("--bucket-view", action="store_true", help="gradient_as_bucket_view=True")
    p.add_argument("--micro-batches", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (the mesh's last dim)")
    p.add_argument("--sp", action="store_true", help="with --tp: sequence parallelism")
    p.add_argument("--extra", action="store_true", help="one all-reduce no layout makes")
    a = p.parse_args()
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Layer(a.hidden, a.ffn) for _ in range(a.layers)])
    group = None
    if a.tp > 1:
        from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

        group = tp_mesh(model, a.tp, a.sp).get_group()
        _pre_dp_module_transform(model)  # DDP sees each rank's local shards
    ddp = DistributedDataParallel(model, process_group=group, bucket_cap_mb=a.bucket_mb or None,
                                  find_unused_parameters=a.find_unused,
                                  static_graph=a.static_graph,
                                  gradient_as_bucket_view=a.bucket_view)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    seq = a.seq // a.tp if a.sp else a.seq  # under SP each rank holds its sequence shard
    for _ in range(a.steps):
        with step():
            opt.zero_grad()
            for i in range(a.micro_batches):
                last = i == a.micro_batches - 1
                with ddp.no_sync() if a.no_sync and not last else nullcontext():
                    ddp(torch.randn(a.batch, seq, a.hidden)).sum().backward()
            opt.step()
            if a.extra:
                dist.all_reduce(torch.ones(8))
