"""Data parallelism as a pattern: the transformer layer replicated on every rank, each rank on its
slice of the batch, gradients summed over the DP group (PyTorch DDP, Li et al. 2020).

Variants: ``ddp`` (buckets of about ``bucket_bytes`` in reverse definition order, each
all-reduced as soon as backward has produced it, overlapping the rest of backward) and ``naive``
(after backward, one blocking all-reduce per parameter). Bytes: one all-reduce of every
parameter either way, 2(d-1)/d * Psi per rank; the calls differ. The reducer:
patterns/buckets.py; its broken variant: dp/ddp_comms.py; the layer it replicates:
tp/layer_pattern.py, tp/tp_layer_comms.py.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from commbench.patterns.base import Broken, Call
from commbench.patterns.tp.configs import MODELS, TPConfig
from commbench.patterns.tp.layer_pattern import LayerPattern, ddp_calls, tp_configs

__all__ = ["DDPConfig", "DataParallel"]


@dataclass(frozen=True, slots=True)
class DDPConfig(TPConfig):
    """The transformer layer replicated on every rank: a :class:`TPConfig` with ``tp = 1``."""

    def validate(self, world_size: int | None = None, variant: str = "") -> DDPConfig:
        if self.tp != 1:
            raise ValueError(f"tp={self.tp}: the ddp pattern replicates the layer (tp=1; TP x DP "
                             "is the tp_layer pattern with dp > 1)")
        TPConfig.validate(self, world_size, variant)  # slots: no zero-argument super()
        return self


def _ddp(cfg: TPConfig) -> DDPConfig:
    return DDPConfig(**{f.name: getattr(cfg, f.name) for f in fields(cfg)})


class DataParallel(LayerPattern):
    """DDP's bucketed, overlapped all-reduce against one all-reduce per parameter."""

    name, markers = "ddp", ("ddp",)
    variants, naive, optimized = ("naive", "ddp"), "naive", "ddp"
    axes = ("dp",)
    Config = DDPConfig
    broken = (Broken("sums_not_written_back", "ddp", {"reducer": "dp.ddp_comms:DDPWithoutCopyBack"},
                     "bucket sums waited for but never written back to the gradients",
                     lambda P: [DDPConfig(batch=2 * P, seq=2, hidden=4, ffn=4, heads=2, vocab=2,
                                         dp=P, tp=1, dtype=dt) for dt in ("float64", "float32")]),)

    def configs(self, world_size: int, variant: str):
        return tp_configs(world_size, self.dtypes, fixed_tp=1).map(_ddp)

    def bench_configs(self, world_size: int) -> list[DDPConfig]:
        return [DDPConfig(batch=b * world_size, seq=s, hidden=h, ffn=f, heads=h // 16, vocab=1,
                         dp=world_size, tp=1, dtype="float32", bucket_bytes=25 << 20)
                for b, s, h, f in MODELS]

    def step(self, ctx, cfg: TPConfig, local: dict, variant: str, groups: dict, parts) -> dict:
        # lazy: imports torch
        from commbench.patterns.tp.tp_layer_comms import layer_step

        return layer_step(ctx, cfg, local, "tp", groups, parts, False, variant)

    def predicted(self, cfg: TPConfig, variant: str, rank: int, seed=None) -> list[Call]:
        return ddp_calls(cfg, variant, rank)
