"""NCCL's model beside a cluster's own nccl-tests logs, and calibrated on them: each row set
beside the model on the machine its header describes, the topology's link figures fitted to the
measured rows, and what the fit predicts on rows it never saw.

Beside the model (:func:`beside`): the topology is the one given, else the preset whose GPU the
header names (A100, H100, H200, GH200; one node or, across nodes, the preset cluster of that
GPU), narrowed to the log's nodes and GPUs per node; the header never says what the interconnect
is, so the preset's is an assumption, stated (:func:`topology_for`).

Fitted, each only where the rows can tell it:

* ``intra_GBps``: a GPU's intra-node bandwidth (NVLink or PCIe as the cluster delivers it), from
  runs with two or more GPUs per node;
* ``nic_GBps``: each NIC's bandwidth, from runs across two or more nodes;
* ``latency_inter_us``: latency added per network hop, from runs across nodes;
* ``proto_bw`` and ``proto_lat_us``: per protocol (LL, LL128, Simple), a factor on the
  bandwidth NCCL's model gives it and a latency added to each call, for the protocols NCCL's
  tuner picks on some row (before or after the fit): where a network runs a protocol slower
  than the model assumes (LL128 over a non-InfiniBand fabric, say), the size at which the tuner
  switches moves with it.

A row's error is ``model time / measured time - 1`` (busbw errs by the reciprocal). The fit
minimises the sum of ``|log(model / measured)|`` over the rows given to it: robust (a slow row
moves it as much as a fast one, an outlier no more than any row) and symmetric in over- and
under-prediction. The model is piecewise (NCCL's tuner switches algorithm and protocol with the
size), so the fit searches each figure over a log-spaced grid and then a finer one around the
best, figure after figure, until no figure moves (coordinate descent); no gradient is assumed.

Set, not fitted: ``chunk_fill`` of NVLS-tree (:data:`NVLS_TREE_FILL`), where the runs pick it.
NCCL's runtime cuts an NVLS-tree call into chunks whose size steps with the call's size
(:func:`~commbench.costmodel.nccl.nvls_tree_chunk`); each call waits for its pipeline to fill,
so the time steps where the chunk does (between 32 and 64 MiB on two HGX H100 nodes), which no
latency and bandwidth can follow.

A fit is only as good as what it predicts: :func:`held_out` fits on every other size and
reports the rest, then fits on the smaller sizes and reports the largest. Pure: no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from commbench.costmodel.nccl import OPS as MODELLED
from commbench.costmodel.nccl import PROTOS, constants, nccl_predict, nccl_times, nvls_tree_chunk
from commbench.costmodel.p2p import P2P_OPS
from commbench.costmodel.topology import Topology, gpu_presets, load
from commbench.ops import OPS as RECORDS
from commbench.results.nccl_tests import Run

__all__ = ["Beside", "Fit", "Measured", "beside", "error", "fit", "held_out", "interpolated",
           "off_calibration", "predict_us", "topology_for"]


# chunk-times a call of NVLS-tree spends filling its pipeline: a chunk passes three stages (the
# node's NVLS reduction, the network, the other node's NVLS multicast), so the last chunk ends
# two chunk-times after the first stage has sent it (docs/decisions.md, "NVLS-tree's chunk")
NVLS_TREE_FILL = 2.0


@dataclass(frozen=True)
class Measured:
    """One row of a log: op, nccl-tests' size, the run's nodes and GPUs per node, time (us)."""

    op: str
    size: int
    nodes: int
    per_node: int
    time_us: float
    source: str = ""


@dataclass(frozen=True)
class Fit:
    topology: Topology
    fitted: tuple[str, ...]        # the figures the rows could tell
    fixed: tuple[str, ...]         # and why the others were left as they were
    loss_before: float
    loss_after: float


def predict_us(topo: Topology, m: Measured, version: str) -> float:
    """NCCL's model of ``m`` on ``topo`` narrowed to the row's nodes and GPUs per node."""
    return nccl_predict(m.op, m.size, topo.part(m.nodes, m.per_node), version).time_us


def error(topo: Topology, m: Measured, version: str) -> float:
    """model time / measured time - 1."""
    return predict_us(topo, m, version) / m.time_us - 1.0


def _predicted(topo: Topology, rows: list[Measured], version: str) -> list[float]:
    """:func:`predict_us` of every row, the rows of one op on one part of ``topo`` priced
    together (:func:`~commbench.costmodel.nccl.nccl_times`): the fit prices them thousands of
    times."""
    runs: dict[tuple[str, int, int], list[int]] = {}
    for i, m in enumerate(rows):
        runs.setdefault((m.op, m.nodes, m.per_node), []).append(i)
    out = [0.0] * len(rows)
    for (op, nodes, per_node), at in runs.items():
        times = nccl_times(op, [rows[i].size for i in at], topo.part(nodes, per_node), version)
        for i, t in zip(at, times, strict=True):
            out[i] = t
    return out


def _loss(topo: Topology, rows: list[Measured], version: str) -> float:
    return sum(abs(math.log(t / m.time_us))
               for t, m in zip(_predicted(topo, rows, version), rows, strict=True))


def _get(topo: Topology, knob: tuple[str, str]) -> float:
    name, proto = knob
    if proto:
        return getattr(topo, name).get(proto, 1.0 if name == "proto_bw" else 0.0)
    return getattr(topo, name)


def _set(topo: Topology, knob: tuple[str, str], v: float) -> Topology:
    name, proto = knob
    if proto:
        return replace(topo, **{name: {**getattr(topo, name), proto: v}})
    return replace(topo, **{name: v})


def _search(topo: Topology, knob, lo: float, hi: float, rows, version, points: int
            ) -> Topology:
    """``topo`` with ``knob`` set to the best of a grid on [lo, hi] (log-spaced, or linear from
    0 for a latency), then of a finer grid around that."""
    best, best_loss = _get(topo, knob), _loss(topo, rows, version)
    for _ in range(2):
        if lo <= 0:
            grid = [lo + (hi - lo) * k / (points - 1) for k in range(points)]
        else:
            grid = [lo * (hi / lo) ** (k / (points - 1)) for k in range(points)]
        for v in grid:
            loss = _loss(_set(topo, knob, v), rows, version)
            if loss < best_loss - 1e-12:
                best, best_loss = v, loss
        step = (hi - lo) / (points - 1) if lo <= 0 else (hi / lo) ** (1 / (points - 1))
        lo, hi = ((max(0.0, best - step), best + step) if lo <= 0 else (best / step, best * step))
    return _set(topo, knob, best)


def _simplex(topo: Topology, knobs, ranges, rows, version, evals: int = 600) -> Topology:
    """Nelder-Mead from ``topo`` over every knob at once (bandwidths in log space, latencies as
    they are, each kept in its range): the joint moves one figure at a time cannot make."""
    def to_x(t: Topology) -> list[float]:
        return [math.log(_get(t, k)) if ranges[k[0]][0] > 0 else _get(t, k) for k in knobs]

    def to_t(x: list[float]) -> Topology:
        t = topo
        for k, v in zip(knobs, x, strict=True):
            lo, hi = ranges[k[0]]
            v = min(max(math.exp(v) if lo > 0 else v, lo), hi)
            t = _set(t, k, v)
        return t

    def f(x: list[float]) -> float:
        return _loss(to_t(x), rows, version)

    x0 = to_x(topo)
    pts = [x0] + [[v + (0.2 if ranges[k[0]][0] > 0 else 10.0) * (j == i) for j, (k, v) in
                   enumerate(zip(knobs, x0, strict=True))] for i in range(len(knobs))]
    vals = [f(p) for p in pts]
    used = len(pts)
    while used < evals:
        order = sorted(range(len(pts)), key=vals.__getitem__)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if vals[-1] - vals[0] < 1e-9:
            break
        mid = [sum(p[j] for p in pts[:-1]) / (len(pts) - 1) for j in range(len(x0))]
        worst = pts[-1]
        refl = [m + (m - w) for m, w in zip(mid, worst, strict=True)]
        fr = f(refl)
        used += 1
        if fr < vals[0]:
            exp = [m + 2 * (m - w) for m, w in zip(mid, worst, strict=True)]
            fe = f(exp)
            used += 1
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = [m + 0.5 * (w - m) for m, w in zip(mid, worst, strict=True)]
            fc = f(con)
            used += 1
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:  # shrink toward the best
                pts = [pts[0]] + [[b + 0.5 * (p - b) for b, p in zip(pts[0], q, strict=True)]
                                  for q in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
                used += len(pts) - 1
    best = min(range(len(pts)), key=vals.__getitem__)
    return to_t(pts[best]) if vals[best] < _loss(topo, rows, version) else topo


def fit(base: Topology, rows: list[Measured], version: str = "2.30.7", points: int = 13) -> Fit:
    """``base`` with the figures the rows can tell fitted to them (module docstring)."""
    rows = [m for m in rows if m.op in MODELLED and m.size > 0 and m.time_us > 0]
    if not rows:
        raise ValueError("no rows to calibrate on: the logs hold no all_reduce, all_gather, "
                         "reduce_scatter, broadcast or reduce rows of size > 0")
    c = constants(version)
    start = replace(base, intra_GBps=base.intra_bw(c["nvlink_bw_per_link"][base.arch]))
    knobs, fixed = [], []
    if any(m.per_node > 1 for m in rows):
        knobs.append(("intra_GBps", ""))
    else:
        fixed.append("intra_GBps: every run has one GPU per node")
    if any(m.nodes > 1 for m in rows):
        if not (base.nics_per_node and base.nic_GBps):
            raise ValueError(f"{base.name}: has no NICs, so runs across nodes cannot be fitted "
                             "on it")
        knobs += [("nic_GBps", ""), ("latency_inter_us", "")]
    else:
        fixed.append("nic_GBps, latency_inter_us: the logs cover only one node, so they cannot "
                     "calibrate inter-node links")
    first = _picks(start, rows, version)
    picked = {c.proto for c in first}
    for proto in PROTOS:
        knobs += [("proto_bw", proto), ("proto_lat_us", proto)]
    if any(c.algo == "nvls_tree" and nvls_tree_chunk(m.size, part, part.nvls_channels)
           for c, m in zip(first, rows, strict=True) for part in [start.part(m.nodes, m.per_node)]):
        start = replace(start, chunk_fill={"nvls_tree": NVLS_TREE_FILL})
        fixed.append(f"chunk_fill.nvls_tree = {NVLS_TREE_FILL:g}: set, the fill of NVLS-tree's "
                     "three-stage pipeline (a node's NVLS reduction, the network, its NVLS "
                     "multicast) in chunk-times")
    ranges = {"intra_GBps": (start.intra_GBps / 30, start.intra_GBps * 3),
              "nic_GBps": (max(base.nic_GBps, 1.0) / 30, max(base.nic_GBps, 1.0) * 3),
              "latency_inter_us": (0.0, 100.0), "proto_bw": (1 / 30, 3.0),
              "proto_lat_us": (0.0, 400.0)}
    before = _loss(start, rows, version)

    def descend(topo: Topology, knobs) -> Topology:
        for _ in range(6):
            last = topo
            for knob in knobs:
                topo = _search(topo, knob, *ranges[knob[0]], rows, version, points)
            if topo == last:
                break
        return topo

    # NCCL's tuner makes the loss piecewise, and one figure at a time can stall where two must
    # move together (one protocol slower, another faster): two starts, the better one kept, the
    # links alone first and then everything, and everything from the preset
    physical = [k for k in knobs if not k[1]]
    topo = min((descend(descend(start, physical), knobs), descend(start, knobs)),
               key=lambda t: _loss(t, rows, version))
    topo = _simplex(topo, knobs, ranges, rows, version)
    last = _picks(topo, rows, version)
    used = {c.proto for c in last} | picked
    topo = replace(topo, proto_bw={p: v for p, v in topo.proto_bw.items() if p in used},
                   proto_lat_us={p: v for p, v in topo.proto_lat_us.items() if p in used},
                   chunk_fill=topo.chunk_fill if any(c.algo == "nvls_tree" for c in last) else {})
    fitted = tuple(f"{n}.{p}" if p else n for n, p in knobs if not p or p in used)
    return Fit(topo, fitted, tuple(fixed), before, _loss(topo, rows, version))


def _picks(topo: Topology, rows: list[Measured], version: str) -> list:
    """NCCL's pick (:func:`~commbench.costmodel.nccl.nccl_predict`) for each row on ``topo``."""
    return [nccl_predict(m.op, m.size, topo.part(m.nodes, m.per_node), version) for m in rows]


