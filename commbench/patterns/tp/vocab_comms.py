"""Vocab-parallel input embedding, tied LM head and vocab-parallel cross-entropy (Shoeybi 2019 §3).

Each rank owns the vocabulary rows [r*V/P, (r+1)*V/P) of the embedding E [V/P, h], used twice:

* input embedding: look up the ids in range, zero the others, then ``g`` (all-reduce) of [b, s, h],
  or reduce-scatter to [b, s/P, h] under SP; backward is local (identity, or an all-gather);
* LM head, tied: logits [b, s, V/P] = column-parallel linear of the hidden state with E;
* cross-entropy on the sharded logits, three all-reduces of [b, s] float32 in forward (the max,
  the target's logit, the sum of exponentials; fused: the max, then one of [2, b, s]) and none in
  backward: grad = softmax - onehot(target), each rank for its own columns.

The naive head all-gathers the logits to [b, s, V] and runs plain cross-entropy. The lookup and
the operators are parts (:class:`VocabParts`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from commbench.patterns.mappings import (
    copy_to_tp,
    gather_from_sp,
    gather_from_tp,
    reduce_from_tp,
    reduce_scatter_to_sp,
)
from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["VocabParts", "lm_head", "masked_embedding", "unmasked_embedding", "vocab_data",
           "vocab_oracle", "vocab_parallel_cross_entropy", "vocab_parallel_embedding"]


def masked_embedding(ids: torch.Tensor, e: torch.Tensor, start: int) -> torch.Tensor:
    """The rows of ``e`` [V/P, h] (vocabulary rows start..) for ``ids`` [b, s]; zero for ids
    outside this rank's range, so that the sum over TP holds each id's row once."""
    outside = (ids < start) | (ids >= start + e.shape[0])
    out = F.embedding((ids - start).masked_fill(outside, 0), e)
    return out.masked_fill(outside.unsqueeze(-1), 0.0)


@dataclass(frozen=True)
class VocabParts:
    """The swappable operators of the vocab-parallel head."""

    embed: Callable = masked_embedding
    f: Callable = copy_to_tp
    g: Callable = reduce_from_tp
    sp_gather: Callable = gather_from_sp
    sp_reduce_scatter: Callable = reduce_scatter_to_sp
    gather: Callable = gather_from_tp


def vocab_parallel_embedding(ids: torch.Tensor, e: torch.Tensor, comm: Comm, group: Group,
                             sequence_parallel: bool, parts: VocabParts) -> torch.Tensor:
    """ids [b, s] -> [b, s, h] (SP: [b, s/P, h]); e [V/P, h] this rank's rows."""
    out = parts.embed(ids, e, group.index * e.shape[0])
    if sequence_parallel:
        return parts.sp_reduce_scatter(out, comm, group)
    return parts.g(out, comm, group)


def lm_head(hidden: torch.Tensor, e: torch.Tensor, comm: Comm, group: Group,
            sequence_parallel: bool, parts: VocabParts) -> torch.Tensor:
    """Column-parallel output layer tied to the embedding: [b, s(/P), h] -> logits [b, s, V/P]."""
    full = parts.sp_gather(hidden, comm, group) if sequence_parallel else \
        parts.f(hidden, comm, group)
    return full @ e.T


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, comm, group, fused):
        lf = logits if logits.dtype == torch.float64 else logits.float()  # bf16/fp16/fp32 -> fp32
        vp = lf.shape[-1]
        start = group.index * vp
        m = lf.max(-1).values
        m = comm.all_reduce(m, group, op="max") if group.size > 1 else m
        shifted = lf - m.unsqueeze(-1)
        outside = (targets < start) | (targets >= start + vp)
        local = (targets - start).masked_fill(outside, 0)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        exp = shifted.exp()
        sum_exp = exp.sum(-1)
        if group.size > 1:
            if fused:
                both = comm.all_reduce(torch.stack([picked, sum_exp]), group)
                picked, sum_exp = both[0], both[1]
            else:
                picked = comm.all_reduce(picked, group)
                sum_exp = comm.all_reduce(sum_exp, group)
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), local, outside)
        ctx.dtype = logits.dtype
        return sum_exp.log() - picked

    @staticmethod
    def backward(ctx, dloss):
        softmax, local, outside = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, local.unsqueeze(-1), -(~outside).to(grad.dtype).unsqueeze(-1))
        return (grad * dloss.unsqueeze(-1)).to(ctx.dtype), None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, comm: Comm,
                                 group: Group, variant: str, parts: VocabParts) -> torch.Tensor:
    """Per-token loss [b, s] from this rank's logits [b, s, V/P] and the targets [b, s];
    ``variant``: ``megatron`` (3 all-reduces), ``fused`` (2) or ``naive`` (logits gathered)."""
    if variant == "naive":
        full = parts.gather(logits, comm, group)  # [b, s, V]
        full = full if full.dtype == torch.float64 else full.float()
        return F.cross_entropy(full.flatten(0, 1), targets.flatten(),
                               reduction="none").view(targets.shape)
    return _VocabParallelCE.apply(logits, targets, comm, group, variant == "fused")


def unmasked_embedding(ids, e, start):
    """The vocab-parallel lookup that does not zero the rows of ids outside this rank's range
    (they read row 0 of the shard instead), so the all-reduce adds garbage."""
    outside = (ids < start) | (ids >= start + e.shape[0])
    return torch.nn.functional.embedding((ids - start).masked_fill(outside, 0), e)


def vocab_data(cfg, seed: int) -> dict[str, torch.Tensor]:
    """The whole seeded data: ids and targets [b, s], the embedding [V, h] in float64."""
    g = torch.Generator().manual_seed(seed)
    b, s = cfg.batch, cfg.seq
    return {"ids": torch.randint(0, cfg.vocab, (b, s), generator=g),
            "targets": torch.randint(0, cfg.vocab, (b, s), generator=g),
            "embedding": torch.randn(cfg.vocab, cfg.hidden, generator=g, dtype=torch.float64)}


def vocab_oracle(cfg, seed: int, dtype=torch.float64, nudge=None) -> dict:
    """The loss and the embedding's gradient of the unsharded head (float64: the truth)."""
    d = vocab_data(cfg, seed)
    e = d["embedding"].to(dtype)
    e = (nudge(e) if nudge else e).requires_grad_()
    logits = F.embedding(d["ids"], e) @ e.T
    loss = F.cross_entropy(logits.flatten(0, 1), d["targets"].flatten(),
                           reduction="none")
    loss.sum().backward()
    return {"loss": loss.detach().view(cfg.batch, cfg.seq), "de": e.grad}
