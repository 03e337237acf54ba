"""The transformer layer as a pattern, shared by ``tp_layer``, ``tp_mlp`` (tp/tp_layer.py) and
``ddp`` (dp/ddp.py): on a ``dp x tp`` grid (TP neighbours adjacent), DP replicas summing
gradients by DDP; its config strategy, predicted calls and tolerance (torch-free; the step on
a rank: tp/tp_layer_comms.py).

Predicted calls per rank and step (A = b s h activation elements, b = batch / dp; blocks = 2 for
the layer, 1 for the MLP block):

    tp           2 blocks all-reduces of A on the TP group (f backward, g forward)
    sp           2 blocks all-gathers of A/P + 2 blocks reduce-scatters of A, then one all-reduce
                 of the LayerNorm and row-bias gradients (3h per block)
    sp_regather  as sp, plus one all-gather of A/P per column linear (Megatron's backward
                 re-gather): 3 blocks all-gathers
    naive        as tp, plus the column outputs all-gathered (3h/P and h/P wide for attention,
                 f/P twice for the MLP)
    dp           DDP: one all-reduce per bucket of gradients (buckets_of), on the DP group
"""

from __future__ import annotations

from commbench.names import ITEMSIZE
from commbench.ops import booked
from commbench.patterns.base import Call, Pattern, Tolerance, drawn, float32_references
from commbench.patterns.tp.configs import (
    MODELS,
    SP_VARIANTS,
    TPConfig,
    buckets_of,
    param_sizes,
    replicated,
)

__all__ = ["TOLERANCE", "LayerPattern", "activation_calls", "ddp_calls", "replicated_sync",
           "torch_style_calls", "tp_calls", "tp_configs"]

TOLERANCE = Tolerance(
    "float64: only the order of the sums over the TP and DP groups differs from the oracle "
    "(~1e-15 relative per operation). float32: as close to the float64 truth as the unsharded "
    "float32 computation of the same layer is, within 8x (its sums run in another order on each "
    "rank), plus 1e-6 x max(1, largest value); 'as close as the unsharded computation' is the "
    "largest error of four such computations, one as is and three with every weight and input "
    "moved by one ulp: a small LayerNorm amplifies rounding by orders of magnitude, and one "
    "computation's error can be small by luck of cancellation.")


def tp_configs(world_size: int, dtypes=("float64", "float32"), fixed_tp: int | None = None):
    """A hypothesis strategy of layers on ``world_size`` ranks (``fixed_tp``: that TP size)."""
    return drawn(_draw, world_size, dtypes, fixed_tp)


def _draw(draw, st, world_size: int, dtypes, fixed_tp: int | None) -> TPConfig:
    tp = fixed_tp or draw(st.sampled_from([d for d in range(1, world_size + 1)
                                           if world_size % d == 0]))
    dp = world_size // tp
    heads = tp * draw(st.integers(1, 2))
    return TPConfig(
        batch=dp * draw(st.integers(1, 2)), seq=tp * draw(st.integers(1, 3)),
        hidden=heads * draw(st.sampled_from([2, 4])), ffn=tp * draw(st.integers(1, 6)),
        heads=heads, vocab=tp * draw(st.integers(1, 5)), tp=tp, dp=dp,
        causal=draw(st.booleans()), dropout=draw(st.sampled_from([0.0, 0.1])),
        dtype=draw(st.sampled_from(dtypes)), bucket_bytes=draw(st.sampled_from([64, 1 << 20])))


def _tp_call(cfg: TPConfig, t: int, op: str, count: int) -> Call:
    e = ITEMSIZE[cfg.dtype]
    return Call(op, "tp", count * e, *booked(op, cfg.tp, t, count, e))


def replicated_sync(cfg: TPConfig, variant: str, t: int, mlp_only: bool = False,
                    biases: bool = True, layers: int = 1) -> list[Call]:
    """Under SP, the one all-reduce of the LayerNorm and row-bias gradients over TP (once per
    optimizer step, not per micro-batch), of ``layers`` layers at once (megatron-core's
    ``finalize_model_grads`` flattens every layer's into one call); ``biases`` False: a layer
    without biases in its linears (the LayerNorms' alone)."""
    if cfg.tp == 1 or variant not in SP_VARIANTS:
        return []
    return [_tp_call(cfg, t, "all_reduce",
                     layers * len(replicated(mlp_only, biases)) * cfg.hidden)]


