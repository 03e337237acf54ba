"""ZeRO-1/2/3 against DDP as a pattern (Rajbhandari et al. 2020): ``steps`` Adam steps of a stack of
tanh layers on ``dp`` ranks, gradient accumulation over ``micro`` micro-batches, mixed precision
with fp32 master weights. The variant is the stage: ``ddp`` (0), ``zero1``, ``zero2``, ``zero3``.
What each stage moves is :func:`stage_calls`. The step, its parts and the broken ones:
dp/zero_comms.py; the oracle: dp/zero_model.py; the config: dp/configs.py.
"""

from __future__ import annotations

from commbench.names import ITEMSIZE
from commbench.ops import booked
from commbench.patterns.base import Broken, Call, Pattern, Tolerance, drawn
from commbench.patterns.dp.configs import STAGES, ZeroConfig, flat_size

__all__ = ["Zero", "dp_calls", "flat_calls", "pad_to", "stage_calls", "zero_calls"]

TOLERANCE = Tolerance(
    "float64: only the order of the sums over ranks differs from the oracle. float32 and mixed "
    "precision (bf16 compute, fp32 master, moments and gradient reduction): within 8x the "
    "largest error of the oracle run in the same precision on the same P batch slices, summed "
    "in either order, plus 1e-5 x max(1, largest weight): Adam divides by sqrt(v), so where a "
    "gradient nearly cancels the order of its sum alone moves the weights.", floor=1e-5)


def zero_configs(world_size: int):
    """A hypothesis strategy of ZeRO runs on ``world_size`` ranks."""
    return drawn(_draw, world_size)


def _draw(draw, st, world_size: int) -> ZeroConfig:
    return ZeroConfig(layers=draw(st.integers(1, 3)), hidden=draw(st.integers(1, 5)),
                      batch=world_size * draw(st.integers(1, 2)), micro=draw(st.integers(1, 3)),
                      steps=draw(st.integers(1, 3)), dp=world_size, prefetch=draw(st.booleans()),
                      dtype=draw(st.sampled_from(["float64", "float64", "float32", "bfloat16"])))


