"""A training layout's configuration (``commbench predict layout``'s flags), apart from the model
that prices it (:mod:`commbench.costmodel.layout`), so that the command line reads it without
importing torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from commbench.costmodel.flavours import (
    ds_config,
    layer_modules,
    megatron_buckets,
    megatron_buffer,
)

__all__ = ["DTYPE", "IMPLS", "TORCH_TP", "Layout"]

DTYPE = {1: "int8", 2: "bfloat16", 4: "float32", 8: "float64"}  # bytes per element -> dtype
IMPLS = ("megatron", "fsdp2", "deepspeed", "torch-ddp")  # whose data-parallel calls (flavours.py)
MAX_RANKS = 1 << 20  # a layout's world at most: the largest training jobs are some 10^5 GPUs
MAX_MICRO = 1 << 16  # micro-batches per step at most (the pipeline's calls are listed per one)
# the flavours whose tensor parallelism is torch's parallelize_module styles (q, k, v apart); the
# others' is Megatron's (q, k, v one fused column-parallel linear)
TORCH_TP = ("fsdp2", "torch-ddp")


@dataclass(frozen=True)
class Layout:
    layers: int = 32
    hidden: int = 4096
    ffn: int = 0            # 0: 4 x hidden
    heads: int = 32
    kv_heads: int = 0       # 0: heads
    vocab: int = 32000
    seq: int = 4096
    micro_batch: int = 1
    micro_batches: int = 8
    tp: int = 1
    sp: bool = False        # Megatron sequence parallelism over the TP group
    regather: bool = False  # SP: the backward re-gather of the column inputs (Megatron's default)
    bias: bool = False      # the linears' biases (Megatron's add_bias_linear): the column-parallel
    #                         ones (q, k, v, the MLP's first) split over tp, the row-parallel ones
    #                         (the output projection's, the MLP's second) whole, summed over tp
    #                         under sp with the LayerNorms' gradients
    loss: str = "megatron"  # vocab-parallel cross-entropy: megatron (3 all-reduces), fused (2),
    #                         naive (all-gathered logits), none (no embedding and head priced)
    cp: int = 1
    cp_kind: str = "ring"   # ring | ulysses
    ep: int = 1
    experts: int = 0        # 0: a dense model
    top_k: int = 2
    capacity_factor: float = 1.0
    dp: int = 1
    dp_shard: int = 0       # hybrid sharding: ranks a parameter is cut over (0: dp / dp_replicate)
    dp_replicate: int = 1   # hybrid sharding: replicas, each of dp_shard ranks (torchtitan's words)
    pp: int = 1
    zero: int = 0
    impl: str = "megatron"  # whose data-parallel calls: megatron | fsdp2 | deepspeed | torch-ddp
    bucket_mb: float = 0.0  # torch-ddp: bucket_cap_mb (0: torch's default, 25 MiB, first 1 MiB)
    no_sync: bool = False   # torch-ddp: micro-batches accumulated under no_sync(); fsdp2:
    #                         under set_requires_gradient_sync(False)
    find_unused: bool = False  # torch-ddp: find_unused_parameters=True
    static_graph: bool = False  # torch-ddp: static_graph=True
    no_reshard: bool = False  # fsdp2: reshard_after_forward=False (no backward re-gather)
    act_bytes: int = 2
    grad_bytes: int = 4
    grad_norm: bool = True  # megatron: its optimizer all-reduces the gradients' norm each step
    #                         (off: a script without megatron-core's optimizer)
    overlap_grad_reduce: bool = False  # megatron: DistributedDataParallelConfig's, the buffer
    #                         reduced in buckets (its distributed optimizer: zero=1)
    bucket_size: int = 0    # megatron: its bucket_size with overlap_grad_reduce (elements; 0:
    #                         megatron-core's default, max(40M, 1M x dp))
    ds_config: str = ""     # deepspeed: the job's ds_config JSON (stage, reduce_bucket_size,
    #                         gradient_accumulation_steps)
    param_bytes: int = 0    # fsdp2: MixedPrecisionPolicy's param_dtype, the gathers' width (0: as
    #                         grad_bytes, no policy); grad_bytes is then its reduce_dtype

    def __post_init__(self) -> None:
        if self.dp_shard > 0 and self.dp == 1:  # --dp-shard N --dp-replicate M: dp is N x M
            object.__setattr__(self, "dp", self.dp_shard * self.dp_replicate)

    def validate(self) -> None:
        for k in ("layers", "hidden", "heads", "vocab", "seq", "micro_batch", "micro_batches",
                  "tp", "cp", "ep", "dp", "dp_replicate", "pp", "act_bytes", "grad_bytes"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k}={getattr(self, k)}: must be >= 1")
        kv = self.kv_heads or self.heads
        if self.heads % self.tp or kv % self.tp and self.tp % kv:
            raise ValueError(f"heads={self.heads}, kv_heads={kv}: must split over tp={self.tp}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden}: must be a multiple of heads={self.heads}")
        if self.seq % (self.cp * (2 if self.cp_kind == "ring" else 1)) or \
                (self.sp and (self.seq // self.cp) % self.tp):
            raise ValueError(f"seq={self.seq}: must split over cp={self.cp} ({self.cp_kind}) "
                             f"and, with sp, over tp={self.tp}")
        if self.cp_kind not in ("ring", "ulysses"):
            raise ValueError(f"cp_kind={self.cp_kind!r}: must be 'ring' or 'ulysses'")
        if self.layers % self.pp:
            raise ValueError(f"layers={self.layers}: must be a multiple of pp={self.pp}")
        if self.micro_batches > MAX_MICRO:
            raise ValueError(f"micro_batches={self.micro_batches}: at most {MAX_MICRO} (a "
                             "pipeline's sends are listed per micro-batch)")
        if self.ranks > MAX_RANKS:
            raise ValueError(f"tp*cp*dp*pp={self.ranks}: at most {MAX_RANKS} ranks (its groups' "
                             "ranks are listed one by one)")
        if self.dp % self.ep:
            raise ValueError(f"ep={self.ep}: must divide dp={self.dp} (experts shard the DP ranks)")
        if self.experts and self.experts % self.ep:
            raise ValueError(f"experts={self.experts}: must be a multiple of ep={self.ep}")
        if self.ep > 1 and not self.experts:
            raise ValueError(f"ep={self.ep}: needs experts > 0")
        for k in ("act_bytes", "grad_bytes"):
            if getattr(self, k) not in DTYPE:
                raise ValueError(f"{k}={getattr(self, k)}: must be 1, 2, 4 or 8")
        if self.loss not in ("megatron", "fused", "naive", "none"):
            raise ValueError(f"loss={self.loss!r}: must be megatron, fused, naive or none")
        if self.vocab % self.tp:
            raise ValueError(f"vocab={self.vocab}: must be a multiple of tp={self.tp}")
        if self.regather and not self.sp:
            raise ValueError("regather=True: the backward re-gather exists under sp only")
        if self.regather and self.tp_style == "torch":
            raise ValueError(f"regather=True: Megatron's backward re-gather; torch's "
                             f"ColwiseParallel keeps its gathered input (impl={self.impl!r})")
        if self.bias and self.experts:
            raise ValueError(f"bias=True with experts={self.experts}: the experts' biases are not "
                             "priced (a dense layer's are)")
        if self.bias and self.tp > 1 and self.tp_style == "torch":
            raise ValueError(f"bias=True with tp={self.tp}: Megatron's layer's biases are priced; "
                             f"torch's tensor parallelism of biases is not (impl={self.impl!r})")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero={self.zero}: must be 0, 1, 2 or 3")
        if self.impl not in IMPLS:
            raise ValueError(f"impl={self.impl!r}: must be one of {', '.join(IMPLS)}")
        if self.impl == "fsdp2" and (self.zero not in (0, 3) or self.experts or self.pp > 1):
            raise ValueError(f"impl='fsdp2': shards every layer as ZeRO-3 does, on a dense model "
                             f"without pipeline stages (zero={self.zero}, experts={self.experts}, "
                             f"pp={self.pp})")
        if self.impl == "deepspeed" and (self.zero not in (1, 2, 3) or self.experts):
            raise ValueError(f"impl='deepspeed': ZeRO stage 1, 2 or 3 on a dense model "
                             f"(zero={self.zero}, experts={self.experts})")
        if self.impl == "torch-ddp" and (self.zero or self.experts):
            raise ValueError(f"impl='torch-ddp': replicates every parameter on a dense model "
                             f"(zero={self.zero}, experts={self.experts})")
        if self.no_reshard and self.impl != "fsdp2":
            raise ValueError(f"no_reshard=True: FSDP2's reshard_after_forward; needs impl='fsdp2' "
                             f"(impl={self.impl!r})")
        if not self.grad_norm and self.impl != "megatron":
            raise ValueError(f"grad_norm=False: megatron-core's optimizer's norm all-reduce; "
                             f"needs impl='megatron' (impl={self.impl!r}: the flavour says)")
        if self.ds_config:
            self._check_ds_config()
        if self.param_bytes and (self.param_bytes not in DTYPE or self.impl != "fsdp2"):
            raise ValueError(f"param_bytes={self.param_bytes}: FSDP2's param_dtype, 1, 2, 4 or 8 "
                             f"bytes; needs impl='fsdp2' (impl={self.impl!r})")
        if self.dp_shard < 0:
            raise ValueError(f"dp_shard={self.dp_shard}: must be >= 0 (0: dp / dp_replicate)")
        if self.dp % self.dp_replicate or self.dp_shard and \
                self.dp != self.dp_shard * self.dp_replicate:
            raise ValueError(f"dp={self.dp}: must be dp_shard x dp_replicate (dp_shard="
                             f"{self.dp_shard or 'dp / dp_replicate'}, dp_replicate="
                             f"{self.dp_replicate})")
        if self.dp_replicate > 1 and (self.experts or not (
                self.impl == "fsdp2" or self.impl == "megatron" and self.zero == 3)):
            raise ValueError(f"dp_replicate={self.dp_replicate}: hybrid sharding cuts the "
                             "parameters over a shard group, on a dense model: needs zero=3 "
                             f"or impl='fsdp2' (impl={self.impl!r}, zero={self.zero}, "
                             f"experts={self.experts})")
        if not self.bucket_mb >= 0:
            raise ValueError(f"bucket_mb={self.bucket_mb}: must be >= 0 (0: torch's default)")
        if self.no_sync and self.impl not in ("torch-ddp", "fsdp2"):
            raise ValueError(f"no_sync=True: DDP's no_sync() or FSDP2's set_requires_gradient_"
                             f"sync(False); needs impl='torch-ddp' or 'fsdp2' (impl="
                             f"{self.impl!r})")
        ddp = [k for k in ("bucket_mb", "find_unused", "static_graph") if getattr(self, k)]
        if ddp and self.impl != "torch-ddp":
            raise ValueError(f"{ddp[0]}={getattr(self, ddp[0])}: DistributedDataParallel's "
                             f"setting; needs impl='torch-ddp' (impl={self.impl!r})")
        if not self.capacity_factor > 0:
            raise ValueError(f"capacity_factor={self.capacity_factor}: must be > 0")
        if self.overlap_grad_reduce and (self.impl != "megatron" or self.zero != 1 or
                                         self.experts):
            raise ValueError(f"overlap_grad_reduce=True: megatron-core's buckets of its "
                             f"distributed optimizer's buffer, on a dense model; needs "
                             f"impl='megatron', zero=1 (impl={self.impl!r}, zero={self.zero}, "
                             f"experts={self.experts})")
        if self.bucket_size < 0 or self.bucket_size and not self.overlap_grad_reduce:
            raise ValueError(f"bucket_size={self.bucket_size}: megatron-core's, used only with "
                             "overlap_grad_reduce; must be >= 0 (0: its default)")

    def _check_ds_config(self) -> None:
        """The ds_config agrees with the layout's own settings, which it does not override."""

        if self.impl != "deepspeed":
            raise ValueError(f"ds_config={self.ds_config!r}: DeepSpeed's config; needs "
                             f"impl='deepspeed' (impl={self.impl!r})")
        ds = ds_config(self.ds_config)
        for key, mine in (("stage", "zero"), ("gradient_accumulation_steps", "micro_batches")):
            if key in ds and ds[key] != getattr(self, mine):
                raise ValueError(f"{mine}={getattr(self, mine)}: ds_config={self.ds_config!r} "
                                 f"says {key}={ds[key]}; give {mine}={ds[key]}")

    @property
    def ranks(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    # -- the model's arithmetic, as every pattern's contribution to the layout reads it --------
    @property
    def gather_bytes(self) -> int:
        """The width parameters are gathered in: ``param_bytes``, else ``grad_bytes``."""
        return self.param_bytes or self.grad_bytes

    @property
    def act_dtype(self) -> str:
        return DTYPE[self.act_bytes]

    @property
    def stage_layers(self) -> int:
        """Layers of one pipeline stage."""
        return self.layers // self.pp

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on one CP rank."""
        return self.micro_batch * self.seq // self.cp

    @property
    def tp_style(self) -> str:
        """Whose tensor parallelism the flavour runs: ``torch`` (:data:`TORCH_TP`) or
        ``megatron``."""
        return "torch" if self.impl in TORCH_TP else "megatron"

    @property
    def layer_params(self) -> int:
        """A dense layer's parameters on one TP rank: the matrices of attention and, without
        experts, the MLP split over TP; the two LayerNorms' weights and biases (4h) whole, as
        Megatron and torch's tensor parallelism replicate them; with ``bias`` the linears'
        biases, column-parallel ones split, row-parallel ones whole (its tensors, the router
        aside)."""
        return sum(self.layer_tensors) - self.hidden * self.experts

    @property
    def layer_tensors(self) -> list[int]:
        """A dense layer's parameter tensors on one TP rank, in registration order (the
        flavours' :func:`~commbench.costmodel.flavours.layer_params`); with experts, its
        router in place of the MLP."""
        return [p for module in self.layer_modules for p in module]

    @property
    def layer_modules(self) -> list[list[int]]:
        """A dense layer's modules, each its parameter tensors on one TP rank, in registration
        order (the flavours' :func:`~commbench.costmodel.flavours.layer_modules`); with
        experts, its router (one module) in place of the MLP's two."""
        h, f = self.hidden, self.ffn or 4 * self.hidden
        kv_d = (self.kv_heads or self.heads) * (h // self.heads)
        dense = layer_modules(h, kv_d, f, self.tp, self.bias)
        return dense[:-2] + [[h * self.experts]] if self.experts else dense

    @property
    def stage_modules(self) -> list[list[int]]:
        """:attr:`stage_tensors` by module: the root first (one module), then each layer's."""
        return ([[self.root_params]] if self.root_params else []) + \
            self.layer_modules * self.stage_layers

    @property
    def stage_tensors(self) -> list[int]:
        """Every parameter tensor of one stage's rank, in registration order: the root (the
        embedding and head, where priced) first, then the layers."""
        return [p for module in self.stage_modules for p in module]

    @property
    def flat_params(self) -> int:
        """The flat gradient vector the ``megatron`` flavour reduces: the dense parameters,
        with ``zero`` >= 1 in megatron-core's padded buffer (:func:`megatron_buffer`) over
        the dp x cp ranks."""
        if self.impl != "megatron" or not self.zero:
            return self.dense_params

        return megatron_buffer(self.stage_tensors, self.dp * self.cp)

    @property
    def flat_buckets(self) -> list[int]:
        """The flat gradient vector cut as the ``megatron`` flavour reduces it: one
        (:attr:`flat_params`), or with ``overlap_grad_reduce`` megatron-core's buckets
        (:func:`~commbench.costmodel.flavours.megatron_buckets`)."""
        if not self.overlap_grad_reduce:
            return [self.flat_params]
        n = self.dp * self.cp
        return megatron_buckets(self.stage_tensors, n, self.bucket_size or
                                max(40_000_000, 1_000_000 * n))

    @property
    def root_params(self) -> int:
        """The embedding and head on one TP rank (priced with pp = 1 and a loss only)."""
        return self.vocab * self.hidden // self.tp if self.pp == 1 and self.loss != "none" else 0

    @property
    def dense_params(self) -> int:
        """Parameters of one stage's rank that every DP rank holds: layers, routers, root."""
        return self.stage_layers * (self.layer_params + self.hidden * self.experts) + \
            self.root_params

    @property
    def expert_params(self) -> int:
        """Expert parameters of one stage's rank (reduced over the ranks holding the same)."""
        f = self.ffn or 4 * self.hidden
        return self.stage_layers * (self.experts // self.ep) * 2 * self.hidden * f // self.tp \
            if self.experts else 0

    def as_dict(self) -> dict:
        return asdict(self)
