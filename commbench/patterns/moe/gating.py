"""GShard top-2 gating (Lepikhin et al. 2020, arXiv:2006.16668, Algorithm 1) with capacity.

For the T tokens of one group, x [T, M] and gate weights [M, E]:

* gates = softmax(x W_g) [T, E]; the first expert is the argmax, the second (top_k = 2) the
  argmax of the others.
* Random routing: the second expert is kept only when u < 2 g2 / (g1 + g2), u uniform per token
  (GShard §2.2). u is drawn from the seed and the token's global index, never from the rank, so
  every TP rank holding the same tokens keeps the same ones.
* Capacity C: :func:`commbench.patterns.moe.configs.capacity` (the largest token count of the
  EP group, so every member's (E, C, M) buffer has the same shape).
* Positions: first choices fill each expert's buffer in token order, second choices after all
  first choices (GShard). A choice whose position is >= C is dropped; a buffer not full is zero
  padding. A token may lose both choices: its output is zero.
* Weights: g1, g2 renormalized over the choices that survived (DeepSpeed ``top2gating``); with
  top_k = 1 the weight is the gate probability itself.
* Auxiliary loss l_aux = E * sum_e mean_t(gates[:, e]) * mean_t(first choice == e), before drops;
  0 for a group without tokens.

Returns ``combine_weights`` [T, E, C], ``dispatch_mask`` [T, E, C] (bool) and ``l_aux``.
:func:`loop_gating` is the same algorithm written token by token, as Algorithm 1 reads: the
oracle of the vectorized one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from commbench.patterns.moe.configs import MoEConfig

__all__ = ["GShardGate", "GateParts", "gate_logits", "gshard_gating", "loop_gating", "positions",
           "positions_without_offset", "uniforms"]


def gate_logits(cfg: MoEConfig, seed: int) -> torch.Tensor:
    """Seeded gate logits [N, E] of every token, float64 on the CPU (the moe_gating pattern)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(sum(cfg.tokens), cfg.experts, generator=g, dtype=torch.float64)


def uniforms(cfg: MoEConfig, seed: int, group: int, rank: int = 0) -> torch.Tensor:
    """The random-routing draws of data group ``group``'s tokens (by global token index, so the
    same on every rank that holds them; ``rank`` takes no part), float64 on the CPU."""
    u = torch.rand(sum(cfg.tokens), generator=torch.Generator().manual_seed(seed + 7),
                   dtype=torch.float64, device="cpu")
    start = sum(cfg.tokens[:group])
    return u[start:start + cfg.tokens[group]]


