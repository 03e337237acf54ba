"""Machine topologies for the NCCL model: presets as data files, user files, and NCCL's own
``NCCL_TOPO_DUMP_FILE`` XML.

A topology holds hardware facts only (GPU architecture, GPUs per node, NVLink links or PCIe
bandwidth, NICs and their measured bandwidth, CPU vendor, NVLS/SHARP support). The per-channel
bandwidths NCCL's graph search would find are derived from them by :func:`graphs`, with rules
written down there, so a preset cannot be tuned to a published figure by hand; a file may still
give ``graphs`` explicitly (from an ``NCCL_GRAPH_DUMP_FILE``), which then wins.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from commbench.results.files import TOPOLOGY_LIMIT, read_json, read_text

__all__ = ["GPU_PRESETS", "Graph", "Topology", "from_nccl_xml", "gpu_presets", "graphs", "load",
           "presets"]

# a GPU's name, by whole word -> (the preset of one node of its machine, of several): a GH200 is
# no H200 and a GB200 no B200; first match wins
GPU_PRESETS = (("GH200", "alps-gh200", "alps-gh200"), ("B200", "dgx-b200", "dgx-b200"),
               ("H200", "dgx-h200", "cluster-h100-ndr"), ("H100", "dgx-h100", "cluster-h100-ndr"),
               ("H800", "hgx-h800", "hgx-h800"),
               ("A100", "dgx-a100", "cluster-a100-hdr"))
_CARD = re.compile(r"\b(?:PCIe|NVL)\b", re.I)  # a PCIe card (NVL: bridged pairs), on no NVSwitch


def gpu_presets(name: str) -> tuple[str, str] | None:
    """(one-node preset, multi-node preset) of the machine a device named ``name`` sits in
    (``NVIDIA H100 80GB HBM3``, ``NVIDIA B200``), or None: a GPU no preset is for, or a PCIe or
    NVL card (``NVIDIA H100 PCIe``, ``NVIDIA H200 NVL``), whose links are not an SXM board's."""
    if _CARD.search(name):
        return None
    return next(((one, many) for word, one, many in GPU_PRESETS
                 if re.search(rf"\b{word}\b", name, re.I)), None)

ARCHS = ("volta", "ampere", "hopper", "blackwell")
SM_ARCH = {70: "volta", 80: "ampere", 90: "hopper", 100: "blackwell"}


@dataclass(frozen=True)
class Graph:
    """What ``ncclTopoTuneModel`` reads from a graph: channels and per-channel GB/s."""

    channels: int
    bw_intra: float
    bw_inter: float


