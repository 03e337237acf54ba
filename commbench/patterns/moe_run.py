"""The MoE layer as a pattern: data, the single-process oracle, the SPMD entry point and the
bytes each rank must move, over a ``dp x ep x tp`` grid (TP neighbours adjacent).

Per step, with L = E/P local experts, C' = C/t, e bytes per element:
    EP group   all-reduce MAX of the token count (1 int64: the capacity needs the largest);
               capacity: 2 all-to-alls of E C' M elements forward (dispatch, combine), 2 backward;
               variable: an all-to-all of P counts, then tokens x (M + L) and rows x M, by routing;
               naive: all-gather of T_max (M + E), reduce-scatter of P T_max M, mirrored backward.
    TP group   all-gather of E C' M after each all-to-all and in backward for each C split (4),
               one all-reduce of P C M per local expert forward (g) and backward (f), and the
               routing fingerprint (2 int64) when ``check_routing``.
    dp x ep    all-reduce of the gate's gradient (M E): dense parameters, every data rank.
    dp         all-reduce of the local experts' gradients: the ranks holding the same experts
               (the notes' ep_dp_group).
"""

from __future__ import annotations

import torch

from commbench.patterns._steps import ledger_rows, timed
from commbench.patterns.moe import expert_ffn, moe_capacity, moe_naive, moe_variable
from commbench.patterns.moe_gating import MoEConfig, capacity, gshard_gating, uniforms
from commbench.wire.volume import booked

__all__ = ["expected", "oracle_moe", "predicted", "run_moe"]
DTYPES = {"float64": torch.float64, "float32": torch.float32}


