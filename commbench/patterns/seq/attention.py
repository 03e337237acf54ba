"""Attention shared by the sequence-parallel patterns: seeded inputs, the oracle, the sequence
layouts (the config: seq/configs.py), and the naive all-gather of K and V that Ulysses and ring
attention are held to.

Shapes: q [b, s, H, d], k and v [b, s, H_kv, d] (grouped-query attention when H_kv < H: query
head h reads KV head h // (H / H_kv)). P is the Ulysses or context-parallel degree. Each rank holds
the tokens at ``positions(cfg, r)``; masks are built from global positions, so one attention
function serves the whole sequence, a contiguous shard and the load-balanced (zigzag) shard.
"""

from __future__ import annotations

import math

import torch

from commbench.patterns.seq.configs import AttnConfig
from commbench.runtime.group import Group
from commbench.wire.comm import Comm

__all__ = ["attend", "attention_inputs", "gqa_index", "local_tokens",
           "naive_attention", "oracle_attention", "positions"]


def positions(cfg: AttnConfig, r: int, device) -> torch.Tensor:
    """Global token positions rank ``r`` of the SP group holds, in its local order."""
    P, s = cfg.sp, cfg.seq
    if cfg.layout == "zigzag":
        c = s // (2 * P)
        return torch.cat([torch.arange(r * c, (r + 1) * c, device=device),
                          torch.arange((2 * P - 1 - r) * c, (2 * P - r) * c, device=device)])
    return torch.arange(r * s // P, (r + 1) * s // P, device=device)


def local_tokens(t: torch.Tensor, cfg: AttnConfig, sp_index: int, dp_index: int) -> torch.Tensor:
    """This rank's share: its DP slice of the batch, its SP positions of the sequence."""
    b = cfg.batch // cfg.dp
    return t[dp_index * b:(dp_index + 1) * b, positions(cfg, sp_index, t.device)].contiguous()


def attention_inputs(cfg: AttnConfig, seed: int) -> dict[str, torch.Tensor]:
    """Seeded float64 q, k, v and the upstream gradient dy, whole, on the CPU."""
    g = torch.Generator().manual_seed(seed)
    b, s, H, K, d = cfg.batch, cfg.seq, cfg.heads, cfg.kv, cfg.head_dim
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    return {"q": r(b, s, H, d), "k": r(b, s, K, d), "v": r(b, s, K, d), "dy": r(b, s, H, d)}


def gqa_index(heads: range, heads_total: int, kv_total: int, kv_first: int = 0) -> list[int]:
    """For each query head in ``heads``, the index of its KV head among those held locally
    (which start at global KV head ``kv_first``)."""
    group = heads_total // kv_total
    return [h // group - kv_first for h in heads]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_index: list[int],
           pos_q: torch.Tensor, pos_k: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v by autograd: q [b, sq, Hq, d], k/v [b, sk, Hk, d] -> [b, sq, Hq, d].

    Query head i reads KV head ``kv_index[i]``; with ``causal``, query at position p sees keys at
    positions <= p. Every query must see at least one key (true whenever it sees itself)."""
    idx = torch.tensor(kv_index, dtype=torch.long, device=q.device)
    ke, ve = k.index_select(2, idx), v.index_select(2, idx)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, ke) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(pos_k[None, :] > pos_q[:, None], float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), ve)


def oracle_attention(cfg: AttnConfig, seed: int, dtype=torch.float64,
                     nudge=None) -> dict[str, torch.Tensor]:
    """The single-process truth: y, dq, dk, dv of the whole sequence. ``nudge``: applied to q,
    k, v and dy once cast (a reference run moved by an ulp, :mod:`commbench.patterns.judge`)."""
    d = attention_inputs(cfg, seed)
    cast = (lambda t: nudge(t.to(dtype))) if nudge else (lambda t: t.to(dtype))
    q, k, v = (cast(d[n]).requires_grad_() for n in ("q", "k", "v"))
    pos = torch.arange(cfg.seq)
    y = attend(q, k, v, gqa_index(range(cfg.heads), cfg.heads, cfg.kv), pos, pos, cfg.causal)
    y.backward(cast(d["dy"]))
    return {"y": y.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: AttnConfig,
                    comm: Comm, group: Group, parts) -> torch.Tensor:
    """The naive counterpart of Ulysses and ring attention: all-gather K and V along the
    sequence (``parts.gather_kv``), attend with the local queries. q [b, n, H, d], k/v
    [b, n, H_kv, d] with n = s/P -> [b, n, H, d]; backward reduce-scatters dK and dV."""
    P = group.size
    k_all, v_all = (parts.gather_kv(t, comm, group, dim=1) for t in (k, v))
    pos_k = torch.cat([positions(cfg, r, q.device) for r in range(P)])
    return attend(q, k_all, v_all, parts.kv_index(range(cfg.heads), cfg.heads, cfg.kv),
                  positions(cfg, group.index, q.device), pos_k, cfg.causal)
