"""The MoE layer's operators: data, the single-process oracle, one step on a rank, its parts and
the broken ones, over a ``dp x ep x tp`` grid (TP neighbours adjacent). The calls a step makes:
:func:`commbench.patterns.moe.moe.moe_calls`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from commbench.patterns.moe.configs import MoEConfig, capacity, group_capacity, span
from commbench.patterns.moe.dispatch import a2a, expert_ffn, moe_capacity, moe_naive, moe_variable
from commbench.patterns.moe.gating import gshard_gating, positions, uniforms
from commbench.wire.dtypes import DTYPES

__all__ = ["MoEParts", "data", "dropped_pass_through", "experts_on_the_dense_group", "oracle_moe",
           "reduce_grads", "rolled_dispatch", "routing", "step_moe", "uniforms_per_rank"]


def data(cfg: MoEConfig, seed: int) -> dict[str, torch.Tensor]:
    """Gate wg [M, E], experts w1 [E, M, F], w2 [E, F, M], every token x and its gradient dy
    [N, M]: float64 on the CPU."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    M, F, E, N = cfg.model, cfg.ffn, cfg.experts, sum(cfg.tokens)
    return {"wg": r(M, E), "w1": r(E, M, F) / M ** 0.5, "w2": r(E, F, M) / F ** 0.5,
            "x": r(N, M), "dy": r(N, M)}


