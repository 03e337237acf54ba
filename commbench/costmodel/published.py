"""Published nccl-tests figures, each with its source, and the model's prediction for it.

``commbench predict published`` prints the table and writes ``results/nccl_published.{md,json}``;
tests/test_costmodel.py holds every figure to 10%. Large-message busbw is predicted at 8 GiB
(nccl-tests' ``-e 8G``), where latency is a rounding error.
"""

from __future__ import annotations

from commbench.costmodel.nccl import nccl_predict
from commbench.costmodel.topology import load
from commbench.results.busbw import factor

__all__ = ["FIGURES", "HEADLINE", "check_published"]

# (what, topology, nodes, op, algo forced or None for NCCL's pick, published busbw GB/s, source)
# HEADLINE figures are held to 10%; the NVLS-by-GPU-count ones show where NCCL's model is flat
# in n (its NVLS busbw does not depend on the number of GPUs) while the measurement rises, and
# the H800 one how far a preset built from specifications is from a user's measurement.
FIGURES = [
    ("8 x H100 ring all-reduce", "dgx-h100", 1, "all_reduce", "ring", 370.0,
     "sjeaugey in NVIDIA/nccl-tests#212 (~370 GB/s effective NVLink with NCCL_ALGO=RING); "
     "365-370 GB/s for 2-8 GPUs in NVIDIA/nccl#1455"),
    ("8 x H100 NVLS all-reduce", "dgx-h100", 1, "all_reduce", "nvls", 480.0,
     "sjeaugey in NVIDIA/nccl-tests#212 (peak ~480 GB/s on 8 GPUs); 370 -> 480 with NVLS on, "
     "NVIDIA/nccl#2140"),
    ("8 x H200 all-reduce (NCCL's pick)", "dgx-h200", 1, "all_reduce", None, 475.0,
     "NVIDIA/nccl-tests#272"),
    ("8 x B200 all-reduce (NCCL's pick)", "dgx-b200", 1, "all_reduce", None, 830.0,
     "pzcyyj in NVIDIA/nccl#1807 ('830+' on one 8 x B200 machine, NCCL 2.27.1; NCCL's own maxBw "
     "there, 721.8 GB/s, is the preset's 18 NVLink 5 links x 40.1 GB/s)"),
    ("8 x H100 all-reduce, single node (NCCL's pick)", "dgx-h100", 1, "all_reduce", None, 476.0,
     "AddyLaddy in NVIDIA/nccl-tests#290 ('in the expected range')"),
    ("H100 nodes x 8 NDR, multi-node all-reduce", "cluster-h100-ndr", 16, "all_reduce", None,
     380.0, "GTC 2024 slides quoted in NVIDIA/nccl#1649 (~380 GB/s without SHARP, 370-380 "
     "NVLSTree)"),
    ("DGX A100 x 8 HDR200, multi-node all-reduce", "cluster-a100-hdr", 16, "all_reduce", None,
     192.0, "AddyLaddy quoted in NVIDIA/nccl#1576"),
]
FIGURES += [  # NCCL's point-to-point (costmodel/p2p.py)
    ("8 x H100 all-to-all, one node", "dgx-h100", 1, "all_to_all", None, 370.0,
     "sjeaugey in NVIDIA/nccl-tests#212 (~370 GB/s effective NVLink, seen as busbw for every "
     "operation but all-reduce)"),
    ("8 x H100 send/recv, one node", "dgx-h100", 1, "sendrecv", None, 370.0,
     "the same statement, NVIDIA/nccl-tests#212"),
    ("H100 nodes x 8 NDR, all-to-all on 6 nodes", "cluster-h100-ndr", 6, "all_to_all", None, 57.6,
     "sjeaugey in NVIDIA/nccl-tests#130 (busbw N/(N-1) x the network bandwidth per GPU) with "
     "48 GB/s per CX-7 NDR NIC (AddyLaddy in NVIDIA/nccl-tests#267, where 6 such nodes show "
     "busbw above 50 GB/s)"),
    ("H100 nodes x 1 GPU NDR, all-to-all on 2 nodes", "cluster-h100-ndr@1", 2, "all_to_all", None,
     48.0, "sjeaugey in NVIDIA/nccl-tests#130 ('with one GPU per node the BusBw should be the NIC "
     "BW'); 48 GB/s per CX-7 NDR NIC, NVIDIA/nccl-tests#267"),
]
HEADLINE = len(FIGURES)
FIGURES += [(f"{g} x H100 NVLS all-reduce", f"dgx-h100@{g}", 1, "all_reduce", "nvls", bw,
             "NVIDIA/nccl#1455 (NVLS 420/440/460/480 GB/s for 5/6/7/8 GPUs)")
            for g, bw in ((5, 420.0), (6, 440.0), (7, 460.0))]
# a user's figure, not a maintainer's, on a preset built from specifications: shown, not held
FIGURES += [("8 x H800 all-reduce (NCCL's pick)", "hgx-h800", 1, "all_reduce", None, 215.0,
             "yupatrick22 in NVIDIA/nccl#1374 (an 8 x H800 node: 215 GB/s, above the H800's "
             "200 GB/s of NVLink each way)")]


def check_published(version: str = "2.30.7", size: int = 8 << 30) -> list[dict]:
    rows = []
    for k, (what, name, nodes, op, algo, published, source) in enumerate(FIGURES):
        name, _, gpus = name.partition("@")
        topo = load(name, nodes)
        if gpus:
            topo = topo.part(topo.nodes, int(gpus))
        pick = nccl_predict(op, size, topo, version, algo)
        busbw = size / pick.time_us / 1e3 * factor(op, topo.ranks)
        rows.append({"figure": what, "topology": name, "ranks": topo.ranks, "op": op,
                     "algorithm": f"{pick.algo}/{pick.proto}", "published_GBps": published,
                     "predicted_GBps": round(busbw, 1), "ratio": busbw / published,
                     "headline": k < HEADLINE, "source": source})
    return rows
