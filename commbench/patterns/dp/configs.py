"""The configs of the data-parallel patterns that their operators read too: ZeRO's stages and
its flat layer vectors (torch-free: the records and the layout prediction import no torch).

Every parameter of a layer lives in one flat vector [W.flatten(), b] of h*h + h elements, padded
to a multiple of the DP size P: rank r owns elements [r*c, (r+1)*c), c = padded / P.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from commbench.names import check_dtype

__all__ = ["STAGES", "ZeroConfig", "flat_size"]

STAGES = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}  # the variants: DDP is stage 0


@dataclass(frozen=True, slots=True)
class ZeroConfig:
    """``steps`` Adam steps of ``layers`` layers on ``dp`` ranks; ``dtype`` bfloat16/float16
    means mixed precision with fp32 master weights; ``prefetch``: ZeRO-3 gathers the next
    layer's parameters while the current one computes."""

    layers: int = 2
    hidden: int = 4
    batch: int = 4  # per micro-batch, across all DP ranks
    micro: int = 1  # micro-batches per optimizer step (gradient accumulation)
    steps: int = 2
    lr: float = 0.01
    dtype: str = "float64"
    dp: int = 1
    prefetch: bool = True

    def label(self) -> str:
        return f"dp{self.dp} L{self.layers} h{self.hidden} m{self.micro} {self.dtype}"

    def validate(self, world_size: int | None = None, variant: str = "") -> ZeroConfig:
        for name in ("layers", "hidden", "batch", "micro", "steps", "dp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr}: must be > 0")
        check_dtype(self.dtype, ("float64", "float32", "bfloat16", "float16"))
        if world_size is not None and self.dp != world_size:
            raise ValueError(f"dp={self.dp}: must equal the world size {world_size}")
        if self.batch % self.dp:
            raise ValueError(f"batch={self.batch}: must be a multiple of the DP size {self.dp} "
                             "(each rank takes batch/P samples of every micro-batch)")
        return self

    @property
    def mixed(self) -> bool:
        return self.dtype in ("bfloat16", "float16")

    def as_dict(self) -> dict:
        return asdict(self)


def flat_size(cfg: ZeroConfig, P: int) -> tuple[int, int]:
    """(elements of one layer's flat vector, padded to a multiple of P)."""
    n = cfg.hidden * cfg.hidden + cfg.hidden
    return n, -(-n // P) * P
