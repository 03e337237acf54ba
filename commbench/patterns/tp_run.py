"""Tensor and sequence parallelism as a pattern: SPMD entry points, expectations, predicted bytes.

Each entry point runs on every rank of a ``dp x tp`` grid (TP neighbours adjacent), builds the
seeded weights, runs forward and backward and returns this rank's outputs, gradients and ledger.
DP replicas take consecutive slices of the batch; their gradients are summed over the DP group by
DDP (:mod:`commbench.patterns.ddp`), so every rank ends with the full-batch gradient of its shard.

Predicted bytes per layer, forward + backward (A = b*s*h elements of the layer's activation):
    TP:                   4 all-reduces of A on the TP group
    TP+SP:                4 all-gathers + 4 reduce-scatters of A (6 all-gathers with regather),
                          plus 1 all-reduce of 6h (LayerNorm and row-bias gradients)
    naive TP:             4 all-reduces of A, plus 4 all-gathers (2 forward, 2 backward) of
                          3A/P and F/P-wide blocks (the column outputs)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from commbench.patterns._steps import ledger_rows, timed
from commbench.patterns.ddp import DDP, naive_sync
from commbench.patterns.tp_layers import shard_weights, sync_replicated_grads, tp_layer
from commbench.patterns.tp_model import DTYPES, LayerWeights, TPConfig, init_weights, inputs
from commbench.patterns.vocab import lm_head, vocab_parallel_cross_entropy, vocab_parallel_embedding

__all__ = ["expected_layer", "predicted_layer", "run_head", "run_layer"]


def _setup(ctx, cfg: TPConfig):
    cfg.validate(ctx.size)
    grid = ctx.grid(f"dp={cfg.dp},tp={cfg.tp}")
    return grid, grid["tp"], grid["dp"], ctx.comm()


def _local(t: torch.Tensor, cfg: TPConfig, dp_index: int, tp_index: int, seq: bool):
    """This rank's slice: its DP share of the batch, and under SP its TP share of the sequence."""
    b = cfg.batch // cfg.dp
    t = t[dp_index * b:(dp_index + 1) * b]
    if seq:
        s = cfg.seq // cfg.tp
        t = t[:, tp_index * s:(tp_index + 1) * s]
    return t.contiguous()


def run_layer(ctx, cfg: TPConfig, seed: int, naive: bool = False, bucket_bytes: int = 1 << 20,
              attention_block: bool = True, iters: int = 0, warmup: int = 0,
              naive_ddp: bool = False):
    """One layer forward + backward: y, dx and gradient shards of this rank; the ledger.

    With ``iters``, the step is then timed ``warmup + iters`` more times (a barrier before each,
    outside the timer) and the per-iteration seconds come back as ``times``.
    """
    _, tp, dp, comm = _setup(ctx, cfg)
    dt = DTYPES[cfg.dtype]
    d = inputs(cfg, seed, dt)
    w = shard_weights(init_weights(cfg, seed, dt), tp.index, tp.size, cfg)
    params = {k: v.clone().requires_grad_() for k, v in w.named().items()}
    wl = LayerWeights(**params)
    sp = cfg.sequence_parallel
    x = _local(d["x"], cfg, dp.index, tp.index, sp).requires_grad_()
    m1, m2, dy = (_local(d[k], cfg, dp.index, tp.index, sp) for k in ("mask1", "mask2", "dy"))

    def step():
        for t in (x, *params.values()):
            t.grad = None
        ddp = DDP(list(params.values()), comm, dp, bucket_bytes) \
            if dp.size > 1 and not naive_ddp else None
        y = tp_layer(x, wl, cfg, comm, tp, m1, m2, naive=naive, attention_block=attention_block)
        y.backward(dy)
        if ddp is not None:  # DP sums first: the buckets left with the gradients as they stood
            ddp.finish()
        elif dp.size > 1:
            naive_sync(list(params.values()), comm, dp)
        if sp:
            sync_replicated_grads(wl, comm, tp)
        return y, ddp

    with ctx.ledger.capture() as cap:
        y, ddp = step()
    times = timed(ctx, step, iters, warmup)
    return {"y": y.detach(), "dx": x.grad,
            **{f"d{k}": p.grad for k, p in params.items() if p.grad is not None},
            "ledger": ledger_rows(cap.entries), "tp": tp.ranks, "dp": dp.ranks,
            "ddp_issued": ddp.issued_at if ddp else [], "times": times}


