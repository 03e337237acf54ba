"""DeepSpeed-Ulysses' own ``DistributedAttention``: one step of attention with the sequence
sharded over the ranks, heads exchanged by all-to-all.

    DS_BUILD_OPS=0 pip install 'commbench[libs]'
    commbench audit examples/deepspeed_ulysses.py --np 2

Forward: q, k and v go from sequence shards to head shards (3 all-to-alls), the output back (1);
backward the same 4 in reverse: 8 all-to-alls of s/P x b x H x d elements each. DeepSpeed's
``init_distributed`` over gloo sets its own communication backend (the process group is the
audit's own when it is already up).

Shapes: q, k, v [s/P, b, H, d] -> [s, b, H/P, d] -> attention -> [s/P, b, H, d].
"""

import argparse

import torch
import torch.nn.functional as F

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=8)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=4)
    a = ap.parse_args()
    import deepspeed
    import torch.distributed as dist
    from deepspeed.sequence.layer import DistributedAttention

    deepspeed.init_distributed(dist_backend="gloo")
    P = dist.get_world_size()

    def local_attention(q, k, v, *args, **kwargs):  # [s, b, H/P, d] each
        out = F.scaled_dot_product_attention(*(t.permute(1, 2, 0, 3) for t in (q, k, v)),
                                             is_causal=True)
        return out.permute(2, 0, 1, 3)

    attention = DistributedAttention(local_attention, dist.group.WORLD, scatter_idx=2,
                                     gather_idx=0)
    torch.manual_seed(0)
    q, k, v = (torch.randn(a.seq // P, a.batch, a.heads, a.head_dim, requires_grad=True)
               for _ in range(3))
    attention(q, k, v, 1).pow(2).mean().backward()  # batch_dim_idx 1
