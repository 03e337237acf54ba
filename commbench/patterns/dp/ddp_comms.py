"""DDP's deliberately broken reducers, which the DDP pattern's contract must catch (the reducer
itself, shared with the TP x DP layer: :mod:`commbench.patterns.buckets`)."""

from __future__ import annotations

from commbench.patterns.buckets import DDP

__all__ = ["DDPWithoutCopyBack"]


# -- broken parts: each a bug class the contract must catch ----------------------------------
class DDPWithoutCopyBack(DDP):
    """Waits for every bucket's all-reduce but never copies the sums back: each rank keeps the
    gradient of its own slice of the batch."""

    def finish(self) -> None:
        for _, work, _ in self._works:
            work.wait()
        for h in self._hooks:
            h.remove()
