"""A job's calls against what the wire allows: NCCL's model on a topology, a committed sweep's
busbw at the same op and size, and the layout the job was meant to have (pure).

* ``model_us``/``model_busbw``: NCCL's tuning model (:mod:`commbench.costmodel.nccl`) for the
  call's op and size on the part of the topology its group spans (nodes, most members on one
  node; ranks numbered node by node); all-to-all and point-to-point by the layout's link model.
  ``efficiency`` = model time / measured time (1: as fast as the model says the wire allows).
* ``baseline_busbw``: the committed sweep's native row of the same op at the nearest size (on a
  log scale), with that row's size and world size beside it.
* The layout: rank 0's calls as the audit's entries, compared per axis by
  :func:`commbench.studies.audit_layout.compare`.
"""

from __future__ import annotations

import math

from commbench.costmodel.calibrate import off_calibration
from commbench.costmodel.nccl import OPS as MODELLED
from commbench.costmodel.p2p import P2P_OPS
from commbench.costmodel.pricing import call_time_us, group_span
from commbench.costmodel.topology import Topology, gpu_presets, load
from commbench.ops import OPS, booked, split_sizes
from commbench.patterns.base import Call as Priced
from commbench.results.busbw import factor
from commbench.results.compare import CompareError
from commbench.results.compare import load as load_results
from commbench.traces.analysis import Matched
from commbench.traces.calls import P2P, Call, TraceError
from commbench.traces.kineto import RankTrace
from commbench.wire.ledger import Entry

__all__ = ["add_baseline", "add_model", "as_entries", "guess_topology", "topology"]


def guess_topology(traces: list[RankTrace]) -> str | None:
    """The one-node preset the traces' device names point to (deviceProperties: the first
    name :func:`~commbench.costmodel.topology.gpu_presets` knows), or None."""
    for name in sorted({d for t in traces for d in t.devices}):
        found = gpu_presets(name)
        if found is not None:
            return found[0]
    return None


def topology(traces: list[RankTrace], name: str | None, nodes: int | None,
             why: list[str] | None = None) -> Topology | None:
    """The topology named, or the one the device names point to, over as many nodes as the
    world needs (ValueError on a bad name); None when neither says. A guessed preset is used
    only where the job fills whole nodes of it: a job of fewer GPUs than a node may sit on any
    of the node's links (PCIe, a few NVLinks), and a model of the wrong machine gives a wrong
    efficiency. ``why`` gains a line saying which model was taken, or why none."""
    why = why if why is not None else []
    world = max([t.world_size for t in traces] + [len(traces)])
    guessed = name is None
    name = name or guess_topology(traces)
    if name is None:
        why.append("no model: the traces name no GPU commbench has a preset for; give "
                   "--topology")
        return None
    topo = load(name)
    if nodes is not None and nodes > world:  # a typo (--nodes 99999999999) priced nothing
        raise ValueError(f"--nodes {nodes}: a job of {world} rank(s) runs on {world} node(s) "
                         "at most")
    if nodes is not None and nodes * topo.gpus_per_node < world:
        raise ValueError(f"--nodes {nodes}: {world} ranks do not fit on {nodes} node(s) of "
                         f"{name} ({topo.gpus_per_node} GPUs each)")
    if guessed and nodes is None and world % topo.gpus_per_node:
        why.append(f"no model: {world} rank(s) fill no whole node of {name} (its "
                   f"{topo.gpus_per_node} GPUs), whose links they would use is not in the trace; "
                   "give --topology")
        return None
    want = nodes if nodes is not None else max(1, math.ceil(world / topo.gpus_per_node))
    topo = load(name, want) if want != topo.nodes else topo
    if guessed:
        devices = sorted({d for t in traces for d in t.devices})
        why.append(f"{name} guessed from the device name ({', '.join(devices[:2])}); "
                   "--topology to choose")
    note = off_calibration(topo)
    if note:
        why.append(f"warning: {note}")
    return topo