@dataclass(frozen=True)
class Topology:
    name: str
    arch: str
    gpus_per_node: int
    nodes: int = 1
    intra: str = "nvswitch"          # nvswitch | nvlink | pci
    nvlink_links: int = 0
    pci_GBps: float = 0.0
    nics_per_node: int = 0
    nic_GBps: float = 0.0            # measured per-NIC bandwidth, GB/s
    latency_inter_us: float = 0.0
    intra_GBps: float = 0.0          # a GPU's intra-node bandwidth as measured (0: from its links)
    proto_bw: dict = field(default_factory=dict)      # protocol -> factor on its bandwidth
    proto_lat_us: dict = field(default_factory=dict)  # protocol -> latency added per call
    chunk_fill: dict = field(default_factory=dict)    # nvls_tree -> chunk-times of fill a call
    cpu_vendor: str = "intel"
    channels: int = 16
    nvls_channels: int = 16
    nvls: bool = False
    collnet: bool = False
    description: str = ""
    sources: tuple[str, ...] = ()
    graphs: dict = field(default_factory=dict)
    calibration: dict = field(default_factory=dict)  # what commbench calibrate fitted, and on what

    def intra_bw(self, nvlink_bw_per_link: float) -> float:
        """A GPU's intra-node GB/s: the calibrated figure, else its NVLink links at the per-link
        bandwidth NCCL assumes (or its PCIe bandwidth)."""
        if self.intra_GBps:
            return self.intra_GBps
        return self.nvlink_links * nvlink_bw_per_link if self.intra != "pci" else self.pci_GBps

    def with_nodes(self, nodes: int) -> Topology:
        return replace(self, nodes=nodes)

    def part(self, nodes: int, per_node: int) -> Topology:
        """``nodes`` nodes with ``per_node`` of this machine's GPUs each (a group of a larger
        job): those GPUs' share of each node's NICs, NVLS only with two or more per node."""
        nics = max(1, self.nics_per_node * per_node // self.gpus_per_node) \
            if self.nics_per_node else 0
        return replace(self, nodes=nodes, gpus_per_node=per_node, nics_per_node=nics,
                       nvls=self.nvls and per_node > 1)

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node


_REQUIRED = ("name", "arch", "gpus_per_node")
_POSITIVE = ("gpus_per_node", "nodes", "channels", "nvls_channels")


def validate(data: dict, where: str) -> Topology:
    """A topology from a dict, or ValueError naming the file, the field and the rule."""
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ValueError(f"{where}: missing field {missing[0]!r}")
    known = set(Topology.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r}; known: {', '.join(sorted(known))}")
    if data["arch"] not in ARCHS:
        raise ValueError(f"{where}: arch={data['arch']!r}: must be one of {', '.join(ARCHS)}")
    for k in _POSITIVE:
        v = data.get(k, 1)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{where}: {k}={v!r}: must be an integer >= 1")
    intra = data.get("intra", "nvswitch")
    if intra not in ("nvswitch", "nvlink", "pci"):
        raise ValueError(f"{where}: intra={intra!r}: must be 'nvswitch', 'nvlink' or 'pci'")
    if intra != "pci" and data.get("nvlink_links", 0) < 1:
        raise ValueError(f"{where}: nvlink_links={data.get('nvlink_links', 0)}: an NVLink "
                         "machine needs at least one link per GPU")
    if intra == "pci" and not data.get("pci_GBps", 0) > 0:
        raise ValueError(f"{where}: pci_GBps={data.get('pci_GBps', 0)}: must be > 0 for intra='pci'")
    for k in ("nic_GBps", "pci_GBps", "latency_inter_us", "intra_GBps"):
        v = data.get(k, 0)
        if not isinstance(v, int | float) or v < 0 or math.isnan(v):
            raise ValueError(f"{where}: {k}={v!r}: must be a number >= 0")
    if data.get("nodes", 1) > 1 and not (data.get("nics_per_node", 0) >= 1 and data.get("nic_GBps", 0) > 0):
        raise ValueError(f"{where}: nodes={data['nodes']} needs nics_per_node >= 1 and nic_GBps > 0")
    if data.get("cpu_vendor", "intel") not in ("intel", "amd"):
        raise ValueError(f"{where}: cpu_vendor={data['cpu_vendor']!r}: must be 'intel' or 'amd'")
    if data.get("nvls") and (data["arch"] not in ("hopper", "blackwell") or intra != "nvswitch"):
        raise ValueError(f"{where}: nvls=true needs a Hopper or Blackwell GPU behind NVSwitch")
    for name, g in data.get("graphs", {}).items():
        if not isinstance(g, dict) or set(g) != {"channels", "bw_intra", "bw_inter"}:
            raise ValueError(f"{where}: graphs.{name}: needs exactly channels, bw_intra, bw_inter")
    for k, rule in (("proto_bw", "a factor > 0"), ("proto_lat_us", "microseconds >= 0")):
        v = data.get(k, {})
        if not isinstance(v, dict) or any(p not in ("LL", "LL128", "Simple") for p in v):
            raise ValueError(f"{where}: {k}: must map LL, LL128 or Simple to {rule}")
        for p, x in v.items():
            ok = isinstance(x, int | float) and math.isfinite(x) and (x > 0 if k == "proto_bw"
                                                                     else x >= 0)
            if not ok:
                raise ValueError(f"{where}: {k}.{p}={x!r}: must be {rule}")
    fill = data.get("chunk_fill", {})
    if not isinstance(fill, dict) or any(a != "nvls_tree" for a in fill):
        raise ValueError(f"{where}: chunk_fill: must map nvls_tree to chunk-times >= 0")
    for a, x in fill.items():
        if not (isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
                and x >= 0):
            raise ValueError(f"{where}: chunk_fill.{a}={x!r}: must be chunk-times >= 0")
    if not isinstance(data.get("calibration", {}), dict):
        raise ValueError(f"{where}: calibration: must be an object")
    return Topology(**{**data, "sources": tuple(data.get("sources", ()))})


def presets() -> dict[str, Path]:
    base = resources.files("commbench.costmodel") / "topologies"
    return {p.name[:-5]: Path(str(p)) for p in base.iterdir() if p.name.endswith(".json")}


def load(name_or_path: str, nodes: int | None = None) -> Topology:
    """A preset by name, a JSON file, or an NCCL_TOPO_DUMP_FILE XML (``.xml``)."""
    known = presets()
    path = known.get(name_or_path) or Path(name_or_path)
    if not path.exists():
        raise ValueError(f"topology {name_or_path!r}: no such preset or file; presets: "
                         f"{', '.join(sorted(known))}")

    if path.suffix == ".xml":
        topo = from_nccl_xml(read_text(str(path), "topology", TOPOLOGY_LIMIT), path.name)
    else:
        data = read_json(str(path), "topology", TOPOLOGY_LIMIT)
        if not isinstance(data, dict):
            raise ValueError(f"{path.name}: must hold a JSON object")
        topo = validate(data, path.name)
    if nodes is not None:
        if nodes < 1:
            raise ValueError(f"nodes={nodes}: must be >= 1")
        if nodes > 1 and not (topo.nics_per_node and topo.nic_GBps):
            raise ValueError(f"{topo.name}: has no NICs, so it cannot span nodes={nodes}")
        topo = topo.with_nodes(nodes)
    return topo


def from_nccl_xml(text: str, where: str = "topology XML") -> Topology:
    """One node from NCCL's topology dump: GPUs (sm), NVLink counts and NVSwitch, NICs (speed in
    Mb/s), CPU vendor. NIC bandwidth is taken as the line rate (speed / 8000 GB/s)."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"{where}: not valid XML ({exc})") from None
    if root.tag != "system":
        raise ValueError(f"{where}: root element is <{root.tag}>, NCCL's dump has <system>")
    gpus = root.findall(".//gpu")
    if not gpus:
        raise ValueError(f"{where}: no <gpu> element")
    sms = {int(g.get("sm", "0")) for g in gpus}
    sm = max(sms)
    arch = SM_ARCH.get(sm // 10 * 10)
    if arch is None:
        raise ValueError(f"{where}: gpu sm={sm}: not a known architecture ({sorted(SM_ARCH)})")
    links = [sum(int(n.get("count", "1")) for n in g.findall("nvlink")) for g in gpus]
    switch = any(n.get("tclass") == "0x068000" for g in gpus for n in g.findall("nvlink"))
    nets = root.findall(".//net")
    vendor = "amd" if any("AMD" in (c.get("vendor") or "") for c in root.findall("cpu")) else "intel"
    data = {"name": where, "arch": arch, "gpus_per_node": len(gpus),
            "intra": "nvswitch" if switch else ("nvlink" if min(links) else "pci"),
            "nvlink_links": min(links), "pci_GBps": 0.0 if min(links) else 24.0,
            "nics_per_node": len(nets),
            "nic_GBps": (min(float(n.get("speed", "0")) for n in nets) / 8000) if nets else 0.0,
            "cpu_vendor": vendor, "nvls": switch and arch in ("hopper", "blackwell"),
            "description": f"read from {where}"}
    return validate(data, where)


def graphs(topo: Topology, nvlink_bw_per_link: float, search_speeds: list[float]) -> dict[str, Graph]:
    """The graphs NCCL's search would build, from the hardware (unless the file gives them).

    * ring/tree: ``channels`` channels sharing the GPU's intra-node bandwidth (links x the per-
      link bandwidth NCCL assumes for the architecture, or the PCIe bandwidth); across nodes a
      channel also gets its share of the node's NICs, and the smaller of the two bounds it, on
      the network's hops as on the node's (search.cc starts a graph at one speed for both, and
      a ring keeps them equal: a channel that crosses the network also crosses NVLink, so its
      inter-node speed is never above what the node's links carry; where NVLink is the slower,
      as on an H800 node, more nodes do not make a ring faster).
    * nvls / nvls_tree: ``nvls_channels`` channels at the fastest of NCCL's search speeds that
      fits the intra-node bandwidth (search.cc tries them from the top).
    """
    intra = topo.intra_bw(nvlink_bw_per_link)
    net = topo.nics_per_node * topo.nic_GBps
    per_intra = intra / topo.channels
    per_inter = net / topo.channels if net else 0.0
    multi = topo.nodes > 1
    per = min(per_intra, per_inter) if multi else per_intra
    ring = Graph(topo.channels, per, per)
    nv_per = intra / topo.nvls_channels
    speed = next((s for s in search_speeds if s <= nv_per), 0.0)
    nvls = Graph(topo.nvls_channels, speed, net / topo.nvls_channels if net else 0.0)
    out = {"ring": ring, "tree": ring, "collnet_direct": ring, "collnet_chain": ring,
           "pat": ring, "nvls": nvls, "nvls_tree": nvls}
    for name, g in topo.graphs.items():
        out[name] = Graph(**g)
    return out
