"""The transformer layer as a pattern, shared by ``tp_layer``, ``tp_mlp`` (tp/tp_layer.py) and
``ddp`` (dp/ddp.py): on a ``dp x tp`` grid (TP neighbours adjacent), DP replicas summing
gradients by DDP; its configs, its step on a rank and its predicted calls.

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

import torch
from hypothesis import strategies as st

from commbench.patterns.base import Call, Pattern, Tolerance, reference_nudges
from commbench.patterns.dp.ddp_comms import buckets_of, naive_sync
from commbench.patterns.tp.layers import TPParts, replicated, shard_weights, tp_layer
from commbench.patterns.tp.model import (
    SP_VARIANTS,
    LayerWeights,
    TPConfig,
    init_weights,
    inputs,
    oracle_layer,
)
from commbench.wire.dtypes import DTYPES
from commbench.wire.ops import booked

__all__ = ["MODELS", "TOLERANCE", "LayerPattern", "activation_calls", "ddp_calls", "layer_step",
           "param_sizes", "replicated_sync", "tp_calls", "tp_configs"]

# (batch, seq, hidden, ffn) of the studies; heads = hidden / 16
MODELS = [(2, 64, 64, 256), (2, 128, 128, 512), (2, 256, 256, 1024)]
MLP_WEIGHTS = ("ln2_w", "ln2_b", "w1", "b1", "w2", "b2")

TOLERANCE = Tolerance(
    "float64: only the order of the sums over the TP and DP groups differs from the oracle "
    "(~1e-15 relative per operation). float32: as close to the float64 truth as the unsharded "
    "float32 computation of the same layer is, within 8x (its sums run in another order on each "
    "rank), plus 1e-6 x max(1, largest value); 'as close as the unsharded computation' is the "
    "largest error of four such computations, one as is and three with every weight and input "
    "moved by one ulp: a small LayerNorm amplifies rounding by orders of magnitude, and one "
    "computation's error can be small by luck of cancellation.")


@st.composite
def tp_configs(draw, world_size: int, dtypes=("float64", "float32"), tp: int | None = None):
    tp = tp or draw(st.sampled_from([d for d in range(1, world_size + 1) if world_size % d == 0]))
    dp = world_size // tp
    heads = tp * draw(st.integers(1, 2))
    return TPConfig(
        batch=dp * draw(st.integers(1, 2)), seq=tp * draw(st.integers(1, 3)),
        hidden=heads * draw(st.sampled_from([2, 4])), ffn=tp * draw(st.integers(1, 6)),
        heads=heads, vocab=tp * draw(st.integers(1, 5)), tp=tp, dp=dp,
        causal=draw(st.booleans()), dropout=draw(st.sampled_from([0.0, 0.1])),
        dtype=draw(st.sampled_from(dtypes)), bucket_bytes=draw(st.sampled_from([64, 1 << 20])))


def param_sizes(cfg: TPConfig, mlp_only: bool = False) -> dict[str, int]:
    """Elements of each weight shard a TP rank holds, in definition order."""
    h, P = cfg.hidden, cfg.tp
    hp, fp = h // P, cfg.ffn // P
    sizes = {"ln1_w": h, "ln1_b": h, "wqkv": 3 * hp * h, "bqkv": 3 * hp, "wo": h * hp, "bo": h,
             "ln2_w": h, "ln2_b": h, "w1": fp * h, "b1": fp, "w2": h * fp, "b2": h}
    return {k: sizes[k] for k in (MLP_WEIGHTS if mlp_only else sizes)}


def _tp_call(cfg: TPConfig, t: int, op: str, count: int) -> Call:
    e = DTYPES[cfg.dtype].itemsize
    return Call(op, "tp", count * e, *booked(op, cfg.tp, t, count, e))


def replicated_sync(cfg: TPConfig, variant: str, t: int, mlp_only: bool = False) -> list[Call]:
    """Under SP, the one all-reduce of the LayerNorm and row-bias gradients over TP (once per
    optimizer step, not per micro-batch)."""
    if cfg.tp == 1 or variant not in SP_VARIANTS:
        return []
    return [_tp_call(cfg, t, "all_reduce", len(replicated(mlp_only)) * cfg.hidden)]


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


def tp_calls(cfg: TPConfig, variant: str, t: int, mlp_only: bool = False) -> list[Call]:
    """Every call TP member ``t`` makes in one step of the layer (module docstring)."""
    return activation_calls(cfg, variant, t, mlp_only) + replicated_sync(cfg, variant, t, mlp_only)


def ddp_calls(cfg: TPConfig, sync: str, d: int, mlp_only: bool = False) -> list[Call]:
    """The gradient reduction of DP member ``d``: DDP's buckets or one call per parameter."""
    D = cfg.dp
    if D == 1:
        return []
    e = DTYPES[cfg.dtype].itemsize
    sizes = list(param_sizes(cfg, mlp_only).values())
    counts = [sum(sizes[i] for i in b) for b in buckets_of([n * e for n in sizes], cfg.bucket_bytes)] \
        if sync == "ddp" else sizes
    return [Call("all_reduce", "dp", n * e, *booked("all_reduce", D, d, n, e)) for n in counts]


