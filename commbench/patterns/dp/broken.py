"""Broken parts of the data-parallel patterns: each is a bug class the contract must catch."""

from __future__ import annotations

from commbench.patterns.dp.ddp_comms import DDP

__all__ = ["DDPWithoutCopyBack", "chunk_start_off_by_one", "local_grad_slice", "stale_prefetch"]


class DDPWithoutCopyBack(DDP):
    """Waits for every bucket's all-reduce but never copies the sums back: each rank keeps the
    gradient of its own slice of the batch."""

    def finish(self) -> None:
        for _, work, _ in self._works:
            work.wait()
        for h in self._hooks:
            h.remove()


def chunk_start_off_by_one(r: int, c: int, P: int) -> int:
    """ZeRO's chunk of a rank one element too far: each rank updates its neighbour's first
    element as its own last."""
    return r * c + (1 if P > 1 else 0)


def local_grad_slice(grad, comm, group):
    """Stage 2 keeping its slice of its own gradient, never reduce-scattered over the group."""
    return grad.view(group.size, -1)[group.index].clone()


def stale_prefetch(pending, k: int, cache: list):
    """Stage 3 that keeps the first gather it ever made of each layer: the parameters of later
    steps are the initial ones."""
    full = pending.wait() if pending is not None else None
    if len(cache) <= k:
        cache.append(full)
    return cache[k]
