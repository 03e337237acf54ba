"""Sequence and context parallelism as a pattern: SPMD entry points, expectations and the bytes
each rank must move, for Ulysses, ring attention and the naive all-gather of K and V.

Ranks form a ``dp x sp`` grid (SP neighbours adjacent). Predicted bytes per rank on the SP group
for one attention forward + backward, with n = s/P local tokens, b the local batch, e bytes per
element and H_r / K_r the query / KV heads member r attends to:

    ulysses  forward: all-to-all of q (sends b n H_j d e to each j != r), of k and v (b n K_j d e),
             of the output (b n H_r d e to each j != r); backward: the same four, mirrored.
             Even heads, no GQA: each of the 8 moves (P-1)/P^2 * b s H d elements per rank.
    ring     forward: P-1 sends of K and V, 2 b n H_kv d e each; backward P-1 of K and V and
             P-1 of dK and dV: 2 (P-1)/P * b s H_kv d e forward, twice that backward.
    naive    forward: all-gather of K and V; backward: reduce-scatter of dK and dV.
"""

from __future__ import annotations

import torch

from commbench.patterns._steps import ledger_rows, timed
from commbench.patterns.attention import (
    DTYPES,
    AttnConfig,
    attend,
    attention_inputs,
    gqa_index,
    local_tokens,
    naive_attention,
)
from commbench.patterns.ring_attention import ring_attention
from commbench.patterns.ulysses import head_ranges, kv_ranges, ulysses_attention
from commbench.patterns.zero import gathered
from commbench.wire.volume import booked

__all__ = ["ATTENTION", "expected", "oracle_zero3", "predicted", "run_attention", "run_zero3"]

ATTENTION = {"ulysses": ulysses_attention, "ring": ring_attention, "naive": naive_attention}


def run_attention(ctx, cfg: AttnConfig, seed: int, variant: str, iters: int = 0,
                  warmup: int = 0) -> dict:
    """One attention forward + backward on every rank: y, dq, dk, dv of this rank's tokens."""
    if variant not in ATTENTION:
        raise ValueError(f"variant={variant!r}: must be one of {sorted(ATTENTION)}")
    cfg.validate(ctx.size, ulysses=variant == "ulysses")
    grid = ctx.grid(f"dp={cfg.dp},sp={cfg.sp}")
    sp, dp, comm = grid["sp"], grid["dp"], ctx.comm()
    d = attention_inputs(cfg, seed)
    dt = DTYPES[cfg.dtype]
    q, k, v = (local_tokens(d[n], cfg, sp.index, dp.index).to(dt).requires_grad_()
               for n in ("q", "k", "v"))
    dy = local_tokens(d["dy"], cfg, sp.index, dp.index).to(dt)

    def step():
        y = ATTENTION[variant](q, k, v, cfg, comm, sp)
        y.backward(dy)

    with ctx.ledger.capture() as cap:
        with ctx.ledger.capture() as fwd:
            y = ATTENTION[variant](q, k, v, cfg, comm, sp)
        y.backward(dy)
    out = {"y": y.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad,
           "ledger": ledger_rows(cap.entries), "ledger_fwd": ledger_rows(fwd.entries),
           "sp": sp.ranks, "dp": dp.ranks}
    for t in (q, k, v):
        t.grad = None
    out["times"] = timed(ctx, step, iters, warmup)
    return out


