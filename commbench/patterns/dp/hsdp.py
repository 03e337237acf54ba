"""Hybrid sharded data parallelism as a pattern, ``hsdp`` (PyTorch FSDP, Zhao et al. 2023, §3.2.2
"hybrid sharding"; FSDP2 on a 2-D device mesh, torchtitan's ``dp_replicate`` x ``dp_shard``).

The model and data are ZeRO's (dp/zero_model.py): ``steps`` Adam steps of ``layers`` tanh layers,
``micro`` micro-batches accumulated, mixed precision with fp32 master weights. The world is a
grid ``dp_replicate=R,dp_shard=S`` (the shard axis fastest, as FSDP2's mesh: a shard group is S
adjacent ranks), and rank (i, j) takes batch slice i*S + j. Variants:

* ``ddp`` (naive): every rank holds everything; each layer's gradient all-reduced over the
  whole world once per step (ZeRO stage 0 on the world).
* ``fsdp``: ZeRO-3 over the whole world (FSDP's full sharding).
* ``hsdp`` (optimized): ZeRO-3 inside the shard group (each layer gathered before its forward
  and again in backward, its gradient reduce-scattered there, every micro-batch), and the
  accumulated gradient chunk all-reduced over the replicate group once per step before Adam
  (FSDP2 with ``set_requires_all_reduce(False)`` on all micro-batches but the last).

Bytes per rank per step, Psi padded elements, P = R S: ``ddp`` 2(P-1)/P Psi on the world;
``fsdp`` 3m(P-1)/P Psi on the world; ``hsdp`` 3m(S-1)/S Psi on the shard group plus 2(R-1)/R Psi/S
on the replicate group, the one that crosses nodes when a shard group fills a node (DDP moves
2(P-1)/P Psi over the whole world). The step and its parts: dp/hsdp_comms.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from commbench.names import ITEMSIZE, check_dtype
from commbench.ops import booked
from commbench.patterns.base import Broken, Call, Pattern, drawn
from commbench.patterns.dp.configs import ZeroConfig, flat_size
from commbench.patterns.dp.zero import TOLERANCE, dp_calls, flat_calls, pad_to, zero_calls

__all__ = ["HSDP", "HSDPConfig", "hsdp_calls"]

WORLD = "dp_replicate_dp_shard"  # the group of every rank (the grid's two axes together)


@dataclass(frozen=True, slots=True)
class HSDPConfig:
    """ZeRO's run (:class:`~commbench.patterns.dp.configs.ZeroConfig`) on ``replicate`` x
    ``shard`` ranks."""

    layers: int = 2
    hidden: int = 4
    batch: int = 4  # per micro-batch, across all ranks
    micro: int = 1
    steps: int = 2
    lr: float = 0.01
    dtype: str = "float64"
    shard: int = 1
    replicate: int = 1
    prefetch: bool = True

    @property
    def ranks(self) -> int:
        return self.shard * self.replicate

    def zero(self, dp: int | None = None) -> ZeroConfig:
        """The same run as ZeRO's config on ``dp`` ranks (default: all of them)."""
        return ZeroConfig(self.layers, self.hidden, self.batch, self.micro, self.steps, self.lr,
                          self.dtype, dp or self.ranks, self.prefetch)

    def label(self) -> str:
        return f"r{self.replicate} s{self.shard} L{self.layers} h{self.hidden} m{self.micro} " \
               f"{self.dtype}"

    def validate(self, world_size: int | None = None, variant: str = "") -> HSDPConfig:
        for name in ("shard", "replicate"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if world_size is not None and self.ranks != world_size:
            raise ValueError(f"replicate={self.replicate} x shard={self.shard}: must equal the "
                             f"world size {world_size}")
        check_dtype(self.dtype, ("float64", "float32", "bfloat16", "float16"))
        self.zero().validate()  # layers, hidden, batch (a multiple of every rank), steps, lr
        return self

    @property
    def mixed(self) -> bool:
        return self.zero().mixed

    def as_dict(self) -> dict:
        return asdict(self)


def hsdp_calls(cfg: HSDPConfig, rank: int) -> list[Call]:
    """The calls rank (i, j) of the grid makes in ``cfg.steps`` steps of ``hsdp``: ZeRO-3's on
    its shard group, and each layer's gradient chunk all-reduced on its replicate group once per
    step (in the master dtype: fp32 under mixed precision)."""
    S, R = cfg.shard, cfg.replicate
    c = flat_size(cfg, S)[1] // S
    e = 4 if cfg.mixed else ITEMSIZE[cfg.dtype]
    sharded = zero_calls(cfg.zero(S), 3, rank % S, axis="dp_shard")
    replicated = [Call("all_reduce", "dp_replicate", c * e, *booked("all_reduce", R, rank // S,
                                                                      c, e))]
    return sharded + replicated * (cfg.layers * cfg.steps)


def _draw(draw, st, world_size: int) -> HSDPConfig:
    shard = draw(st.sampled_from([d for d in range(1, world_size + 1) if world_size % d == 0]))
    return HSDPConfig(layers=draw(st.integers(1, 3)), hidden=draw(st.integers(1, 5)),
                      batch=world_size * draw(st.integers(1, 2)), micro=draw(st.integers(1, 3)),
                      steps=draw(st.integers(1, 3)), shard=shard, replicate=world_size // shard,
                      prefetch=draw(st.booleans()),
                      dtype=draw(st.sampled_from(["float64", "float64", "float32", "bfloat16"])))


def _split(world_size: int) -> tuple[int, int]:
    """(replicate, shard) with two replicas where the world has an even number of ranks."""
    return (2, world_size // 2) if world_size % 2 == 0 else (1, world_size)


def _example(P: int) -> list[HSDPConfig]:
    R, S = _split(P)
    return [HSDPConfig(layers=2, hidden=3, batch=2 * P, micro=2, steps=2, shard=S, replicate=R)]


class HSDP(Pattern):
    """ZeRO-3 inside a shard group, DDP across the replica groups."""

    name, markers = "hsdp", ("zero", "ddp")
    variants, naive, optimized = ("ddp", "fsdp", "hsdp"), "ddp", "hsdp"
    axes = ("dp_shard", "dp_replicate", WORLD)
    combos = (("dp_replicate", "dp_shard"),)
    Config = HSDPConfig
    tolerance = TOLERANCE
    parts_from = "dp.hsdp_comms:HSDPParts"
    dtypes = ("float64", "float32", "bfloat16")
    broken = (
        Broken("replicas_never_reduced", "hsdp",
               {"replicate_reduce": "dp.hsdp_comms:replicas_never_reduced"},
               "each replica group steps on its own half of the batch: the gradient chunk is "
               "never all-reduced across replicas", _example, (2, 4)),
        Broken("reduced_on_the_shard_group", "hsdp",
               {"replicate_reduce": "dp.hsdp_comms:reduced_on_the_shard_group"},
               "the gradient chunk all-reduced over the shard group instead of the replicate "
               "group: different chunks summed", _example, (4,)),
    )

    def grid(self, cfg: HSDPConfig) -> str:
        return f"dp_replicate={cfg.replicate},dp_shard={cfg.shard}"

    def configs(self, world_size: int, variant: str):
        return drawn(_draw, world_size)

    def edge_configs(self, world_size: int, variant: str) -> list[HSDPConfig]:
        """Layers of 2 elements (hidden 1), smaller than the shard group, so every shard pads;
        with accumulation, in full and in mixed precision."""
        R, S = _split(world_size)
        return [HSDPConfig(layers=2, hidden=1, batch=world_size, micro=2, steps=2, shard=S,
                           replicate=R, dtype=d) for d in ("float64", "bfloat16")]

    def bench_configs(self, world_size: int) -> list[HSDPConfig]:
        R, S = _split(world_size)
        return [HSDPConfig(layers=4, hidden=h, batch=4 * world_size, micro=micro, steps=1,
                           shard=S, replicate=R, dtype="float32")
                for h in (64, 256) for micro in (1, 4)]

    def _sharding(self, cfg: HSDPConfig, variant: str) -> tuple[int, int]:
        """(ranks a layer is cut over, this variant's ZeRO stage on them)."""
        return {"ddp": (cfg.ranks, 0), "fsdp": (cfg.ranks, 3), "hsdp": (cfg.shard, 3)}[variant]

    def inputs(self, cfg: HSDPConfig, seed: int, device) -> dict:
        # lazy: imports torch
        from commbench.patterns.dp.zero_model import batch, init_layers

        return {"layers": [f.to(device) for f in init_layers(cfg.zero(), seed)],
                "batches": [[tuple(v.to(device) for v in batch(cfg.zero(), seed, step, mb))
                             for mb in range(cfg.micro)] for step in range(cfg.steps)]}

    def shard(self, cfg: HSDPConfig, inputs: dict, groups: dict, variant: str, parts) -> dict:
        padded = flat_size(cfg, self._sharding(cfg, variant)[0])[1]
        return {**inputs, "layers": [pad_to(f, padded) for f in inputs["layers"]]}

    def oracle(self, cfg: HSDPConfig, seed: int) -> dict:
        # lazy: imports torch
        from commbench.patterns.dp.zero_model import oracle_train

        return {f"w{k}": w for k, w in enumerate(oracle_train(cfg.zero(), seed))}

    def references(self, cfg: HSDPConfig, seed: int) -> list[dict]:
        if cfg.dtype == "float64":
            return []
        # lazy: imports torch
        from commbench.patterns.dp.zero_model import oracle_train

        # lazy: imports torch
        from commbench.wire.dtypes import DTYPES

        dt = DTYPES[cfg.dtype]
        return [{f"w{k}": w for k, w in enumerate(oracle_train(cfg.zero(), seed, dt, cfg.ranks,
                                                               reverse))}
                for reverse in (False, True)]

    def expected(self, oracle: dict, cfg: HSDPConfig, rank: int, variant: str) -> dict:
        n, stage = self._sharding(cfg, variant)
        padded = flat_size(cfg, n)[1]
        full = {k: pad_to(w, padded) for k, w in oracle.items()}
        if stage == 0:
            return full
        c, i = padded // n, rank % n  # this rank's chunk: its index on the group cut over
        return {k: w[i * c:(i + 1) * c] for k, w in full.items()}

    def step(self, ctx, cfg: HSDPConfig, local: dict, variant: str, groups: dict, parts) -> dict:
        # lazy: imports torch
        from commbench.patterns.dp.hsdp_comms import train

        # lazy: imports torch
        from commbench.patterns.dp.zero_comms import ZeroParts

        # lazy: imports torch
        from commbench.patterns.dp.zero_comms import train as zero_train

        if variant == "hsdp":
            return train(ctx, cfg, local, groups["dp_shard"], groups["dp_replicate"], parts)
        return zero_train(ctx, cfg.zero(), self._sharding(cfg, variant)[1], local, groups[WORLD],
                          ZeroParts())

    def layout_calls(self, lay, stage: int | None) -> dict[str, list[tuple[Call, int]]]:
        """With ``dp_replicate`` > 1 (and commbench's own ZeRO-3): ZeRO-3's calls of the dense
        flat vector on the shard group (its ``dp_shard`` ranks with the CP ranks: dense
        gradients reduce over CP too), and its chunk all-reduced on the replicate group once
        per step. FSDP2's own hybrid sharding is its flavour's (``impl='fsdp2'``)."""
        if lay.dp_replicate < 2 or lay.impl != "megatron":
            return {}
        n, R, g = lay.dp // lay.dp_replicate * lay.cp, lay.dp_replicate, lay.grad_bytes
        c = -(-lay.dense_params // n)  # the chunk of the flat vector padded to n
        return {"dp_shard": flat_calls(dp_calls(lay.dense_params, n, 3, lay.micro_batches, g),
                                       "dp_shard", n),
                "dp_replicate": flat_calls([("all_reduce", c, g, 1)], "dp_replicate", R)}

    def predicted(self, cfg: HSDPConfig, variant: str, rank: int, seed=None) -> list[Call]:
        if variant == "hsdp":
            return hsdp_calls(cfg, rank)
        return zero_calls(cfg.zero(), self._sharding(cfg, variant)[1], rank, axis=WORLD)