def oracle_moe(cfg: MoEConfig, seed: int) -> dict:
    """Every group's gating and every expert in one process, float64."""
    d = data(cfg, seed)
    x, wg, w1, w2 = (d[k].clone().requires_grad_() for k in ("x", "wg", "w1", "w2"))
    ys, kept, aux = [], [], []
    for g in range(len(cfg.tokens)):
        xg = x[span(cfg, g)]
        gate = gshard_gating(xg @ wg, cfg, group_capacity(cfg, g // cfg.ep), uniforms(cfg, seed, g))
        w = gate.combine.sum(2)
        ys.append(sum(w[:, e, None] * expert_ffn(xg, w1[e], w2[e]) for e in range(cfg.experts)))
        kept.append(gate.dispatch.any(2))
        aux.append(gate.l_aux)
    y = torch.cat(ys)
    torch.autograd.backward([y, torch.stack(aux).sum()],
                            [d["dy"], torch.tensor(cfg.aux_weight, dtype=torch.float64)])
    return {"y": y.detach(), "dx": x.grad, "dwg": wg.grad, "dw1": w1.grad, "dw2": w2.grad,
            "kept": kept, "l_aux": [a.detach() for a in aux]}


@functools.lru_cache(maxsize=16)
def routing(cfg: MoEConfig, seed: int) -> list[torch.Tensor]:
    """Each data group's kept choices [T, E], gated in the run's dtype as the ranks gate them
    (kept for the next rank's prediction: every rank of a run asks for the same)."""
    d = data(cfg, seed)
    dt = DTYPES[cfg.dtype]
    return [gshard_gating(d["x"][span(cfg, g)].to(dt) @ d["wg"].to(dt), cfg,
                          group_capacity(cfg, g // cfg.ep), uniforms(cfg, seed, g)).dispatch.any(2)
            for g in range(len(cfg.tokens))]


def check_same_routing(dispatch, comm, tp) -> None:
    """The notes' rule: the MoE input under TP is the same on every TP rank and must not drop
    tokens independently on each; a fingerprint of the kept choices must agree across TP."""
    where = torch.nonzero(dispatch).to(torch.int64)
    mix = torch.tensor([7919, 104729, 1], device=dispatch.device)
    mark = torch.stack([where.new_tensor(len(where)), (where * mix).sum()])
    seen = comm.all_gather(mark, tp).view(tp.size, 2)
    if not bool((seen == seen[0]).all()):
        raise ValueError(f"MoE input under TP: ranks {list(tp.ranks)} routed the same tokens "
                         f"differently (kept choices {seen[:, 0].tolist()}); tokens must not be "
                         "dropped independently on each TP rank")


def reduce_grads(comm, wg, experts, data_group, dp) -> None:
    """Dense gradients over every data rank; expert gradients over the ranks holding the same
    experts (expert-data-parallel)."""
    if data_group.size > 1:
        wg.grad = comm.all_reduce(wg.grad, data_group)
    if dp.size > 1:
        flat = comm.all_reduce(torch.cat([p.grad.flatten() for p in experts]), dp)
        for p, part in zip(experts, flat.split([p.numel() for p in experts]), strict=True):
            p.grad = part.view_as(p)


@dataclass(frozen=True)
class MoEParts:
    """The swappable steps of the MoE layer."""

    a2a: Callable = a2a                  # the all-to-all of dispatch and combine
    positions: Callable = positions      # gating: buffer slots of one round of choices
    uniforms: Callable = uniforms        # gating: the random-routing draws of a group's tokens
    capacity: Callable = moe_capacity
    variable: Callable = moe_variable
    naive: Callable = moe_naive
    reduce_grads: Callable = reduce_grads


def step_moe(ctx, cfg: MoEConfig, local: dict, variant: str, groups: dict, parts: MoEParts,
             seed: int) -> dict:
    """One MoE layer forward + backward + gradient reduction on this rank."""
    ep, tp, dp, data_group = groups["ep"], groups["tp"], groups["dp"], groups["dp_ep"]
    comm = ctx.comm()
    x, wg, w1, w2 = (local[k].detach().requires_grad_() for k in ("x", "wg", "w1", "w2"))
    t_max = int(comm.all_reduce(torch.tensor([x.shape[0]], device=x.device), ep, op="max")) \
        if ep.size > 1 else x.shape[0]
    u = parts.uniforms(cfg, seed, local["group"], ctx.rank)
    gate = gshard_gating(x @ wg, cfg, capacity(cfg, t_max), u, parts.positions)
    if cfg.check_routing and tp.size > 1:
        check_same_routing(gate.dispatch, comm, tp)
    if variant == "capacity":
        y = parts.capacity(x, gate.combine, gate.dispatch, w1, w2, comm, ep, tp, parts)
    elif variant == "variable":
        y = parts.variable(x, gate.combine, w1, w2, comm, ep, parts)
    else:
        y = parts.naive(x, gate.combine, w1, w2, comm, ep, t_max)
    aux = torch.tensor(cfg.aux_weight, dtype=x.dtype, device=x.device)
    torch.autograd.backward([y, gate.l_aux], [local["dy"], aux])
    parts.reduce_grads(comm, wg, (w1, w2), data_group, dp)
    return {"y": y.detach(), "dx": x.grad, "dwg": wg.grad, "dw1": w1.grad, "dw2": w2.grad,
            "kept": gate.dispatch.any(2), "l_aux": gate.l_aux.detach()}


# -- broken parts: each a bug class the contract must catch ----------------------------------
def rolled_dispatch(x, comm, group, in_splits=None, out_splits=None):
    """The capacity buffer's expert blocks rotated by one rank before the dispatch."""
    if x.dim() == 3 and in_splits is None and group.size > 1 and x.requires_grad:
        x = x.roll(x.shape[0] // group.size, 0)
    return a2a(x, comm, group, in_splits, out_splits)


def dropped_pass_through(x, combine, dispatch, *args):
    """A token that lost every choice comes back as its input instead of zero."""
    y = moe_capacity(x, combine, dispatch, *args)
    return y + x * (~dispatch.any(2).any(1)).to(x.dtype)[:, None]


def uniforms_per_rank(cfg, seed: int, group: int, rank: int = 0) -> torch.Tensor:
    """Each rank draws its own random routing: TP ranks holding the same tokens drop different
    ones."""
    return uniforms(cfg, seed + 1000 * rank, group)


def experts_on_the_dense_group(comm, wg, experts, data_group, dp) -> None:
    """Expert gradients reduced over every data rank instead of the expert-data-parallel group."""
    if data_group.size > 1:
        wg.grad = comm.all_reduce(wg.grad, data_group)
        flat = comm.all_reduce(torch.cat([p.grad.flatten() for p in experts]), data_group)
        for p, part in zip(experts, flat.split([p.numel() for p in experts]), strict=True):
            p.grad = part.view_as(p)