def expected(oracle: dict, cfg: AttnConfig, rank: int) -> dict[str, torch.Tensor]:
    return {k: local_tokens(v, cfg, rank % cfg.sp, rank // cfg.sp) for k, v in oracle.items()}


def predicted(cfg: AttnConfig, variant: str, r: int) -> list[tuple[str, int, int]]:
    """(op, bytes sent, bytes received) of SP-group member ``r``, one attention fwd + bwd."""
    P = cfg.sp
    if P == 1:
        return []
    e = torch.empty((), dtype=DTYPES[cfg.dtype]).element_size()
    b, n, d = cfg.batch // cfg.dp, cfg.seq // P, cfg.head_dim
    if variant == "ring":
        kv = 2 * b * n * cfg.kv * d
        return ([("isend", kv * e, 0), ("irecv", 0, kv * e)]) * (3 * (P - 1))
    if variant == "naive":
        kv = b * n * cfg.kv * d
        return [("all_gather", *booked("all_gather", P, r, kv, e))] * 2 + \
            [("reduce_scatter", *booked("reduce_scatter", P, r, P * kv, e))] * 2
    calls = []
    for ranges in (head_ranges(cfg.heads, P), *[kv_ranges(cfg.heads, cfg.kv, P)] * 2):
        m = [b * n * (z - a) * d for a, z in ranges]
        s2h = booked("all_to_all", P, r, 0, e, in_splits=m, out_splits=[m[r]] * P)
        calls += [("all_to_all", *s2h), ("all_to_all", *reversed(s2h))]  # and its mirror
    m = [b * n * (z - a) * d for a, z in head_ranges(cfg.heads, P)]
    h2s = booked("all_to_all", P, r, 0, e, in_splits=[m[r]] * P, out_splits=m)
    return calls + [("all_to_all", *h2s), ("all_to_all", *reversed(h2s))]


# -- Ulysses with ZeRO-3 --------------------------------------------------------------------------
def _zero3_data(cfg: AttnConfig, seed: int):
    g = torch.Generator().manual_seed(seed + 1)
    H, K, d = cfg.heads, cfg.kv, cfg.head_dim
    hm = H * d
    numel = 2 * hm * hm + 2 * K * d * hm
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    return r(cfg.batch, cfg.seq, hm), r(numel) / hm ** 0.5, r(cfg.batch, cfg.seq, hm), numel


def _layer(x, w, cfg: AttnConfig, attention):
    """x [b, n, H d] -> projections -> attention -> output projection [b, n, H d]."""
    H, K, d = cfg.heads, cfg.kv, cfg.head_dim
    hm, b, n = H * d, x.shape[0], x.shape[1]
    wq, wk, wv, wo = w.split([hm * hm, K * d * hm, K * d * hm, hm * hm])
    q = (x @ wq.view(hm, hm).T).view(b, n, H, d)
    k, v = ((x @ t.view(K * d, hm).T).view(b, n, K, d) for t in (wk, wv))
    return attention(q, k, v).reshape(b, n, hm) @ wo.view(hm, hm).T


def run_zero3(ctx, cfg: AttnConfig, seed: int) -> dict:
    """Ulysses + ZeRO-3: the layer's projection weights are sharded over the whole world and
    all-gathered just before the layer; their gradient is reduce-scattered back in backward."""
    cfg.validate(ctx.size, ulysses=True)
    grid = ctx.grid(f"dp={cfg.dp},sp={cfg.sp}")
    sp, dp, comm = grid["sp"], grid["dp"], ctx.comm()
    x, w, dy, numel = _zero3_data(cfg, seed)
    W = ctx.size
    c = -(-numel // W)
    chunk = torch.zeros(c * W, dtype=torch.float64)
    chunk[:numel] = w
    chunk = chunk[ctx.rank * c:(ctx.rank + 1) * c].clone().requires_grad_()
    xl = local_tokens(x, cfg, sp.index, dp.index).requires_grad_()
    with ctx.ledger.capture() as cap:
        full = gathered(chunk, numel, comm, ctx.world)
        y = _layer(xl, full, cfg, lambda q, k, v: ulysses_attention(q, k, v, cfg, comm, sp))
        y.backward(local_tokens(dy, cfg, sp.index, dp.index))
    return {"y": y.detach(), "dx": xl.grad, "dchunk": chunk.grad, "ledger": ledger_rows(cap.entries),
            "sp": sp.ranks, "world": ctx.world.ranks}


def oracle_zero3(cfg: AttnConfig, seed: int) -> dict[str, torch.Tensor]:
    x, w, dy, numel = _zero3_data(cfg, seed)
    x, w = x.requires_grad_(), w.requires_grad_()
    pos = torch.arange(cfg.seq)
    idx = gqa_index(range(cfg.heads), cfg.heads, cfg.kv)
    y = _layer(x, w, cfg, lambda q, k, v: attend(q, k, v, idx, pos, pos, cfg.causal))
    y.backward(dy)
    return {"y": y.detach(), "dx": x.grad, "dw": w.grad}