def stage_calls(stage: int, sizes: list[int], P: int, micro: int) -> list[tuple[str, int, str]]:
    """(op, elements per call, "param" or "grad") of one optimizer step for layers of ``sizes``
    elements each (padded to a multiple of P): the one statement of what each stage moves."""
    out = []
    for n in sizes:
        padded = -(-n // P) * P
        c = padded // P
        out += {0: [("all_reduce", padded, "grad")],
                1: [("reduce_scatter", padded, "grad"), ("all_gather", c, "param")],
                2: [("reduce_scatter", padded, "grad")] * micro + [("all_gather", c, "param")],
                3: [("all_gather", c, "param")] * (2 * micro) +
                   [("reduce_scatter", padded, "grad")] * micro}[stage]
    return out


def zero_calls(cfg: ZeroConfig, stage: int, r: int, axis: str = "dp") -> list[Call]:
    """The calls DP member ``r`` makes in ``cfg.steps`` steps: parameters move in the compute
    dtype, gradients in the master dtype (fp32 under mixed precision)."""
    P = cfg.dp
    n, _ = flat_size(cfg, P)
    e = {"param": ITEMSIZE[cfg.dtype], "grad": 4 if cfg.mixed else ITEMSIZE[cfg.dtype]}
    return [Call(op, axis, k * e[kind], *booked(op, P, r, k, e[kind]))
            for op, k, kind in stage_calls(stage, [n] * cfg.layers, P, cfg.micro)] * cfg.steps


def dp_calls(psi: int | list[int], n: int, zero: int, m: int, g: int
             ) -> list[tuple[str, int, int, int]]:
    """The data-parallel calls per step, (op, elements, bytes per element, calls), for ``psi``
    gradient elements on ``n`` ranks: the stage calls of one flat vector (or of each of its
    buckets, ``psi`` a list), in ``g``-byte gradients (a layout's parameters travel in the
    same width)."""
    counts: dict[tuple[str, int], int] = {}
    for op, count, _ in stage_calls(zero, psi if isinstance(psi, list) else [psi], n, m):
        counts[op, count] = counts.get((op, count), 0) + 1
    return [(op, count, g, k) for (op, count), k in counts.items()]


def flat_calls(calls: list[tuple[str, int, int, int]], axis: str, n: int) -> list[tuple[Call, int]]:
    """(op, elements, bytes each, times) on a group of ``n`` as (:class:`Call` of member 0,
    times)."""
    return [(Call(op, axis, count * e, *booked(op, n, 0, count, e)), k) for op, count, e, k in calls]


def pad_to(f, padded: int):
    """``f`` followed by zeros to ``padded`` elements (a flat vector cut into equal chunks)."""
    out = f.new_zeros(padded)
    out[:f.numel()] = f
    return out


def _example(P: int) -> list[ZeroConfig]:
    return [ZeroConfig(layers=2, hidden=3, batch=2 * P, micro=1, steps=2, dp=P)]


class Zero(Pattern):
    """Optimizer states, then gradients, then parameters sharded over the DP group."""

    name, markers = "zero", ("zero",)
    variants, naive, optimized = tuple(STAGES), "ddp", "zero3"
    axes = ("dp",)
    Config = ZeroConfig
    tolerance = TOLERANCE
    parts_from = "dp.zero_comms:ZeroParts"
    dtypes = ("float64", "float32", "bfloat16")
    broken = (
        Broken("chunk_off_by_one", "zero1", {"chunk_start": "dp.zero_comms:chunk_start_off_by_one"},
               "each rank's shard starts one element too far", _example, (2, 3)),
        Broken("no_reduce_scatter", "zero2", {"grad_shard": "dp.zero_comms:local_grad_slice"},
               "stage 2 keeps its slice of its own gradient, never summed", _example, (2, 3)),
        Broken("parameters_gathered_twice", "zero1",
               {"gather_params": "dp.zero_comms:gather_params_twice"},
               "the updated parameters all-gathered a second time: right values, one call of a "
               "kind it books anyway too many (only the call count shows it)", _example, (2, 3)),
        Broken("stale_prefetch", "zero3", {"take_prefetched": "dp.zero_comms:stale_prefetch"},
               "stage 3 reuses the parameters of its first gather", _example, (2, 3)),
    )

    def grid(self, cfg: ZeroConfig) -> str:
        return f"dp={cfg.dp}"

    def configs(self, world_size: int, variant: str):
        return zero_configs(world_size)

    def edge_configs(self, world_size: int, variant: str) -> list[ZeroConfig]:
        """Layers of 2 elements (hidden 1): smaller than a world of 3 or 4, so every stage pads
        its shards; with accumulation, in full and in mixed precision."""
        return [ZeroConfig(layers=2, hidden=1, batch=world_size, micro=2, steps=2, dp=world_size,
                           prefetch=True, dtype=d) for d in ("float64", "bfloat16")]

    def bench_configs(self, world_size: int) -> list[ZeroConfig]:
        return [ZeroConfig(layers=layers, hidden=h, batch=4 * world_size, micro=micro, steps=1,
                           dp=world_size, dtype="float32")
                for layers, h in ((4, 64), (4, 256)) for micro in (1, 4)]

    def inputs(self, cfg: ZeroConfig, seed: int, device) -> dict:
        # lazy: imports torch
        from commbench.patterns.dp.zero_model import batch, init_layers

        _, padded = flat_size(cfg, cfg.dp)
        return {"layers": [pad_to(f, padded).to(device) for f in init_layers(cfg, seed)],
                "batches": [[tuple(v.to(device) for v in batch(cfg, seed, step, mb))
                             for mb in range(cfg.micro)] for step in range(cfg.steps)]}

    def oracle(self, cfg: ZeroConfig, seed: int) -> dict:
        # lazy: imports torch
        from commbench.patterns.dp.zero_model import oracle_train

        return {f"w{k}": w for k, w in enumerate(oracle_train(cfg, seed))}

    def references(self, cfg: ZeroConfig, seed: int) -> list[dict]:
        if cfg.dtype == "float64":
            return []
        # lazy: imports torch
        from commbench.patterns.dp.zero_model import oracle_train

        # lazy: imports torch
        from commbench.wire.dtypes import DTYPES

        dt = DTYPES[cfg.dtype]
        return [{f"w{k}": w for k, w in enumerate(oracle_train(cfg, seed, dt, cfg.dp, reverse))}
                for reverse in (False, True)]

    def expected(self, oracle: dict, cfg: ZeroConfig, rank: int, variant: str) -> dict:
        _, padded = flat_size(cfg, cfg.dp)
        c = padded // cfg.dp
        full = {k: pad_to(w, padded) for k, w in oracle.items()}
        if STAGES[variant] == 0:
            return full
        return {k: w[rank * c:(rank + 1) * c] for k, w in full.items()}

    def step(self, ctx, cfg: ZeroConfig, local: dict, variant: str, groups: dict, parts) -> dict:
        # lazy: imports torch
        from commbench.patterns.dp.zero_comms import train

        return train(ctx, cfg, STAGES[variant], local, groups["dp"], parts)

    def layout_calls(self, lay, stage: int | None) -> dict[str, list[tuple[Call, int]]]:
        """The stage calls of one flat vector per step: the dense parameters over the DP and CP
        ranks (``dp``; ``lay.flat_buckets``, padded and cut as the flavour does), the experts over
        the ranks holding the same ones (``edp``); the layout's own data parallelism only
        (``impl='megatron'``, no hybrid sharding: the libraries' are their flavours', hybrid
        sharding its own pattern's)."""
        if lay.impl != "megatron" or lay.dp_replicate > 1:
            return {}
        out = {}
        for group, n, psi in (("dp", lay.dp * lay.cp, lay.flat_buckets),
                              ("edp", lay.dp // lay.ep * lay.cp, lay.expert_params)):
            if n > 1 and psi:
                out[group] = flat_calls(dp_calls(psi, n, lay.zero, lay.micro_batches,
                                                 lay.grad_bytes), group, n)
        return out

    def predicted(self, cfg: ZeroConfig, variant: str, rank: int, seed=None) -> list[Call]:
        return zero_calls(cfg, STAGES[variant], rank)

    def metrics(self, cfg: ZeroConfig, variant: str, outs: list[dict]) -> dict:
        mem = outs[0]["outputs"]["stats"]["memory"]
        return {"memory(B) params/grads/optimizer": f"{mem['params']}/{mem['grads']}/"
                                                    f"{mem['optimizer']}"}
