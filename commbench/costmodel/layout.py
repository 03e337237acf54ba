"""A whole training layout: bytes per rank per group per step, and their time on a topology.

Ranks are laid out Megatron's way, TP fastest: tp, cp, ep-within-dp, dp, pp. Per step (m
micro-batches of b sequences of s tokens, e bytes per activation element, g per gradient
element), per rank of the busiest stage. The calls come from the patterns, each adding its own
(:meth:`~commbench.patterns.base.Pattern.layout_calls`; the layout names none of them), so that
what the layout predicts is what the code moves:

    tp   the TP layer's activation calls (``tp_layer``: f/g, or SP all-gathers and reduce-scatters,
         with Megatron's backward re-gather when ``regather``) x layers/pp x m, plus under SP one
         all-reduce per step of every layer's LayerNorm gradients (and the row-parallel
         biases', with ``bias``), flattened as megatron-core's ``finalize_model_grads`` does;
         MoE layers add the
         ``moe`` pattern's TP calls (capacity all-gathers, the experts' f and g); with pp = 1 the
         ``vocab`` pattern's embedding, head and cross-entropy (``loss``: Megatron's 3
         all-reduces, fused 2, or the naive all-gathered logits) x m; with pp > 1 the head and
         the loss of the last stage, the busiest (the first stage's embedding, and Megatron's
         all-reduce of tied embeddings between the two, are not priced)
    cp   ``ring_attention`` (K/V blocks round the ring) or ``ulysses`` (all-to-alls) per layer,
         with H/t query and max(H_kv/t, 1) KV heads
    ep   the ``moe`` pattern's capacity-layout calls on the EP group per MoE layer, C = ceil(k cf
         T / E), T = b s/cp
    dp   ZeRO's :func:`~commbench.patterns.dp.zero.stage_calls` for this rank's parameter shard
         (expert parameters over the dp/ep ranks holding the same experts: ``edp``), or a
         library's (``impl``, :mod:`flavours`); with ``dp_replicate`` > 1, hybrid sharding:
         ZeRO-3 (or FSDP2) on ``dp_shard`` and the gradient shard all-reduced on
         ``dp_replicate`` (per step; FSDP2's, per micro-batch)
    pp   the ``pp`` pattern's calls of its busiest stage, m micro-batches of A/t (SP) or A
    mp, world  megatron-core's optimizer's all-reduce of the gradients' norm (``grad_norm``),
         one float32 element per step: on the model-parallel ranks (tp x pp), under the
         distributed optimizer (``zero`` >= 1) on every rank

Bytes are what those calls send; time is NCCL's model of each collective (:mod:`nccl`) and a
latency plus bytes over the link for point-to-point and all-to-all. A small layout that the
patterns can run agrees with their ledger to the byte (tests/test_layout.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from commbench.costmodel.flavours import (
    DDP_CAP,
    DS_BUCKET,
    DS_PERSIST,
    DS_PREFETCH,
    FIRST_BUCKET,
    NORMS,
    ddp_buckets,
    deepspeed_calls,
    ds_config,
    fsdp2_calls,
    torch_tp_arrival,
)
from commbench.costmodel.layout_config import Layout
from commbench.costmodel.pricing import call_time_us, group_span
from commbench.costmodel.topology import Topology
from commbench.ops import booked
from commbench.patterns.base import Call
from commbench.patterns.dp.zero import dp_calls
from commbench.patterns.registry import PATTERNS

__all__ = ["GRADIENT_GROUPS", "GROUPS", "Layout", "Priced", "call_time_us", "dp_calls",
           "group_ranks", "group_span", "layout_axes", "predict_layout", "step_bytes"]


@dataclass(frozen=True, slots=True)
class Priced(Call):
    """A call whose elements are not the axis's width (DeepSpeed's float64 gradient norm)."""

    itemsize: int = 0


# the groups a layout's calls run on, in the order its table lists them; those that carry
# gradients and parameters (in grad_bytes) rather than activations (in act_bytes)
GROUPS = ("tp", "cp", "ep", "dp", "dp_shard", "dp_replicate", "edp", "pp", "mp", "world")
GRADIENT_GROUPS = ("dp", "dp_shard", "dp_replicate", "edp")
_HYBRID = ("dp_shard", "dp_replicate")
_NORM = ("mp", "world")  # the groups of megatron-core's gradient norm


def _norm_axis(lay: Layout) -> str:
    """The group the gradients' norm is all-reduced on beside the data-parallel group:
    megatron-core's optimizer, under the distributed optimizer (``zero`` >= 1) every rank,
    else the model-parallel ranks (none with ``grad_norm`` off); DeepSpeed's ZeRO, told the
    grid through its ``mpu``, sums its data-parallel norm over the model-parallel ranks too,
    whatever ``grad_norm`` says. "" when the layout makes no such call."""
    if lay.impl == "deepspeed":
        return "mp" if lay.tp * lay.pp > 1 else ""
    if lay.impl != "megatron" or not lay.grad_norm:
        return ""
    return "world" if lay.zero else "mp"


def layout_axes(lay: Layout) -> tuple[str, ...]:
    """The groups ``lay`` has: with hybrid sharding (``dp_replicate`` > 1) its shard and
    replicate groups in place of the one dp group; the group of megatron-core's gradient norm
    when the layout makes it (:func:`_norm`)."""
    hybrid = lay.dp_replicate > 1
    norm = _norm_axis(lay)
    return tuple(g for g in GROUPS if ((g in _HYBRID) == hybrid or g not in (*_HYBRID, "dp"))
                 and (g not in _NORM or g == norm))


def _calls(lay: Layout, stage: int | None = None) -> dict[str, list[tuple[Call, int]]]:
    """group -> [(a call of a rank of ``stage``, times per step)] (the module docstring);
    ``stage`` None: the busiest. Every pattern adds its own (:meth:`Pattern.layout_calls`), the
    libraries' data parallelism its flavour's (:func:`_flavour_calls`)."""
    out: dict[str, list] = {g: [] for g in GROUPS}
    for pattern in PATTERNS.values():
        for group, calls in pattern.layout_calls(lay, stage).items():
            out[group] += calls
    for group, calls in _flavour_calls(lay).items():
        out[group] += calls
    return {k: v for k, v in out.items() if v}


def _flavour_calls(lay: Layout) -> dict[str, list[tuple[Call, int]]]:
    """A library's data-parallel calls (``impl``; :mod:`flavours`) on the dense parameters
    (the flavours take dense models only): FSDP2's per layer and root, with ``dp_replicate`` > 1
    its hybrid sharding (the shard group's calls, then each shard's gradient all-reduced over
    the replicas per micro-batch, as ``fully_shard`` on a 2-D mesh does); DeepSpeed's ZeRO,
    and with model parallelism its norm summed over the model-parallel ranks; DDP's
    buckets."""
    if lay.impl == "megatron":
        return _norm(lay)
    m, g, L, R = lay.micro_batches, lay.grad_bytes, lay.stage_layers, lay.dp_replicate
    layer, emb = lay.layer_params, lay.root_params
    n = lay.dp // R * lay.cp
    group = "dp_shard" if R > 1 else "dp"
    out = {}
    if n > 1 and lay.dense_params:
        if lay.impl == "fsdp2":  # layers and root
            calls = fsdp2_calls(layer, L, emb, n, m, g, not lay.no_reshard, lay.param_bytes,
                                lay.no_sync)
        elif lay.impl == "deepspeed":
            # a job's ds_config: DeepSpeed's own defaults where it says nothing; without one,
            # every parameter sharded (a model of real size, the flavour's stated assumption)
            ds = ds_config(lay.ds_config) if lay.ds_config else \
                {"stage3_param_persistence_threshold": 0}
            calls = deepspeed_calls(lay.zero, lay.dense_params, n, m, g, lay.stage_tensors,
                                    ds.get("reduce_bucket_size", DS_BUCKET), lay.stage_modules,
                                    ds.get("stage3_prefetch_bucket_size", DS_PREFETCH),
                                    ds.get("stage3_param_persistence_threshold", DS_PERSIST))
        else:  # torch-ddp: the embedding first, then the layers
            calls = _ddp_calls(lay)
        out[group] = _group(calls, group, n, g)
    if lay.impl == "deepspeed":  # its norm over the model-parallel ranks
        out.update(_norm(lay))
    if R > 1:  # fsdp2 only (validate); accumulating, once per step
        r = 1 if lay.no_sync else m
        shards = [("all_reduce", layer // n, g, L * r)] + ([("all_reduce", emb // n, g, r)]
                                                           if emb else [])
        out["dp_replicate"] = _group(shards, "dp_replicate", R, g)
    return out


def _ddp_calls(lay: Layout) -> list[tuple[str, int, int, int]]:
    """DistributedDataParallel's calls per step for a stage's tensors (:func:`ddp_buckets`):
    one all-reduce per bucket per micro-batch, or per step when the others accumulate under
    ``no_sync()``; with ``find_unused_parameters`` the buckets stay as first cut and each
    synchronised backward also all-reduces the bitmap of parameters used, one int32 each
    (with ``static_graph`` too, only in the first iteration: the buckets are rebuilt). With
    torch's TP (tp > 1) the rebuilt buckets follow :func:`torch_tp_arrival`, every module but
    the LayerNorms sharded (the LayerNorms too under SP)."""
    m, g = 1 if lay.no_sync else lay.micro_batches, lay.grad_bytes
    cap = int(lay.bucket_mb * 2**20) if lay.bucket_mb else DDP_CAP
    first = cap if lay.bucket_mb else FIRST_BUCKET
    rebuilt = lay.static_graph or not lay.find_unused
    params, arrival = lay.stage_tensors, None
    if lay.tp > 1:
        modules, root, n = lay.stage_modules, 1 if lay.root_params else 0, len(lay.layer_modules)
        arrival = torch_tp_arrival(modules, [i < root or lay.sp or (i - root) % n not in NORMS
                                             for i in range(len(modules))])
    buckets = ddp_buckets(params, g, cap, first, rebuilt, arrival)
    calls = [("all_reduce", b, g, m * k) for b, k in sorted(Counter(buckets).items())]
    return calls + ([] if rebuilt else [("all_reduce", len(params), 4, m)])


def _norm(lay: Layout) -> dict[str, list[tuple[Call, int]]]:
    """The all-reduce of the gradients' norm beside the data-parallel group, one element per
    step on :func:`_norm_axis`'s group. megatron-core 0.16's optimizer: float32
    (``get_grad_norm_fp32``); ``get_megatron_optimizer`` returns a ChainedOptimizer, whose
    step takes the norm whatever ``clip_grad`` says (a lone optimizer takes it only with
    ``clip_grad`` > 0). DeepSpeed's ZeRO: its data-parallel norm summed over the
    model-parallel ranks, in the width of that norm (float64 in stage 3)."""
    axis = _norm_axis(lay)
    n = len(group_ranks(lay, axis)) if axis else 1
    if n < 2:
        return {}
    w = 8 if lay.impl == "deepspeed" and lay.zero == 3 else 4
    return {axis: [(Priced("all_reduce", axis, w, *booked("all_reduce", n, 0, 1, w), w), 1)]}


def _group(calls: list[tuple[str, int, int, int]], axis: str, n: int, width: int = 0
           ) -> list[tuple[Call, int]]:
    """(op, elements, bytes each, times) as priced calls on ``axis``; a call in another width
    than ``width`` says its own."""
    return [(Priced(op, axis, count * e, *booked(op, n, 0, count, e), e) if width and e != width
             else Call(op, axis, count * e, *booked(op, n, 0, count, e)), k)
            for op, count, e, k in calls]


# the coordinates each axis's group varies, of (tp, cp, ep, dp_shard/ep, dp_replicate, pp), TP
# fastest (without hybrid sharding, dp_replicate is 1 and dp_shard is dp)
_VARIES = {"tp": (0,), "cp": (1,), "ep": (2,), "dp": (1, 2, 3, 4), "edp": (1, 3, 4),
           "dp_shard": (1, 2, 3), "dp_replicate": (4,), "pp": (5,), "mp": (0, 5),
           "world": (0, 1, 2, 3, 4, 5)}


def group_ranks(lay: Layout, axis: str, rank: int = 0) -> tuple[int, ...]:
    """The ranks of ``rank``'s group on ``axis``: those that differ from it only in the axis's
    coordinates. dp: the cp, ep and dp ranks (dense gradients reduce over cp too); edp: the cp
    and dp/ep ranks holding the same experts (two strides when cp > 1 and ep > 1)."""
    dims = (lay.tp, lay.cp, lay.ep, lay.dp // lay.ep // lay.dp_replicate, lay.dp_replicate,
            lay.pp)
    coords, r = [], rank
    for d in dims:
        coords.append(r % d)
        r //= d
    out = [0]
    for k in range(len(dims) - 1, -1, -1):  # rank = c0 + d0 * (c1 + d1 * (...))
        values = range(dims[k]) if k in _VARIES[axis] else (coords[k],)
        out = [base * dims[k] + v for base in out for v in values]
    return tuple(sorted(out))


def step_bytes(calls: list[tuple[str, int, int, int]], n: int) -> int:
    """Bytes member 0 sends per step for ``calls`` (op, elements, bytes each, times) on ``n``."""
    return sum(k * c.sent for c, k in _group(calls, "dp", n))


def predict_layout(lay: Layout, topo: Topology, version: str = "2.30.7") -> list[dict]:
    """Per group: calls, bytes sent per rank per step, predicted time per step, NCCL's pick."""
    lay.validate()
    if lay.ranks > topo.ranks:
        raise ValueError(f"layout needs {lay.ranks} ranks (tp*cp*dp*pp); {topo.name} has "
                         f"{topo.ranks}: give more nodes")
    rows = []
    for group, calls in _calls(lay).items():
        ranks = group_ranks(lay, group)
        n, span = len(ranks), group_span(ranks, topo.gpus_per_node)
        sent = secs = 0.0
        picks = set()
        for call, k in calls:
            sent += k * call.sent
            t, pick = call_time_us(call, n, topo, span, version)
            secs += k * t
            if call.op not in ("irecv", "recv"):
                picks.add(f"{call.op}: {pick}")
        rows.append({"group": group, "size": n, "nodes": span[0], "per_node": span[1],
                     "calls": sum(k for *_, k in calls), "bytes_per_rank": int(sent),
                     "time_ms": secs / 1e3, "nccl": sorted(picks)})
    return rows
