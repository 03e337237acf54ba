"""SPMD cases for the tensor-parallel tests, with the deliberately broken variants they must catch."""

from __future__ import annotations

import contextlib
from unittest import mock

import torch

from commbench.patterns import ddp as ddp_mod
from commbench.patterns import tp_layers
from commbench.patterns import tp_run as tp_mod
from commbench.patterns.tp import communications as tp_ops
from commbench.patterns.tp_model import TPConfig
from commbench.patterns.tp_run import run_head, run_layer


def _no_backward_all_reduce(ctx, dy):  # f that forgets its backward all-reduce
    return dy, None, None


def _heads_off_by_one(w, rank, P, cfg):
    """Shard the attention heads one head too far on rank 0 (a wrong split)."""
    out = _REAL_SHARD(w, rank, P, cfg)
    if rank == 0 and P > 1:
        d = cfg.hidden // cfg.heads
        out.wqkv = torch.roll(out.wqkv, d, 0)
    return out


_REAL_SHARD = tp_layers.shard_weights


def _mutation(mutant: str | None):
    if mutant == "no_backward_all_reduce":
        return mock.patch.object(tp_ops._Copy, "backward", staticmethod(_no_backward_all_reduce))
    if mutant == "wrong_split":
        return mock.patch.object(tp_mod, "shard_weights", _heads_off_by_one)
    if mutant == "no_replicated_sync":
        return mock.patch.object(tp_mod, "sync_replicated_grads", lambda *a: None)
    return contextlib.nullcontext()


def layer_case(ctx, cfg: TPConfig, seed: int, naive: bool = False, bucket_bytes: int = 1 << 20,
               mutant: str | None = None):
    with _mutation(mutant):
        return run_layer(ctx, cfg, seed, naive, bucket_bytes)


def head_case(ctx, cfg: TPConfig, seed: int, fused: bool = False, naive: bool = False,
              mutant: str | None = None):
    with _mutation(mutant):
        return run_head(ctx, cfg, seed, fused, naive)


def naive_ddp_case(ctx, n_params: int):
    """DP only: one all-reduce per parameter after backward (the naive counterpart)."""
    params = [torch.full((k + 1,), float(ctx.rank)).requires_grad_() for k in range(n_params)]
    sum(p.sum() * (k + 1) for k, p in enumerate(params)).backward()
    with ctx.ledger.capture() as cap:
        ddp_mod.naive_sync(params, ctx.comm(), ctx.world)
    return [p.grad.tolist() for p in params], [(e.op, e.count) for e in cap.entries]
