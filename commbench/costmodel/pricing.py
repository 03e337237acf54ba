"""NCCL's model of one call on the part of a topology its group spans (pure): what the layout
prediction sums per group and ``commbench analyze`` sets beside each traced call. A module of
its own so that pricing a call does not import every pattern (the layout's calls do)."""

from __future__ import annotations

from commbench.costmodel.nccl import nccl_predict
from commbench.costmodel.topology import Topology
from commbench.ops import OPS
from commbench.patterns.base import Call

__all__ = ["call_time_us", "group_span"]


def group_span(ranks: tuple[int, ...], per_node: int) -> tuple[int, int]:
    """(nodes, most members on one node) of a group of ``ranks``, ``per_node`` ranks a node."""
    on: dict[int, int] = {}
    for r in ranks:
        on[r // per_node] = on.get(r // per_node, 0) + 1
    return len(on), max(on.values())


P2P = ("isend", "send", "recv", "irecv")


def call_time_us(call: Call, n: int, topo: Topology, span, version: str):
    """NCCL's model of a call on its ``span`` (nodes, GPUs per node) of ``topo``: its tuning
    model for a collective, the point-to-point model (:mod:`.p2p`) for all-to-all and for a
    send (a receive costs nothing more than its send)."""
    nodes, here = span
    op = call.op
    if op in ("irecv", "recv"):
        return 0.0, "p2p"
    sub = topo.part(nodes, here)
    nbytes = call.size * n if OPS[op].input == "block" else call.size  # nccl-tests' size
    choice = nccl_predict("sendrecv" if op in P2P else op, nbytes, sub, version)
    return choice.time_us, f"{choice.algo}/{choice.proto}"
