"""The pipeline pattern's config, torch-free (its record and the layout prediction import no
torch; the operators read the same)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from commbench.names import check_dtype
from commbench.patterns.pp.schedule import SCHEDULES

__all__ = ["PPConfig"]


@dataclass(frozen=True, slots=True)
class PPConfig:
    """A pipeline of ``stages`` ranks over ``layers`` tanh layers [h, h], ``batch`` rows in
    ``micro`` micro-batches; the interleaved schedule gives each rank ``virtual`` chunks."""

    stages: int = 2
    layers: int = 4
    hidden: int = 4
    batch: int = 4
    micro: int = 2
    virtual: int = 1
    checkpoint: bool = False
    compute_s: float = 0.0  # synthetic forward compute per layer, whole batch (backward: 2x)
    dtype: str = "float64"

    def label(self) -> str:
        ckpt = " ckpt" if self.checkpoint else ""
        return f"p{self.stages} L{self.layers} h{self.hidden} m{self.micro} v{self.virtual}{ckpt}"

    def chunks(self, variant: str) -> int:
        """Chunks per rank: ``virtual`` under the interleaved schedule, else one."""
        return self.virtual if variant == "interleaved" else 1

    def validate(self, world_size: int | None = None, variant: str = "1f1b") -> PPConfig:
        for name in ("stages", "layers", "hidden", "batch", "micro", "virtual"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        v = self.chunks(variant)
        rules = [
            (variant not in ("naive", *SCHEDULES),
             f"variant={variant!r}: must be naive or one of {', '.join(SCHEDULES)}"),
            (self.layers % (self.stages * v),
             f"layers={self.layers}: must be a multiple of stages x chunks per rank = "
             f"{self.stages * v}"),
            (self.batch % self.micro, f"batch={self.batch}: must be a multiple of micro={self.micro}"),
            (variant == "interleaved" and self.micro % self.stages,
             f"micro={self.micro}: the interleaved schedule needs a multiple of stages="
             f"{self.stages}"),
            (self.compute_s < 0, f"compute_s={self.compute_s}: must be >= 0"),
            (world_size is not None and self.stages != world_size,
             f"stages={self.stages}: must equal the world size {world_size}"),
        ]
        for bad, message in rules:
            if bad:
                raise ValueError(message)
        check_dtype(self.dtype, ("float64", "float32"))
        return self

    def as_dict(self) -> dict:
        return asdict(self)
