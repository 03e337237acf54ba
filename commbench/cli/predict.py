"""``commbench predict``: time and bytes from the models, no ranks started.

    commbench predict collective all_reduce 1G --topology dgx-h100,dgx-a100
    commbench predict layout --topology cluster-h100-ndr --nodes 1024 --tp 8 --pp 8 --dp 128 ...

A collective: every (algorithm, protocol) NCCL's tuning model would consider, its pick, and the
busbw nccl-tests would report. A layout: per group (tp, cp, ep, dp, edp = expert data parallel,
pp) the ranks, nodes, calls and bytes per rank per step, the predicted time per step and NCCL's
pick for each collective, per topology.
"""

from __future__ import annotations

import argparse
import os
import time

from tabulate import tabulate

from commbench.costmodel import twolevel
from commbench.costmodel.calibrate import off_calibration
from commbench.costmodel.layout import predict_layout
from commbench.costmodel.layout_config import Layout
from commbench.costmodel.nccl import hierarchical_all_reduce, nccl_predict, nccl_table
from commbench.costmodel.published import check_published
from commbench.costmodel.topology import load
from commbench.costmodel.twolevel import predict_us
from commbench.names import parse_size
from commbench.results import records as res
from commbench.results.busbw import factor as bus_factor

__all__ = ["add_parser", "command", "on_ranks"]


# what each layout flag means, with its unit (the defaults come from Layout's fields)
LAYOUT_HELP = {
    "layers": "transformer layers of the model", "hidden": "hidden size (elements)",
    "ffn": "MLP inner size (elements; 0: 4 x hidden)", "heads": "attention heads",
    "kv_heads": "key/value heads (0: as many as heads; fewer: grouped-query attention)",
    "vocab": "vocabulary size (tokens)", "seq": "sequence length (tokens)",
    "micro_batch": "sequences per micro-batch", "micro_batches": "micro-batches per step",
    "tp": "tensor-parallel group size (ranks)",
    "sp": "Megatron sequence parallelism over the TP group",
    "regather": "SP: re-gather the column inputs in the backward (Megatron's default)",
    "bias": "biases in the linears (Megatron's add_bias_linear): column-parallel ones split "
            "over tp, row-parallel ones whole and, under --sp, summed over tp with the "
            "LayerNorms' gradients",
    "loss": "vocab-parallel cross-entropy: megatron (3 all-reduces), fused (2), naive "
            "(all-gathered logits), none (embedding and head not priced)",
    "cp": "context-parallel group size (ranks)", "cp_kind": "context parallelism: ring | ulysses",
    "ep": "expert-parallel group size (ranks)", "experts": "experts per MoE layer (0: dense)",
    "top_k": "experts each token is routed to",
    "capacity_factor": "expert capacity as a multiple of the even share of tokens",
    "dp": "data-parallel group size (ranks)", "pp": "pipeline stages",
    "dp_shard": "hybrid sharding (torchtitan's words): ranks each parameter is sharded over "
                "(0: dp / dp_replicate); dp is dp_shard x dp_replicate",
    "dp_replicate": "hybrid sharding: replicas of the shard group, the gradient shard "
                    "all-reduced across them (needs --zero 3 or --impl fsdp2)",
    "zero": "ZeRO stage: 0 (DDP), 1, 2 or 3", "act_bytes": "bytes per activation element",
    "impl": "whose data-parallel calls: megatron (ZeRO's stage calls of one flat vector), "
            "fsdp2 (torch's fully_shard per layer: gathers per layer forward and backward, a "
            "reduce-scatter per layer), deepspeed (ZeRO 1/2: the whole gradient all-reduced, "
            "the partitions all-gathered; 3: the model gathered and the gradient "
            "reduce-scattered per micro-batch) or torch-ddp (DDP's rebuilt buckets); with "
            "--tp, fsdp2 and torch-ddp price torch's TP styles (q, k, v apart), the others "
            "Megatron's",
    "bucket_mb": "torch-ddp: DistributedDataParallel's bucket_cap_mb (0: torch's default, "
                 "25 MiB with a first bucket of 1 MiB)",
    "no_sync": "torch-ddp: the micro-batches accumulated under no_sync(), one all-reduce per "
               "bucket per step; fsdp2: under set_requires_gradient_sync(False), one "
               "reduce-scatter per layer per step",
    "find_unused": "torch-ddp: find_unused_parameters=True (buckets never rebuilt, a bitmap "
                   "all-reduce per step)",
    "static_graph": "torch-ddp: static_graph=True (the same steady state, rebuilt one step "
                    "later; with --find-unused, rebuilt and no bitmap)",
    "no_reshard": "fsdp2: reshard_after_forward=False (the layers stay gathered for backward)",
    "overlap_grad_reduce": "megatron, zero 1: overlap_grad_reduce=True, the distributed "
                           "optimizer's buffer reduce-scattered and gathered in buckets",
    "bucket_size": "megatron with --overlap-grad-reduce: its bucket_size (elements; 0: "
                   "megatron-core's default, max(40M, 1M x dp))",
    "grad_bytes": "bytes per gradient element (the all-reduce's dtype; fsdp2: reduce_dtype)",
    "grad_norm": "megatron: its optimizer's all-reduce of the gradients' norm each step "
                 "(--no-grad-norm: a job without megatron-core's optimizer)",
    "ds_config": "deepspeed: the job's ds_config JSON (its stage, reduce_bucket_size and "
                 "gradient_accumulation_steps; they must agree with --zero, --micro-batches)",
    "param_bytes": "fsdp2: bytes per gathered parameter element (MixedPrecisionPolicy's "
                   "param_dtype; 0: as --grad-bytes)",
}
EXAMPLES = {
    "collective": "commbench predict collective all_reduce 1G --topology dgx-h100,pcie-8gpu",
    "published": "commbench predict published --nccl-version 2.30.7",
    "layout": "commbench predict layout --topology cluster-h100-ndr --nodes 64 --tp 8 --sp "
              "--pp 4 --dp 16",
}


