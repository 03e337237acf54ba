"""``commbench calibrate LOG... --topology PRESET|FILE --json FILE``: NCCL's model fitted to a
cluster's nccl-tests logs (costmodel/calibrate.py), with the error of every row before and after,
and of rows held out of the fit."""

from __future__ import annotations

import datetime
import json
import os
import sys
from dataclasses import asdict

from tabulate import tabulate

from commbench.cli.checks import check_file
from commbench.cli.common import UsageError
from commbench.cli.importing import LOG_LIMIT
from commbench.cli.sniff import hint
from commbench.costmodel.calibrate import MODELLED, Measured, error, fit, held_out, interpolated
from commbench.costmodel.nccl import versions
from commbench.costmodel.topology import load
from commbench.names import parse_size
from commbench.results.files import FileRefused, read_text
from commbench.results.nccl_tests import LogError
from commbench.results.nccl_tests_json import runs_of
from commbench.results.records import write_atomic

__all__ = ["add_parser", "command"]


def add_parser(sub) -> None:
    c = sub.add_parser(
        "calibrate", help="fit NCCL's model to nccl-tests logs; write a calibrated topology",
        description="Fits the topology's intra-node bandwidth, NIC bandwidth and network latency, "
        "and per protocol a bandwidth factor and a latency, to the logs' rows of at least "
        "--min-size (a robust fit: the sum of |log(model/measured)|), prints each row's error "
        "before and after, then the error on rows held out of the fit (every other size; the "
        "largest sizes when fitted on the smaller ones), and writes the calibrated topology "
        "(--json), which every --topology accepts. A log of one node cannot calibrate the "
        "network, and says so. Example: commbench calibrate all_reduce_perf.log "
        "all_gather_perf.log --topology cluster-h100-ndr --json calibrated.json")
    c.add_argument("logs", nargs="+", metavar="LOG", help="nccl-tests or rccl-tests output")
    c.add_argument("--topology", required=True, help="the preset or topology file to calibrate")
    c.add_argument("--json", required=True, help="where to write the calibrated topology")
    c.add_argument("--min-size", default="64K", help="smallest row size fitted (smaller rows "
                   "measure latency alone); K, M, G: powers of 2")
    c.add_argument("--nccl-version", default="2.30.7", help="NCCL version of the model")


HICCUP = 1.5  # a row's two runs this far apart: the slower one was disturbed


def _steady(r) -> float:
    """A row's time: its out-of-place run's (nccl-tests' convention), unless that run took
    :data:`HICCUP` times its in-place run's or more. The two runs move the same bytes with the
    same algorithm; one so much slower met a hiccup of the machine (the 8 MiB row of
    NVIDIA/nccl-tests#309's 8-node log: 1272 us out of place, 321 us in place, between rows of
    204 and 378 us), and a fit that takes it prices the model around it."""
    t = r.out.time_us
    if r.inplace is not None and 0 < r.inplace.time_us <= t / HICCUP:
        return r.inplace.time_us
    return t


