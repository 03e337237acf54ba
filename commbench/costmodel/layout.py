"""A whole training layout: bytes per rank per group per step, and their time on a topology.

Ranks are laid out Megatron's way, TP fastest: tp, cp, ep-within-dp, dp, pp. Per step (m
micro-batches of b sequences of s tokens, e bytes per activation element, g per gradient
element), per rank of the busiest stage. The calls come from the patterns, so that what the
layout predicts is what the code moves:

    tp   the TP layer's activation calls (``tp_layer``: f/g, or SP all-gathers and reduce-scatters,
         with Megatron's backward re-gather when ``regather``) x layers/pp x m, plus under SP one
         all-reduce of the LayerNorm and bias gradients per layer per step; MoE layers add the
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
         (expert parameters over the dp/ep ranks holding the same experts: ``edp``)
    pp   the ``pp`` pattern's calls of its busiest stage, m micro-batches of A/t (SP) or A

Bytes are what those calls send; time is NCCL's model of each collective (:mod:`nccl`) and a
latency plus bytes over the link for point-to-point and all-to-all. A small layout that the
patterns can run agrees with their ledger to the byte (tests/test_layout.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from commbench.costmodel.flavours import (
    ddp_buckets,
    deepspeed_calls,
    fsdp2_calls,
    layer_params,
)
from commbench.costmodel.layout_config import DTYPE, Layout
from commbench.costmodel.nccl import constants, nccl_predict
from commbench.costmodel.topology import Topology
from commbench.ops import OPS, booked
from commbench.patterns.base import Call
from commbench.patterns.dp.zero import stage_calls
from commbench.patterns.moe.configs import MoEConfig
from commbench.patterns.moe.moe import moe_calls
from commbench.patterns.pp.configs import PPConfig
from commbench.patterns.registry import get
from commbench.patterns.seq.configs import AttnConfig
from commbench.patterns.seq.ring_attention import ring_calls
from commbench.patterns.seq.ulysses import ulysses_calls
from commbench.patterns.tp.configs import TPConfig
from commbench.patterns.tp.layer_pattern import activation_calls, replicated_sync
from commbench.patterns.tp.vocab import VocabConfig

__all__ = ["Layout", "Priced", "call_time_us", "dp_calls", "group_ranks", "group_span",
           "predict_layout", "step_bytes"]


@dataclass(frozen=True, slots=True)
class Priced(Call):
    """A call whose elements are not the axis's width (DeepSpeed's float64 gradient norm)."""

    itemsize: int = 0


def _calls(lay: Layout, stage: int | None = None) -> dict[str, list[tuple[Call, int]]]:
    """group -> [(a call of a rank of ``stage``, times per step)] (the module docstring);
    ``stage`` None: the busiest. The pp calls are the stage's own; the head and loss are the
    last stage's (a stage priced apart from the last takes none: audit it with loss=none)."""
    t, m, L = lay.tp, lay.micro_batches, lay.layers // lay.pp
    h, d = lay.hidden, lay.hidden // lay.heads
    kv, f = lay.kv_heads or lay.heads, lay.ffn or 4 * lay.hidden
    tokens = lay.micro_batch * lay.seq // lay.cp
    act = DTYPE[lay.act_bytes]
    out: dict[str, list] = {g: [] for g in ("tp", "cp", "ep", "dp", "edp", "pp")}
    tp_cfg = TPConfig(batch=lay.micro_batch, seq=lay.seq // lay.cp, hidden=h, ffn=f,
                      heads=lay.heads, tp=t, dtype=act)
    variant = ("sp_regather" if lay.regather else "sp") if lay.sp else "tp"
    out["tp"] += [(c, L * m) for c in activation_calls(tp_cfg, variant, 0)]
    out["tp"] += [(c, L) for c in replicated_sync(tp_cfg, variant, 0)]
    if lay.loss != "none" and t > 1:  # the vocab pattern's embedding, head, loss
        head = VocabConfig(batch=lay.micro_batch, seq=lay.seq // lay.cp, hidden=h, vocab=lay.vocab,
                           tp=t, sequence_parallel=lay.sp, dtype=act)
        vocab = [c for c in get("vocab").predicted(head, lay.loss, 0) if c.axis == "tp"]
        if lay.pp > 1:  # the last stage, the busiest: the head's half and the loss
            acts = 4 if lay.sp else 2  # embedding and head: RS+AG each (SP), or one all-reduce
            vocab = vocab[:acts // 2] + vocab[acts:] if stage in (None, lay.pp - 1) else []
        out["tp"] += [(c, m) for c in vocab]
    if lay.cp > 1:
        attn = AttnConfig(batch=lay.micro_batch, seq=lay.seq, heads=lay.heads // t,
                          kv_heads=max(kv // t, 1), head_dim=d, sp=lay.cp, dtype=act)
        calls = {"ring": ring_calls, "ulysses": ulysses_calls}[lay.cp_kind]
        out["cp"] += [(c, L * m) for c in calls(attn, 0)]
    moe_layers = L if lay.experts else 0
    if lay.experts and (lay.ep > 1 or t > 1):
        moe = MoEConfig(tokens=(tokens,) * lay.ep, model=h, ffn=f, experts=lay.experts,
                        top_k=lay.top_k, capacity_factor=lay.capacity_factor, ep=lay.ep, tp=t,
                        check_routing=False, dtype=act)
        for c in moe_calls(moe, "capacity", 0):
            if c.axis in ("ep", "tp"):
                out[c.axis].append((c, moe_layers * m))
    layer = (2 * h * h + 2 * h * kv * d + 4 * h + (0 if lay.experts else 2 * h * f)) // t
    emb = lay.vocab * h // t if lay.pp == 1 and lay.loss != "none" else 0  # embedding, head
    dense = L * layer + L * h * lay.experts + emb
    expert = moe_layers * (lay.experts // lay.ep) * 2 * h * f // t
    g = lay.grad_bytes
    for group, n, psi in (("dp", lay.dp * lay.cp, dense), ("edp", lay.dp // lay.ep * lay.cp, expert)):
        if n < 2 or not psi:
            continue
        if lay.impl == "fsdp2":  # dense only (validate): layers and root
            calls = fsdp2_calls(layer, L, emb, n, m, g, not lay.no_reshard)
        elif lay.impl == "deepspeed":
            calls = deepspeed_calls(lay.zero, psi, n, m, g)
        elif lay.impl == "torch-ddp":  # dense only: the embedding first, then the layers
            params = ([emb] if emb else []) + layer_params(h, kv * d, f, t) * L
            buckets = ddp_buckets(params, g, int(lay.bucket_mb * 2**20))
            calls = [("all_reduce", b, g, m * k) for b, k in sorted(Counter(buckets).items())]
        else:
            calls = dp_calls(psi, n, lay.zero, m, g)
        out[group] += _group(calls, group, n, g)
    if lay.pp > 1:
        rows = tokens // t if lay.sp else tokens
        pp = PPConfig(stages=lay.pp, layers=lay.pp, hidden=h, batch=rows * m, micro=m, dtype=act)
        pattern = get("pp")
        if stage is None:
            stage = max(range(lay.pp), key=lambda r: sum(
                c.sent for c in pattern.predicted(pp, "1f1b", r)))
        out["pp"] += [(c, 1) for c in pattern.predicted(pp, "1f1b", stage)]
    return {k: v for k, v in out.items() if v}


def _group(calls: list[tuple[str, int, int, int]], axis: str, n: int, width: int = 0
           ) -> list[tuple[Call, int]]:
    """(op, elements, bytes each, times) as priced calls on ``axis``; a call in another width
    than ``width`` says its own."""
    return [(Priced(op, axis, count * e, *booked(op, n, 0, count, e), e) if width and e != width
             else Call(op, axis, count * e, *booked(op, n, 0, count, e)), k)
            for op, count, e, k in calls]


def dp_calls(psi: int, n: int, zero: int, m: int, g: int) -> list[tuple[str, int, int, int]]:
    """The data-parallel calls per step, (op, elements, bytes per element, calls), for ``psi``
    gradient elements on ``n`` ranks: ZeRO's stage calls of one flat vector, in ``g``-byte
    gradients (the layout's parameters travel in the same width)."""
    counts: dict[tuple[str, int], int] = {}
    for op, count, _ in stage_calls(zero, [psi], n, m):
        counts[op, count] = counts.get((op, count), 0) + 1
    return [(op, count, g, k) for (op, count), k in counts.items()]


# the coordinates each axis's group varies, of (tp, cp, ep, dp/ep, pp), TP fastest
_VARIES = {"tp": (0,), "cp": (1,), "ep": (2,), "dp": (1, 2, 3), "edp": (1, 3), "pp": (4,)}


def group_ranks(lay: Layout, axis: str, rank: int = 0) -> tuple[int, ...]:
    """The ranks of ``rank``'s group on ``axis``: those that differ from it only in the axis's
    coordinates. dp: the cp, ep and dp ranks (dense gradients reduce over cp too); edp: the cp
    and dp/ep ranks holding the same experts (two strides when cp > 1 and ep > 1)."""
    dims = (lay.tp, lay.cp, lay.ep, lay.dp // lay.ep, lay.pp)
    coords, r = [], rank
    for d in dims:
        coords.append(r % d)
        r //= d
    out = [0]
    for k in range(len(dims) - 1, -1, -1):  # rank = c0 + d0 * (c1 + d1 * (...))
        values = range(dims[k]) if k in _VARIES[axis] else (coords[k],)
        out = [base * dims[k] + v for base in out for v in values]
    return tuple(sorted(out))


def group_span(ranks: tuple[int, ...], per_node: int) -> tuple[int, int]:
    """(nodes, most members on one node) of a group of ``ranks``, ``per_node`` ranks a node."""
    on: dict[int, int] = {}
    for r in ranks:
        on[r // per_node] = on.get(r // per_node, 0) + 1
    return len(on), max(on.values())


P2P = ("isend", "send", "recv", "irecv")


def call_time_us(call: Call, n: int, topo: Topology, span, version: str):
    """NCCL's model for a collective; latency plus bytes over the link for point-to-point and
    all-to-all (a receive costs nothing more than its send)."""
    nodes, here = span
    op, sent = call.op, call.sent
    if op in ("irecv", "recv"):
        return 0.0, "p2p"
    if op in P2P or op == "all_to_all":
        c = constants(version)
        link = "pci" if topo.intra == "pci" else "nvlink"
        nv = topo.nvlink_links * c["nvlink_bw_per_link"][topo.arch] if link == "nvlink" \
            else topo.pci_GBps
        nic = topo.nics_per_node * topo.nic_GBps / topo.gpus_per_node
        cross = sent if op in P2P and nodes > 1 else sent * (n - here) / max(n - 1, 1)
        lat = c["base_lat_us"]["ring"][2] + c["hw_lat_us"]["net" if nodes > 1 else link]["ring"][2]
        return lat + (sent - cross) / (1000 * nv) + (cross / (1000 * nic) if cross else 0), "p2p"
    sub = topo.part(nodes, here)
    nbytes = call.size * n if OPS[op].input == "block" else call.size  # nccl-tests' size
    choice = nccl_predict(op, nbytes, sub, version)
    return choice.time_us, f"{choice.algo}/{choice.proto}"


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
