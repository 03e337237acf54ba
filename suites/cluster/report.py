"""``results/cluster_*`` from the folders of ``measure.py``: the measured all-reduce at each link
rate beside the two-level model's prediction (:mod:`commbench.costmodel.twolevel`).

    python suites/cluster/report.py DIR [--out results] [--name emulated-2x2]

The host constants are fitted on the unshaped rows and written, with the nodes and the link, as
``cluster_<name>-topology.json`` (``commbench predict collective all_reduce 16M --topology`` that
file, ``--link-gbit`` for another rate). Each shaped row then gets its prediction and error; the
tables give, per rate, the algorithms side by side (hierarchical / ring, hierarchical / native:
the same run, the same sizes), busbw against the link's rate, and the median error per
algorithm at 1 MiB and up, where the link decides.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from tabulate import tabulate

from commbench.costmodel.twolevel import HostCluster, fit_host, link_bytes, predict_us
from commbench.names import parse_size
from commbench.results import records as res
from commbench.results.busbw import factor

BIG = 1 << 20  # from here the link decides; the model's target is judged on these rows
TARGET = 0.25


def _rows(folder: Path) -> list[dict]:
    rows = []
    for f in sorted(folder.glob("all_reduce_*.json")):
        rows += json.loads(f.read_text())["rows"]
    return rows


def _mib(size: int) -> str:
    return f"{size / (1 << 20):g} MiB" if size >= BIG else f"{size} B"


def build(runs: Path, name: str) -> tuple[dict, HostCluster, str]:
    base = _rows(runs / "unshaped")
    if not base:
        raise SystemExit(f"{runs}/unshaped: no rows (run measure.py with the rate 'none')")
    cluster = HostCluster(name=name, nodes=2, ranks_per_node=2, link_Gbps=1.0, host=fit_host(base),
                          description="2 network namespaces x 2 ranks on one host, joined by a "
                                      "veth pair shaped with tc tbf (suites/cluster)",
                          sources=("host constants: relative least squares on the unshaped "
                                   "rows of the same run",))
    n = cluster.ranks
    volume = json.loads((runs / "volume.json").read_text())
    for v in volume:
        v["predicted"] = link_bytes(v["algo"], v["transport"], 2, 2, parse_size(v["size"]))
    rates, out_rows, md, medians = [], [], [], []
    for folder in sorted(p for p in runs.iterdir() if p.is_dir() and p.name != "unshaped"):
        link = json.loads((folder / "link.json").read_text())
        gbit = link["gbit"]
        rates.append({"gbit": gbit, "seconds": link["seconds"], "tx_bytes": link["tx_bytes"]})
        c = cluster.at(gbit)
        table, errs = [], {}
        rows = _rows(folder)
        by = {(r["transport"], r["algo"], r["size"]): r for r in rows}
        for r in sorted(rows, key=lambda r: (r["transport"], r["size"], r["algo"])):
            p = predict_us(c, r["transport"], r["algo"], r["size"])
            err = p["time_us"] / r["time_us"] - 1
            ring = by.get((r["transport"], "ring", r["size"]))
            native = by.get((r["transport"], "native", r["size"]))
            row = {"gbit": gbit, "transport": r["transport"], "algo": r["algo"], "size": r["size"],
                   "time_us": r["time_us"], "min_us": r["min_us"], "max_us": r["max_us"],
                   "busbw": r["busbw"], "busbw_over_link": r["busbw"] / (gbit / 8),
                   "link_bytes": link_bytes(r["algo"], r["transport"], 2, 2, r["size"]),
                   "pred_host_us": p["host_us"], "pred_link_us": p["link_us"],
                   "pred_us": p["time_us"], "error": err, "pred_overlap_us": p["overlap_us"],
                   "error_overlap": p["overlap_us"] / r["time_us"] - 1,
                   "over_ring": r["time_us"] / ring["time_us"] if ring else None,
                   "over_native": r["time_us"] / native["time_us"] if native else None,
                   "wrong": r["wrong"]}
            out_rows.append(row)
            if r["size"] >= BIG:
                errs.setdefault((r["transport"], r["algo"]), []).append(
                    (abs(err), abs(row["error_overlap"])))
            table.append([r["transport"], _mib(r["size"]), r["algo"], f"{r['time_us']:.0f}",
                          f"{r['min_us']:.0f}-{r['max_us']:.0f}", f"{r['busbw']:.3f}",
                          f"{row['busbw_over_link']:.2f}", f"{row['over_ring']:.2f}",
                          f"{row['over_native']:.2f}", f"{p['time_us']:.0f}",
                          f"{100 * err:+.0f}%", r["wrong"]])
        summary = []
        for (t, a), e in sorted(errs.items()):
            med = statistics.median(x for x, _ in e)
            summary.append([t, a, len(e), f"{100 * med:.0f}%", f"{100 * max(x for x, _ in e):.0f}%",
                            "yes" if med <= TARGET else "no",
                            f"{100 * statistics.median(y for _, y in e):.0f}%"])
            medians.append({"gbit": gbit, "transport": t, "algo": a, "rows": len(e),
                            "median_error": med, "worst_error": max(x for x, _ in e),
                            "median_error_overlap": statistics.median(y for _, y in e)})
        sides = []
        for t in sorted({r["transport"] for r in rows}):
            mine = [x for x in out_rows if x["gbit"] == gbit and x["transport"] == t
                    and x["size"] >= BIG]
            ratio = [x["over_ring"] for x in mine if x["algo"] == "hierarchical"]
            best = {a: max(x["busbw_over_link"] for x in mine if x["algo"] == a)
                    for a in ("native", "ring", "hierarchical")}
            sides.append([t, f"{statistics.median(ratio):.2f}", f"{min(ratio):.2f}-{max(ratio):.2f}",
                          *(f"{best[a]:.2f}" for a in ("native", "ring", "hierarchical"))])
        md.append(f"## Link at {gbit:g} Gbit/s each way\n\n"
                  "Side by side at 1 MiB and up: hierarchical time over ring time (median, range; "
                  "below 1: the hierarchical algorithm is faster; 0.67 where only the link "
                  "counts), and the highest busbw over the link's rate per algorithm:\n\n"
                  + tabulate(sides, headers=["transport", "hierarchical / ring", "range",
                                             "native busbw/link", "ring busbw/link",
                                             "hierarchical busbw/link"], tablefmt="github")
                  + "\n\n"
                  f"Link bytes sent during the run (node0, node1): {link['tx_bytes'][0]:,}, "
                  f"{link['tx_bytes'][1]:,}; {link['seconds']:.0f} s.\n\n"
                  "Median |predicted - measured| / measured at 1 MiB and up:\n\n"
                  + tabulate(summary, headers=["transport", "algorithm", "rows", "median error",
                                               "worst", f"within {TARGET:.0%}",
                                               "overlapped: median error"],
                             tablefmt="github") + "\n\n"
                  + tabulate(table, headers=["transport", "size", "algorithm", "time (us)",
                                             "min-max (us)", "busbw (GB/s)", "busbw / link",
                                             "/ ring", "/ native", "predicted (us)", "error",
                                             "#wrong"], tablefmt="github") + "\n")
    record = res.header(f"cluster_{name}", n, "gloo,mpi", "emulated", {
        "nodes": 2, "ranks_per_node": 2, "rates_gbit": [r["gbit"] for r in rates],
        "algos": ["native", "ring", "hierarchical"], "op": "all_reduce", "dtype": "float32"})
    record.update({"links": rates, "topology": f"cluster_{name}-topology.json",
                   "busbw_factor": factor("all_reduce", n), "medians": medians,
                   "volume": volume, "rows": out_rows})
    host = tabulate([[k, _mib(h["from_bytes"]), f"{h['alpha_us']:.1f}",
                      f"{h['beta_us_per_byte'] * 1e3:.3f}", h["rows"]]
                     for k, regimes in sorted(cluster.host.items()) for h in regimes],
                    headers=["transport/algorithm", "from", "alpha (us)", "beta (ns/B)", "rows"],
                    tablefmt="github")
    vol = tabulate([[v["transport"], v["algo"], v["size"], f"{v['tx_bytes_per_call'][0]:,.0f}",
                     f"{v['tx_bytes_per_call'][1]:,.0f}", f"{v['predicted']:,.0f}",
                     f"{max(v['tx_bytes_per_call']) / v['predicted']:.3f}"] for v in volume],
                   headers=["transport", "algorithm", "size", "node0 sent / call",
                            "node1 sent / call", "model's link bytes", "measured / model"],
                   tablefmt="github")
    text = (f"# All-reduce on an emulated two-node cluster ({name})\n\n"
            "2 nodes x 2 ranks: network namespaces on one 2-core host, joined by a veth link "
            "shaped with tc tbf to the rate given, each direction; MPICH's mpiexec across both "
            "(suites/cluster). Time: the median iteration (max over ranks), min-max beside it; "
            "busbw as nccl-tests; `busbw / link`: busbw over the link's rate in GB/s (the ring "
            "is bound at 1.0, the hierarchical algorithm at 1.5 on 2 x 2; the token bucket's burst, "
            "4 ms of the rate, lets calls of about 1 MiB run slightly past it); `/ ring`, `/ native`: "
            "time over that algorithm's at the same size, in the same run. Predicted: the "
            "two-level model (commbench/costmodel/twolevel.py) with the host constants below, "
            "fitted on the same run's rows with the link unshaped.\n\n"
            "Bytes on the link per call (the link's counters, frames included; runs of 6 and 2 "
            "iterations, their difference over 4), against the model's link bytes:\n\n"
            f"{vol}\n\nHost constants (`cluster_{name}-topology.json`):\n\n{host}\n\n"
            + "\n".join(md))
    return record, cluster, text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs")
    p.add_argument("--out", default="results")
    p.add_argument("--name", default="emulated-2x2")
    a = p.parse_args()
    record, cluster, text = build(Path(a.runs), a.name)
    out = Path(a.out)
    topo = {k: v for k, v in cluster.__dict__.items()}
    topo["sources"] = list(cluster.sources)
    res.write_json(str(out / f"cluster_{a.name}-topology.json"), topo)
    res.write_json(str(out / f"cluster_{a.name}.json"), record)
    res.write_atomic(str(out / f"cluster_{a.name}.md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
