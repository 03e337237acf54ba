"""``commbench analyze``'s record (JSON) and its markdown: the worst calls first, then per group,
per op and size bucket, per step, and the layout's comparison where one was asked for."""

from __future__ import annotations

import datetime
import statistics
from collections import Counter

from tabulate import tabulate

from commbench.rankset import ranks_text
from commbench.results.records import Rows
from commbench.traces.analysis import Cover, Matched, per_group, per_size, per_step
from commbench.traces.calls import LIBRARIES, SYMM_MEM
from commbench.traces.kineto import RankTrace
from commbench.version import __version__

__all__ = ["markdown", "record"]


def _call_row(m: Matched) -> dict:
    c = m.first
    return {"op": c.op, "rank": c.rank, "name": c.name, "group": list(c.group),
            "group_name": c.group_name,
            "ranks": sorted(x.rank for x in m.calls), "seq": c.seq, "step": c.step,
            "dtype": c.dtype, "in_elems": c.in_elems, "out_elems": c.out_elems,
            "in_splits": list(c.in_splits), "out_splits": list(c.out_splits), "peer": c.peer,
            "bytes": c.size if c.sized else None, "source": c.source, "algo": c.algo,
            "proto": c.proto,
            "start_us": min(x.ts for x in m.calls), "time_us": m.time_us if m.timed else None,
            "algbw": m.algbw, "busbw": m.busbw, "skew_us": m.skew_us, "slowest": m.slowest,
            "exposed_us": m.exposed_us, **m.extra}


def record(traces: list[RankTrace], rows: list[Matched], extra: dict,
           cover: dict[int, Cover] | None = None) -> dict:
    # worst first; each call's row made as it is printed or written, not held (a big job has
    # hundreds of thousands)
    calls = Rows(sorted(rows, key=lambda m: (-m.exposed_us, -m.time_us)), _call_row)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return {"schema": "commbench.analyze/1", "suite": "analyze", "created": now,
            "commbench": __version__, "files": [t.path.rsplit("/", 1)[-1] for t in traces],
            "ranks": [t.rank for t in traces],
            "world_size": max([t.world_size for t in traces] + [len(traces)]),
            "world_stated": all(t.world_stated for t in traces),
            "backend": traces[0].backend, "nccl_version": traces[0].nccl_version,
            "source": sorted({c.source for t in traces for c in t.calls}),
            "calls": calls, "groups": per_group(rows), "sizes": per_size(rows),
            "steps": per_step(traces, cover), "unlinked": sum(t.unlinked for t in traces),
            "graphed": sum(t.graphed for t in traces),
            "library": _library(traces),
            "no_kernel": sum(t.no_kernel for t in traces),
            "unsized": sum(t.unsized for t in traces), **extra}


def _library(traces: list[RankTrace]) -> dict[str, int]:
    """Other libraries' communication kernels in the job's traces: how many of each library's."""
    return dict(sum((Counter(t.library) for t in traces), Counter()))


def _holds(calls, key: str) -> bool:
    """Whether any call's row holds ``key`` (a model's or a baseline's column): read off the
    matched calls where the record holds them, without making every row to look."""
    if isinstance(calls, Rows) and calls.make is _call_row:
        return any(key in m.extra for m in calls.items)
    return any(key in c for c in calls)


