"""The transformer layer's config and sizes, shared by the TP/SP patterns (tp/tp_layer.py), the
vocab head (tp/vocab.py) and DDP (dp/ddp.py): torch-free, so the records and the layout
prediction import no torch, and the operators (tp/tp_layer_comms.py) read the same names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from commbench.names import check_dtype

__all__ = ["MLP_WEIGHTS", "MODELS", "REPLICATED_UNDER_SP", "SP_VARIANTS", "TPConfig", "buckets_of",
           "ROW_BIASES", "param_sizes", "replicated"]

# (batch, seq, hidden, ffn) of the studies; heads = hidden / 16
MODELS = [(2, 64, 64, 256), (2, 128, 128, 512), (2, 256, 256, 1024)]
MLP_WEIGHTS = ("ln2_w", "ln2_b", "w1", "b1", "w2", "b2")
REPLICATED_UNDER_SP = ("ln1_w", "ln1_b", "bo", "ln2_w", "ln2_b", "b2")
ROW_BIASES = ("bo", "b2")  # the row-parallel linears' biases, whole on every TP rank
SP_VARIANTS = ("sp", "sp_regather")  # the layer's variants under sequence parallelism


@dataclass(frozen=True, slots=True)
class TPConfig:
    """One tensor-parallel layer over a ``dp x tp`` grid: b batch, s sequence, h hidden, f FFN,
    H heads, V vocabulary; DP replicas sum their gradients in buckets of ``bucket_bytes``."""

    batch: int = 2
    seq: int = 8
    hidden: int = 16
    ffn: int = 32
    heads: int = 4
    vocab: int = 32
    tp: int = 2
    dp: int = 1
    causal: bool = True
    dropout: float = 0.0
    dtype: str = "float64"
    bucket_bytes: int = 1 << 20

    def label(self) -> str:
        return f"tp{self.tp} dp{self.dp} b{self.batch} s{self.seq} h{self.hidden} f{self.ffn}"

    def validate(self, world_size: int | None = None, variant: str = "") -> TPConfig:
        """Raise ValueError naming the value and the rule; return self when it can work."""
        for name in ("batch", "seq", "hidden", "ffn", "heads", "vocab", "tp", "dp", "bucket_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        rules = [
            (self.hidden % self.heads, f"hidden={self.hidden} is not a multiple of heads={self.heads}"),
            (self.heads % self.tp, f"heads={self.heads}: must be a multiple of tp={self.tp} (each "
                                   "rank holds whole heads)"),
            (self.ffn % self.tp, f"ffn={self.ffn}: must be a multiple of tp={self.tp}"),
            (self.vocab % self.tp, f"vocab={self.vocab}: must be a multiple of tp={self.tp}"),
            (self.batch % self.dp, f"batch={self.batch}: must be a multiple of dp={self.dp} (each "
                                   "DP replica takes batch/dp)"),
            (variant in SP_VARIANTS and self.seq % self.tp,
             f"seq={self.seq}: must be a multiple of tp={self.tp} under sequence parallelism"),
            (not 0 <= self.dropout < 1, f"dropout={self.dropout}: must be in [0, 1)"),
        ]
        for bad, message in rules:
            if bad:
                raise ValueError(message)
        check_dtype(self.dtype, ("float64", "float32"))
        if world_size is not None and self.tp * self.dp != world_size:
            raise ValueError(f"tp={self.tp} x dp={self.dp} = {self.tp * self.dp}: must equal the "
                             f"world size {world_size}")
        return self

    def as_dict(self) -> dict:
        return asdict(self)


def replicated(mlp_only: bool, biases: bool = True) -> tuple[str, ...]:
    """The weights whose gradients SP leaves per sequence shard: LayerNorms and row biases
    (``biases`` False: a layer whose linears have none, the LayerNorms alone)."""
    names = REPLICATED_UNDER_SP[3:] if mlp_only else REPLICATED_UNDER_SP
    return names if biases else tuple(n for n in names if n not in ROW_BIASES)


def param_sizes(cfg: TPConfig, mlp_only: bool = False) -> dict[str, int]:
    """Elements of each weight shard a TP rank holds, in definition order."""
    h, P = cfg.hidden, cfg.tp
    hp, fp = h // P, cfg.ffn // P
    sizes = {"ln1_w": h, "ln1_b": h, "wqkv": 3 * hp * h, "bqkv": 3 * hp, "wo": h * hp, "bo": h,
             "ln2_w": h, "ln2_b": h, "w1": fp * h, "b1": fp, "w2": h * fp, "b2": h}
    return {k: sizes[k] for k in (MLP_WEIGHTS if mlp_only else sizes)}


def buckets_of(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Indices of the parameters of ``sizes`` (bytes each) per bucket, last parameter first,
    each bucket about ``bucket_bytes``."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes}: must be >= 1")
    out: list[list[int]] = [[]]
    size = 0
    for i in reversed(range(len(sizes))):
        nbytes = sizes[i]
        if out[-1] and size + nbytes > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append(i)
        size += nbytes
    return [b for b in out if b]