def add_parser(sub) -> None:
    p = sub.add_parser("predict", help="bytes and time from the cost models (no ranks started)",
                       description="Bytes and time from the cost models, no ranks started. "
                                   f"Example: {EXAMPLES['layout']}\nTopology presets: "
                                   "commbench list --topologies")
    what = p.add_subparsers(dest="what", required=True, parser_class=type(p))
    c = what.add_parser("collective", help="one collective on one or more topologies",
                        description=f"Example: {EXAMPLES['collective']}")
    c.add_argument("op", help="all_reduce, all_gather, reduce_scatter, broadcast, reduce "
                   "(NCCL's tuning model), all_to_all, sendrecv (point-to-point, "
                   "costmodel/p2p.py)")
    c.add_argument("size", help="bytes (whole buffer; all-gather: the gathered size), e.g. 1G")
    _common(c)
    c.add_argument("--ranks", type=int, default=None,
                   help="GPUs taking part (default: every GPU of the topology); filled node by node")
    c.add_argument("--algo", default=None,
                   help="NCCL's algorithm to price (tree, ring, collnet_direct, collnet_chain, nvls, "
                        "nvls_tree, pat; "
                        "default: the one NCCL's tuner would pick)")
    c.add_argument("--proto", default=None,
                   help="NCCL's protocol (LL, LL128, Simple; default: the tuner's pick)")
    c.add_argument("--link-gbit", type=float, default=None,
                   help="a hosts topology (\"kind\": \"hosts\"): its link at this rate instead")
    pub = what.add_parser("published", help="the presets against published nccl-tests figures",
                          description=f"Example: {EXAMPLES['published']}")
    pub.add_argument("--nccl-version", default="2.30.7",
                     help="the NCCL version whose cost model (tuning constants) is used")
    pub.add_argument("--out", default="results", help="folder for the JSON and markdown tables")
    pub.add_argument("--no-write", action="store_true", help="write no results files")
    lay = what.add_parser("layout", help="a training layout on one or more topologies",
                          description=f"Example: {EXAMPLES['layout']}")
    _common(lay)

    for name, f in Layout.__dataclass_fields__.items():
        kind = type(f.default)
        flag, text = f"--{name.replace('_', '-')}", LAYOUT_HELP[name]
        if kind is bool:
            lay.add_argument(flag, action=argparse.BooleanOptionalAction if f.default
                             else "store_true", default=f.default,
                             help=f"{text} (default: {'on' if f.default else 'off'})")
        else:
            lay.add_argument(flag, type=kind, default=f.default, help=text)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", default="dgx-h100",
                   help="comma-separated presets (commbench list --topologies), JSON files or "
                        "NCCL_TOPO_DUMP_FILE XML files")
    p.add_argument("--nodes", type=int, default=None,
                   help="nodes of the topology (default: the topology's own count)")
    p.add_argument("--nccl-version", default="2.30.7",
                   help="the NCCL version whose cost model (tuning constants) is used")


