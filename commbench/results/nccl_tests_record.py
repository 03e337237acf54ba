"""A run read from an nccl-tests or rccl-tests log, or from nccl-tests' JSON output
(:mod:`commbench.results.nccl_tests`), as commbench's results file, and the checks of its rows
against what the log printed. Pure: no torch.

A run becomes commbench's results file (:func:`record`): ``time_us`` the log's out-of-place time
(nccl-tests' average over its iterations; by default it prints no spread, so ``min_us`` is the
same figure and ``spread`` is false: the regression gate says when it judges such rows; with
``-I 1`` its iterations' fastest, slowest and 99th percentile are the row's spread), algbw and busbw
recomputed from size and time (the log prints two decimals, 0.00 below 5 MB/s), ``transport``
``nccl`` or ``rccl``, ``algo`` ``native``, ``wrong`` the wrong elements of both halves (and
``checked`` false where the log printed ``N/A``: results not checked, ``-c 0``),
``inplace_us`` the in-place time. A log's printed busbw must agree with the recomputed one to its
printed precision (:func:`check_printed`); where it does not, the op or the world read from the
header is wrong, and the row is flagged.
"""

from __future__ import annotations

import datetime

from commbench.ops import OPS
from commbench.results.nccl_tests import Row, Run, Timing
from commbench.results.records import SCHEMA, percentile

__all__ = ["check_printed", "out_of_bounds", "record"]


def _mismatches(run: Run) -> list[tuple[Row, str]]:
    """Each row whose printed busbw disagrees with size / time x the bus factor of the run's op at
    its ranks beyond the log's rounding, and what it says."""
    out: list[tuple[Row, str]] = []
    record = OPS.get(run.op)
    if record is None or record.bus is None or not run.ranks:
        return out
    f = record.bus(run.ranks)
    for r in run.rows:
        if r.size <= 0 or r.out.time_us <= 0:
            continue
        alg = r.size / r.out.time_us / 1e3
        # the time has 3-4 significant digits, the bandwidths two decimals
        slack = 0.006 + alg * f * 0.01
        if abs(alg * f - r.out.busbw) > slack:
            out.append((r, f"line {r.line}: busbw {r.out.busbw} printed, {alg * f:.2f} from size "
                           f"/ time x {f:.4g} ({run.op} at {run.ranks} ranks)"))
    return out


