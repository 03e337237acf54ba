"""The config of the sequence-parallel patterns and the head and weight arithmetic their records
and operators share, torch-free (the records and the layout prediction import no torch).

Heads not divisible by P are split unevenly (the first H mod P ranks get one more, DeepSpeed's
``get_shard_size_list``); under grouped-query attention a rank receives the KV heads its query
heads read, so KV ranges may overlap.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from commbench.names import check_dtype
from commbench.ops import split_sizes

__all__ = ["AttnConfig", "Ranges", "head_ranges", "kv_ranges", "projection_chunk",
           "projection_numel"]

@dataclass(frozen=True)
class AttnConfig:
    """One attention call under sequence (Ulysses) or context parallelism over a ``dp x sp``
    grid. ``kv_heads`` 0 means as many as ``heads``. ``layout``: ``contiguous`` (rank r holds
    tokens [r s/P, (r+1) s/P)) or ``zigzag`` (2P chunks, rank r holds chunks r and 2P-1-r, the
    load-balanced split for causal ring attention)."""

    batch: int = 1
    seq: int = 8
    heads: int = 4
    kv_heads: int = 0
    head_dim: int = 4
    sp: int = 1
    dp: int = 1
    causal: bool = False
    layout: str = "contiguous"
    dtype: str = "float64"

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    def as_dict(self) -> dict:
        return asdict(self)

    def label(self) -> str:
        return f"b{self.batch} s{self.seq} H{self.heads}/{self.kv} d{self.head_dim} {self.layout}"

    def validate(self, world_size: int, variant: str = "") -> None:
        """Raise ValueError naming the value and the rule, before any collective."""
        for name in ("batch", "seq", "heads", "head_dim", "sp", "dp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.kv_heads < 0 or self.heads % self.kv:
            raise ValueError(f"kv_heads={self.kv_heads}: must divide heads={self.heads} "
                             "(grouped-query attention)")
        if self.sp * self.dp != world_size:
            raise ValueError(f"sp={self.sp} x dp={self.dp}: must equal the world size {world_size}")
        if self.batch % self.dp:
            raise ValueError(f"batch={self.batch}: must be a multiple of dp={self.dp}")
        if self.layout not in ("contiguous", "zigzag"):
            raise ValueError(f"layout={self.layout!r}: must be 'contiguous' or 'zigzag'")
        chunks = self.sp * (2 if self.layout == "zigzag" else 1)
        if self.seq % chunks:
            raise ValueError(f"seq={self.seq}: must be a multiple of {chunks} "
                             f"({self.layout} split over sp={self.sp})")
        if variant == "ulysses" and self.heads < self.sp:
            raise ValueError(f"heads={self.heads}, sp={self.sp}: Ulysses needs at least one "
                             "query head per rank (heads >= sp)")
        check_dtype(self.dtype, ("float64", "float32"))


Ranges = list[tuple[int, int]]


def head_ranges(heads: int, P: int) -> Ranges:
    """[lo, hi) of the query heads each member attends to after the all-to-all."""
    out, lo = [], 0
    for n in split_sizes(heads, P):
        out.append((lo, lo + n))
        lo += n
    return out


def kv_ranges(heads: int, kv: int, P: int) -> Ranges:
    """[lo, hi) of the KV heads each member needs for its query heads (they may overlap)."""
    g = heads // kv
    return [(lo // g, (hi - 1) // g + 1) for lo, hi in head_ranges(heads, P)]


def projection_numel(cfg: AttnConfig) -> int:
    """Elements of the flat projection weights [Wq, Wk, Wv, Wo] of Ulysses with ZeRO-3."""
    h = cfg.heads * cfg.head_dim
    return 2 * h * h + 2 * cfg.kv * cfg.head_dim * h


def projection_chunk(cfg: AttnConfig, world: int) -> int:
    """Elements of each rank's chunk of them over a world of ``world``."""
    return -(-projection_numel(cfg) // world)
