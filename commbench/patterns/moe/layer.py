"""The MoE layer: data, the single-process oracle, one step on a rank and the calls it makes, over
a ``dp x ep x tp`` grid (TP neighbours adjacent).

Per step, with L = E/P local experts, C' = C/t, e bytes per element:
    ep     all-reduce MAX of the token count (1 int64: the capacity needs the largest);
           capacity: 2 all-to-alls of E C' M elements forward (dispatch, combine), 2 backward;
           variable: an all-to-all of P counts, then tokens x (M + L) and rows x M, by routing;
           naive: all-gather of T_max (M + E), reduce-scatter of P T_max M, mirrored backward.
    tp     all-gather of E C' M after each all-to-all and in backward for each C split (4),
           one all-reduce of P C M per local expert forward (g) and backward (f), and the
           routing fingerprint (2 int64) when ``check_routing``.
    dp_ep  all-reduce of the gate's gradient (M E): dense parameters, every data rank.
    dp     all-reduce of the local experts' gradients: the ranks holding the same experts
           (the notes' ep_dp_group).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from commbench.patterns.base import Call
from commbench.patterns.moe.dispatch import a2a, expert_ffn, moe_capacity, moe_naive, moe_variable
from commbench.patterns.moe.gating import MoEConfig, capacity, gshard_gating, positions, uniforms
from commbench.wire.dtypes import DTYPES
from commbench.wire.ops import booked

__all__ = ["MoEParts", "data", "moe_calls", "oracle_moe", "reduce_grads", "routing", "span",
           "step_moe"]


def data(cfg: MoEConfig, seed: int) -> dict[str, torch.Tensor]:
    """Gate wg [M, E], experts w1 [E, M, F], w2 [E, F, M], every token x and its gradient dy
    [N, M]: float64 on the CPU."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    M, F, E, N = cfg.model, cfg.ffn, cfg.experts, sum(cfg.tokens)
    return {"wg": r(M, E), "w1": r(E, M, F) / M ** 0.5, "w2": r(E, F, M) / F ** 0.5,
            "x": r(N, M), "dy": r(N, M)}


def span(cfg: MoEConfig, g: int) -> slice:
    """The tokens of data group ``g`` among all of them."""
    start = sum(cfg.tokens[:g])
    return slice(start, start + cfg.tokens[g])


def group_capacity(cfg: MoEConfig, dp_index: int) -> int:
    P = cfg.ep
    return capacity(cfg, max(cfg.tokens[dp_index * P:(dp_index + 1) * P]))


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


def moe_calls(cfg: MoEConfig, variant: str, rank: int, kept: list | None = None) -> list[Call]:
    """The calls ``rank`` makes in one step (module docstring). The variable layout's volume
    depends on routing: give each data group's kept choices (:func:`routing`)."""
    P, T, D = cfg.ep, cfg.tp, cfg.dp
    t, rest = rank % T, rank // T
    r, dpi = rest % P, rest // P
    e = DTYPES[cfg.dtype].itemsize
    L, M, E = cfg.experts // P, cfg.model, cfg.experts
    C = group_capacity(cfg, dpi)
    toks = cfg.tokens[dpi * P:(dpi + 1) * P]

    def call(op: str, axis: str, n: int, i: int, count: int, size: int, **kw) -> Call:
        sent, recv = booked(op, n, i, count, size, **kw)
        return Call(op, axis, count * size, sent, recv)

    out = []
    if P > 1:
        out.append(call("all_reduce", "ep", P, r, 1, 8))
        if variant == "capacity":
            row = C // T * M
            out += [call("all_to_all", "ep", P, r, E * row, e, in_splits=[L] * P,
                         out_splits=[L] * P, row=row)] * 4
        elif variant == "naive":
            tm = max(toks)
            out += [call("all_gather", "ep", P, r, tm * (M + E), e),
                    call("reduce_scatter", "ep", P, r, P * tm * (M + E), e),
                    call("reduce_scatter", "ep", P, r, P * tm * M, e),
                    call("all_gather", "ep", P, r, tm * M, e)]
        else:
            if kept is None:
                raise ValueError("the variable layout's calls depend on the routing: give a seed")
            groups = kept[dpi * P:(dpi + 1) * P]
            to = [[int(k.view(len(k), P, L).any(2)[:, j].sum()) for j in range(P)] for k in groups]
            sends, gets = to[r], [to[i][r] for i in range(P)]
            out.append(call("all_to_all", "ep", P, r, P, 8, in_splits=[1] * P, out_splits=[1] * P))
            for row, a, b in ((M + L, sends, gets), (M, gets, sends)):
                out += [call("all_to_all", "ep", P, r, sum(a) * row, e, in_splits=a, out_splits=b,
                             row=row),
                        call("all_to_all", "ep", P, r, sum(b) * row, e, in_splits=b, out_splits=a,
                             row=row)]
    if T > 1:
        out += [call("all_gather", "tp", T, t, E * (C // T) * M, e)] * 4 + \
            [call("all_reduce", "tp", T, t, P * C * M, e)] * (2 * L)
        if cfg.check_routing:
            out.append(call("all_gather", "tp", T, t, 2, 8))
    if D * P > 1:
        out.append(call("all_reduce", "dp_ep", D * P, dpi * P + r, M * E, e))
    if D > 1:
        out.append(call("all_reduce", "dp", D, dpi, 2 * L * M * (cfg.ffn // T), e))
    return out
