"""What NCCL itself printed about a run (``NCCL_DEBUG=INFO``: :mod:`commbench.results.nccl_info`)
set against the topology the model prices the run on: its nodes, channels, NVLS, network and
connections, and its own tuning table against the model's. One line for each contradiction.
Pure: no torch."""

from __future__ import annotations

from commbench.costmodel.nccl import OPS as MODELLED
from commbench.costmodel.nccl import nccl_choices
from commbench.costmodel.topology import Topology
from commbench.results.nccl_info import NcclSaid

__all__ = ["TUNING_BAND", "said_against", "tuning_against"]


TUNING_BAND = (0.8, 1.25)  # the model's algorithm bandwidth over NCCL's printed one: agreeing


def tuning_against(said: NcclSaid, op: str, topo: Topology, version: str = "2.30.7"
                   ) -> list[str]:
    """Where NCCL's own tuning table (``NCCL_DEBUG_SUBSYS=TUNING``) for ``op`` disagrees with the
    model of it on ``topo`` (the run's whole topology), one line each: a choice one enables and
    the other not, or an algorithm bandwidth outside :data:`TUNING_BAND` of NCCL's. NCCL's
    table holds the figures its tuner picks by, on the machine it found: the model's presets
    stand for them."""
    printed = {(a, p): v for (o, a, p), v in said.tuning.items() if o == op}
    if not printed or op not in MODELLED or topo.ranks < 2:
        return []
    model = nccl_choices(op, topo, version)
    out = []
    for algo, proto in sorted(set(printed) | set(model)):
        name, ncclbw = f"{algo}/{proto}", printed.get((algo, proto))
        if ncclbw is None:
            continue  # not printed (an excerpt's row cut short): nothing to set against
        ncclbw = ncclbw[1]
        ours = model[(algo, proto)][1] if (algo, proto) in model else None
        if ncclbw > 0 and ours is None:
            out.append(f"NCCL enables {op} {name} ({ncclbw:g} GB/s); the model on {topo.name} "
                       "does not")
        elif ncclbw <= 0 and ours is not None:
            out.append(f"NCCL disables {op} {name}; the model on {topo.name} enables it "
                       f"({ours:.1f} GB/s)")
        elif ours is not None and not TUNING_BAND[0] <= ours / ncclbw <= TUNING_BAND[1]:
            out.append(f"{op} {name}: NCCL's own algorithm bandwidth {ncclbw:g} GB/s, the "
                       f"model's on {topo.name} {ours:.1f} ({ours / ncclbw:.2f}x)")
    return out


def said_against(said: NcclSaid, topo: Topology) -> list[str]:
    """Where what NCCL printed about the run contradicts the topology the model prices it on,
    one line each: its nodes (or ranks a node), its channels, NVLS, the network it fell back
    to, intra-node P2P, and connections through host memory (SHM) where the topology has GPU
    links."""
    out = []
    if said.nodes is not None and said.nodes != topo.nodes:
        out.append(f"NCCL counted {said.nodes} node(s); {topo.name} is priced as {topo.nodes}")
    elif said.local_ranks is not None and said.local_ranks != topo.gpus_per_node:
        out.append(f"NCCL put {said.local_ranks} rank(s) on a node; {topo.name} has "
                   f"{topo.gpus_per_node} GPUs per node")
    if said.coll_channels is not None and said.coll_channels != topo.channels:
        out.append(f"NCCL built {said.coll_channels} collective channels; {topo.name} assumes "
                   f"{topo.channels} (give the file a \"channels\" of {said.coll_channels})")
    if said.nvls_channels is not None and (said.nvls_channels > 0) != topo.nvls:
        out.append(f"NCCL made {said.nvls_channels} NVLS channels; {topo.name} assumes NVLS "
                   + ("on" if topo.nvls else "off"))
    if said.network == "Socket" and topo.nodes > 1:
        out.append(f"NCCL fell back to sockets (NET/Socket); {topo.name}'s NICs "
                   f"({topo.nic_GBps:g} GB/s) are RDMA ones: expect far less across nodes")
    elif said.network and said.nics and topo.nodes > 1 and said.nics != topo.nics_per_node:
        out.append(f"NCCL uses {said.nics} network device(s); {topo.name} has "
                   f"{topo.nics_per_node} NICs per node")
    shm = [t for t in said.transports if t.startswith("SHM")]
    if shm and topo.intra != "pci" and topo.gpus_per_node > 1 and said.p2p_intra is not False:
        out.append(f"NCCL connected GPUs through host memory ({', '.join(shm)}), not over "
                   f"{topo.intra} as {topo.name} assumes: P2P between them was not possible")
    if said.p2p_intra is False and topo.intra != "pci" and topo.gpus_per_node > 1:
        out.append(f"NCCL found no intra-node P2P (intraNodeP2pSupport 0): inside a node data "
                   f"goes through host memory, not over {topo.intra} as {topo.name} assumes")
    return out