def command(a) -> int:
    check_file(a.json, "--json")
    if a.nccl_version not in versions():
        raise UsageError(f"--nccl-version {a.nccl_version}: must be one of {', '.join(versions())}")
    try:
        min_size = parse_size(a.min_size)
        base = load(a.topology)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    rows: list[Measured] = []
    hiccups: list[str] = []
    for path in a.logs:
        try:
            runs = runs_of(read_text(path, "log", LOG_LIMIT), os.path.basename(path))
        except (FileRefused, LogError) as exc:
            raise UsageError(str(exc) + hint([path], "commbench calibrate", str(exc))) from None
        for run in runs:
            nodes, per = max(1, len(run.hosts)), run.gpus_per_node
            if run.op not in MODELLED or not run.ranks:
                print(f"# {path}: line {run.first_line}: {run.op or 'an unnamed op'} is not "
                      "fitted (NCCL's tuning model covers " + ", ".join(MODELLED) + ")",
                      file=sys.stderr)
                continue
            if run.ranks == 1:
                print(f"# {path}: line {run.first_line}: one rank: nothing crosses a link, "
                      "nothing to fit", file=sys.stderr)
                continue
            if not run.listed:
                raise UsageError(f"{path}: line {run.first_line}: the device lines of "
                                 f"{len(run.devices)} of its {run.ranks} ranks only: its nodes "
                                 "and GPUs per node, which the fit needs, are unknown")
            if per > base.gpus_per_node:
                raise UsageError(f"{path}: {per} GPUs per node, {base.gpus_per_node} in "
                                 f"{base.name}: calibrate on a topology of the log's machine")
            for r in run.rows:
                if r.size < min_size or r.out.time_us <= 0 or r.wrong:
                    continue
                t = _steady(r)
                rows.append(Measured(run.op, r.size, nodes, per, t, os.path.basename(path)))
                if t != r.out.time_us:
                    hiccups.append(f"{os.path.basename(path)} {r.size} B ({r.out.time_us:g} us "
                                   f"out of place, {r.inplace.time_us:g} in place)")
    if not rows:
        raise UsageError(f"no rows of at least {min_size} B to fit in {', '.join(a.logs)}")
    try:
        f = fit(base, rows, a.nccl_version)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    v = a.nccl_version
    print(f"# fitted on {len(rows)} rows of >= {min_size} B: " + ", ".join(f.fitted))
    if hiccups:
        print(f"# {len(hiccups)} row(s) taken at their in-place time, their out-of-place run "
              f"{HICCUP:g}x slower or more (a hiccup): " + "; ".join(hiccups))
    for why in f.fixed:
        print(f"# not fitted: {why}")
    t = f.topology
    print(f"# intra_GBps {t.intra_GBps:.2f}, nic_GBps {t.nic_GBps:.2f}, latency_inter_us "
          f"{t.latency_inter_us:.2f}, proto_bw " + ", ".join(f"{p} {x:.3f}" for p, x in
                                                             t.proto_bw.items())
          + ", proto_lat_us " + ", ".join(f"{p} {x:.1f}" for p, x in t.proto_lat_us.items()))
    table = [[m.source, m.op, m.size, f"{m.time_us:.1f}", f"{error(base, m, v):+.1%}",
              f"{error(t, m, v):+.1%}"] for m in rows]
    print(tabulate(table, headers=["log", "op", "size(B)", "time(us)", "model err before",
                                   "after"], tablefmt="plain"))
    held = held_out(base, rows, v)
    print("# held out of the fit (model time / measured - 1; busbw errs by the reciprocal):")
    print(tabulate([[s, m.source, m.size, f"{b:+.1%}", f"{x:+.1%}"] for s, m, b, x in held],
                   headers=["split", "log", "size(B)", "before", "after"], tablefmt="plain"))
    big = [x for _, m, _, x in held if m.size >= 1 << 20]
    if big:
        worst = max(abs(1 / (1 + x) - 1) for x in big)
        print(f"# held-out rows of >= 1 MiB: worst busbw error {worst:.1%} (target 10%)")
    line = [(m, x) for m, x in interpolated(rows) if m.size >= 1 << 20]
    if line:
        m, x = max(line, key=lambda mx: abs(1 / (1 + mx[1]) - 1))
        print(f"# the log's own bends: each alternate held-out row of >= 1 MiB read off the "
              f"line through its two neighbours (log-log) misses by up to "
              f"{abs(1 / (1 + x) - 1):.1%} in busbw ({m.source} {m.size} B)")
    data = {k: val for k, val in asdict(t).items() if k != "calibration"}
    data["sources"] = list(t.sources)
    data["name"] = f"{base.name}-calibrated"
    logs = sorted({m.source for m in rows})
    data["description"] = f"{base.description}; calibrated on {', '.join(logs)}"
    data["calibration"] = {
        "from": base.name, "logs": logs, "rows": len(rows),
        "nodes": sorted({m.nodes for m in rows}),
        "min_size": min_size, "nccl_version": v, "fitted": list(f.fitted),
        "not_fitted": list(f.fixed), "loss_before": f.loss_before, "loss_after": f.loss_after,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "held_out": [{"split": s, "log": m.source, "op": m.op, "size": m.size,
                      "before": b, "after": x} for s, m, b, x in held]}
    try:
        write_atomic(a.json, json.dumps(data, indent=1) + "\n")
    except OSError as exc:
        raise UsageError(f"--json {a.json}: cannot write ({exc.strerror})") from None
    print(f"# wrote {a.json}: give it as --topology to predict, analyze or run")
    return 0
