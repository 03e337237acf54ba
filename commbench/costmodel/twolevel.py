"""The alpha-beta model on a two-level network of hosts: ranks on nodes joined by one link each.

    T(op, algo, S) = alpha + beta * S  +  link_bytes(algo, S) / rate  +  latency * link_steps

alpha and beta are the host's own costs of the call (per call, per byte), calibrated on the same
nodes with the link unshaped, per transport and algorithm, in two regimes (below 1 MiB and from
it: small calls are latency, large ones bandwidth, and one line fits neither); the link term is the bytes the
busiest direction of a node's link carries per call, at the link's rate. For all-reduce over
N nodes of L adjacent ranks (n = N L):

* ring: one ring edge leaves each node, and every edge carries 2(n-1)/n * S;
* hierarchical (reduce-scatter in the node, all-reduce across, all-gather in the node): the
  node's L ranks each send 2(N-1)/N * S/L across, 2(N-1)/N * S in all: the lower bound of any
  all-reduce across N nodes, L-fold less than the ring's with n >> N;
* native: gloo's all-reduce is a ring over the ranks (the ring's bytes); MPICH's, for the large
  messages where the link decides, reaches the lower bound (Rabenseifner's reduce-scatter and
  all-gather on 2 nodes, or its node-aware composition), so it is priced at the bound: an
  assumption about the library, checked on the link's byte counters (``results/cluster_*``).

The terms add: a ring step or a phase of the hierarchical algorithm is host work, then the link
crossing, and the next step waits for both. Where the host's work and the link's overlap fully
(a stream paced by the link while the host copies) the time is the larger of the two instead;
:func:`predict_us` gives both, the sum as the model's prediction and the larger as a lower
bound. A topology file of ``"kind": "hosts"`` holds the nodes, the rate and the calibrated
constants; ``commbench predict collective all_reduce 16M --topology FILE`` reads it
(:func:`load`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from commbench.results.files import TOPOLOGY_LIMIT, FileRefused, read_json

__all__ = ["HostCluster", "fit_host", "host_us", "link_bytes", "load",
           "predict_us", "validate"]

ALGOS = ("native", "ring", "hierarchical")
TRANSPORTS = ("gloo", "mpi")


@dataclass(frozen=True)
class HostCluster:
    """nodes x ranks_per_node ranks; each node's link at link_Gbps each way, link_latency_us
    per crossing message; host: ``"transport/algo"`` -> its regimes, each {"from_bytes",
    "alpha_us", "beta_us_per_byte"}, in increasing from_bytes, the first from 0."""

    name: str
    nodes: int
    ranks_per_node: int
    link_Gbps: float
    link_latency_us: float = 0.0
    host: dict = field(default_factory=dict)
    kind: str = "hosts"
    description: str = ""
    sources: tuple[str, ...] = ()

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    def at(self, gbit: float) -> HostCluster:
        return replace(self, link_Gbps=gbit)


def _ring_like(algo: str, transport: str) -> bool:
    """Priced as a ring over every rank (else at the node-level bound): the ring and gloo's own;
    the hierarchical algorithm and MPICH's own at the bound."""
    if algo not in ALGOS or transport not in TRANSPORTS:
        raise ValueError(f"algo={algo!r} on {transport}: no two-level terms; known: "
                         f"{', '.join(ALGOS)} on {', '.join(TRANSPORTS)}")
    return algo == "ring" or (algo == "native" and transport == "gloo")


def link_bytes(algo: str, transport: str, nodes: int, per_node: int, size: float) -> float:
    """Bytes on the busiest direction of one node's link per all-reduce of ``size`` bytes."""
    n = nodes * per_node
    ring = _ring_like(algo, transport)
    if nodes < 2:
        return 0.0
    return 2 * (n - 1) / n * size if ring else 2 * (nodes - 1) / nodes * size


def link_steps(algo: str, transport: str, nodes: int, per_node: int) -> int:
    """Messages on the critical path that cross a link: every step of the ring's, the
    cross-node all-reduce's of the bound's."""
    if nodes < 2:
        return 0
    return 2 * (nodes * per_node - 1) if _ring_like(algo, transport) else 2 * (nodes - 1)


SPLIT = 1 << 20  # the host's two regimes: below 1 MiB, and from it


def host_us(regimes: list[dict], size: float) -> float:
    h = [r for r in regimes if r["from_bytes"] <= size][-1]
    return h["alpha_us"] + h["beta_us_per_byte"] * size


