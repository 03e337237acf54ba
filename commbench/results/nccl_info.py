"""What NCCL itself prints under ``NCCL_DEBUG=INFO``, read from a log's lines (an nccl-tests log
keeps them between its rows: :mod:`commbench.results.nccl_tests`): its version, ranks and
hosts, the network it uses and its devices, its channels, NVLS, the rings it built, and whether
intra-node P2P works. Lines as pasted: srun's ``  0: `` and Open MPI's ``[1,0]<stdout>:``
prefixes are taken off first (:func:`clean_line`). Pure: no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from commbench.ops import OPS

__all__ = ["TUNED_ALGOS", "TUNED_OPS", "NcclReader", "NcclSaid", "clean_line", "nccl_said"]

_PREFIX = re.compile(r"^(?:\s*\d+:\s|\[\d+,\d+\]<std(?:out|err)>:\s?)")
# host:pid:tid [device] NCCL INFO ..., or as excerpts quote it, without the host or the device
_INFO_HOST = re.compile(r"^(?:(\S+?):\d+:\d+ )?(?:\[\d+\] )?(?:NCCL|RCCL) INFO (.*)$")
# its tuning table (NCCL_DEBUG_SUBSYS=TUNING): its own latency (us) and algorithm bandwidth
# (GB/s) of each (collective, algorithm, protocol). Older NCCL heads it "Latency/AlgBw | Tree/
# LL | ...", newer with an "Algorithm | Tree | Ring ..." and a "Protocol | LL | LL128 ..." line
_TUNE_OLD = re.compile(r"^Latency/AlgBw\s*\|(.*)$")
_TUNE_ALGOS = re.compile(r"^Algorithm\s*\|(.*)$")
_TUNE_PROTOS = re.compile(r"^Protocol\s*\|(.*)$")
_TUNE_CELL = re.compile(r"^\s*([-0-9.]+)\s*/\s*([-0-9.]+)\s*$")
# its rows are named as its kernels name the collective (the records' kernel word: AllReduce)
TUNED_OPS = {o.names.kernel: o.name for o in OPS.values()
             if o.nccl and o.names.kernel and o.names.kernel != "SendRecv"}
_TUNE_ROW = re.compile(r"^(" + "|".join(map(re.escape, TUNED_OPS)) + r")\s*\|(.*)$")
# NCCL's algorithm names -> commbench's (CollNet: its one collnet algorithm before it split)
TUNED_ALGOS = {"Tree": "tree", "Ring": "ring", "CollNet": "collnet_direct",
               "CollNetDirect": "collnet_direct", "CollNetChain": "collnet_chain", "NVLS": "nvls",
               "NVLSTree": "nvls_tree", "PAT": "pat"}
# its pick for each call (NCCL_DEBUG_SUBSYS=TUNING, newer NCCL): "AllReduce: 1048576 Bytes ->
# Algo RING proto SIMPLE channel{Lo..Hi}={0..3}"
_PICK = re.compile(r"^(" + "|".join(map(re.escape, TUNED_OPS)) +
                   r"): (\d+) Bytes -> Algo (\w+) proto (\w+)")
_PROTO_NAMES = {"LL": "LL", "LL128": "LL128", "SIMPLE": "Simple"}
# a connection NCCL set up: "Channel 00/0 : 1[21000] -> 0[1000] via P2P/direct pointer",
# "... via NET/IB/0/GDRDMA", "... [send] via SHM/direct/direct": its transport, two words
# (NCCL before 2.7 printed them as "Ring 00 : 26[2] -> 30[6] via P2P/IPC", and a network
# plugin's as "... [send] via NET/AWS Libfabric/0")
_VIA = re.compile(r"^(?:Channel \d+/\d+|Ring \d+) : .*? via (\S.*?)\s*$")
_CHANNELS = re.compile(r"(\d+) coll channels, (?:(\d+) collnet channels, )?(?:(\d+) nvls channels, )?"
                       r"(\d+) p2p channels, (\d+) p2p channels per peer")
_NET = re.compile(r"^NET/(\S+) : Using (.*?)(?:\s*;\s*OOB.*)?$")
# the network NCCL chose, by name ("Using network IB", "Socket", a plugin's "Libfabric"), and
# AWS's plugin's count of its NICs: "NET/OFI Selected Provider is efa (found 16 nics)"
_USING = re.compile(r"^Using network (\S.*?)\s*$")
_OFI = re.compile(r"^NET/OFI Selected Provider is ([\w-]+).*\(found (\d+) nics\)")
_INIT = re.compile(r"\brank (\d+) nranks (\d+) cudaDev (\d+).*Init COMPLETE")
# NCCL >= 2.20.3 (src/init.cc), each rank once its topology is settled: "comm 0x... rank 7
# nRanks 16 nNodes 2 localRanks 8 localRank 7 MNNVL 0": its own count of the nodes and of the
# ranks on its node
_NODES = re.compile(r"\brank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+)")
_RING = re.compile(r"^Channel (\d+)/(\d+) :((?:\s+\d+)+)\s*$")
# each rank's place in each channel's tree: "Trees [0] 3/-1/-1->2->1 [1] ...", the channel, its
# three children (-1: none), the rank, its parent (-1: the root)
_TREE = re.compile(r"\[(\d+)\]\s+(-?\d+)/(-?\d+)/(-?\d+)->(-?\d+)->(-?\d+)")


@dataclass
class NcclSaid:
    """What NCCL itself printed under ``NCCL_DEBUG=INFO`` (None / 0 / '': it did not say)."""

    version: str = ""
    network: str = ""              # "IB", "Socket", "OFI", ...: the transport of NET/<name>
    net_devices: tuple[str, ...] = ()  # what it says it uses: "mlx5_0:1/IB", "eth0:10.0.0.1<0>"
    found_nics: int = 0            # NICs a network plugin says it found (AWS's OFI: "found 16")
    provider: str = ""             # the OFI plugin's libfabric provider ("efa")
    coll_channels: int | None = None
    nvls_channels: int | None = None
    p2p_channels: int | None = None
    nranks: int | None = None
    nodes: int | None = None       # NCCL's own count (nNodes), where it printed one
    local_ranks: int | None = None  # the ranks on one node (localRanks), where it printed them
    hosts: tuple[str, ...] = ()
    rings: int = 0                 # "Channel k/N : 0 1 2 ..." lines: N, the rings NCCL built
    tree_channels: int = 0         # "Trees [0] ... [k] ..." lines: the channels of NCCL's trees
    tree_fanout: int = 0           # the most children a rank has in a tree (1: a chain)
    p2p_intra: bool | None = None  # "Check P2P Type intraNodeP2pSupport 1|0"
    transports: tuple[str, ...] = ()  # what its connections went through: P2P/IPC, SHM/direct
    # its tuning table: (op, algorithm, protocol) -> (latency us, algorithm bandwidth GB/s), in
    # commbench's names, every cell printed: a choice NCCL disabled prints (and keeps) 0.0 / 0.0
    tuning: dict[tuple[str, str, str], tuple[float, float]] = field(default_factory=dict)
    # what its tuner picked for each call: (op, bytes as it counts them) -> (algorithm, protocol)
    picks: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)

    @property
    def nics(self) -> int:
        """The network devices NCCL says it uses (0: it did not say)."""
        return len(self.net_devices) or self.found_nics

    def facts(self) -> list[str]:
        out = []
        if self.version:
            out.append(f"NCCL {self.version}")
        if self.nranks and self.nodes:
            out.append(f"{self.nranks} ranks on {self.nodes} node(s)"
                       + (f", {self.local_ranks} a node" if self.local_ranks else ""))
        elif self.nranks:
            out.append(f"{self.nranks} ranks" + (f" on {len(self.hosts)} host(s)" if self.hosts
                                                 else ""))
        if self.network:
            out.append(f"network NET/{self.network}"
                       + (f" ({self.provider})" if self.provider else "")
                       + (f" over {self.nics} device(s)" if self.nics else ""))
        if self.coll_channels is not None:
            out.append(f"{self.coll_channels} collective channels")
        if self.rings:
            out.append(f"{self.rings} rings")
        if self.tree_channels:
            shape = "chains" if self.tree_fanout <= 1 else \
                f"trees of up to {self.tree_fanout} children a rank"
            out.append(f"{self.tree_channels} tree channels ({shape})")
        if self.nvls_channels is not None:
            out.append(f"{self.nvls_channels} NVLS channels")
        if self.p2p_intra is not None:
            out.append("intra-node P2P " + ("on" if self.p2p_intra else "off"))
        if self.transports:
            out.append("connections via " + ", ".join(self.transports))
        if self.tuning:
            on = sum(1 for _, bw in self.tuning.values() if bw > 0)
            out.append(f"its tuning table ({on} of {len(self.tuning)} choices printed enabled)")
        if self.picks:
            out.append(f"its own pick for {len(self.picks)} call size(s)")
        return out


def nccl_said(lines) -> NcclSaid | None:
    """NCCL's own ``INFO`` lines among ``lines``, read (None when there are none)."""
    reader = NcclReader()
    for raw in lines:
        reader.feed(raw)
    return reader.result()


