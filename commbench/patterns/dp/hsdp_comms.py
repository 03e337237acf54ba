"""Hybrid sharding (the ``hsdp`` pattern, dp/hsdp.py): ZeRO-3 inside the shard group, the
gradient chunk all-reduced across the replicate group once per step.

Rank (i, j) of the ``dp_replicate=R,dp_shard=S`` grid holds chunk j of every layer's flat vector
(padded to a multiple of S), the same chunk as every other replica's j-th rank, and trains on
batch slice i*S + j. Each micro-batch runs ZeRO-3's forward and backward on the shard group
(:func:`~commbench.patterns.dp.zero_comms.forward_zero3`: gathered before use, again in
backward, the gradient reduce-scattered into the chunk's accumulator); after the last one the
accumulated chunk is summed over the replicas (:attr:`HSDPParts.replicate_reduce`) and Adam
updates the chunk. The replicas then hold the same chunk again, as a DDP replica would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from commbench.patterns.dp.configs import flat_size
from commbench.patterns.dp.zero_comms import ZeroParts, forward_zero3
from commbench.patterns.dp.zero_model import Adam
from commbench.runtime.group import Group
from commbench.wire.comm import Comm
from commbench.wire.dtypes import DTYPES

__all__ = ["HSDPParts", "reduced_on_the_shard_group", "replicas_never_reduced",
           "replicate_reduce", "train"]


def replicate_reduce(comm: Comm, chunk: torch.Tensor, replicate: Group,
                     shard: Group) -> torch.Tensor:
    """The gradient chunk summed over the replicas holding the same chunk."""
    return comm.all_reduce(chunk, replicate)


@dataclass(frozen=True)
class HSDPParts:
    """The swappable step of hybrid sharding (ZeRO-3's own steps inside are ZeRO's)."""

    replicate_reduce: Callable = replicate_reduce


def train(ctx, cfg, data: dict, shard: Group, replicate: Group, parts: HSDPParts) -> dict:
    """``cfg.steps`` Adam steps from ``data`` (the layers' flat vectors padded to a multiple of
    the shard group, the batches); this rank's master chunk of every layer."""
    comm = ctx.comm()
    S, zcfg = shard.size, cfg.zero(shard.size)
    r = replicate.index * S + shard.index  # this rank's batch slice
    cdt = DTYPES[cfg.dtype]
    mdt = torch.float32 if cfg.mixed else cdt
    c = flat_size(cfg, S)[1] // S
    master = [f[shard.index * c:(shard.index + 1) * c].to(mdt).clone() for f in data["layers"]]
    opt = Adam(master, cfg.lr)
    chunks = [m.to(cdt, copy=True) for m in master]
    bl = cfg.batch // cfg.ranks
    cache: list = []
    for step in range(cfg.steps):
        acc = [m.new_zeros(c) for m in master]
        for mb in range(cfg.micro):
            x, t = (v[r * bl:(r + 1) * bl].to(cdt) for v in data["batches"][step][mb])
            y = forward_zero3(chunks, acc, x, zcfg, comm, shard, ZeroParts(), cache)
            (0.5 * ((y - t) ** 2).sum()).backward()
        opt.step([parts.replicate_reduce(comm, a, replicate, shard) for a in acc])
        for p, m in zip(chunks, master):
            p.copy_(m.to(cdt))
    return {f"w{k}": m for k, m in enumerate(master)}


# -- broken parts: each a bug class the contract must catch ----------------------------------
def replicas_never_reduced(comm: Comm, chunk: torch.Tensor, replicate: Group,
                           shard: Group) -> torch.Tensor:
    """Each replica group steps on its own slices of the batch: no all-reduce at all."""
    return chunk


def reduced_on_the_shard_group(comm: Comm, chunk: torch.Tensor, replicate: Group,
                               shard: Group) -> torch.Tensor:
    """The all-reduce on the wrong axis: the shard group sums different chunks of a layer."""
    return comm.all_reduce(chunk, shard)
