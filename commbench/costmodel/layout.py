"""A whole training layout: bytes per rank per group per step, and their time on a topology.

Ranks are laid out Megatron's way, TP fastest: tp, cp, ep-within-dp, dp, pp. Per step (m
micro-batches of b sequences of s tokens; e bytes per activation element, g per gradient
element), per rank of the busiest stage, with A = b (s/cp) h activation elements per layer:

    tp   4 all-reduces of A per layer (TP+SP: 4 all-gathers + 4 reduce-scatters of A, plus one
         all-reduce of the 6h LayerNorm/bias gradients), x layers/pp x m
    cp   ring attention: 3 (cp-1) sends of K,V blocks 2 b (s/cp) (H_kv/t) d per layer;
         Ulysses: 8 all-to-alls of b (s/cp) (H/t) d (K,V at H_kv) per layer
    ep   4 all-to-alls of E C/t M per MoE layer, C = ceil(k cf T / E), T = b s/cp
    dp   the gradients of this rank's parameter shard: DDP one all-reduce; ZeRO-1 RS + AG;
         ZeRO-2 m RS + AG; ZeRO-3 2m AG + m RS (expert parameters over dp/ep ranks)
    pp   activations forward and gradients backward, A/t (SP) or A, 2 per micro-batch

The bytes use the same formulas as the ledger (:func:`commbench.wire.volume.booked`), so a small
layout that the patterns can run agrees with their ledger to the byte (tests/test_layout.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from commbench.costmodel.nccl import constants, nccl_predict
from commbench.costmodel.topology import Topology
from commbench.wire.volume import booked

__all__ = ["Layout", "dp_calls", "group_span", "predict_layout", "step_bytes"]


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
    cp: int = 1
    cp_kind: str = "ring"   # ring | ulysses
    ep: int = 1
    experts: int = 0        # 0: a dense model
    top_k: int = 2
    capacity_factor: float = 1.0
    dp: int = 1
    pp: int = 1
    zero: int = 0
    act_bytes: int = 2
    grad_bytes: int = 4

    def validate(self) -> None:
        for k in ("layers", "hidden", "heads", "vocab", "seq", "micro_batch", "micro_batches",
                  "tp", "cp", "ep", "dp", "pp", "act_bytes", "grad_bytes"):
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
        if self.dp % self.ep:
            raise ValueError(f"ep={self.ep}: must divide dp={self.dp} (experts shard the DP ranks)")
        if self.experts and self.experts % self.ep:
            raise ValueError(f"experts={self.experts}: must be a multiple of ep={self.ep}")
        if self.ep > 1 and not self.experts:
            raise ValueError(f"ep={self.ep}: needs experts > 0")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero={self.zero}: must be 0, 1, 2 or 3")
        if not self.capacity_factor > 0:
            raise ValueError(f"capacity_factor={self.capacity_factor}: must be > 0")

    @property
    def ranks(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def as_dict(self) -> dict:
        return asdict(self)


def _calls(lay: Layout) -> dict[str, list[tuple[str, int, int, int]]]:
    """group -> [(op, elements per call, bytes per element, calls per step)]."""
    t, m, L = lay.tp, lay.micro_batches, lay.layers // lay.pp
    h, d = lay.hidden, lay.hidden // lay.heads
    kv, f = lay.kv_heads or lay.heads, lay.ffn or 4 * lay.hidden
    tokens = lay.micro_batch * lay.seq // lay.cp
    A, e = tokens * h, lay.act_bytes
    out: dict[str, list] = {g: [] for g in ("tp", "cp", "ep", "dp", "edp", "pp")}
    if t > 1:
        if lay.sp:
            out["tp"] += [("all_gather", A // t, e, 4 * L * m), ("reduce_scatter", A, e, 4 * L * m),
                          ("all_reduce", 6 * h, lay.grad_bytes, L)]
        else:
            out["tp"].append(("all_reduce", A, e, 4 * L * m))
    if lay.cp > 1:
        if lay.cp_kind == "ring":
            block = 2 * tokens * max(kv // t, 1) * d
            out["cp"].append(("send", block, e, 3 * (lay.cp - 1) * L * m))
        else:
            out["cp"] += [("all_to_all_h", tokens * (lay.heads // t) * d, e, 4 * L * m),
                          ("all_to_all_kv", tokens * max(kv // t, 1) * d, e, 4 * L * m)]
    moe_layers = L if lay.experts else 0
    if lay.experts and lay.ep > 1:
        C = -(-math.ceil(lay.top_k * lay.capacity_factor * tokens / lay.experts) // t) * t
        out["ep"].append(("all_to_all", lay.experts * (C // t) * h, e, 4 * moe_layers * m))
    dense = L * (2 * h * h + 2 * h * kv * d + 4 * h + (0 if lay.experts else 2 * h * f)) // t \
        + L * h * lay.experts + (lay.vocab * h // t if lay.pp == 1 else 0)
    expert = moe_layers * (lay.experts // lay.ep) * 2 * h * f // t
    for group, n, psi in (("dp", lay.dp * lay.cp, dense), ("edp", lay.dp // lay.ep * lay.cp, expert)):
        if n > 1 and psi:
            out[group] += dp_calls(psi, n, lay.zero, m, lay.grad_bytes)
    if lay.pp > 1:
        out["pp"].append(("send", A // t if lay.sp else A, e, 2 * m))
    return {k: v for k, v in out.items() if v}


def dp_calls(psi: int, n: int, zero: int, m: int, g: int) -> list[tuple[str, int, int, int]]:
    """The data-parallel calls per step for ``psi`` gradient elements on ``n`` ranks (ZeRO
    shards padded to a multiple of n), m micro-batches, g bytes per element."""
    padded = -(-psi // n) * n
    return {0: [("all_reduce", psi, g, 1)],
            1: [("reduce_scatter", padded, g, 1), ("all_gather", padded // n, g, 1)],
            2: [("reduce_scatter", padded, g, m), ("all_gather", padded // n, g, 1)],
            3: [("all_gather", padded // n, g, 2 * m), ("reduce_scatter", padded, g, m)]}[zero]


def _size(lay: Layout, group: str) -> int:
    return {"tp": lay.tp, "cp": lay.cp, "ep": lay.ep, "dp": lay.dp * lay.cp,
            "edp": lay.dp // lay.ep * lay.cp, "pp": lay.pp}[group]


def _stride(lay: Layout, group: str) -> int:
    return {"tp": 1, "cp": lay.tp, "ep": lay.tp * lay.cp, "dp": lay.tp,
            "edp": lay.tp * lay.cp * lay.ep, "pp": lay.tp * lay.cp * lay.dp}[group]


def group_span(size: int, stride: int, per_node: int) -> tuple[int, int]:
    """(nodes, members per node) of a group of ``size`` ranks ``stride`` apart."""
    if stride >= per_node:
        return size, 1
    here = min(size, max(per_node // stride, 1))
    return -(-size // here), here


def _bytes(op: str, n: int, count: int, e: int) -> int:
    if op == "send":
        return count * e
    if op.startswith("all_to_all"):
        return (n - 1) * (count // n) * e
    return booked(op, n, 0, count, e)[0]


def _time_us(op: str, n: int, count: int, e: int, topo: Topology, span, version: str):
    nodes, here = span
    if op in ("send",) or op.startswith("all_to_all"):
        c = constants(version)
        link = "pci" if topo.intra == "pci" else "nvlink"
        nv = topo.nvlink_links * c["nvlink_bw_per_link"][topo.arch] if link == "nvlink" \
            else topo.pci_GBps
        nic = topo.nics_per_node * topo.nic_GBps / topo.gpus_per_node
        sent = _bytes(op, n, count, e)
        cross = sent if op == "send" and nodes > 1 else sent * (n - here) / max(n - 1, 1)
        lat = c["base_lat_us"]["ring"][2] + c["hw_lat_us"]["net" if nodes > 1 else link]["ring"][2]
        return lat + (sent - cross) / (1000 * nv) + (cross / (1000 * nic) if cross else 0), "p2p"
    sub = topo.part(nodes, here)
    choice = nccl_predict(op, count * n * e if op == "all_gather" else count * e, sub, version)
    return choice.time_us, f"{choice.algo}/{choice.proto}"


def step_bytes(calls: list[tuple[str, int, int, int]], n: int) -> int:
    """Bytes one rank sends per step for ``calls`` on a group of ``n``."""
    return sum(k * _bytes(op, n, count, e) for op, count, e, k in calls)


def predict_layout(lay: Layout, topo: Topology, version: str = "2.30.7") -> list[dict]:
    """Per group: calls, bytes sent per rank per step, predicted time per step, NCCL's pick."""
    lay.validate()
    if lay.ranks > topo.ranks:
        raise ValueError(f"layout needs {lay.ranks} ranks (tp*cp*dp*pp); {topo.name} has "
                         f"{topo.ranks}: give more nodes")
    rows = []
    for group, calls in _calls(lay).items():
        n = _size(lay, group)
        span = group_span(n, _stride(lay, group), topo.gpus_per_node)
        sent = secs = 0.0
        picks = set()
        for op, count, e, k in calls:
            sent += k * _bytes(op, n, count, e)
            t, pick = _time_us(op, n, count, e, topo, span, version)
            secs += k * t
            picks.add(f"{op.split('_h')[0].split('_kv')[0]}: {pick}")
        rows.append({"group": group, "size": n, "nodes": span[0], "per_node": span[1],
                     "calls": sum(k for *_, k in calls), "bytes_per_rank": int(sent),
                     "time_ms": secs / 1e3, "nccl": sorted(picks)})
    return rows