def _f(x, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


STEP_ROWS = 64  # a per-rank-step table longer than this is summed up per step in the markdown


def _step_name(s: dict):
    return s["step"] or ("outside" if s.get("outside") else "whole")


def _steps(steps: list[dict], top: int) -> str:
    """The per-rank-step table, whole where it is short; else (a job of many ranks) one line per
    step across its ranks (the median and the worst rank's communication and exposed time, the
    least overlap) and the ``top`` (rank, step) pairs of most exposed time. The JSON keeps every
    pair."""
    heads = ["rank", "step", "calls", "comm(us)", "exposed(us)", "overlap"]

    def row(s: dict) -> list:
        return [s["rank"], _step_name(s), s["calls"], _f(s["comm_us"]), _f(s["exposed_us"]),
                _f(s["overlap"], ".2f")]

    if len(steps) <= STEP_ROWS:
        return f":\n\n{tabulate([row(s) for s in steps], headers=heads, tablefmt='github')}\n"
    by: dict = {}
    for s in steps:
        by.setdefault(str(_step_name(s)), []).append(s)
    lines = []
    for name, ss in by.items():
        comm = max(ss, key=lambda s: s["comm_us"])
        bare = max(ss, key=lambda s: s["exposed_us"])
        laps = [s for s in ss if s["overlap"] is not None]
        low = min(laps, key=lambda s: s["overlap"]) if laps else None
        lines.append([name, ranks_text(s["rank"] for s in ss), sum(s["calls"] for s in ss),
                      _f(statistics.median(s["comm_us"] for s in ss)),
                      f"{_f(comm['comm_us'])} (rank {comm['rank']})",
                      _f(statistics.median(s["exposed_us"] for s in ss)),
                      f"{_f(bare['exposed_us'])} (rank {bare['rank']})",
                      f"{low['overlap']:.2f} (rank {low['rank']})" if low else "-"])
    worst = sorted(steps, key=lambda s: -s["exposed_us"])[:top]
    summary = tabulate(lines, headers=["step", "ranks", "calls", "median comm(us)",
                                       "most comm(us)", "median exposed(us)",
                                       "most exposed(us)", "least overlap"], tablefmt="github")
    return (f", {len(steps)} (rank, step) pairs (every one in the JSON): per step across its "
            f"ranks\n\n{summary}\n\nand the {len(worst)} pairs of most exposed time:\n\n"
            f"{tabulate([row(s) for s in worst], headers=heads, tablefmt='github')}\n")


def markdown(rec: dict, top: int = 20) -> str:
    model, base = _holds(rec["calls"], "model_us"), _holds(rec["calls"], "baseline_busbw")
    world = rec["world_size"]
    if rec.get("world_given"):
        world = f"{world} (--world; no world_size in the traces)"
    elif not rec.get("world_stated", True):
        world = f"at least {world} (no world_size in the traces)"
    head = (f"# commbench analyze: {len(rec['files'])} trace(s), ranks {ranks_text(rec['ranks'])} of "
            f"{world}, backend {rec['backend'] or '?'}, NCCL "
            f"{rec['nccl_version'] or '?'}; times from {', '.join(rec['source']) or 'no calls'}")
    if rec.get("unlinked"):
        head += (f"\n# {rec['unlinked']} NCCL kernel(s) launched before the trace's window: "
                 "counted as communication (time, exposed time), their sizes and groups unknown")
    if rec.get("graphed"):
        head += (f"\n# {rec['graphed']} NCCL kernel(s) replayed from a CUDA graph (their calls "
                 "ran at its capture, before the trace): counted as communication (time, "
                 "exposed time) in the step of the graph's launch, their sizes and groups unknown")
    for lib, n in (rec.get("library") or {}).items():
        what = LIBRARIES[lib][1] if lib in LIBRARIES else "its own communication"
        known = ("their sizes and groups from the calls torch recorded for them "
                 "(record_param_comms), else their sizes from the ops that launched them where "
                 "those hold them") if lib == SYMM_MEM else "their sizes and groups not in the trace"
        head += (f"\n# {n} kernel(s) of {lib} ({what}; not NCCL's): counted as communication "
                 f"(time, exposed time), {known}")
    if rec.get("no_kernel"):
        head += (f"\n# {rec['no_kernel']} call(s) made no NCCL kernel in the trace (a one-rank "
                 f"group's collective is a copy on the device or nothing; a kernel after the "
                 f"window is not recorded): counted with their bytes, no time or bandwidth")
    if rec.get("unsized"):
        head += (f"\n# {rec['unsized']} call(s) without sizes: the trace was recorded without "
                 "shapes (torch < 2.1 keeps a call's sizes only with record_shapes=True): "
                 "their time, no bytes or bandwidth")
    if "cpu" in rec["source"]:
        head += ("\n# CPU ops time the call on the host, not its transfer (no kernel in the "
                 "trace; on NCCL the enqueue, on gloo the run, its wait for its peers included): "
                 "no bandwidth is given for them")
    if rec.get("topology"):
        head += f"\n# NCCL's model on {rec['topology']}"
    if rec.get("model_note"):
        head += f"\n# {rec['model_note']}"
    if rec.get("misaligned"):
        head += (f"\n# the ranks' calls do not line up ({rec['misaligned']}): each rank is "
                 "analysed alone, no call matched across ranks")
    if rec.get("baseline"):
        b = rec["baseline"]
        head += f"\n# baseline {b['path']} ({b['hardware']}, {b['world_size']} ranks)"
    rows = []
    for c in rec["calls"][:top]:
        op = f"{c['op']} {c['rank']}->{c['peer']}" if c["op"] == "send" else (
            f"recv {c['peer']}->{c['rank']}" if c["op"] == "recv" else c["op"])
        rows.append([op, ranks_text(c["group"]), c["dtype"], _f(c["bytes"], "d"),
                     f"{c['algo']}/{c['proto']}" if c["algo"] else "-", _f(c["time_us"]),
                     _f(c["busbw"], ".3g"), _f(c["skew_us"]),
                     c["slowest"] if c["slowest"] >= 0 else "-", _f(c["exposed_us"])]
                    + ([_f(c.get("model_us")), _f(c.get("model_busbw"), ".3g"),
                        _f(c.get("efficiency"), ".2f")] if model else [])
                    + ([_f(c.get("baseline_busbw"), ".3g")] if base else []))
    heads = (["op", "group", "dtype", "bytes", "algo", "time(us)", "busbw(GB/s)", "skew(us)",
              "slowest", "exposed(us)"] + (["model(us)", "model busbw", "eff"] if model else [])
             + (["baseline busbw"] if base else []))
    text = (f"{head}\n\nThe {min(top, len(rec['calls']))} worst of {len(rec['calls'])} calls "
            f"(most exposed time first; time: from the last member's start to the end):\n\n"
            f"{tabulate(rows, headers=heads, tablefmt='github')}\n")
    groups = tabulate([[ranks_text(g["group"]), g["name"] or "-", g["calls"], g["bytes"],
                        _f(g["time_us"]), _f(g["exposed_us"]), _f(g["busbw_median"], ".3g")]
                       for g in rec["groups"]],
                      headers=["group", "name", "calls", "bytes", "time(us)", "exposed(us)",
                               "median busbw"], tablefmt="github")
    sizes = tabulate([[s["op"], s["ranks"], s["bucket"], s["calls"], _f(s["time_us_median"]),
                       _f(s["busbw_median"], ".3g")]
                      + ([_f(s.get("model_busbw"), ".3g")] if model else [])
                      + ([_f(s.get("baseline_busbw"), ".3g")] if base else [])
                      for s in rec["sizes"]],
                     headers=["op", "ranks", "size >=", "calls", "median time(us)",
                              "median busbw"] + (["model busbw"] if model else [])
                     + (["baseline busbw"] if base else []), tablefmt="github")
    text += (f"\nPer group:\n\n{groups}\n\nPer op and size:\n\n{sizes}\n\nPer rank and step "
             f"(ProfilerStep#N, the one that holds the call's CPU op; outside: calls whose op is in "
             f"none, launched before the window among them; comm: the union of its calls; "
             f"exposed: the part no computation kernel covers)" + _steps(rec["steps"], top))
    lay = rec.get("layout")
    if lay:
        # lazy: imports commbench.patterns.registry
        from commbench.studies.audit_layout import layout_tables  # only for --layout

        rows, verdict = layout_tables(lay, "traced")
        text += f"\nRank 0 against the layout `{lay['spec']}`:\n\n{rows}\n\n{verdict}\n"
    return text
