"""A transformer-shaped layer for the examples: attention's q, k, v and output projections, two
LayerNorms and a two-matrix MLP, no biases in the linears; its parameters are the ones
``predict layout`` counts per layer (2h^2 + 2h kv d + 4h + 2hf at tp=1).

Shapes: x [b, s, h] -> [b, s, h]."""

import torch


class Layer(torch.nn.Module):
    def __init__(self, h: int, f: int) -> None:
        super().__init__()
        # registered in the order forward uses them (the layout's order: DDP's first buckets)
        self.ln1 = torch.nn.LayerNorm(h)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(h, h, bias=False) for _ in range(4))
        self.ln2 = torch.nn.LayerNorm(h)
        self.fc1, self.fc2 = torch.nn.Linear(h, f, bias=False), torch.nn.Linear(f, h, bias=False)

    def forward(self, x):
        a = self.ln1(x)
        x = x + self.o(torch.softmax(self.q(a) @ self.k(a).transpose(-1, -2), -1) @ self.v(a))
        return x + self.fc2(torch.relu(self.fc1(self.ln2(x))))


def shape_args(p) -> None:
    """The model's and batch's flags, as the layout names them: --layers, --hidden, --ffn,
    --seq, --batch (sequences per micro-batch)."""
    for flag, default in (("--layers", 2), ("--hidden", 16), ("--ffn", 64), ("--seq", 8),
                          ("--batch", 2)):
        p.add_argument(flag, type=int, default=default)


def tp_mesh(model: torch.nn.Sequential, tp: int, sp: bool):
    """Megatron's split of each layer over the mesh's ``tp`` dim, with torch's styles: q, k, v
    and fc1 column-, o and fc2 row-parallel, the LayerNorms replicated (with ``sp``: sequence-
    parallel); the ``dp`` dim, for the data parallelism around it."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (dist.get_world_size() // tp, tp), mesh_dim_names=("dp", "tp"))
    col = ColwiseParallel(input_layouts=Shard(1)) if sp else ColwiseParallel()
    row = RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel()
    plan = {"q": col, "k": col, "v": col, "fc1": col, "o": row, "fc2": row}
    if sp:
        plan |= {"ln1": SequenceParallel(), "ln2": SequenceParallel()}
    for layer in model:
        parallelize_module(layer, mesh["tp"], plan)
    return mesh["dp"]
