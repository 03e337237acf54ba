"""DeepSpeed's ZeRO, stage 1, 2 or 3, on the transformer-shaped layers of examples/layers.py:
``deepspeed.initialize`` on the CPU accelerator over gloo, SGD, fp32, ``--steps`` steps of one
micro-batch, each marked for the audit's ``--step``.

    DS_BUILD_OPS=0 pip install 'commbench[libs]'
    DS_ACCELERATOR=cpu commbench audit examples/deepspeed_zero.py --np 2 -- --stage 2
    DS_ACCELERATOR=cpu commbench audit examples/deepspeed_zero.py --np 2 --step 3 \\
        --layout impl=deepspeed,zero=2,dp=2,layers=2,hidden=16,heads=4,ffn=64,seq=8,\\
micro-batch=2,micro-batches=1,loss=none -- --stage 2 --steps 3

From the third step on (the first two trace ZeRO-3's parameter order) it makes the calls of the
layout's ``impl=deepspeed`` (docs/audit.md). With ``--tp T``: Megatron's tensor parallelism in
plain torch inside each layer (``TPLayer``), DeepSpeed told the (dp, tp) grid through its
``mpu`` argument (``Grid``), the calls of ``tp=T``.
"""

import argparse
import json

import torch
import torch.distributed as dist
from layers import Layer, shape_args  # examples/layers.py

try:
    import commbench

    step = commbench.audit.step  # marks the step for commbench audit --step
except ImportError:  # without commbench
    from contextlib import nullcontext as step

class Grid:
    """The model-parallel unit DeepSpeed takes (``deepspeed.initialize(mpu=...)``): TP ranks
    adjacent, as Megatron lays them out; each rank's data-parallel group the ranks holding
    the same TP shard."""

    def __init__(self, tp: int) -> None:
        world, rank = dist.get_world_size(), dist.get_rank()
        self.tp, self.dp = tp, world // tp
        for start in range(0, world, tp):  # every rank makes every group, in one order
            g = dist.new_group(list(range(start, start + tp)))
            if rank // tp == start // tp:
                self.tp_group = g
        for t in range(tp):
            g = dist.new_group(list(range(t, world, tp)))
            if rank % tp == t:
                self.dp_group = g

    def get_model_parallel_group(self):
        return self.tp_group

    def get_model_parallel_world_size(self) -> int:
        return self.tp

    def get_model_parallel_rank(self) -> int:
        return dist.get_rank() % self.tp

    def get_data_parallel_group(self):
        return self.dp_group

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_data_parallel_rank(self) -> int:
        return dist.get_rank() // self.tp

    get_tensor_model_parallel_group = get_model_parallel_group
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_rank = get_model_parallel_rank


class _Copy(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient over TP backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _Reduce(torch.autograd.Function):
    """Megatron's g: all-reduce over TP forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class TPLayer(torch.nn.Module):
    """examples/layers.py's layer split over ``t`` TP ranks Megatron's way: q, k and v one
    fused column-parallel matrix, the output projection row-parallel, the MLP's first matrix
    column- and its second row-parallel, the LayerNorms whole. Shapes on a TP rank: x [b, s, h]
    -> qkv [b, s, 3h/t] -> [b, s, h]."""

    def __init__(self, h: int, f: int, t: int, group) -> None:
        super().__init__()
        self.group = group
        self.ln1, self.ln2 = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
        self.qkv = torch.nn.Linear(h, 3 * h // t, bias=False)
        self.o = torch.nn.Linear(h // t, h, bias=False)
        self.fc1 = torch.nn.Linear(h, f // t, bias=False)
        self.fc2 = torch.nn.Linear(f // t, h, bias=False)

    def forward(self, x):
        q, k, v = self.qkv(_Copy.apply(self.ln1(x), self.group)).chunk(3, dim=-1)
        x = x + _Reduce.apply(self.o(torch.softmax(q @ k.transpose(-1, -2), -1) @ v), self.group)
        y = torch.relu(self.fc1(_Copy.apply(self.ln2(x), self.group)))
        return x + _Reduce.apply(self.fc2(y), self.group)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--stage", type=int, default=1, choices=(1, 2, 3))
    shape_args(p)
    p.add_argument("--micro-batches", type=int, default=1, help="gradient accumulation steps")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--config", default=None,
                   help="a ds_config JSON whose zero_optimization settings are laid over these")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (TPLayer, Grid)")
    p.add_argument("--extra", action="store_true", help="one all-reduce no layout makes")
    a = p.parse_args()
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    grid = Grid(a.tp) if a.tp > 1 else None
    model = torch.nn.Sequential(*[
        TPLayer(a.hidden, a.ffn, a.tp, grid.tp_group) if grid else Layer(a.hidden, a.ffn)
        for _ in range(a.layers)])
    config = {"train_micro_batch_size_per_gpu": a.batch,
              "gradient_accumulation_steps": a.micro_batches,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "zero_allow_untested_optimizer": True, "steps_per_print": 1 << 30,
              # every parameter sharded, as in a model of real size (the default keeps those
              # under 100,000 elements whole: every one of this model's)
              "zero_optimization": {"stage": a.stage, "stage3_param_persistence_threshold": 0}}
    if a.config:
        with open(a.config) as f:
            config["zero_optimization"] |= json.load(f).get("zero_optimization", {})
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config, mpu=grid)
    for _ in range(a.steps):
        with step():
            for _ in range(a.micro_batches):
                loss = engine(torch.randn(a.batch, a.seq, a.hidden)).sum()
                engine.backward(loss)
                engine.step()  # steps the optimizer at the last micro-batch
            if a.extra:
                dist.all_reduce(torch.ones(8))
