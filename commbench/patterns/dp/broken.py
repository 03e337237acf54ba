"""Broken parts of the data-parallel patterns: each is a bug class the contract must catch."""

from __future__ import annotations

from commbench.patterns.dp.ddp import DDP

__all__ = ["DDPWithoutCopyBack"]


class DDPWithoutCopyBack(DDP):
    """Waits for every bucket's all-reduce but never copies the sums back: each rank keeps the
    gradient of its own slice of the batch."""

    def finish(self) -> None:
        for _, work, _ in self._works:
            work.wait()
        for h in self._hooks:
            h.remove()
