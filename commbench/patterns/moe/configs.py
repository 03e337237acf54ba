"""The MoE layer's config and the token and capacity arithmetic its record and operators share,
torch-free (the records and the layout prediction import no torch).

Capacity C = max(ceil(k * capacity_factor * T_max / E), min_capacity), rounded up to a multiple
of the TP degree (the capacity dimension is split over TP); T_max is the largest token count of
the EP group, so every member's (E, C, M) buffer has the same shape.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = ["MoEConfig", "capacity", "group_capacity", "span"]


@dataclass(frozen=True)
class MoEConfig:
    """An MoE layer over a ``dp x ep x tp`` grid. ``tokens[g]``: tokens of data group
    g = dp_index * ep + ep_index (the TP ranks of a group hold the same tokens)."""

    tokens: tuple[int, ...] = (4,)
    model: int = 4
    ffn: int = 8
    experts: int = 2
    top_k: int = 2
    capacity_factor: float = 1.0
    min_capacity: int = 1
    random_routing: bool = True
    aux_weight: float = 0.01
    ep: int = 1
    dp: int = 1
    tp: int = 1
    check_routing: bool = True
    dtype: str = "float64"

    def as_dict(self) -> dict:
        return asdict(self)

    def label(self) -> str:
        return (f"ep{self.ep} dp{self.dp} tp{self.tp} T{max(self.tokens, default=0)} "
                f"M{self.model} E{self.experts} cf{self.capacity_factor}")

    def validate(self, world_size: int, variant: str = "capacity") -> None:
        """Raise ValueError naming the value and the rule, before any collective."""
        if not self.capacity_factor > 0:
            raise ValueError(f"capacity_factor={self.capacity_factor}: must be > 0")
        for name in ("model", "ffn", "experts", "min_capacity", "ep", "dp", "tp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.top_k not in (1, 2):
            raise ValueError(f"top_k={self.top_k}: GShard gating takes 1 or 2")
        if self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k}: must be <= experts={self.experts}")
        if self.experts % self.ep:
            raise ValueError(f"experts={self.experts}: must be a multiple of ep={self.ep}")
        if self.ffn % self.tp:
            raise ValueError(f"ffn={self.ffn}: must be a multiple of tp={self.tp}")
        if self.dp * self.ep * self.tp != world_size:
            raise ValueError(f"dp={self.dp} x ep={self.ep} x tp={self.tp}: must equal the world "
                             f"size {world_size}")
        if len(self.tokens) != self.dp * self.ep:
            raise ValueError(f"tokens={list(self.tokens)}: needs one count per data group, "
                             f"dp*ep = {self.dp * self.ep}")
        if any(t < 0 for t in self.tokens):
            raise ValueError(f"tokens={list(self.tokens)}: counts must be >= 0")
        if variant != "capacity" and self.tp > 1:
            raise ValueError(f"variant={variant!r} with tp={self.tp}: EP+TP runs the capacity "
                             "layout (the C dimension split over TP)")
        if self.dtype not in ("float64", "float32"):
            raise ValueError(f"dtype={self.dtype!r}: must be 'float64' or 'float32'")


def capacity(cfg: MoEConfig, tokens_max: int) -> int:
    c = max(math.ceil(cfg.top_k * cfg.capacity_factor * tokens_max / cfg.experts),
            cfg.min_capacity)
    return -(-c // cfg.tp) * cfg.tp


def span(cfg: MoEConfig, g: int) -> slice:
    """The tokens of data group ``g`` among all of them."""
    start = sum(cfg.tokens[:g])
    return slice(start, start + cfg.tokens[g])


def group_capacity(cfg: MoEConfig, dp_index: int) -> int:
    P = cfg.ep
    return capacity(cfg, max(cfg.tokens[dp_index * P:(dp_index + 1) * P]))