def _topologies(a):
    return [load(t, a.nodes) for t in a.topology.split(",") if t]


def command(a) -> int:
    t0 = time.perf_counter()
    if a.what == "collective":
        _collective(a)
    elif a.what == "published":
        return _published(a)
    else:
        _layout(a)
    print(f"# answered in {(time.perf_counter() - t0) * 1e3:.1f} ms")
    return 0


def _collective(a) -> None:
    size = parse_size(a.size)
    names = [t for t in a.topology.split(",") if t]
    hosts = [c for c in map(twolevel.load, names) if c is not None]
    if hosts:
        if len(hosts) != len(names):
            raise ValueError(f"--topology {a.topology}: give hosts files (\"kind\": \"hosts\") "
                             "and GPU topologies in separate calls")
        return _on_hosts(a, hosts, size)
    if a.link_gbit is not None:
        raise ValueError("--link-gbit: only for a hosts topology (\"kind\": \"hosts\")")
    for topo in _topologies(a):
        if a.ranks is not None:
            topo = on_ranks(topo, a.ranks)
        n = topo.ranks
        table = nccl_table(a.op, size, topo, a.nccl_version)
        pick = nccl_predict(a.op, size, topo, a.nccl_version, a.algo, a.proto)
        print(f"# {a.op} of {size} B on {topo.name}: {n} ranks ({topo.nodes} x "
              f"{topo.gpus_per_node}), NCCL {a.nccl_version} model")
        _warn_off_calibration(topo)
        rows = [[t.algo, t.proto, f"{t.lat_us:.1f}", f"{t.time_us:.1f}",
                 f"{size / t.time_us / 1e3 * bus_factor(a.op, n) if t.time_us else 0:.1f}",
                 "<-" if t == pick else ""] for t in sorted(table, key=lambda t: t.time_us)]
        print(tabulate(rows, headers=["algorithm", "protocol", "latency(us)", "time(us)",
                                      "busbw(GB/s)", "pick"]))
        if a.op == "all_reduce" and topo.nodes > 1:
            t = hierarchical_all_reduce(size, topo, a.nccl_version)
            print(f"# two-level (RS in node, AR across nodes on each rail, AG in node): "
                  f"{t:.1f} us, busbw {size / t / 1e3 * bus_factor(a.op, n):.1f} GB/s")


def _on_hosts(a, clusters: list, size: int) -> None:
    """The two-level alpha-beta model of clusters of hosts (:mod:`..costmodel.twolevel`)."""

    if a.op != "all_reduce":
        raise ValueError(f"{a.op}: a hosts topology has two-level terms for all_reduce only")
    if a.link_gbit is not None and not a.link_gbit > 0:
        raise ValueError(f"--link-gbit {a.link_gbit}: must be > 0")
    for c in clusters:
        c = c.at(a.link_gbit) if a.link_gbit is not None else c
        n = c.ranks
        print(f"# all_reduce of {size} B on {c.name}: {n} ranks ({c.nodes} x {c.ranks_per_node}), "
              f"link {c.link_Gbps:g} Gbit/s each way; two-level alpha-beta model")
        rows = []
        for key in sorted(c.host):
            transport, _, algo = key.partition("/")
            if a.algo and algo != a.algo:
                continue
            p = predict_us(c, transport, algo, size)
            rows.append([transport, algo, f"{p['host_us']:.1f}", f"{p['link_us']:.1f}",
                         f"{p['time_us']:.1f}", f"{p['overlap_us']:.1f}",
                         f"{size / p['time_us'] / 1e3 * bus_factor(a.op, n):.3f}"])
        print(tabulate(rows, headers=["transport", "algorithm", "host(us)", "link(us)",
                                      "time(us)", "overlapped(us)", "busbw(GB/s)"],
                       disable_numparse=True))
        print("# time = host + link (host work and link crossing in turn); overlapped: the "
              "larger of the two, a lower bound")