def predict_us(c: HostCluster, transport: str, algo: str, size: float) -> dict:
    """Host, link, their sum (the prediction, ``time_us``) and their larger (``overlap_us``),
    in us, of one all-reduce of ``size`` bytes."""
    key = f"{transport}/{algo}"
    if key not in c.host:
        raise ValueError(f"{c.name}: no host constants for {key}; calibrated: "
                         f"{', '.join(sorted(c.host)) or 'none'}")
    host = host_us(c.host[key], size)
    link = (link_bytes(algo, transport, c.nodes, c.ranks_per_node, size) / (c.link_Gbps * 125)
            + c.link_latency_us * link_steps(algo, transport, c.nodes, c.ranks_per_node))
    return {"host_us": host, "link_us": link, "time_us": host + link,
            "overlap_us": max(host, link)}


def fit_host(rows: list[dict], split: int = SPLIT) -> dict:
    """Per ``transport/algo``, alpha and beta (both >= 0) of each regime (below ``split``
    bytes, from it) by least squares of the relative error, from measured all-reduce rows
    (op, algo, transport, size, time_us)."""
    # lazy: imports numpy
    import numpy as np

    # lazy: imports numpy
    from commbench.costmodel.lsq import nnls_relative

    out: dict[str, list[dict]] = {}
    keys = sorted({(r["transport"], r["algo"]) for r in rows if r["op"] == "all_reduce"})
    for t, a in keys:
        mine = [r for r in rows if (r["op"], r["transport"], r["algo"]) == ("all_reduce", t, a)
                and r["time_us"] > 0]
        regimes = []
        for lo, hi in ((0, split), (split, float("inf"))):
            part = [r for r in mine if lo <= r["size"] < hi]
            if len(part) < 2:
                continue
            A = np.array([[1.0, float(r["size"])] for r in part])
            y = np.array([float(r["time_us"]) for r in part])
            alpha, beta = nnls_relative(A, y)
            regimes.append({"from_bytes": lo, "alpha_us": float(alpha),
                            "beta_us_per_byte": float(beta), "rows": len(part)})
        if regimes:
            regimes[0]["from_bytes"] = 0
            out[f"{t}/{a}"] = regimes
    return out


_POSITIVE_INT = ("nodes", "ranks_per_node")


def validate(data: dict, where: str) -> HostCluster:
    """A host cluster from a dict, or ValueError naming the file, the field and the rule."""
    known = set(HostCluster.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r}; known: {', '.join(sorted(known))}")
    for k in ("name", "nodes", "ranks_per_node", "link_Gbps"):
        if k not in data:
            raise ValueError(f"{where}: missing field {k!r}")
    for k in _POSITIVE_INT:
        v = data[k]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{where}: {k}={v!r}: must be an integer >= 1")
    for k, positive in (("link_Gbps", True), ("link_latency_us", False)):
        v = data.get(k, 0.0)
        bad = not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v)
        if bad or v < 0 or (positive and v == 0):
            rule = "a finite number > 0" if positive else "a finite number >= 0"
            raise ValueError(f"{where}: {k}={v!r}: must be {rule}")
    for key, regimes in data.get("host", {}).items():
        t, _, a = key.partition("/")
        if t not in TRANSPORTS or a not in ALGOS:
            raise ValueError(f"{where}: host.{key}: must be transport/algo with transport in "
                             f"{', '.join(TRANSPORTS)} and algo in {', '.join(ALGOS)}")
        need = {"from_bytes", "alpha_us", "beta_us_per_byte"}
        if not isinstance(regimes, list) or not regimes or not all(
                isinstance(h, dict) and need <= set(h) for h in regimes):
            raise ValueError(f"{where}: host.{key}: a list of regimes, each with "
                             f"{', '.join(sorted(need))}")
        starts = [h["from_bytes"] for h in regimes]
        if starts[0] != 0 or starts != sorted(set(starts)):
            raise ValueError(f"{where}: host.{key}: from_bytes {starts}: must start at 0 and "
                             "increase")
        if any(min(h["alpha_us"], h["beta_us_per_byte"]) < 0 for h in regimes):
            raise ValueError(f"{where}: host.{key}: alpha_us and beta_us_per_byte must be >= 0")
    return HostCluster(**{**data, "sources": tuple(data.get("sources", ()))})


def load(path: str) -> HostCluster | None:
    """The hosts topology in the JSON file ``path``; None when it is not one (a GPU topology, a
    preset's name, another file); ValueError naming the field and the rule when it is one that
    does not hold."""

    p = Path(path)
    if p.suffix != ".json" or not p.exists():
        return None
    try:
        data = read_json(path, "topology", TOPOLOGY_LIMIT)
    except FileRefused as exc:  # not JSON: the GPU topology loader names the error
        if "not valid JSON" in str(exc):
            return None
        raise
    if not isinstance(data, dict) or data.get("kind") != "hosts":
        return None
    return validate(data, p.name)