def _data(cfg: MoEConfig, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    M, F, E, N = cfg.model, cfg.ffn, cfg.experts, sum(cfg.tokens)
    return {"wg": r(M, E), "w1": r(E, M, F) / M ** 0.5, "w2": r(E, F, M) / F ** 0.5,
            "x": r(N, M), "dy": r(N, M)}


def _span(cfg: MoEConfig, g: int) -> slice:
    start = sum(cfg.tokens[:g])
    return slice(start, start + cfg.tokens[g])


def _cap(cfg: MoEConfig, dp_index: int) -> int:
    P = cfg.ep
    return capacity(cfg, max(cfg.tokens[dp_index * P:(dp_index + 1) * P]))


def oracle_moe(cfg: MoEConfig, seed: int) -> dict:
    """Every group's gating and every expert in one process, float64."""
    d = _data(cfg, seed)
    x, wg, w1, w2 = (d[k].clone().requires_grad_() for k in ("x", "wg", "w1", "w2"))
    ys, kept, aux = [], [], []
    for g in range(len(cfg.tokens)):
        xg = x[_span(cfg, g)]
        gate = gshard_gating(xg @ wg, cfg, _cap(cfg, g // cfg.ep), uniforms(cfg, seed, g))
        w = gate.combine.sum(2)
        ys.append(sum(w[:, e, None] * expert_ffn(xg, w1[e], w2[e]) for e in range(cfg.experts)))
        kept.append(gate.dispatch.any(2))
        aux.append(gate.l_aux)
    y = torch.cat(ys)
    torch.autograd.backward([y, torch.stack(aux).sum()],
                            [d["dy"], torch.tensor(cfg.aux_weight, dtype=torch.float64)])
    return {"y": y.detach(), "dx": x.grad, "dwg": wg.grad, "dw1": w1.grad, "dw2": w2.grad,
            "kept": kept, "l_aux": [a.detach() for a in aux]}


def _route(cfg, seed, x, wg, cap, group_index, tp, comm):
    gate = gshard_gating(x @ wg, cfg, cap, uniforms(cfg, seed, group_index))
    if cfg.check_routing and tp.size > 1:
        _check_same_routing(gate.dispatch, comm, tp)
    return gate


def _check_same_routing(dispatch, comm, tp) -> None:
    """The notes' rule: the MoE input under TP is the same on every TP rank and must not drop
    tokens independently on each; a fingerprint of the kept choices must agree across TP."""
    where = torch.nonzero(dispatch).to(torch.int64)
    mark = torch.tensor([len(where), int((where * torch.tensor([7919, 104729, 1])).sum())])
    seen = comm.all_gather(mark, tp).view(tp.size, 2)
    if not bool((seen == seen[0]).all()):
        raise ValueError(f"MoE input under TP: ranks {list(tp.ranks)} routed the same tokens "
                         f"differently (kept choices {seen[:, 0].tolist()}); tokens must not be "
                         "dropped independently on each TP rank")


def run_moe(ctx, cfg: MoEConfig, seed: int, variant: str = "capacity", iters: int = 0,
            warmup: int = 0) -> dict:
    """One MoE layer forward + backward + gradient reduction on every rank."""
    cfg.validate(ctx.size, variant)
    grid = ctx.grid(f"dp={cfg.dp},ep={cfg.ep},tp={cfg.tp}", combos=(("dp", "ep"),))
    ep, tp, dp, data = grid["ep"], grid["tp"], grid["dp"], grid["dp_ep"]
    comm = ctx.comm()
    dt = DTYPES[cfg.dtype]
    d = {k: v.to(dt) for k, v in _data(cfg, seed).items()}
    L, Ft = cfg.experts // cfg.ep, cfg.ffn // cfg.tp
    mine = slice(ep.index * L, (ep.index + 1) * L)
    fs = slice(tp.index * Ft, (tp.index + 1) * Ft)
    g = dp.index * cfg.ep + ep.index
    x = d["x"][_span(cfg, g)].clone().requires_grad_()
    wg = d["wg"].clone().requires_grad_()
    w1 = d["w1"][mine, :, fs].clone().requires_grad_()
    w2 = d["w2"][mine, fs, :].clone().requires_grad_()
    dy = d["dy"][_span(cfg, g)]

    def step():
        for t in (x, wg, w1, w2):
            t.grad = None
        t_max = int(comm.all_reduce(torch.tensor([x.shape[0]]), ep, op="max")) \
            if ep.size > 1 else x.shape[0]
        gate = _route(cfg, seed, x, wg, capacity(cfg, t_max), g, tp, comm)
        if variant == "capacity":
            y = moe_capacity(x, gate.combine, gate.dispatch, w1, w2, comm, ep, tp)
        elif variant == "variable":
            y = moe_variable(x, gate.combine, w1, w2, comm, ep)
        else:
            y = moe_naive(x, gate.combine, w1, w2, comm, ep, t_max)
        torch.autograd.backward([y, gate.l_aux], [dy, torch.tensor(cfg.aux_weight, dtype=dt)])
        _reduce_grads(comm, wg, (w1, w2), data, dp)
        return y, gate

    with ctx.ledger.capture() as cap:
        y, gate = step()
    times = timed(ctx, step, iters, warmup)
    return {"y": y.detach(), "dx": x.grad, "dwg": wg.grad, "dw1": w1.grad, "dw2": w2.grad,
            "kept": gate.dispatch.any(2), "l_aux": gate.l_aux.detach(),
            "ledger": ledger_rows(cap.entries),
            "groups": {"ep": ep.ranks, "tp": tp.ranks, "dp": dp.ranks, "dp_ep": data.ranks},
            "times": times}


def _reduce_grads(comm, wg, experts, data, dp) -> None:
    """Dense gradients over every data rank; expert gradients over the ranks holding the same
    experts (expert-data-parallel)."""
    if data.size > 1:
        wg.grad = comm.all_reduce(wg.grad, data)
    if dp.size > 1:
        flat = comm.all_reduce(torch.cat([p.grad.flatten() for p in experts]), dp)
        for p, part in zip(experts, flat.split([p.numel() for p in experts]), strict=True):
            p.grad = part.view_as(p)


def expected(oracle: dict, cfg: MoEConfig, rank: int) -> dict:
    """The oracle's values rank ``rank`` must hold."""
    t, rest = rank % cfg.tp, rank // cfg.tp
    e, dpi = rest % cfg.ep, rest // cfg.ep
    L, Ft = cfg.experts // cfg.ep, cfg.ffn // cfg.tp
    g = dpi * cfg.ep + e
    mine, fs = slice(e * L, (e + 1) * L), slice(t * Ft, (t + 1) * Ft)
    return {"y": oracle["y"][_span(cfg, g)], "dx": oracle["dx"][_span(cfg, g)],
            "dwg": oracle["dwg"], "dw1": oracle["dw1"][mine, :, fs],
            "dw2": oracle["dw2"][mine, fs, :], "kept": oracle["kept"][g], "l_aux": oracle["l_aux"][g]}


def predicted(cfg: MoEConfig, variant: str, rank: int, kept: list | None = None) -> list[tuple]:
    """(op, group axis, bytes sent, bytes received) for ``rank``, one step, as a multiset.
    The variable layout's volume depends on routing: pass the oracle's ``kept`` masks."""
    P, T, D = cfg.ep, cfg.tp, cfg.dp
    t, rest = rank % T, rank // T
    r, dpi = rest % P, rest // P
    e = torch.empty((), dtype=DTYPES[cfg.dtype]).element_size()
    L, M, E = cfg.experts // P, cfg.model, cfg.experts
    C = _cap(cfg, dpi)
    toks = cfg.tokens[dpi * P:(dpi + 1) * P]
    out = []
    if P > 1:
        out.append(("all_reduce", "ep", *booked("all_reduce", P, r, 1, 8)))
        if variant == "capacity":
            out += [("all_to_all", "ep", *booked("all_to_all", P, r, 0, e, in_splits=[L] * P,
                                                 out_splits=[L] * P, row=C // T * M))] * 4
        elif variant == "naive":
            tm = max(toks)
            out += [("all_gather", "ep", *booked("all_gather", P, r, tm * (M + E), e)),
                    ("reduce_scatter", "ep", *booked("reduce_scatter", P, r, P * tm * (M + E), e)),
                    ("reduce_scatter", "ep", *booked("reduce_scatter", P, r, P * tm * M, e)),
                    ("all_gather", "ep", *booked("all_gather", P, r, tm * M, e))]
        else:
            groups = kept[dpi * P:(dpi + 1) * P]
            to = [[int(k.view(len(k), P, L).any(2)[:, j].sum()) for j in range(P)] for k in groups]
            sends, gets = to[r], [to[i][r] for i in range(P)]
            out.append(("all_to_all", "ep", *booked("all_to_all", P, r, 0, 8, in_splits=[1] * P,
                                                    out_splits=[1] * P)))
            for row, a, b in ((M + L, sends, gets), (M, gets, sends)):
                s, rc = booked("all_to_all", P, r, 0, e, in_splits=a, out_splits=b, row=row)
                out += [("all_to_all", "ep", s, rc), ("all_to_all", "ep", rc, s)]
    if T > 1:
        ag = booked("all_gather", T, t, E * (C // T) * M, e)
        out += [("all_gather", "tp", *ag)] * 4 + \
            [("all_reduce", "tp", *booked("all_reduce", T, t, P * C * M, e))] * (2 * L)
        if cfg.check_routing:
            out.append(("all_gather", "tp", *booked("all_gather", T, t, 2, 8)))
    if D * P > 1:
        out.append(("all_reduce", "dp_ep", *booked("all_reduce", D * P, dpi * P + r, M * E, e)))
    if D > 1:
        out.append(("all_reduce", "dp", *booked("all_reduce", D, dpi, 2 * L * M * (cfg.ffn // T),
                                                 e)))
    return out
