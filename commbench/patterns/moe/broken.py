"""Broken parts of the MoE patterns: each is a bug class the contract must catch."""

from __future__ import annotations

import torch

from commbench.patterns.moe.dispatch import a2a, moe_capacity
from commbench.patterns.moe.gating import uniforms

__all__ = ["dropped_pass_through", "experts_on_the_dense_group", "positions_without_offset",
           "rolled_dispatch", "uniforms_per_rank"]


def rolled_dispatch(x, comm, group, in_splits=None, out_splits=None):
    """The capacity buffer's expert blocks rotated by one rank before the dispatch."""
    if x.dim() == 3 and in_splits is None and group.size > 1 and x.requires_grad:
        x = x.roll(x.shape[0] // group.size, 0)
    return a2a(x, comm, group, in_splits, out_splits)


def dropped_pass_through(x, combine, dispatch, *args):
    """A token that lost every choice comes back as its input instead of zero."""
    y = moe_capacity(x, combine, dispatch, *args)
    return y + x * (~dispatch.any(2).any(1)).to(x.dtype)[:, None]


def uniforms_per_rank(cfg, seed: int, group: int, rank: int = 0) -> torch.Tensor:
    """Each rank draws its own random routing: TP ranks holding the same tokens drop different
    ones."""
    return uniforms(cfg, seed + 1000 * rank, group)


def experts_on_the_dense_group(comm, wg, experts, data_group, dp) -> None:
    """Expert gradients reduced over every data rank instead of the expert-data-parallel group."""
    if data_group.size > 1:
        wg.grad = comm.all_reduce(wg.grad, data_group)
        flat = comm.all_reduce(torch.cat([p.grad.flatten() for p in experts]), data_group)
        for p, part in zip(experts, flat.split([p.numel() for p in experts]), strict=True):
            p.grad = part.view_as(p)


def positions_without_offset(mask, before):
    """Second choices placed from slot 0 instead of after the first choices (GShard queues
    them after every first choice)."""
    return torch.cumsum(mask, 0) - 1, before
