"""Expert parallelism as a pattern, in three layouts (capacity, DeepEP-like variable, naive
all-gather) with EP+DP and EP+TP, and the calls each makes (its layer, oracle and broken parts:
moe/moe_comms.py; dispatch and combine: moe/dispatch.py; its gating: moe/gating.py and the
moe_gating pattern, moe/moe_gating.py; the config: moe/configs.py).

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

from commbench.names import ITEMSIZE
from commbench.ops import booked
from commbench.patterns.base import Broken, Call, Pattern, Tolerance, drawn
from commbench.patterns.moe.configs import MoEConfig, group_capacity, span

__all__ = ["ExpertParallel", "moe_calls"]

# (tokens per rank, model, ffn, experts per rank) of the studies
MOE_MODELS = [(256, 64, 256, 2), (1024, 128, 512, 2)]
TOLERANCE = Tolerance(
    "float64 only: the order of the sums differs from the oracle; in float32 a near-tie between "
    "two gates may route a token differently from the float64 oracle, which is not a bug.")


def ep_configs(world_size: int, variant: str):
    """A hypothesis strategy of MoE layers on ``world_size`` ranks for ``variant``."""
    return drawn(_draw, world_size, variant)


def _draw(draw, st, world_size: int, variant: str) -> MoEConfig:
    tp = 1 if variant != "capacity" else draw(st.sampled_from(
        [t for t in (1, 2) if world_size % t == 0]))
    ep = draw(st.sampled_from([e for e in range(1, world_size // tp + 1)
                               if (world_size // tp) % e == 0]))
    dp = world_size // tp // ep
    E = ep * draw(st.integers(1, 2))
    return MoEConfig(
        tokens=tuple(draw(st.lists(st.integers(0, 9), min_size=dp * ep, max_size=dp * ep))),
        model=draw(st.integers(1, 4)), ffn=tp * draw(st.integers(1, 3)), experts=E,
        top_k=draw(st.integers(1, min(2, E))),
        capacity_factor=draw(st.sampled_from([0.1, 0.5, 1.0, 2.0, 4.0])),
        min_capacity=draw(st.integers(1, 2)), random_routing=draw(st.booleans()),
        ep=ep, dp=dp, tp=tp)


def _starved(P: int, ep: int, dp: int, cf: float = 0.5) -> list[MoEConfig]:
    return [MoEConfig(tokens=(9, 4, 0, 7)[:ep * dp], experts=2 * ep, ep=ep, dp=dp,
                      capacity_factor=cf)]


class ExpertParallel(Pattern):
    """Dispatch and combine all-to-alls around the experts (GShard, DeepSpeed-MoE, DeepEP)."""

    name, markers = "moe", ("moe", "ep")
    variants, naive, optimized = ("naive", "capacity", "variable"), "naive", "capacity"
    axes, combos = ("ep", "tp", "dp", "dp_ep"), (("dp", "ep"),)
    Config = MoEConfig
    tolerance = TOLERANCE
    parts_from = "moe.moe_comms:MoEParts"
    dtypes = ("float64",)
    broken = (
        Broken("wrong_permutation", "capacity", {"a2a": "moe.moe_comms:rolled_dispatch"},
               "expert blocks sent to the wrong rank", lambda P: _starved(P, P, 1)),
        Broken("dropped_not_zeroed", "capacity", {"capacity": "moe.moe_comms:dropped_pass_through"},
               "a token that lost every choice returns its input",
               lambda P: _starved(P, P, 1, cf=0.1)),
        Broken("wrong_grad_group", "capacity", {"reduce_grads": "moe.moe_comms:experts_on_the_dense_group"},
               "expert gradients summed over every data rank, not the ranks holding them",
               lambda P: _starved(P, P // 2, 2), (4,)),
        Broken("independent_drops", "capacity", {"uniforms": "moe.moe_comms:uniforms_per_rank"},
               "TP ranks route the same tokens each their own way (routing check off)",
               lambda P: [MoEConfig(tokens=(16,) * (P // 2), experts=4, ep=P // 2, tp=2, ffn=4,
                                    capacity_factor=2.0, check_routing=False)]),
    )

    def grid(self, cfg: MoEConfig) -> str:
        return f"dp={cfg.dp},ep={cfg.ep},tp={cfg.tp}"

    def configs(self, world_size: int, variant: str):
        return ep_configs(world_size, variant)

    def bench_configs(self, world_size: int) -> list[MoEConfig]:
        n = world_size
        grids = [(n, 1, 1)] + ([(n // 2, 2, 1), (n // 2, 1, 2)] if n >= 4 and n % 2 == 0 else [])
        return [MoEConfig(tokens=(T,) * (ep * dp), model=M, ffn=F, experts=per * ep,
                          capacity_factor=cf, ep=ep, dp=dp, tp=tp, dtype="float32")
                for T, M, F, per in MOE_MODELS for ep, dp, tp in grids for cf in (0.5, 2.0)]

    def inputs(self, cfg: MoEConfig, seed: int, device) -> dict:
        # lazy: imports torch
        from commbench.patterns.moe.moe_comms import data

        # lazy: imports torch
        from commbench.wire.dtypes import DTYPES

        dt = DTYPES[cfg.dtype]
        return {**{k: v.to(device=device, dtype=dt) for k, v in data(cfg, seed).items()},
                "seed": seed}

    def shard(self, cfg: MoEConfig, d: dict, groups: dict, variant: str, parts) -> dict:
        ep, tp, dp = groups["ep"], groups["tp"], groups["dp"]
        L, Ft = cfg.experts // cfg.ep, cfg.ffn // cfg.tp
        mine = slice(ep.index * L, (ep.index + 1) * L)
        fs = slice(tp.index * Ft, (tp.index + 1) * Ft)
        g = dp.index * cfg.ep + ep.index
        return {"x": d["x"][span(cfg, g)], "dy": d["dy"][span(cfg, g)], "wg": d["wg"],
                "w1": d["w1"][mine, :, fs].contiguous(), "w2": d["w2"][mine, fs, :].contiguous(),
                "group": g, "seed": d["seed"]}

    def oracle(self, cfg: MoEConfig, seed: int) -> dict:
        # lazy: imports torch
        from commbench.patterns.moe.moe_comms import oracle_moe

        return oracle_moe(cfg, seed)

    def expected(self, oracle: dict, cfg: MoEConfig, rank: int, variant: str) -> dict:
        c = self.coords(cfg, rank)
        t, e, dpi = c["tp"], c["ep"], c["dp"]
        L, Ft = cfg.experts // cfg.ep, cfg.ffn // cfg.tp
        g = dpi * cfg.ep + e
        mine, fs = slice(e * L, (e + 1) * L), slice(t * Ft, (t + 1) * Ft)
        return {"y": oracle["y"][span(cfg, g)], "dx": oracle["dx"][span(cfg, g)],
                "dwg": oracle["dwg"], "dw1": oracle["dw1"][mine, :, fs],
                "dw2": oracle["dw2"][mine, fs, :], "kept": oracle["kept"][g],
                "l_aux": oracle["l_aux"][g]}

    def step(self, ctx, cfg: MoEConfig, local: dict, variant: str, groups: dict, parts) -> dict:
        # lazy: imports torch
        from commbench.patterns.moe.moe_comms import step_moe

        return step_moe(ctx, cfg, local, variant, groups, parts, local["seed"])

    def layout_calls(self, lay, stage: int | None) -> dict[str, list[tuple[Call, int]]]:
        """The capacity layout's EP and TP calls per MoE layer and micro-batch, C = ceil(k cf
        T / E) for T tokens of a micro-batch on a CP rank."""
        if not lay.experts or (lay.ep < 2 and lay.tp < 2):
            return {}
        cfg = MoEConfig(tokens=(lay.tokens,) * lay.ep, model=lay.hidden,
                        ffn=lay.ffn or 4 * lay.hidden, experts=lay.experts, top_k=lay.top_k,
                        capacity_factor=lay.capacity_factor, ep=lay.ep, tp=lay.tp,
                        check_routing=False, dtype=lay.act_dtype)
        out: dict[str, list[tuple[Call, int]]] = {}
        for c in moe_calls(cfg, "capacity", 0):
            if c.axis in ("ep", "tp"):
                out.setdefault(c.axis, []).append((c, lay.stage_layers * lay.micro_batches))
        return out

    def predicted(self, cfg: MoEConfig, variant: str, rank: int, seed=None) -> list[Call]:
        kept = None
        if variant == "variable" and seed is not None:
            # lazy: imports torch
            from commbench.patterns.moe.moe_comms import routing  # the calls follow the data

            kept = routing(cfg, seed)
        return moe_calls(cfg, variant, rank, kept)

    def metrics(self, cfg: MoEConfig, variant: str, outs: list[dict]) -> dict:
        kept = sum(int(o["outputs"]["kept"].sum()) for o in outs[::cfg.tp])
        return {"choices kept": round(kept / (cfg.top_k * sum(cfg.tokens)), 2)}


def moe_calls(cfg: MoEConfig, variant: str, rank: int, kept: list | None = None) -> list[Call]:
    """The calls ``rank`` makes in one step (module docstring). The variable layout's volume
    depends on routing: give each data group's kept choices
    (:func:`~commbench.patterns.moe.moe_comms.routing`)."""
    P, T, D = cfg.ep, cfg.tp, cfg.dp
    t, rest = rank % T, rank // T
    r, dpi = rest % P, rest // P
    e = ITEMSIZE[cfg.dtype]
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
