"""Transports behind :class:`commbench.wire.comm.Comm`: torch.distributed (gloo, NCCL) and mpi4py.

Each backend takes tensors that the comm layer has already checked and made contiguous, writes
results into the buffers it is given, and names dtype/op pairs it cannot do (``unsupported``).
"""

from __future__ import annotations

__all__ = ["Work"]


class Work:
    """Handle of a non-blocking call; ``wait()`` returns the tensor and books the call."""

    def __init__(self, handle, tensor, on_done) -> None:
        self._handle, self.tensor, self._on_done = handle, tensor, on_done

    def wait(self):
        if self._handle is not None:
            self._handle.wait()
            self._handle = None
            self._on_done()
        return self.tensor