def positions(mask: torch.Tensor, before: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Buffer positions of one round of choices [T, E], after the ``before`` [E] slots taken by
    earlier rounds (all of them, dropped or not, as in GShard); and the new ``before``."""
    return torch.cumsum(mask, 0) - 1 + before, before + mask.sum(0)


class GShardGate(NamedTuple):
    """What the gate returns for one group's tokens."""

    combine: torch.Tensor   # [T, E, C], differentiable
    dispatch: torch.Tensor  # [T, E, C] bool
    l_aux: torch.Tensor     # scalar


def gshard_gating(logits: torch.Tensor, cfg: MoEConfig, cap: int, u: torch.Tensor,
                  positions=positions) -> GShardGate:
    """logits [T, E] -> combine weights, dispatch mask and auxiliary loss (module docstring).
    ``positions`` places one round of choices in the buffers after the earlier rounds."""
    T, E = logits.shape
    gates = logits.softmax(-1)
    idx1 = gates.argmax(-1)
    mask1 = F.one_hot(idx1, E).to(torch.int64)
    l_aux = (gates.mean(0) * mask1.to(gates.dtype).mean(0)).sum() * E if T else gates.sum()
    masks = [mask1]
    if cfg.top_k == 2:
        idx2 = gates.masked_fill(mask1.bool(), float("-inf")).argmax(-1)
        mask2 = F.one_hot(idx2, E).to(torch.int64)
        if cfg.random_routing:
            g1, g2 = gates.gather(1, idx1[:, None])[:, 0], gates.gather(1, idx2[:, None])[:, 0]
            keep = (u.to(gates.device, gates.dtype) < 2 * g2 / (g1 + g2)).detach()
            mask2 = mask2 * keep[:, None].to(torch.int64)
        masks.append(mask2)
    combine = gates.new_zeros((T, E, cap))
    dispatch = torch.zeros((T, E, cap), dtype=torch.bool, device=logits.device)
    before = torch.zeros(E, dtype=torch.int64, device=logits.device)
    kept, locs = [], []
    for mask in masks:
        loc, before = positions(mask, before)
        mask = mask * (loc < cap)
        kept.append(mask)
        locs.append((loc * mask).sum(1))
    weights = [(gates * m).sum(1) for m in kept]
    if cfg.top_k == 2:
        den = (weights[0] + weights[1]).clamp_min(torch.finfo(gates.dtype).eps)
        weights = [w / den for w in weights]
    for m, loc, w in zip(kept, locs, weights, strict=True):
        slot = F.one_hot(loc, cap).to(torch.bool) & m.bool().any(1)[:, None]
        sel = m.bool()[:, :, None] & slot[:, None, :]
        dispatch |= sel
        combine = combine + w[:, None, None] * sel.to(gates.dtype)
    return GShardGate(combine, dispatch, l_aux)


def loop_gating(logits: torch.Tensor, cfg: MoEConfig, cap: int, u: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """GShard top-k gating written token by token, as the paper's Algorithm 1 reads:
    combine weights [T, E, C] (float64) and l_aux."""
    T, E = logits.shape
    gates = logits.double().softmax(-1).tolist()
    combine = torch.zeros(T, E, cap, dtype=torch.float64)
    firsts = [max(range(E), key=lambda e: g[e]) for g in gates]
    seconds = [max((e for e in range(E) if e != f), key=lambda e: g[e]) if cfg.top_k == 2 else None
               for g, f in zip(gates, firsts, strict=True)]
    filled = [0] * E
    choices: list[list[tuple[int, int]]] = [[] for _ in range(T)]
    for t, e in enumerate(firsts):
        choices[t].append((e, filled[e]))
        filled[e] += 1
    for t, e in enumerate(seconds):
        if e is None:
            continue
        g1, g2 = gates[t][firsts[t]], gates[t][e]
        if cfg.random_routing and not float(u[t]) < 2 * g2 / (g1 + g2):
            continue
        choices[t].append((e, filled[e]))
        filled[e] += 1
    for t in range(T):
        kept = [(e, c) for e, c in choices[t] if c < cap]
        w = [gates[t][e] for e, _ in kept]
        if cfg.top_k == 2:
            w = [x / max(sum(w), torch.finfo(torch.float64).eps) for x in w]
        for (e, c), x in zip(kept, w, strict=True):
            combine[t, e, c] = x
    frac = [sum(1 for f in firsts if f == e) / T for e in range(E)] if T else [0.0] * E
    mean = [sum(g[e] for g in gates) / T for e in range(E)] if T else [0.0] * E
    return combine, torch.tensor(E * sum(m * f for m, f in zip(mean, frac, strict=True)),
                                 dtype=torch.float64)



@dataclass(frozen=True)
class GateParts:
    """The swappable steps of the gate alone (the moe_gating pattern)."""

    positions: Callable = positions  # buffer slots of one round of choices
    uniforms: Callable = uniforms    # the random-routing draws of a group's tokens


# -- broken parts: each a bug class the contract must catch ----------------------------------
def positions_without_offset(mask, before):
    """Second choices placed from slot 0 instead of after the first choices (GShard queues
    them after every first choice)."""
    return torch.cumsum(mask, 0) - 1, before
