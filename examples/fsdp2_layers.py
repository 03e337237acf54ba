"""FSDP2 on a transformer-shaped model: ``fully_shard`` on each layer (attention's q, k, v and
output projections, two LayerNorms, a two-matrix MLP, no biases in the linears) and on the
root, one step of one micro-batch: the calls ``predict layout --impl fsdp2`` prices.

    commbench audit examples/fsdp2_layers.py --np 2 --layout impl=fsdp2,dp=2,layers=2,\
hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,micro-batches=1,loss=none,act-bytes=4
"""

import argparse

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


class Layer(torch.nn.Module):
    def __init__(self, h: int, f: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(h, h, bias=False) for _ in range(4))
        self.fc1, self.fc2 = torch.nn.Linear(h, f, bias=False), torch.nn.Linear(f, h, bias=False)

    def forward(self, x):
        a = self.ln1(x)
        x = x + self.o(torch.softmax(self.q(a) @ self.k(a).transpose(-1, -2), -1) @ self.v(a))
        return x + self.fc2(torch.relu(self.fc1(self.ln2(x))))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--ffn", type=int, default=64)
    p.add_argument("--seq", type=int, default=8)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--extra", action="store_true", help="one all-reduce no layout makes")
    a = p.parse_args()
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Layer(a.hidden, a.ffn) for _ in range(a.layers)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    model(torch.randn(a.batch, a.seq, a.hidden)).sum().backward()
    if a.extra:
        dist.all_reduce(torch.ones(8))
