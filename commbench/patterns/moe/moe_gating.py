"""GShard top-k gating with capacity as a pattern, each data rank gating its own tokens
(its code, oracle and broken part: moe/gating.py; the config and capacity: moe/configs.py)."""

from __future__ import annotations

from commbench.patterns.base import Broken, Call, Pattern, Tolerance, drawn
from commbench.patterns.moe.configs import MoEConfig, capacity, span

__all__ = ["MoEGating"]


def gate_configs(world_size: int):
    """A hypothesis strategy of gating runs on ``world_size`` ranks."""
    return drawn(_draw, world_size)


def _draw(draw, st, world_size: int) -> MoEConfig:
    E = draw(st.integers(1, 6))
    return MoEConfig(tokens=tuple(draw(st.lists(st.integers(0, 14), min_size=world_size,
                                                max_size=world_size))),
                     experts=E, top_k=draw(st.integers(1, min(2, E))),
                     capacity_factor=draw(st.sampled_from([0.1, 0.5, 1.0, 1.5, 4.0])),
                     min_capacity=draw(st.integers(1, 3)), random_routing=draw(st.booleans()),
                     dp=world_size)


class MoEGating(Pattern):
    """GShard top-k gating with capacity (Lepikhin et al. 2020, Algorithm 1), each data rank
    gating its own tokens with a capacity of its own: vectorized, against the algorithm written
    token by token."""

    name, markers = "moe_gating", ("moe",)
    variants, naive, optimized = ("gshard",), "gshard", "gshard"
    axes = ("dp",)
    Config = MoEConfig
    tolerance = Tolerance("float64: the vectorized and the token-by-token gating compute the "
                          "same softmax; only summation order differs.")
    parts_from = "moe.gating:GateParts"
    dtypes = ("float64",)
    broken = (Broken("no_second_offset", "gshard", {"positions": "moe.gating:positions_without_offset"},
                     "second choices queued from slot 0, not after the first choices",
                     lambda P: [MoEConfig(tokens=(12,) * P, experts=3, capacity_factor=1.0,
                                          random_routing=False, dp=P)]),)

    def grid(self, cfg: MoEConfig) -> str:
        return f"dp={cfg.dp}"

    def configs(self, world_size: int, variant: str):
        return gate_configs(world_size)

    def bench_configs(self, world_size: int) -> list[MoEConfig]:
        return [MoEConfig(tokens=(T,) * world_size, experts=E, capacity_factor=1.0, dp=world_size)
                for T, E in ((1024, 8), (4096, 64))]

    def inputs(self, cfg: MoEConfig, seed: int, device) -> dict:
        # lazy: imports torch
        from commbench.patterns.moe.gating import gate_logits

        return {"logits": gate_logits(cfg, seed).to(device), "seed": seed}

    def shard(self, cfg: MoEConfig, d: dict, groups: dict, variant: str, parts) -> dict:
        g = groups["dp"].index
        return {"logits": d["logits"][span(cfg, g)], "group": g,
                "u": parts.uniforms(cfg, d["seed"], g).to(d["logits"].device)}

    def oracle(self, cfg: MoEConfig, seed: int) -> dict:
        # lazy: imports torch
        from commbench.patterns.moe.gating import gate_logits, loop_gating, uniforms

        logits = gate_logits(cfg, seed)
        out = [loop_gating(logits[span(cfg, g)], cfg, capacity(cfg, cfg.tokens[g]),
                           uniforms(cfg, seed, g)) for g in range(len(cfg.tokens))]
        return {"combine": [c for c, _ in out], "l_aux": [a for _, a in out]}

    def expected(self, oracle: dict, cfg: MoEConfig, rank: int, variant: str) -> dict:
        combine = oracle["combine"][rank]
        return {"combine": combine, "dispatch": combine > 0, "l_aux": oracle["l_aux"][rank]}

    def step(self, ctx, cfg: MoEConfig, local: dict, variant: str, groups: dict, parts) -> dict:
        # lazy: imports torch
        from commbench.patterns.moe.gating import gshard_gating

        cap = capacity(cfg, cfg.tokens[local["group"]])
        gate = gshard_gating(local["logits"], cfg, cap, local["u"], parts.positions)
        return {"combine": gate.combine, "dispatch": gate.dispatch, "l_aux": gate.l_aux}

    def predicted(self, cfg: MoEConfig, variant: str, rank: int, seed=None) -> list[Call]:
        return []
