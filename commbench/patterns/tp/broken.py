"""Broken parts of the tensor-parallel patterns: each is a bug class the contract must catch."""

from __future__ import annotations

import torch

from commbench.patterns.tp.layers import shard_weights

__all__ = ["copy_without_all_reduce", "heads_off_by_one", "no_replicated_sync",
           "unmasked_embedding"]


class _CopyNoReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return dy


def copy_without_all_reduce(x, comm, group):
    """Megatron's f that forgets its backward all-reduce: each rank keeps its partial dx."""
    return x if group.size == 1 else _CopyNoReduce.apply(x)


def heads_off_by_one(w, rank, P, cfg):
    """The attention heads sharded one head too far on rank 0 (a wrong split)."""
    out = shard_weights(w, rank, P, cfg)
    if rank == 0 and P > 1:
        out.wqkv = torch.roll(out.wqkv, cfg.hidden // cfg.heads, 0)
    return out


def no_replicated_sync(w, comm, group, mlp_only=False):
    """SP without the all-reduce of the LayerNorm and row-bias gradients over TP."""


def unmasked_embedding(ids, e, start):
    """The vocab-parallel lookup that does not zero the rows of ids outside this rank's range
    (they read row 0 of the shard instead), so the all-reduce adds garbage."""
    outside = (ids < start) | (ids >= start + e.shape[0])
    return torch.nn.functional.embedding((ids - start).masked_fill(outside, 0), e)
