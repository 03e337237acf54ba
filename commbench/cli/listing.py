"""``commbench list``: every registered pattern and every collective algorithm;
``commbench list --topologies``: the topology presets ``--topology`` takes by name."""

from __future__ import annotations

from tabulate import tabulate

from commbench.collectives import ALGORITHMS
from commbench.costmodel.topology import load, presets
from commbench.patterns.registry import PATTERNS

__all__ = ["listing", "topologies"]


def topologies(emit=print) -> int:
    rows = []
    for name in sorted(presets()):
        t = load(name)
        nic = f"{t.nics_per_node} x {t.nic_GBps:g} GB/s" if t.nics_per_node else "-"
        rows.append([name, t.arch, t.gpus_per_node, t.intra, nic, t.description])
    emit(tabulate(rows, headers=["preset (--topology NAME)", "arch", "GPUs/node", "in the node",
                                 "NICs per node", "what it is"], tablefmt="github"))
    emit("")
    emit("A file works too: --topology FILE (JSON as these presets, or NCCL_TOPO_DUMP_FILE's XML).")
    return 0


def listing(emit=print) -> int:
    rows = [[p.name, " ".join(p.markers), ", ".join(p.variants), p.optimized,
             " ".join(p.axes), ", ".join(b.name for b in p.broken)] for p in PATTERNS.values()]
    emit(tabulate(rows, headers=["pattern", "markers", "variants", "optimized", "groups",
                                 "broken variants (the contract must catch them)"],
                  tablefmt="github"))
    emit("")
    algos: dict[str, list[str]] = {}
    for op, name in ALGORITHMS:
        algos.setdefault(op, []).append(name)
    emit(tabulate([[op, ", ".join(names)] for op, names in algos.items()],
                  headers=["collective", "algorithms (native: the transport's own)"],
                  tablefmt="github"))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("list", help="every registered pattern and collective algorithm",
                       description="Example: commbench list; commbench list --topologies")
    p.add_argument("--topologies", action="store_true",
                   help="list the topology presets --topology takes by name instead")


def command(a) -> int:
    return topologies() if a.topologies else listing()
