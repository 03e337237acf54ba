"""Megatron's tensor + sequence parallel transformer layer written with plain torch.distributed,
as Megatron-core's mappings do it: one training step of ``--layers`` layers on every rank.

Per block (attention, MLP): the sequence-sharded input is all-gathered before the column-
parallel linear (its backward: a reduce-scatter of the gradient) and the row-parallel output is
reduce-scattered back to sequence shards (its backward: an all-gather); after backward, one
all-reduce of every layer's LayerNorm and row-bias gradients, which each rank computed on its
shard only (flattened into one call, as megatron-core's ``finalize_model_grads`` does).

    L=tp=2,sp,grad-norm=0,layers=2,hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,micro-batches=1,loss=none
    commbench audit examples/megatron_sp.py --np 2 --layout $L,act-bytes=4,grad-bytes=4

``--extra-gather`` also gathers the layer's output before the loss (as a loss on the full
sequence would): the audit flags an all-gather the layout does not make.

Shapes: x [s/P, b, h]; qkv [s, b, 3 h/P]; the heads H/P of this rank; fc1 [s, b, f/P].
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F

# torch 2.13 names them *_single; older releases *_into_tensor and *_tensor
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class GatherSeq(torch.autograd.Function):
    """Megatron's ``gather_from_sequence_parallel_region``: all-gather forward, reduce-scatter
    backward."""

    @staticmethod
    def forward(ctx, x):
        out = x.new_empty((x.shape[0] * dist.get_world_size(), *x.shape[1:]))
        all_gather(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, g):
        out = g.new_empty((g.shape[0] // dist.get_world_size(), *g.shape[1:]))
        reduce_scatter(out, g.contiguous())
        return out


class ScatterSeq(torch.autograd.Function):
    """Megatron's ``reduce_scatter_to_sequence_parallel_region``: reduce-scatter forward,
    all-gather backward."""

    @staticmethod
    def forward(ctx, x):
        out = x.new_empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]))
        reduce_scatter(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, g):
        return GatherSeq.forward(ctx, g)


def layer(p: dict, x: torch.Tensor, heads: int) -> torch.Tensor:
    """One layer on x [s/P, b, h]; p holds this rank's shards and the replicated weights."""
    h = x.shape[-1]
    y = GatherSeq.apply(F.layer_norm(x, (h,), p["ln1_w"], p["ln1_b"]))  # [s, b, h]
    q, k, v = (y @ p["wqkv"]).chunk(3, dim=-1)  # [s, b, h/P] each
    s, b, hp = q.shape
    split = [t.reshape(s, b, heads, hp // heads).permute(1, 2, 0, 3) for t in (q, k, v)]
    a = F.scaled_dot_product_attention(*split, is_causal=True)  # [b, H/P, s, d]
    a = a.permute(2, 0, 1, 3).reshape(s, b, hp)
    x = x + ScatterSeq.apply(a @ p["wo"]) + p["bo"]  # row-parallel, bias after the scatter
    y = GatherSeq.apply(F.layer_norm(x, (h,), p["ln2_w"], p["ln2_b"]))
    y = F.gelu(y @ p["w1"] + p["b1"])  # [s, b, f/P]
    return x + ScatterSeq.apply(y @ p["w2"]) + p["b2"]


def weights(h: int, f: int, P: int) -> dict:
    g = torch.Generator().manual_seed(dist.get_rank())
    shard = {"wqkv": (h, 3 * h // P), "wo": (h // P, h), "w1": (h, f // P), "b1": (f // P,),
             "w2": (f // P, h)}
    p = {k: (torch.randn(*s, generator=g) / s[0] ** 0.5).requires_grad_() for k, s in shard.items()}
    for k in ("ln1_w", "ln2_w"):
        p[k] = torch.ones(h, requires_grad=True)
    for k in ("ln1_b", "bo", "ln2_b", "b2"):
        p[k] = torch.zeros(h, requires_grad=True)
    return p


REPLICATED = ("ln1_w", "ln1_b", "bo", "ln2_w", "ln2_b", "b2")

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=64)
    ap.add_argument("--seq", type=int, default=8)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--extra-gather", action="store_true")
    a = ap.parse_args()
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    P = dist.get_world_size()
    layers = [weights(a.hidden, a.ffn, P) for _ in range(a.layers)]
    x = torch.randn(a.seq // P, a.batch, a.hidden)
    for p in layers:
        x = layer(p, x, a.heads // P)
    loss = (GatherSeq.apply(x) if a.extra_gather else x).pow(2).mean()
    loss.backward()
    # every layer's replicated weights' gradients, summed over the sequence shards at once
    flat = torch.cat([p[k].grad for p in layers for k in REPLICATED])
    dist.all_reduce(flat)
