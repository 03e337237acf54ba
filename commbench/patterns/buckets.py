"""DDP's bucketed gradient all-reduce, overlapped with backward: the data-parallel half of a
layer's step, shared by the DDP pattern (dp/ddp.py) and the TP x DP layer (tp/tp_layer_comms.py),
so that neither family imports the other for it.

PyTorch DDP (Li et al. 2020, "PyTorch Distributed", VLDB §3.2): parameters are grouped into buckets
of about ``bucket_bytes`` in the reverse of their definition order (the order backward produces
their gradients); when the last gradient of a bucket is accumulated, that bucket's all-reduce
starts at once, asynchronously, while backward goes on with earlier layers. ``finish`` waits for
every bucket and writes the sums back. Under TP x DP this is the notes' overlap: the DP all-reduce
of one layer's gradients runs while the TP group carries on with the next layer's backward.

The loss is a sum over the batch and each DP replica holds a slice of it, so gradients are summed,
not averaged. Bytes: one all-reduce of every parameter, 2(d-1)/d * Psi per rank.

The naive counterpart (:func:`naive_sync`) waits for the whole backward, then all-reduces each
parameter's gradient on its own: as many calls as parameters, no overlap.
"""

from __future__ import annotations

import torch

from commbench.patterns.tp.configs import buckets_of
from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["DDP", "naive_sync"]


class DDP:
    def __init__(self, params: list[torch.Tensor], comm: Comm, group: Group,
                 bucket_bytes: int = 25 << 20) -> None:
        self.params, self.comm, self.group = params, comm, group
        self.buckets = buckets_of([p.numel() * p.element_size() for p in params], bucket_bytes)
        self._bucket_of = {i: k for k, b in enumerate(self.buckets) for i in b}
        self._left = [len(b) for b in self.buckets]
        self._works: list[tuple[int, object, torch.Tensor]] = []
        self.issued_at: list[int] = []  # ledger length when each bucket's all-reduce started
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook(i))
                       for i, p in enumerate(params)]

    def _hook(self, i: int):
        def ready(p: torch.Tensor) -> None:
            k = self._bucket_of[i]
            self._left[k] -= 1
            if self._left[k] == 0:
                flat = torch.cat([self.params[j].grad.reshape(-1) for j in self.buckets[k]])
                self.issued_at.append(len(self.comm.ledger.entries))
                self._works.append((k, self.comm.all_reduce_async(flat, self.group), flat))
        return ready

    def finish(self) -> None:
        """Wait for every bucket, write the summed gradients back, and detach the hooks."""
        for k, work, _ in self._works:
            total = work.wait()
            for j, part in zip(self.buckets[k], total.split([self.params[j].numel()
                                                               for j in self.buckets[k]])):
                self.params[j].grad.copy_(part.view_as(self.params[j]))
        missing = [k for k, left in enumerate(self._left) if left]
        for h in self._hooks:
            h.remove()
        if missing:
            raise RuntimeError(f"DDP: buckets {missing} never got all their gradients (a "
                               "parameter unused in this backward?)")


def naive_sync(params: list[torch.Tensor], comm: Comm, group: Group) -> None:
    """One blocking all-reduce per parameter, after backward."""
    for p in params:
        p.grad.copy_(comm.all_reduce(p.grad, group))