def held_out(base: Topology, rows: list[Measured], version: str = "2.30.7"
             ) -> list[tuple[str, Measured, float, float]]:
    """(split, row, error before, error after) for every row held out of a fit: 'alternate'
    (fitted on every other size of each run, judged on the rest) and 'largest' (fitted on the
    sizes up to a quarter of each run's largest, judged on those above)."""
    out = []
    for split in ("alternate", "largest"):
        train, test = [], []
        for series in _series(rows):
            if split == "alternate":
                train += series[0::2]
                test += series[1::2]
            else:
                top = series[-1].size
                train += [m for m in series if m.size <= top // 4]
                test += [m for m in series if m.size > top // 4]
        if not train or not test:
            continue
        f = fit(base, train, version)
        for m in test:
            out.append((split, m, error(base, m, version), error(f.topology, m, version)))
    return out


def _series(rows: list[Measured]) -> list[list[Measured]]:
    """The rows of each run (log, op, nodes, GPUs per node), each by size."""
    runs: dict[tuple, list[Measured]] = {}
    for m in rows:
        runs.setdefault((m.source, m.op, m.nodes, m.per_node), []).append(m)
    return [sorted(series, key=lambda m: m.size) for series in runs.values()]


def interpolated(rows: list[Measured]) -> list[tuple[Measured, float]]:
    """(row, error) for each row the 'alternate' split holds out that has a fitted size on
    either side: the time read off the straight line through its two neighbours on log-log
    axes, as :func:`error` gives a model's. No model is fitted: this is how irregular the log
    itself is. Where a log's neighbouring sizes bend more than a target allows, a model as
    smooth as the rows cannot meet it there either."""
    out = []
    for series in _series(rows):
        for i in range(1, len(series) - 1, 2):
            lo, m, hi = series[i - 1], series[i], series[i + 1]
            w = math.log(m.size / lo.size) / math.log(hi.size / lo.size)
            line = math.exp(math.log(lo.time_us) * (1 - w) + math.log(hi.time_us) * w)
            out.append((m, line / m.time_us - 1.0))
    return out


def off_calibration(topo: Topology) -> str | None:
    """A line saying that ``topo`` is priced at a node count its calibration never saw (None:
    no calibration record, or one that saw this count). The fitted figures are effective ones
    for the runs they were fitted on: NCCL runs other algorithms at 2 nodes than at 8 (the tree's
    two-node case), and a fit of 2-node rows prices an 8-node run's large all-reduce several
    times too fast (docs/nccl-tests.md)."""
    seen = (topo.calibration or {}).get("nodes")
    if not seen or topo.nodes in seen:
        return None
    return (f"{topo.name} was calibrated on runs of {', '.join(map(str, seen))} node(s) and is "
            f"priced here at {topo.nodes}: its fitted figures hold for the node counts it was "
            "fitted on and can be far off at others (docs/nccl-tests.md); calibrate on logs of "
            "the node counts you price")


# -- a log's rows beside the model ------------------------------------------------------------------
def topology_for(run: Run, given: str | None = None):
    """(Topology of the run's nodes x GPUs per node, what was assumed), or (None, why not)."""
    nodes, per = max(1, len(run.hosts)), run.gpus_per_node
    if run.ranks == 1:
        return None, "one rank: nothing crosses a link between GPUs; no model beside it"
    if not run.listed:
        return None, (f"the log holds the device lines of {len(run.devices)} of its {run.ranks} "
                      "ranks: its nodes and GPUs per node are unknown; no model beside it")
    if given:
        base = load(given)
        why = f"topology {base.name} (given)"
    else:
        match = gpu_presets(run.gpu)
        if match is None:
            return None, (f"no preset for the GPU {run.gpu or '(none named)'!r}: give "
                          "--topology PRESET|FILE to set the log beside NCCL's model")
        base = load(match[0] if nodes == 1 else match[1])
        why = (f"the header names no interconnect: assumed {base.name} ({base.description})")
    if per > base.gpus_per_node:
        return None, (f"{per} GPUs per node in the log, {base.gpus_per_node} in {base.name}")
    if nodes > 1 and not (base.nics_per_node and base.nic_GBps):
        return None, f"{base.name} has no NICs: it cannot span {nodes} nodes"
    topo = base.part(nodes, per)
    note = off_calibration(topo)
    return topo, (f"{why}; warning: {note}" if note else why)


@dataclass(frozen=True)
class Beside:
    size: int
    measured: float      # busbw, GB/s
    model: float         # busbw of the model's time at this size (its latency included)
    algo: str
    proto: str

    @property
    def ratio(self) -> float:
        return self.measured / self.model if self.model > 0 else math.nan


def beside(run: Run, topo, version: str = "2.30.7") -> list[Beside]:
    """Each row of size > 0 with NCCL's modelled busbw on ``topo`` and the algorithm and protocol
    the model picks there (all-to-all and send/recv: the point-to-point model); [] for an op it
    does not cover (gather, scatter)."""
    if run.op not in MODELLED + P2P_OPS or topo is None or topo.ranks != run.ranks:
        return []
    f = RECORDS[run.op].bus(run.ranks)
    out = []
    for r in run.rows:
        if r.size <= 0 or r.out.time_us <= 0:
            continue
        c = nccl_predict(run.op, r.size, topo, version)
        if c.time_us <= 0:
            continue
        out.append(Beside(r.size, r.size / r.out.time_us / 1e3 * f, r.size / c.time_us / 1e3 * f,
                          c.algo, c.proto))
    return out