def expected_layer(oracle: dict, cfg: TPConfig, rank: int) -> dict[str, torch.Tensor]:
    """The oracle's values that ``rank`` must hold (its slices, in the run's dtype)."""
    tp_index, dp_index = rank % cfg.tp, rank // cfg.tp
    sp = cfg.sequence_parallel
    grads = LayerWeights(**{k[1:]: v for k, v in oracle.items() if k.startswith("d") and k != "dx"})
    shard = shard_weights(grads, tp_index, cfg.tp, cfg).named()
    out = {"y": _local(oracle["y"], cfg, dp_index, tp_index, sp),
           "dx": _local(oracle["dx"], cfg, dp_index, tp_index, sp)}
    out.update({f"d{k}": v for k, v in shard.items()})
    return out


def predicted_layer(cfg: TPConfig, naive: bool = False) -> list[tuple[str, int]]:
    """(op, elements per call) on the TP group for one layer forward + backward, in call order
    up to the order of the two directions (compared as a multiset)."""
    P = cfg.tp
    if P == 1:
        return []
    A = cfg.batch // cfg.dp * cfg.seq * cfg.hidden
    if cfg.sequence_parallel:
        shard = A // P
        ag = 6 if cfg.regather else 4
        return [("all_gather", shard)] * ag + [("reduce_scatter", A)] * 4 + \
            [("all_reduce", 6 * cfg.hidden)]
    calls = [("all_reduce", A)] * 4
    if naive:
        rows = cfg.batch // cfg.dp * cfg.seq
        calls += [("all_gather", rows * 3 * cfg.hidden // P)] * 1 + \
            [("all_gather", rows * cfg.hidden // P)] * 1 + \
            [("all_gather", rows * cfg.ffn // P)] * 2
    return calls


def run_head(ctx, cfg: TPConfig, seed: int, fused: bool = False, naive: bool = False):
    """Vocab-parallel embedding -> tied LM head -> cross-entropy, forward + backward.

    Returns the per-token loss, this rank's embedding-shard gradient and the ledger of the
    cross-entropy alone and of the whole head.
    """
    _, tp, dp, comm = _setup(ctx, cfg)
    dt = DTYPES[cfg.dtype]
    d = inputs(cfg, seed, dt)
    vp = cfg.vocab // tp.size
    e = d["embedding"][tp.index * vp:(tp.index + 1) * vp].clone().requires_grad_()
    ids = _local(d["ids"], cfg, dp.index, 0, False)
    targets = _local(d["targets"], cfg, dp.index, 0, False)
    sp = cfg.sequence_parallel
    with ctx.ledger.capture() as whole:
        hidden = vocab_parallel_embedding(ids, e, comm, tp, sp)
        logits = lm_head(hidden, e, comm, tp, sp)
        with ctx.ledger.capture() as ce_fwd:
            loss = vocab_parallel_cross_entropy(logits, targets, comm, tp, fused, naive)
        with ctx.ledger.capture() as ce_bwd:
            grad_logits, = torch.autograd.grad(loss.sum(), logits, retain_graph=True)
        logits.backward(grad_logits)
        if dp.size > 1:
            e.grad = comm.all_reduce(e.grad, dp)
    return {"loss": loss.detach(), "de": e.grad, "ce": ledger_rows(ce_fwd.entries + ce_bwd.entries),
            "ledger": ledger_rows(whole.entries)}


def oracle_head(cfg: TPConfig, seed: int) -> dict[str, torch.Tensor]:
    d = inputs(cfg, seed)
    e = d["embedding"].clone().requires_grad_()
    logits = F.embedding(d["ids"], e) @ e.T
    loss = F.cross_entropy(logits.flatten(0, 1), d["targets"].flatten(), reduction="none")
    loss.sum().backward()
    return {"loss": loss.detach().view(cfg.batch, cfg.seq), "de": e.grad}
