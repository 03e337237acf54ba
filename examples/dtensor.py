"""DTensor by hand: a row-sharded matmul whose right operand DTensor must all-gather, and torch's
loss_parallel cross-entropy over vocabulary-sharded logits (three all-reduces inside).

    commbench audit examples/dtensor.py --np 2
"""

import torch
import torch.distributed as dist
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel

if __name__ == "__main__":
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    P = mesh.size()
    a = distribute_tensor(torch.randn(4 * P, 4), mesh, [Shard(0)])
    b = distribute_tensor(torch.randn(4, 2 * P), mesh, [Shard(0)])
    logits = a @ b  # [4P, 2P], rows sharded
    vocab = logits.redistribute(mesh, [Shard(1)])  # [b, V] with V sharded, as loss_parallel wants
    with loss_parallel():
        torch.nn.functional.cross_entropy(vocab, torch.zeros(4 * P, dtype=torch.long))
