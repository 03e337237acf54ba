"""NCCL's all-to-all and send/recv: grouped point-to-point over its p2p channels, which NCCL's
tuning model (:mod:`commbench.costmodel.nccl`) does not price. Written from NCCL's maintainers'
statements of how the two behave (sources in ``docs/costmodel.md``) and nccl-tests' conventions.

Per rank, for nccl-tests' size S (all-to-all: what one rank sends in all, S/n to each rank;
send/recv: what each rank sends to the next and receives from the previous):

* inside a node the messages go over NVLink (through NVSwitch, or the direct links of a switchless
  node) or PCIe at the GPU's intra-node bandwidth, the same figure NCCL's graph search starts from
  (18 NVLink 4 links x 20.6 GB/s = 370.8 GB/s on an H100, the ~370 GB/s NCCL reaches on NVLink for
  every operation but all-reduce);
* across nodes a GPU's messages leave through its own NIC: point-to-point cannot aggregate several
  NICs, so its share is ``min(nic_GBps, nics_per_node * nic_GBps / gpus_per_node)`` (PXN moves a
  message to the GPU of the right rail first; it does not add bandwidth);
* all-to-all: the (L-1)/n of S for the node's other GPUs and the (n-L)/n for other nodes move at
  once, so ``time = latency + max(S (L-1)/n / intra, S (n-L)/n / nic)``; busbw = algbw (n-1)/n,
  which on N nodes of L GPUs is (n-1)/(n-L) x the NIC share: N/(N-1) x it for large L, the NIC's
  own bandwidth with one GPU per node;
* send/recv: every rank's S goes to one peer; a ring of ranks over several nodes has pairs that
  cross the network, and the slowest pair sets nccl-tests' time: ``latency + S / bw`` with bw the
  NIC share across nodes, else the intra-node bandwidth to one peer (through NVSwitch the GPU's
  whole bandwidth; on direct links its share of them, links / (L-1));
* latency: NCCL's ring base latency and one hop of its hardware latency (network across nodes,
  else NVLink or PCI), for the Simple protocol, as its point-to-point operations use.

Pure: no torch.
"""

from __future__ import annotations

from commbench.costmodel.topology import Topology

__all__ = ["P2P_OPS", "p2p_time"]

P2P_OPS = ("all_to_all", "sendrecv")


def p2p_time(op: str, nbytes: int, topo: Topology, c: dict) -> tuple[float, float]:
    """(time us, latency us) of ``op`` with nccl-tests' size ``nbytes`` on all of ``topo``'s
    ranks, NCCL's constants ``c`` (module docstring)."""
    if op not in P2P_OPS:
        raise ValueError(f"op={op!r}: the point-to-point model covers {', '.join(P2P_OPS)}")
    n, L, N = topo.ranks, topo.gpus_per_node, topo.nodes
    if n == 1:
        return 0.0, 0.0
    intra = topo.intra_bw(c["nvlink_bw_per_link"][topo.arch])
    nic = min(topo.nic_GBps, topo.nics_per_node * topo.nic_GBps / L) if N > 1 else 0.0
    link = "net" if N > 1 else ("pci" if topo.intra == "pci" else "nvlink")
    lat = c["base_lat_us"]["ring"][2] + c["hw_lat_us"][link]["ring"][2]
    if op == "all_to_all":
        here = nbytes * (L - 1) / n / (1000 * intra) if L > 1 else 0.0
        away = nbytes * (n - L) / n / (1000 * nic) if N > 1 else 0.0
        return lat + max(here, away), lat
    if N > 1:
        bw = nic
    elif topo.intra == "nvlink":  # direct links, no switch: a pair has its share of them
        bw = intra / max(L - 1, 1)
    else:
        bw = intra
    return lat + nbytes / (1000 * bw), lat