def _local(t: torch.Tensor, cfg: TPConfig, dp_index: int, tp_index: int, seq: bool):
    """This rank's slice: its DP share of the batch, and under SP its TP share of the sequence."""
    b = cfg.batch // cfg.dp
    t = t[dp_index * b:(dp_index + 1) * b]
    if seq:
        s = cfg.seq // cfg.tp
        t = t[:, tp_index * s:(tp_index + 1) * s]
    return t.contiguous()


def layer_step(ctx, cfg: TPConfig, local: dict, variant: str, groups: dict, parts: TPParts,
               mlp_only: bool, sync: str) -> dict:
    """One layer (or MLP block) forward + backward on this rank, its gradients summed over DP by
    DDP's buckets (``sync="ddp"``) or one blocking all-reduce per parameter (``"naive"``)."""
    comm, tp, dp = ctx.comm(), groups["tp"], groups["dp"]
    names = MLP_WEIGHTS if mlp_only else tuple(local["weights"])
    params = {k: local["weights"][k].detach().requires_grad_() for k in names}
    w = LayerWeights(**{**local["weights"], **params})
    x = local["x"].detach().requires_grad_()
    start = len(ctx.ledger.entries)
    ddp = parts.reducer(list(params.values()), comm, dp, cfg.bucket_bytes) \
        if dp.size > 1 and sync == "ddp" else None
    y = tp_layer(x, w, cfg, variant, comm, tp, local["mask1"], local["mask2"], parts, mlp_only)
    y.backward(local["dy"])
    if ddp is not None:  # DP sums first: the buckets left with the gradients as they stood
        ddp.finish()
    elif dp.size > 1:
        naive_sync(list(params.values()), comm, dp)
    if variant in SP_VARIANTS:
        parts.sync_replicated(w, comm, tp, mlp_only)
    return {"y": y.detach(), "dx": x.grad, **{f"d{k}": p.grad for k, p in params.items()},
            "stats": {"ddp_issued": [i - start for i in ddp.issued_at] if ddp else []}}


class LayerPattern(Pattern):
    """Megatron's tensor-parallel layer; :class:`TPMLP` is its MLP block alone."""

    variants, naive, optimized = ("naive", "tp", "sp", "sp_regather"), "naive", "tp"
    axes = ("tp", "dp")
    Config = TPConfig
    tolerance = TOLERANCE
    parts = TPParts()
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
        dt = DTYPES[cfg.dtype]
        data = {k: inputs(cfg, seed, dt)[k].to(device) for k in ("x", "dy", "mask1", "mask2")}
        weights = init_weights(cfg, seed, dt).named()
        return {**data, "weights": {k: v.to(device) for k, v in weights.items()}}

    def shard(self, cfg: TPConfig, data: dict, groups: dict, variant: str, parts) -> dict:
        tp, dp = groups["tp"], groups["dp"]
        sp = variant in SP_VARIANTS
        w = parts.shard(LayerWeights(**data["weights"]), tp.index, tp.size, cfg)
        return {**{k: _local(data[k], cfg, dp.index, tp.index, sp)
                   for k in ("x", "dy", "mask1", "mask2")}, "weights": w.named()}

    def oracle(self, cfg: TPConfig, seed: int) -> dict:
        return oracle_layer(cfg, seed, mlp_only=self.mlp_only)

    def references(self, cfg: TPConfig, seed: int) -> list[dict]:
        if cfg.dtype == "float64":
            return []
        return [oracle_layer(cfg, seed, torch.float32, n, self.mlp_only) for n in reference_nudges()]

    def expected(self, oracle: dict, cfg: TPConfig, rank: int, variant: str) -> dict:
        at = self.coords(cfg, rank)
        t, d = at["tp"], at["dp"]
        sp = variant in SP_VARIANTS
        full = {k[1:]: v for k, v in oracle.items() if k.startswith("d") and k != "dx"}
        absent = {k: torch.zeros(v.shape) for k, v in init_weights(cfg, 0).named().items()
                  if k not in full} if self.mlp_only else {}  # the MLP block: no attention grads
        shard = shard_weights(LayerWeights(**full, **absent), t, cfg.tp, cfg).named()
        return {"y": _local(oracle["y"], cfg, d, t, sp), "dx": _local(oracle["dx"], cfg, d, t, sp),
                **{f"d{k}": shard[k] for k in full}}

    def step(self, ctx, cfg: TPConfig, local: dict, variant: str, groups: dict, parts) -> dict:
        return layer_step(ctx, cfg, local, variant, groups, parts, self.mlp_only, "ddp")

    def predicted(self, cfg: TPConfig, variant: str, rank: int, seed=None) -> list[Call]:
        c = self.coords(cfg, rank)
        return tp_calls(cfg, variant, c["tp"], self.mlp_only) + \
            ddp_calls(cfg, "ddp", c["dp"], self.mlp_only)
