"""NCCL's own tuning model, rebuilt from its published source (``ncclTopoTuneModel``,
``ncclTopoGetAlgoTime``, ``topoGetAlgoInfo``; constants in ``data/nccl-<version>.json``).

For every enabled (algorithm, protocol) pair NCCL computes

    time_us = latency + nBytes / (1000 * algBw)

and runs the fastest; ``nBytes`` is the whole buffer (all-gather / reduce-scatter: n x the
per-rank block). Algorithms Ring, Tree, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT;
protocols LL, LL128, Simple. Latency = base + per-hop hardware latency x steps (intra-node:
NVLink or PCI; inter-node: NET); bandwidth = channels x per-channel graph bandwidth, capped per
protocol, then turned into algorithm bandwidth (Ring: n / nsteps; Tree, CollNet: 1/2).
Not modeled: the lowering of channel and thread counts for tiny messages, tuner plugins, FP8;
the NVLS-tree chunk only in a calibrated topology's pipeline fill (:func:`nvls_tree_chunk`).
All-to-all and send/recv, which NCCL runs as grouped point-to-point outside this model, come from
:mod:`commbench.costmodel.p2p` as one choice, ``p2p/Simple``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from importlib import resources

from commbench import ops as op_records
from commbench.costmodel.p2p import P2P_OPS, p2p_time
from commbench.costmodel.topology import Graph, Topology, graphs

__all__ = ["ALGOS", "PROTOS", "Choice", "constants", "hierarchical_all_reduce", "nccl_choices",
           "nccl_predict", "nccl_table", "nccl_tables", "nccl_times", "nvls_heads", "nvls_tree_chunk",
           "versions"]

ALGOS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOS = ("LL", "LL128", "Simple")
# the collectives NCCL's tuning model prices: those whose record says NCCL's ring (Op.nccl)
OPS = tuple(o.name for o in op_records.OPS.values() if o.nccl)


@cache
def constants(version: str = "2.30.7") -> dict:
    name = f"nccl-{version}.json"
    base = resources.files("commbench.costmodel") / "data"
    if not (base / name).is_file():
        raise ValueError(f"NCCL version {version!r}: no constants; known: {', '.join(versions())}")
    return json.loads((base / name).read_text())


def versions() -> list[str]:
    base = resources.files("commbench.costmodel") / "data"
    return sorted(p.name[5:-5] for p in base.iterdir() if p.name.startswith("nccl-"))


@dataclass(frozen=True)
class Choice:
    algo: str
    proto: str
    time_us: float
    lat_us: float
    bus_bw: float   # GB/s, nccl-tests' busbw convention
    alg_bw: float


def _node_index(nodes: int) -> int:
    return 0 if nodes == 1 else (1 if nodes == 2 else 2)


# per op: the ring's steps over n ranks (NCCL's nsteps), and of those, the steps per node
# boundary that cross the network (0: a chain, priced per step)
_STEPS = {op: op_records.OPS[op].nccl for op in OPS}
# per algorithm: the ops NCCL runs with it (ring: every op)
_RUNS = {"tree": {"all_reduce"}, "collnet_direct": {"all_reduce"}, "collnet_chain": {"all_reduce"},
         "nvls": {"all_reduce", "all_gather", "reduce_scatter"},
         "nvls_tree": {"all_reduce", "all_gather", "reduce_scatter"},
         "pat": {"all_gather", "reduce_scatter"}, "ring": set(OPS)}


def _nsteps(op: str, n: int) -> int:
    return _STEPS[op][0](n)


def _bus_bw(op, algo, p, topo: Topology, g: Graph, c: dict, ppn: int) -> float:
    arch, ni, nodes = topo.arch, _node_index(topo.nodes), topo.nodes
    per = g.bw_intra if nodes <= 2 or algo.startswith("collnet") else g.bw_inter
    bus = g.channels * per
    ll_row = arch if nodes == 1 else ("volta" if topo.cpu_vendor == "intel" else "ampere")
    ll_max = c["ll_max_bw"][ll_row][ni]
    if algo == "ring":
        return [min(ll_max, 0.5 * bus),
                min(0.92 * bus, g.channels * c["per_ch_max_ring_ll128_bw"][arch][ni]), bus][p]
    if algo == "tree":
        return [min(bus / 3.8, ll_max),
                min(bus * (7 / 9 if nodes == 1 else 120 / 128),
                    g.channels * c["per_ch_max_tree_ll128_bw"][arch][ni]),
                min(0.92 * bus, g.channels * c["per_ch_max_tree_bw"][arch][ni])][p]
    if algo in ("nvls", "nvls_tree"):
        intra = g.bw_intra * c["nvls_efficiency"][arch] * (g.channels - 1) / g.channels
        intra *= 2.0 if op == "all_reduce" else (ppn - 1) / ppn
        if nodes == 1:
            return g.channels * intra
        inter = g.bw_inter * (2.0 if algo == "nvls_tree" and nodes <= 2 else 1.0)
        bw = min(intra, inter)
        if algo == "nvls_tree":
            bw = min(bw, c["per_ch_max_nvls_tree_bw"][arch][ni])
        return g.channels * bw
    if algo == "pat":
        return 0.75 * bus
    return bus  # collnet


def _enabled(op: str, algo: str, p: int, topo: Topology, n: int, ppn: int, c: dict) -> bool:
    if algo not in c["base_lat_us"] or op not in _RUNS[algo]:
        return False
    if algo in ("nvls", "nvls_tree"):
        if p != 2 or not topo.nvls or (algo == "nvls_tree") != (topo.nodes > 1):
            return False
        if algo == "nvls" and topo.nodes > 1 and not topo.collnet:
            return False
        return op == "all_reduce" or ppn <= c["max_nvls_arity"]  # all-gather, reduce-scatter
    if algo.startswith("collnet"):
        return topo.collnet and p == 2
    if algo == "pat":
        return ppn == 1 and p == 2
    return True


def _latency(op, algo, p, topo: Topology, n: int, ppn: int, c: dict) -> float:
    link = "pci" if topo.intra == "pci" else "nvlink"
    intra = c["hw_lat_us"][link][algo][p]
    net_algo = "tree" if ppn == 1 and algo == "ring" else algo
    inter = c["hw_lat_us"]["net"][net_algo][p] + topo.latency_inter_us * (2 if p == 2 else 1)
    base, nodes = c["base_lat_us"][algo][p], topo.nodes
    nsteps = _nsteps(op, n)
    if algo == "ring":
        crossing = _STEPS[op][1]
        if not crossing:  # a chain
            return base + nsteps * intra
        inter_steps = crossing * (nodes - 1)
        if nodes > 1:
            intra = max(intra, c["net_overhead_us"][topo.cpu_vendor] * (3 if p == 2 else 1))
        return base + (nsteps - inter_steps) * intra + inter_steps * inter
    if algo == "tree":
        return base + 2 * ((ppn - 1) * intra + math.log2(nodes) * inter)
    if algo == "nvls":
        return intra + (inter if nodes > 1 else 0.0)
    if algo == "nvls_tree":
        return intra + 2 * math.log2(nodes) * inter
    if algo == "collnet_direct":
        return base + 2 * (min(1, ppn - 1) * intra + (ppn - 1) * 0.4) + inter
    if algo == "collnet_chain":
        return base + 2 * (ppn - 1) * intra + inter
    return base + math.log2(nodes) * inter / 3.5 + 2.8 * n  # pat


def nccl_table(op: str, nbytes: int, topo: Topology, version: str = "2.30.7") -> list[Choice]:
    """Every enabled (algorithm, protocol) for ``op`` of ``nbytes`` on all of ``topo``'s ranks;
    all-to-all and send/recv: their one point-to-point choice (:mod:`..p2p`)."""
    if op not in OPS and op not in P2P_OPS:
        raise ValueError(f"op={op!r}: NCCL's model covers {', '.join(OPS + P2P_OPS)}")
    if nbytes < 0:
        raise ValueError(f"nbytes={nbytes}: must be >= 0")
    c = constants(version)
    n = topo.ranks
    if op in P2P_OPS:
        t, lat = p2p_time(op, nbytes, topo, c)
        alg = nbytes / (1000 * (t - lat)) if t > lat else 0.0
        return [Choice("p2p", "Simple", t, lat, alg * op_records.OPS[op].bus(n), alg)]
    if n == 1:
        return [Choice("ring", "Simple", 0.0, 0.0, 0.0, 0.0)]
    return _sized(op, nbytes, topo, c, _unsized(op, topo, c))


def nccl_tables(op: str, sizes: list[int], topo: Topology, version: str = "2.30.7"
                ) -> list[list[Choice]]:
    """:func:`nccl_table` for each of ``sizes``: the same choices, their size-free part (the
    graphs, each choice's bandwidth and latency) worked out once for all of them."""
    if op not in OPS or topo.ranks == 1 or any(s < 0 for s in sizes):
        return [nccl_table(op, s, topo, version) for s in sizes]
    c = constants(version)
    unsized = _unsized(op, topo, c)
    return [_sized(op, s, topo, c, unsized) for s in sizes]


def nccl_choices(op: str, topo: Topology, version: str = "2.30.7"
                 ) -> dict[tuple[str, str], tuple[float, float]]:
    """(algorithm, protocol) -> (latency in us, algorithm bandwidth in GB/s) of every choice the
    model enables for ``op`` on all of ``topo``'s ranks, before the corrections that depend on
    the size: what NCCL prints as its tuning table (``NCCL_DEBUG_SUBSYS=TUNING``)."""
    if op not in OPS:
        raise ValueError(f"op={op!r}: NCCL's tuning model covers {', '.join(OPS)}")
    if topo.ranks < 2:
        return {}
    return {(algo, proto): (lat, alg)
            for algo, _, proto, lat, alg, _ in _unsized(op, topo, constants(version))}


def _unsized(op: str, topo: Topology, c: dict) -> list[tuple[str, int, str, float, float, int]]:
    """(algorithm, protocol index, protocol, latency, algorithm bandwidth, channels) of every
    enabled choice, before the corrections that depend on the size."""
    n, ppn = topo.ranks, topo.gpus_per_node
    g_all = graphs(topo, c["nvlink_bw_per_link"][topo.arch], c["nvls_search_speeds_sm90"])
    out = []
    for algo in ALGOS:
        for p, proto in enumerate(PROTOS):
            if not _enabled(op, algo, p, topo, n, ppn, c):
                continue
            g = g_all[algo]
            bus = _bus_bw(op, algo, p, topo, g, c, ppn) * topo.proto_bw.get(proto, 1.0)
            if bus <= 0:
                continue
            if algo == "ring" or (algo in ("nvls", "nvls_tree") and op == "all_reduce"):
                alg = bus * n / _nsteps(op, n)
            elif algo == "tree" or algo.startswith("collnet"):
                alg = bus * 0.5
            else:
                alg = bus
            lat = _latency(op, algo, p, topo, n, ppn, c) + topo.proto_lat_us.get(proto, 0.0)
            out.append((algo, p, proto, lat, alg, g.channels))
    return out


def _sized(op: str, nbytes: int, topo: Topology, c: dict, unsized) -> list[Choice]:
    bus_of = op_records.OPS[op].bus(topo.ranks)
    return [Choice(algo, proto, t, lat, alg * bus_of, alg)
            for algo, proto, t, lat, alg in _timed(op, nbytes, topo, c, unsized)]


def _timed(op: str, nbytes: int, topo: Topology, c: dict, unsized
           ) -> list[tuple[str, str, float, float, float]]:
    """(algorithm, protocol, time, latency, algorithm bandwidth) of every choice at ``nbytes``:
    the size-free part with the corrections that depend on the size."""
    n = topo.ranks
    out = []
    windows = c["tree_correction_sizes"]
    for algo, p, proto, lat, alg, channels in unsized:
        # NCCL's static correction of trees at medium sizes, over the sizes its source applies
        # it to (the tree: 64 B << 22; NVLS_TREE, from 2.30 on Blackwell with an x86 host, which
        # every topology here has: 64 B << 23)
        if op == "all_reduce" and nbytes >> 6 > 0 and (
                algo == "tree" or (algo == "nvls_tree" and topo.arch == "blackwell")):
            k = int(math.log2(nbytes >> 6))
            if k < windows.get(algo, 0):
                alg *= c["tree_correction"][p][k]
        if algo == "ring" and p == 2 and op == "all_reduce" and topo.nodes > 1 \
                and nbytes / (channels * n) >= 64:
            lat *= c["ring_plateau"]["sm80_plus" if topo.arch != "volta" else "older"]
        # a calibrated topology's pipeline fill: the chunk-times a call spends before its last
        # chunk is through (NCCL's runtime chunking, outside its tuning model)
        fill = topo.chunk_fill.get(algo, 0.0)
        if fill and (chunk := nvls_tree_chunk(nbytes, topo, channels)):
            lat += fill * chunk * channels * nvls_heads(topo) / (1000 * alg)
        out.append((algo, proto, lat + nbytes / (1000 * alg), lat, alg))
    return out


def nvls_heads(topo: Topology) -> int:
    """NVLS heads of a node (``nvls.nHeads``): one per GPU inside a node; across nodes, one per
    GPU with a NIC of its own (NCCL's NVLS search pairs each head with a NIC)."""
    per = topo.gpus_per_node
    return min(per, topo.nics_per_node) if topo.nodes > 1 and topo.nics_per_node else per


def nvls_tree_chunk(nbytes: int, topo: Topology, channels: int) -> int | None:
    """The chunk NCCL's runtime cuts an NVLS-tree collective of ``nbytes`` into
    (``calcCollChunking``, the same from 2.21 to 2.30): 128 KiB (64 KiB at 4 nodes or more),
    halved step by step the fewer bytes there are per concurrent operation (channels x NVLS
    heads): on two HGX H100 nodes 32 KiB below 8 MiB, 64 KiB below 64 MiB, 128 KiB from there.
    NCCL's tuning model does not see it; a calibrated topology prices each call's pipeline fill
    with it (``Topology.chunk_fill``). None across Blackwell nodes, whose NVLS-tree chunk NCCL
    tunes at init (2.28 on) by rules commbench does not model."""
    if topo.arch == "blackwell" and topo.nodes > 1:
        return None
    ops = channels * nvls_heads(topo)
    chunk = 64 << 10 if topo.nodes >= 4 else 128 << 10
    for times, floor in ((32, 256 << 10), (16, 128 << 10), (4, 64 << 10), (1, 32 << 10)):
        if nbytes < times * ops * chunk and chunk > floor:
            chunk = floor
    return chunk


def nccl_times(op: str, sizes: list[int], topo: Topology, version: str = "2.30.7"
               ) -> list[float]:
    """The time of NCCL's pick at each of ``sizes`` (us): :func:`nccl_tables`' fastest choice,
    without making the choices (a fit prices its rows thousands of times)."""
    if op not in OPS or topo.ranks == 1 or any(s < 0 for s in sizes):
        return [min(x.time_us for x in t) for t in nccl_tables(op, sizes, topo, version)]
    c = constants(version)
    unsized = _unsized(op, topo, c)
    return [min(x[2] for x in _timed(op, s, topo, c, unsized)) for s in sizes]


def nccl_predict(op: str, nbytes: int, topo: Topology, version: str = "2.30.7",
                 algo: str | None = None, proto: str | None = None) -> Choice:
    """NCCL's pick (the argmin of :func:`nccl_table`), or the given algorithm/protocol."""
    table = nccl_table(op, nbytes, topo, version)
    if algo or proto:
        table = [t for t in table if (not algo or t.algo == algo) and (not proto or t.proto == proto)]
        if not table:
            raise ValueError(f"{op} on {topo.name} ({topo.ranks} ranks): NCCL would not run "
                             f"algo={algo} proto={proto} here")
    return min(table, key=lambda t: t.time_us)


def hierarchical_all_reduce(nbytes: int, topo: Topology, version: str = "2.30.7") -> float:
    """A two-level all-reduce across nodes (costmodel.md 1.3): reduce-scatter inside each node,
    an all-reduce of S/L across nodes on each of the L rails at once (one GPU per node, its
    share of the NICs), all-gather inside the node; each stage timed by NCCL's model (us)."""
    L, N = topo.gpus_per_node, topo.nodes
    node, rail = topo.part(1, L), topo.part(N, 1)
    t = 0.0
    if L > 1:
        t += nccl_predict("reduce_scatter", nbytes, node, version).time_us
        t += nccl_predict("all_gather", nbytes, node, version).time_us
    if N > 1:
        t += nccl_predict("all_reduce", nbytes // L, rail, version).time_us
    return t