def _splits(c: Call, n: int) -> dict:
    """A split call's splits: the trace's, or, where it recorded none (torch's default, and
    every trace before torch 2.1), equal ones: the call's total bytes stand whatever the job's
    real splits were."""
    if not (c.op in OPS and OPS[c.op].split):
        return {}
    if c.in_splits and c.out_splits:
        return {"in_splits": list(c.in_splits), "out_splits": list(c.out_splits)}
    return {"in_splits": split_sizes(c.in_elems, n), "out_splits": split_sizes(c.out_elems, n)}


def model_us(c: Call, topo: Topology, version: str = "2.30.7") -> tuple[float, str] | None:
    """NCCL's modelled time of ``c`` on ``topo`` and its pick, or None (an op it has no model
    for, or a group wider than the topology)."""

    n = len(c.group)
    if n < 2 or c.op not in MODELLED + P2P_OPS + P2P or max(c.group) >= topo.ranks \
            or not c.sized:
        return None
    count = c.in_elems
    kw = _splits(c, n)
    me = c.group.index(c.rank) if c.rank in c.group else 0
    sent, recv = booked(c.op, n, me, count, c.itemsize, **kw)
    size = c.size // n if OPS[c.op].input == "block" else c.size
    return call_time_us(Priced(c.op, "", size, sent, recv), n, topo,
                        group_span(c.group, topo.gpus_per_node), version)


def add_model(rows: list[Matched], topo: Topology) -> None:
    for m in rows:
        got = model_us(m.first, topo)
        if got is None or got[0] <= 0:
            continue
        t, pick = got
        m.extra["model_us"] = t
        m.extra["model_pick"] = pick
        op = "sendrecv" if m.first.op in P2P else m.first.op
        m.extra["model_busbw"] = m.first.size / t / 1e3 * factor(op, len(m.first.group))
        # a CPU op's time is its enqueue: no efficiency from it (no bandwidth either)
        m.extra["efficiency"] = t / m.time_us if m.time_us > 0 and m.busbw is not None else None


def add_baseline(rows: list[Matched], path: str) -> dict:
    """The committed sweep's busbw beside each call of an op it has; its header."""

    try:
        record = load_results(path)
    except CompareError as exc:
        raise TraceError(str(exc)) from None
    native: dict[str, list[dict]] = {}
    for row in record["rows"]:
        if row.get("algo") == "native" and row.get("busbw") is not None:
            native.setdefault(row["op"], []).append(row)
    for m in rows:
        op = "sendrecv" if m.first.op in P2P else m.first.op
        cands = native.get(op)
        if not cands or m.first.size <= 0:
            continue
        best = min(cands, key=lambda r: abs(math.log2(max(r["size"], 1)) -
                                            math.log2(m.first.size)))
        m.extra["baseline_busbw"] = best["busbw"]
        m.extra["baseline_size"] = best["size"]
    return {"path": path, "hardware": record.get("hardware"),
            "world_size": record.get("world_size"), "launch": record.get("launch")}


def as_entries(t: RankTrace, steps: tuple[int, int] | None = None) -> list[tuple]:
    """One rank's calls as the audit's ledger entries (``steps``: from, to inclusive)."""
    out = []
    for c in t.calls:
        if steps is not None and not steps[0] <= c.step <= steps[1]:
            continue
        n = len(c.group)
        me = c.group.index(c.rank) if c.rank in c.group else 0
        if c.op in OPS and n > 0:
            kw = _splits(c, n)
            try:
                sent, recv = booked(c.op, n, me, c.in_elems, c.itemsize, **kw)
            except (ValueError, ZeroDivisionError, IndexError):
                sent = recv = 0
        else:
            sent = recv = 0
        out.append(tuple(Entry(c.op, c.group, "trace", c.dtype, c.in_elems, sent, recv,
                               c.dur / 1e6, start=c.ts / 1e6, peer=c.peer)))
    return out