# older builds' bound on a half's max error, per element type, before it counts as out of
# bounds: this times (ranks - 1) (src/common.cu's DeltaMaxValue); integers: any error at all
_DELTA = {"float16": 1e-2, "bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-12}


def out_of_bounds(run: Run, row: Row) -> list[str]:
    """The halves of ``row`` an older build (max ``error`` column, no ``#wrong``) counted out of
    bounds, as it did: a max error above the type's bound times (ranks - 1). Its all-to-all
    reported no in-place error (in-place was not checked: src/alltoall.cu), so neither does
    this. A newer build's count is in ``#wrong`` (:attr:`Row.wrong`)."""
    out = []
    bound = _DELTA.get(row.dtype, 1e-200) * max(run.ranks - 1, 1)
    for name, t in (("out-of-place", row.out), ("in-place", row.inplace)):
        if t is None or t.error is None or t.wrong is not None or t.error <= bound:
            continue
        if name == "in-place" and run.op == "all_to_all":
            continue
        out.append(f"{name} max error {t.error:g} > {bound:g}")
    return out


def _spread(t: Timing) -> dict:
    """A half's iterations' spread as a results row's fields (``-I 1``): fastest, slowest and
    99th percentile, and from every iteration's time (the JSON output) their lower decile and
    count; nothing where the log printed none (the row keeps ``spread`` false)."""
    if t.min_us is None or t.min_us <= 0:
        return {}
    out = {"spread": True, "min_us": t.min_us, "max_us": t.max_us, "p99_us": t.p99_us}
    if t.samples:  # the lower decile as commbench's own rows take it
        out["p10_us"] = percentile(list(t.samples), 10)
        out["n_samples"] = len(t.samples)
    return out


def check_printed(run: Run) -> list[str]:
    """Rows whose printed busbw disagrees with size / time x the bus factor of the run's op at
    its ranks beyond the log's rounding: a sign that the op or the world is not what the header
    says (one line each)."""
    return [line for _, line in _mismatches(run)]


def record(run: Run, source: str) -> dict:
    """``run`` as a commbench results file (module docstring); ``source``: the log's file name."""
    transport = "rccl" if run.tool == "rccl-tests" else "nccl"
    f = OPS[run.op].bus(run.ranks) if run.op in OPS and OPS[run.op].bus and run.ranks else 1.0
    bad_lines = {r.line for r, _ in _mismatches(run)}
    rows = []
    for r in run.rows:
        t = r.out.time_us
        alg = r.size / t / 1e3 if t > 0 else 0.0
        row = {"op": run.op, "algo": "native", "transport": transport, "size": r.size,
               "requested": r.size, "count": r.count, "type": r.dtype, "redop": r.redop,
               "root": r.root, "time_us": t, "min_us": t, "avg_us": t, "spread": False,
               "n_samples": None, "algbw": alg, "busbw": alg * f, "wrong": r.wrong,
               "log_busbw": r.out.busbw, "inplace_us": r.inplace.time_us if r.inplace else None,
               "line": r.line}
        row.update(_spread(r.out))
        if r.out.cpu_us is not None:
            row["cputime_us"] = r.out.cpu_us  # what the time column printed: the host's
        bounds = out_of_bounds(run, r)
        if not r.checked:  # N/A: 0 wrong elements because none were counted
            row["checked"] = False
        if r.wrong:
            row["flag"] = f"#wrong {r.wrong}"
        elif bounds:  # an older build: how many checks failed, as its closing line counts them
            row["wrong"] = len(bounds)
            row["flag"] = "; ".join(bounds) + f" (nccl-tests' bound for {r.dtype} at {run.ranks} ranks)"
        elif r.line in bad_lines:
            row["flag"] = "printed busbw disagrees with size/time at these ranks"
        rows.append(row)
    versions = {run.tool: run.tests_version or "unknown"}
    if run.library:
        versions["rccl" if transport == "rccl" else "nccl"] = run.library
    if run.listed:
        launch = (f"{run.tool}: {run.processes} process(es), {run.hosts and len(run.hosts)} "
                  f"node(s), {run.gpus_per_node} GPU(s) per node")
    elif run.devices:
        launch = (f"{run.tool}: the device lines of {len(run.devices)} of its {run.ranks} ranks "
                  "only: nodes and GPUs per node unknown")
    else:
        launch = (f"{run.tool}: no device lines; {run.ranks} ranks ({run.world_from}): devices, "
                  "nodes and GPUs per node unknown")
    return {"schema": SCHEMA, "suite": "nccl-tests",
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": run.hosts[0] if run.hosts else "", "hardware": run.gpu or "unknown GPU",
            "world_size": run.ranks, "launch": launch, "versions": versions, "commit": None,
            "measurement": {"statistic": _statistic(run),
                            "warmup": run.params.get("warmup_iters"), "source": source,
                            "op_from": run.op_from,
                            "columns": run.inferred or "the log's column header",
                            "nodes": len(run.hosts) if run.listed else None,
                            "gpus_per_node": run.gpus_per_node if run.listed else None,
                            "truncated": run.truncated, "failure": run.failure,
                            "rows_left_out": run.elided, "rows_untimed": run.untimed},
            "rows": rows}


def _statistic(run: Run) -> str:
    """What a run's time figure is, as the results file's ``measurement`` says it."""
    iters = run.params.get("iters", "?")
    what = (f"size / algbw (the log's time column is the host's launch time, -C 1), over {iters} "
            "iterations" if run.cputime else f"mean over {iters} iterations (the log's)")
    spread = any(r.out.min_us is not None for r in run.rows)
    return what + ("; each iteration timed too (-I 1): fastest, slowest, 99th percentile"
                   if spread else "; no spread printed")