def on_ranks(topo, ranks: int):
    """``topo`` cut down to ``ranks`` GPUs, filled node by node."""
    if ranks < 2:
        raise ValueError(f"--ranks {ranks}: a world of one moves nothing (no time, no bus "
                         "bandwidth); give 2 or more")
    if ranks > topo.ranks:
        raise ValueError(f"--ranks {ranks}: {topo.name} has {topo.ranks} GPUs ({topo.nodes} x "
                         f"{topo.gpus_per_node}); give --nodes {-(-ranks // topo.gpus_per_node)} "
                         "for more")
    here = min(ranks, topo.gpus_per_node)
    if ranks % here:
        raise ValueError(f"--ranks {ranks}: must fill whole nodes of {topo.gpus_per_node} GPUs "
                         "when it spans several")
    nodes = ranks // here
    if nodes > 1 and not (topo.nics_per_node and topo.nic_GBps):
        raise ValueError(f"--ranks {ranks}: {topo.name} has no NICs to span {nodes} nodes")
    return topo.part(nodes, here)


def _warn_off_calibration(topo) -> None:
    note = off_calibration(topo)
    if note:
        print(f"# warning: {note}")


def _layout(a) -> None:
    lay = Layout(**{k: getattr(a, k) for k in Layout.__dataclass_fields__})
    for topo in _topologies(a):
        rows = predict_layout(lay, topo, a.nccl_version)
        print(f"# layout on {topo.name} ({topo.ranks} GPUs; the layout uses {lay.ranks}): "
              f"tp={lay.tp} sp={lay.sp} cp={lay.cp} ({lay.cp_kind}) ep={lay.ep} dp={lay.dp} "
              + (f"(shard {lay.dp // lay.dp_replicate} x replicate {lay.dp_replicate}) "
                 if lay.dp_replicate > 1 else "")
              + f"pp={lay.pp} zero={lay.zero}, {lay.micro_batches} micro-batches; NCCL "
              f"{a.nccl_version} model")
        _warn_off_calibration(topo)
        print(tabulate([[r["group"], r["size"], f"{r['nodes']}x{r['per_node']}", r["calls"],
                         r["bytes_per_rank"], f"{r['time_ms']:.3f}", "; ".join(r["nccl"])]
                        for r in rows],
                       headers=["group", "ranks", "nodes x per node", "calls/step",
                                "bytes/rank/step", "time/step (ms)", "NCCL pick"]))
        total = sum(r["time_ms"] for r in rows)
        print(f"# communication per step if nothing overlaps: {total:.3f} ms")


def _published(a) -> int:
    rows = check_published(a.nccl_version)
    table = tabulate([[r["figure"], r["ranks"], r["algorithm"], r["published_GBps"],
                       r["predicted_GBps"], f"{r['ratio']:.3f}", r["source"]] for r in rows],
                     headers=["figure", "ranks", "model's algorithm", "published busbw",
                              "predicted busbw", "predicted/published", "source"],
                     tablefmt="github")
    print(table)
    head = [r for r in rows if r["headline"]]
    bad = [r for r in head if abs(r["ratio"] - 1) > 0.10]
    verdict = (f"Headline figures (the first {len(head)}) within 10%: {len(head) - len(bad)} of "
               f"{len(head)}. The NVLS rows by GPU count (5, 6, 7) are not held to it: they show "
               "NCCL's model flat in n, its NVLS busbw the same for any number of GPUs, while the "
               "measurements rise with n. Nor is the H800 row, a user's figure on a preset built "
               "from specifications: it shows how far off that preset is.")
    print(f"# {verdict}")
    if not a.no_write:
        record = res.header("nccl_published", 0, "none", "model", {"nccl_version": a.nccl_version,
                                                                  "size": "8 GiB"})
        record["rows"] = rows
        stem = os.path.join(a.out, "nccl_published")
        res.write_json(stem + ".json", record)
        res.write_atomic(stem + ".md", "# NCCL model against published nccl-tests figures\n\n"
                         f"NCCL {a.nccl_version} tuning model, busbw at 8 GiB; presets in "
                         "commbench/costmodel/topologies/.\n\n" + table + f"\n\n{verdict}\n")
        print(f"# wrote {stem}.json and {stem}.md")
    return 1 if bad else 0
