"""Broken parts of the pipeline pattern: each is a bug class the contract must catch."""

from __future__ import annotations

__all__ = ["last_rank_shifted_layers", "no_grad_accumulation"]


def last_rank_shifted_layers(all_w, c: int, per: int, rank: int, ranks: int) -> list:
    """The last rank takes its chunk's weights one layer too late (a wrong split of the model)."""
    shift = 1 if rank == ranks - 1 else 0
    return (all_w[c * per + shift:(c + 1) * per + shift] + all_w)[:per]


def no_grad_accumulation(ws) -> None:
    """Each backward starts from zero gradients: only the last micro-batch's gradient is kept."""
    for w in ws:
        w.grad = None