def activation_calls(cfg: TPConfig, variant: str, t: int, mlp_only: bool = False) -> list[Call]:
    """The calls on activations TP member ``t`` makes in one forward + backward of the layer."""
    P = cfg.tp
    if P == 1:
        return []
    rows = cfg.batch // cfg.dp * cfg.seq
    A, blocks = rows * cfg.hidden, 1 if mlp_only else 2

    def call(op: str, count: int) -> Call:
        return _tp_call(cfg, t, op, count)

    if variant in SP_VARIANTS:
        gathers = (3 if variant == "sp_regather" else 2) * blocks
        return [call("all_gather", A // P)] * gathers + [call("reduce_scatter", A)] * (2 * blocks)
    calls = [call("all_reduce", A)] * (2 * blocks)
    if variant == "naive":
        calls += [call("all_gather", rows * cfg.ffn // P)] * 2
        if not mlp_only:
            calls += [call("all_gather", rows * 3 * cfg.hidden // P),
                      call("all_gather", rows * cfg.hidden // P)]
    return calls


def torch_style_calls(cfg: TPConfig, sp: bool) -> list[Call]:
    """One forward + backward of the layout's layer (examples/layers.py: no linear biases) under
    torch's parallelize_module styles, q, k, v and fc1 ``ColwiseParallel``, o and fc2
    ``RowwiseParallel``, each module converting its own input and output (so q, k and v, apart,
    make three calls where Megatron's fused linear makes one):

    * without SP: an all-reduce of each row-parallel output (forward) and of each
      column-parallel input's gradient (backward): 2 + 4 of A;
    * with SP (``SequenceParallel`` LayerNorms): an all-gather of A/P before each
      column-parallel module (forward) and of each row-parallel output's gradient (backward),
      a reduce-scatter of A after each row-parallel module (forward) and of each column-parallel
      input's gradient (backward): 6 of each; and each LayerNorm weight's and bias's gradient,
      replicated and computed on the rank's sequence shard, all-reduced on its own in every
      backward: 4 of h."""
    if cfg.tp == 1:
        return []
    A, col, row = cfg.batch * cfg.seq * cfg.hidden, 4, 2

    def call(op: str, count: int) -> Call:
        return _tp_call(cfg, 0, op, count)

    if sp:
        return ([call("all_gather", A // cfg.tp)] * (col + row) +
                [call("reduce_scatter", A)] * (row + col) + [call("all_reduce", cfg.hidden)] * 4)
    return [call("all_reduce", A)] * (row + col)


def tp_calls(cfg: TPConfig, variant: str, t: int, mlp_only: bool = False) -> list[Call]:
    """Every call TP member ``t`` makes in one step of the layer (module docstring)."""
    return activation_calls(cfg, variant, t, mlp_only) + replicated_sync(cfg, variant, t, mlp_only)


def ddp_calls(cfg: TPConfig, sync: str, d: int, mlp_only: bool = False) -> list[Call]:
    """The gradient reduction of DP member ``d``: DDP's buckets or one call per parameter."""
    D = cfg.dp
    if D == 1:
        return []
    e = ITEMSIZE[cfg.dtype]
    sizes = list(param_sizes(cfg, mlp_only).values())
    counts = [sum(sizes[i] for i in b) for b in buckets_of([n * e for n in sizes], cfg.bucket_bytes)] \
        if sync == "ddp" else sizes
    return [Call("all_reduce", "dp", n * e, *booked("all_reduce", D, d, n, e)) for n in counts]


class LayerPattern(Pattern):
    """Megatron's tensor-parallel layer; :class:`TPMLP` is its MLP block alone. The step, the
    linears and the broken parts: tp/tp_layer_comms.py; the oracle: tp/model.py."""

    variants, naive, optimized = ("naive", "tp", "sp", "sp_regather"), "naive", "tp"
    axes = ("tp", "dp")
    Config = TPConfig
    tolerance = TOLERANCE
    parts_from = "tp.tp_layer_comms:TPParts"
    mlp_only = False

    def grid(self, cfg: TPConfig) -> str:
        return f"dp={cfg.dp},tp={cfg.tp}"

    def configs(self, world_size: int, variant: str):
        return tp_configs(world_size, self.dtypes)

    def bench_configs(self, world_size: int) -> list[TPConfig]:
        return [TPConfig(batch=b, seq=s, hidden=h, ffn=f, heads=h // 16, vocab=world_size,
                         tp=world_size, dtype="float32", bucket_bytes=25 << 20)
                for b, s, h, f in MODELS]

    def inputs(self, cfg: TPConfig, seed: int, device) -> dict:
        # lazy: imports torch
        from commbench.patterns.tp.model import init_weights, inputs

        # lazy: imports torch
        from commbench.wire.dtypes import DTYPES

        dt = DTYPES[cfg.dtype]
        data = {k: inputs(cfg, seed, dt)[k].to(device) for k in ("x", "dy", "mask1", "mask2")}
        weights = init_weights(cfg, seed, dt).named()
        return {**data, "weights": {k: v.to(device) for k, v in weights.items()}}

    def shard(self, cfg: TPConfig, data: dict, groups: dict, variant: str, parts) -> dict:
        # lazy: imports torch
        from commbench.patterns.tp.model import LayerWeights

        # lazy: imports torch
        from commbench.patterns.tp.tp_layer_comms import local_slice

        tp, dp = groups["tp"], groups["dp"]
        sp = variant in SP_VARIANTS
        w = parts.shard(LayerWeights(**data["weights"]), tp.index, tp.size, cfg)
        return {**{k: local_slice(data[k], cfg, dp.index, tp.index, sp)
                   for k in ("x", "dy", "mask1", "mask2")}, "weights": w.named()}

    def oracle(self, cfg: TPConfig, seed: int) -> dict:
        # lazy: imports torch
        from commbench.patterns.tp.model import oracle_layer

        return oracle_layer(cfg, seed, mlp_only=self.mlp_only)

    def references(self, cfg: TPConfig, seed: int) -> list[dict]:
        # lazy: imports torch
        from commbench.patterns.tp.model import oracle_layer

        return float32_references(cfg, lambda dt, n: oracle_layer(cfg, seed, dt, n, self.mlp_only))

    def expected(self, oracle: dict, cfg: TPConfig, rank: int, variant: str) -> dict:
        # lazy: imports torch
        import torch

        # lazy: imports torch
        from commbench.patterns.tp.model import LayerWeights, init_weights

        # lazy: imports torch
        from commbench.patterns.tp.tp_layer_comms import local_slice, shard_weights

        at = self.coords(cfg, rank)
        t, d = at["tp"], at["dp"]
        sp = variant in SP_VARIANTS
        full = {k[1:]: v for k, v in oracle.items() if k.startswith("d") and k != "dx"}
        absent = {k: torch.zeros(v.shape) for k, v in init_weights(cfg, 0).named().items()
                  if k not in full} if self.mlp_only else {}  # the MLP block: no attention grads
        shard = shard_weights(LayerWeights(**full, **absent), t, cfg.tp, cfg).named()
        return {"y": local_slice(oracle["y"], cfg, d, t, sp), "dx": local_slice(oracle["dx"], cfg, d, t, sp),
                **{f"d{k}": shard[k] for k in full}}

    def step(self, ctx, cfg: TPConfig, local: dict, variant: str, groups: dict, parts) -> dict:
        # lazy: imports torch
        from commbench.patterns.tp.tp_layer_comms import layer_step

        return layer_step(ctx, cfg, local, variant, groups, parts, self.mlp_only, "ddp")

    layout_layer: bool = False  # the layer a training layout is made of

    def layout_calls(self, lay, stage: int | None) -> dict[str, list[tuple[Call, int]]]:
        """The layer's activation calls x layers x micro-batches, and under SP the TP sum of
        the stage's replicated gradients in one call per step, as megatron-core makes it
        (``finalize_model_grads``): the whole layer's (``layout_layer``),
        not its MLP block's or DDP's, which run the same layer. Under a flavour whose tensor
        parallelism is torch's (``lay.tp_style``), torch's calls per micro-batch
        (:func:`torch_style_calls`)."""
        if not self.layout_layer:
            return {}
        cfg = TPConfig(batch=lay.micro_batch, seq=lay.seq // lay.cp, hidden=lay.hidden,
                       ffn=lay.ffn or 4 * lay.hidden, heads=lay.heads, tp=lay.tp,
                       dtype=lay.act_dtype)
        variant = ("sp_regather" if lay.regather else "sp") if lay.sp else "tp"
        L, m = lay.stage_layers, lay.micro_batches
        if lay.tp_style == "torch":
            return {"tp": [(c, L * m) for c in torch_style_calls(cfg, lay.sp)]}
        return {"tp": [(c, L * m) for c in activation_calls(cfg, variant, 0)] +
                [(c, 1) for c in replicated_sync(cfg, variant, 0, biases=lay.bias, layers=L)]}

    def predicted(self, cfg: TPConfig, variant: str, rank: int, seed=None) -> list[Call]:
        c = self.coords(cfg, rank)
        return tp_calls(cfg, variant, c["tp"], self.mlp_only) + \
            ddp_calls(cfg, "ddp", c["dp"], self.mlp_only)
