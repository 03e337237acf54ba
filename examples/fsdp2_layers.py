"""FSDP2 on a transformer-shaped model: ``fully_shard`` on each layer (examples/layers.py) and
on the root, one step of one micro-batch: the calls ``predict layout --impl fsdp2`` prices
(with ``--no-reshard``: those of ``impl=fsdp2,no-reshard``; with ``--dp-replicate R``: FSDP2's
hybrid sharding on a 2-D mesh of R replicas, those of ``dp-replicate=R``; with ``--tp T``:
torch's tensor parallelism inside each layer on a (dp, tp) mesh, q, k, v and fc1 column-, o and
fc2 row-parallel, the LayerNorms replicated, those of ``tp=T``; ``--sp`` adds torch's sequence
parallelism, those of ``tp=T,sp``; ``--micro-batches M --no-sync`` accumulates under
``set_requires_gradient_sync(False)``, those of ``micro-batches=M,no-sync``).

    commbench audit examples/fsdp2_layers.py --np 2 --layout impl=fsdp2,dp=2,layers=2,\
hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,micro-batches=1,loss=none,act-bytes=4
"""

import argparse

import torch
import torch.distributed as dist
from layers import Layer, shape_args, tp_mesh  # examples/layers.py
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

try:
    import commbench

    step = commbench.audit.step  # marks the step for commbench audit --step
except ImportError:  # without commbench
    from contextlib import nullcontext as step


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    shape_args(p)
    p.add_argument("--no-reshard", action="store_true",
                   help="reshard_after_forward=False: the layers stay gathered for backward")
    p.add_argument("--dp-replicate", type=int, default=1,
                   help="hybrid sharding: replicas on a (replicate, shard) device mesh")
    p.add_argument("--micro-batches", type=int, default=1)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--no-sync", action="store_true", help="accumulate: set_requires_gradient_"
                   "sync(False) on all but each step's last micro-batch")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (the mesh's last dim)")
    p.add_argument("--sp", action="store_true", help="with --tp: sequence parallelism")
    p.add_argument("--param-dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="MixedPrecisionPolicy's param_dtype: the width parameters are gathered in")
    p.add_argument("--reduce-dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="MixedPrecisionPolicy's reduce_dtype: the width gradients are reduced in")
    p.add_argument("--extra", action="store_true", help="one all-reduce no layout makes")
    a = p.parse_args()
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Layer(a.hidden, a.ffn) for _ in range(a.layers)])
    mesh = None
    if a.tp > 1:
        mesh = tp_mesh(model, a.tp, a.sp)
    elif a.dp_replicate > 1:
        from torch.distributed.device_mesh import init_device_mesh

        world = dist.get_world_size()
        mesh = init_device_mesh("cpu", (a.dp_replicate, world // a.dp_replicate),
                                mesh_dim_names=("dp_replicate", "dp_shard"))
    mp = MixedPrecisionPolicy(*(a.param_dtype and getattr(torch, a.param_dtype),
                                a.reduce_dtype and getattr(torch, a.reduce_dtype)))
    for layer in model:
        fully_shard(layer, mesh=mesh, reshard_after_forward=not a.no_reshard, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    seq = a.seq // a.tp if a.sp else a.seq  # under SP each rank holds its sequence shard
    for _ in range(a.steps):
        with step():
            for i in range(a.micro_batches):
                if a.no_sync:
                    model.set_requires_gradient_sync(i == a.micro_batches - 1)
                model(torch.randn(a.batch, seq, a.hidden)).sum().backward()
            if a.extra:
                dist.all_reduce(torch.ones(8))