class NcclReader:
    """:func:`nccl_said` a line at a time, for a caller that reads a file once for more than
    NCCL's lines (a job's log of any size: its INFO lines are read, never kept)."""

    def __init__(self) -> None:
        self.said, self.seen = NcclSaid(), False
        self.hosts: dict[str, None] = {}  # in the order met (a set would lose it)
        self.via: dict[str, None] = {}
        self.columns: list[tuple[str, str]] = []  # the tuning table's (algorithm, protocol)
        self.algos: list[str] = []

    def feed(self, raw: str) -> None:
        m = _INFO_HOST.match(clean_line(raw))
        if not m:
            return
        said = self.said
        self.seen = True
        host, text = m.group(1), m.group(2).strip()
        if host is not None:  # an excerpt's line may not name it
            self.hosts.setdefault(host)
        if text.startswith("NCCL version "):
            said.version = text.split()[2]
        elif n := _NET.match(text):
            said.network = n.group(1)
            said.net_devices = tuple(d for d in re.findall(r"\[\d+\](\S+)", n.group(2)))
        elif n := _OFI.match(text):
            said.network = said.network or "OFI"
            said.provider, said.found_nics = n.group(1), int(n.group(2))
        elif n := _USING.match(text):
            said.network = said.network or n.group(1)
        elif c := _CHANNELS.search(text):
            said.coll_channels = int(c.group(1))
            said.nvls_channels = int(c.group(3)) if c.group(3) is not None else said.nvls_channels
            said.p2p_channels = int(c.group(4))
        elif i := _INIT.search(text):
            said.nranks = int(i.group(2))
        elif i := _NODES.search(text):
            said.nranks, said.nodes, said.local_ranks = (int(i.group(k)) for k in (2, 3, 4))
        elif r := _RING.match(text):
            said.rings = max(said.rings, int(r.group(2)))
        elif text.startswith("Trees") and (trees := _TREE.findall(text)):
            said.tree_channels = max(said.tree_channels, len({t[0] for t in trees}))
            said.tree_fanout = max(said.tree_fanout, *(sum(int(c) >= 0 for c in t[1:4])
                                                       for t in trees))
        elif text.startswith("Check P2P Type intraNodeP2pSupport"):
            said.p2p_intra = text.split()[4] == "1"
        elif (v := _VIA.match(text)) and (t := _transport(v.group(1))) not in self.via:
            self.via[t] = None
        elif t := _TUNE_OLD.match(text):
            self.columns = [tuple(x.strip() for x in cell.split("/", 1))
                            for cell in _cells(t.group(1))]
        elif t := _TUNE_ALGOS.match(text):
            self.algos = _cells(t.group(1))
        elif (t := _TUNE_PROTOS.match(text)) and self.algos:
            protos = _cells(t.group(1))  # each algorithm's protocols, in turn; a block of
            per = len(dict.fromkeys(protos))  # fewer algorithms may print them all the same
            self.columns = [(self.algos[i // per], p) for i, p in enumerate(protos)
                            if i // per < len(self.algos)]
        elif k := _PICK.match(text):
            said.picks.setdefault((TUNED_OPS[k.group(1)], int(k.group(2))),
                                  (k.group(3).lower(), _PROTO_NAMES.get(k.group(4), k.group(4))))
        elif (t := _TUNE_ROW.match(text)) and self.columns:
            _tuned(said, TUNED_OPS[t.group(1)], self.columns, _cells(t.group(2)))

    def result(self) -> NcclSaid | None:
        if not self.seen:
            return None
        self.said.hosts, self.said.transports = tuple(self.hosts), tuple(self.via)
        return self.said


def _transport(via: str) -> str:
    """A connection's transport, its first two words: ``P2P/direct pointer`` -> ``P2P/direct``,
    ``NET/IB/0/GDRDMA`` -> ``NET/IB``, a plugin's ``NET/AWS Libfabric/0`` -> ``NET/AWS
    Libfabric`` (a name between two slashes is whole, spaces and all)."""
    parts = via.split("/")
    if len(parts) == 1:
        return parts[0].split()[0]
    return f"{parts[0]}/{parts[1] if len(parts) > 2 else parts[1].split()[0]}"


def _cells(text: str) -> list[str]:
    return [c.strip() for c in text.split("|") if c.strip()]


def _tuned(said: NcclSaid, op: str, columns: list[tuple[str, str]], cells: list[str]) -> None:
    """One row of the tuning table: each choice's (latency, bandwidth), the first printed kept
    (every rank prints the table; a row cut short keeps the cells it has, whole)."""
    for (algo, proto), cell in zip(columns, cells, strict=False):
        m = _TUNE_CELL.match(cell)
        if m is None or algo not in TUNED_ALGOS:
            continue
        said.tuning.setdefault((op, TUNED_ALGOS[algo], proto),
                               (float(m.group(1)), float(m.group(2))))


def clean_line(raw: str) -> str:
    """A pasted line without its launcher prefix and surrounding whitespace."""
    line = _PREFIX.sub("", raw.rstrip("\r\n"))
    return line.strip()
