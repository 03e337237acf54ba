"""NCCL-kernel traces with known figures, one Kineto-shaped file per rank (pure).

Each planned call runs on its members as an NCCL kernel: member i starts ``skew_us[i]`` after
the call's base time and every member ends ``max(skew) + dur_us`` after it, so the call's wire
time is ``dur_us``, its skew ``max(skew) - min(skew)`` and its slowest rank the last to start. A
computation kernel on another stream covers ``covered_us`` of the wire part on every member. The
kernels carry torch's arguments (or, with ``link``, only an ``External id`` shared with their
``record_param_comms`` op); ``ProfilerStep#N`` annotations span each step's calls.
:func:`expected` gives the figures the analyzer must read back.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass

from commbench.ops import OPS
from commbench.results.busbw import factor
from commbench.traces.calls import DTYPES, op_of

__all__ = ["LAYOUTS", "Planned", "expected", "generate", "lay_out"]

KERNEL = {o.name: o.names.kernel for o in OPS.values() if o.nccl}
SHORT = {"Float": "f32", "BFloat16": "bf16", "Half": "f16", "Double": "f64", "Long": "i64",
         "Int": "i32", "Char": "i8", "Byte": "u8"}


@dataclass(frozen=True)
class Planned:
    """One call of the plan. ``name`` is torch's Collective name (allreduce, _allgather_base,
    _reduce_scatter_base, all_to_allv, broadcast, send, ...); ``elems`` each member's
    In msg nelems; ``skew_us`` each member's start delay, by member index. A ``send`` on a
    pair is the first member's send and the second's receive."""

    name: str
    group: tuple[int, ...]
    elems: int
    dtype: str = "BFloat16"
    dur_us: float = 100.0
    skew_us: tuple[float, ...] = ()
    covered_us: float = 0.0
    algo: str = "RING"
    proto: str = "LL"
    step: int = 1
    ends: tuple[int, int] | None = None

    @property
    def op(self) -> str:
        return op_of(self.name)

    @property
    def members(self) -> tuple[int, ...]:
        """The ranks that run the call: a send's two ends, a collective's group."""
        if self.op in ("send", "recv"):
            return self.ends or self.group[:2]
        return self.group

    def out_elems(self) -> int:
        n = len(self.group)
        return {"all_gather": self.elems * n, "reduce_scatter": self.elems // n}.get(
            self.op, self.elems)

    def skew(self, i: int) -> float:
        return self.skew_us[i] if i < len(self.skew_us) else 0.0


def _kernel_name(p: Planned, old: bool) -> str:
    if p.op in ("send", "recv"):
        return "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
    coll, short = KERNEL.get(p.op, "SendRecv"), SHORT.get(p.dtype, "f32")
    if p.op in ("all_gather", "broadcast"):
        return (f"ncclKernel_{coll}_{p.algo}_{p.proto}_Sum_{short}(ncclDevComm*, unsigned long, "
                f"ncclWork*)" if old else
                f"ncclDevKernel_{coll}_{p.algo}_{p.proto}(ncclDevKernelArgsStorage<4096ul>)")
    if old:
        return f"ncclKernel_{coll}_{p.algo}_{p.proto}_Sum_{short}(ncclDevComm*, unsigned long, ncclWork*)"
    return f"ncclDevKernel_{coll}_Sum_{short}_{p.algo}_{p.proto}(ncclDevKernelArgsStorage<4096ul>)"


def _base_times(plan: list[Planned], gap_us: float) -> list[float]:
    out, t = [], 1000.0
    for p in plan:
        out.append(t)
        t += max((p.skew(i) for i in range(len(p.members))), default=0.0) + p.dur_us + gap_us
    return out


def generate(world: int, plan: list[Planned], folder: str, *, gap_us: float = 50.0,
             old_names: bool = False, link: bool = False, compress: bool = False,
             ranks: list[int] | None = None, groups_name: dict | None = None,
             layout: str = "compact") -> list[str]:
    """Write ``rank<r>.pt.trace.json[.gz]`` for every rank (or ``ranks``), laid out as
    :func:`lay_out` says; their paths."""
    os.makedirs(folder, exist_ok=True)
    base = _base_times(plan, gap_us)
    names = dict(groups_name or {})
    for p in plan:
        names.setdefault(p.group, str(len(names)))
    pg_config = [{"pg_name": n, "pg_desc": f"group {n}", "backend_config": "cuda:nccl",
                  "pg_size": len(g), "ranks": list(g)} for g, n in names.items()]
    paths = []
    for r in (ranks if ranks is not None else range(world)):
        events: list[dict] = [{"ph": "M", "name": "process_name", "pid": r, "tid": 0,
                               "args": {"name": f"rank {r}"}}]
        seqs: dict[tuple, int] = {}
        steps: dict[int, list[float]] = {}
        for k, (p, t0) in enumerate(zip(plan, base, strict=True)):
            if r not in p.members:
                continue
            i = p.members.index(r)
            top = max((p.skew(j) for j in range(len(p.members))), default=0.0)
            ts, end = t0 + p.skew(i), t0 + top + p.dur_us
            gname = names.get(p.group, "0")
            seq = seqs.get(p.group, 0) if p.op not in ("send", "recv") else None
            if seq is not None:
                seqs[p.group] = seq + 1
            name = p.name if p.op not in ("send", "recv") else ("send", "recv")[i]
            args = {"Collective name": name, "In msg nelems": p.elems,
                    "Out msg nelems": p.out_elems(), "Group size": len(p.group),
                    "dtype": p.dtype, "In split size": "[]", "Out split size": "[]",
                    "Process Group Name": gname, "Process Group Description": f"group {gname}",
                    "Process Group Ranks": json.dumps(list(p.group))}
            if seq is not None:
                args["Seq"] = seq
            if p.op in ("send", "recv"):
                args["Rank"] = p.group.index(p.members[1 - i])  # the peer, group-local
            xid = 10_000 + k
            events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": r,
                           "tid": 1, "ts": t0 - 20.0, "dur": 5.0,
                           "args": {**args, "External id": xid}})
            kargs = {"External id": xid} if link else {**args, "External id": xid}
            events.append({"ph": "X", "cat": "kernel", "name": _kernel_name(p, old_names),
                           "pid": 0, "tid": 20, "ts": ts, "dur": end - ts, "args": kargs})
            if p.covered_us > 0:
                events.append({"ph": "X", "cat": "kernel", "name": "ampere_bf16_gemm_128x64",
                               "pid": 0, "tid": 7, "ts": t0 + top, "dur": p.covered_us,
                               "args": {"External id": xid + 1}})
            steps.setdefault(p.step, []).extend([t0 - 30.0, end + 1.0])
        for n, ts in sorted(steps.items()):
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}",
                           "pid": r, "tid": 1, "ts": min(ts), "dur": max(ts) - min(ts)})
        doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
               "distributedInfo": {"backend": "nccl", "rank": r, "world_size": world,
                                   "nccl_version": "2.21.5", "pg_count": len(pg_config),
                                   "pg_config": pg_config},
               "traceEvents": events, "baseTimeNanoseconds": 1_700_000_000_000_000_000}
        path = os.path.join(folder, f"rank{r}.pt.trace.json" + (".gz" if compress else ""))
        text = lay_out(doc, layout)
        if compress:
            with gzip.open(path, "wt", encoding="utf-8") as f:
                f.write(text)
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        paths.append(path)
    return paths


LAYOUTS = ("compact", "kineto", "indent", "lines")


def lay_out(doc: dict, how: str) -> str:
    """A trace's text: ``compact`` (json.dumps, one line), ``kineto`` (the profiler's own
    writer: each event opening on a line of its own at two spaces, its keys at four, its
    ``args`` one object at six, the array closed at two), ``indent`` (json.dumps with
    ``indent=2``, as tools that rewrite traces leave them) or ``lines`` (one event a line)."""
    if how == "compact":
        return json.dumps(doc)
    if how == "indent":
        return json.dumps(doc, indent=2)
    if how not in ("lines", "kineto"):
        raise ValueError(f"layout={how!r}: one of {', '.join(LAYOUTS)}")
    keys = []  # the top-level keys in their order, the events' array where it stands
    for k, v in doc.items():
        if k != "traceEvents":
            keys.append(f"{json.dumps(k)}: {json.dumps(v)}")
        elif how == "lines":
            keys.append('"traceEvents": [\n' + ",\n".join(json.dumps(e) for e in v) + "\n]")
        else:
            keys.append('"traceEvents": [\n' + ",\n".join(_kineto_event(e) for e in v) +
                        "\n  ]")
    if how == "lines":
        return "{" + ", ".join(keys) + "}\n"
    return "{\n  " + ",\n  ".join(keys) + "\n}\n"


def _kineto_event(e: dict) -> str:
    text = "  {\n    " + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in e.items()
                                   if k != "args")
    if "args" in e:
        inner = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in e["args"].items())
        text += ',\n    "args": {\n      ' + inner + "\n    }"
    return text + "\n  }"


def expected(p: Planned) -> dict:
    """The figures the analyzer must read for ``p``: bytes, time, busbw, skew, slowest rank and
    exposed time (the most any member spends uncovered: the first to start waits longest)."""
    n, item = len(p.group), DTYPES[p.dtype][1]
    elems = {"all_gather": p.out_elems(), "reduce_scatter": p.elems}.get(p.op, p.elems)
    size = elems * item
    delays = [p.skew(i) for i in range(len(p.members))]
    top, low = max(delays), min(delays)
    last = max(range(len(delays)), key=lambda i: (delays[i], p.members[i]))
    op = "sendrecv" if p.op in ("send", "recv") else p.op
    return {"bytes": size, "time_us": p.dur_us, "busbw": size / p.dur_us / 1e3 * factor(op, n),
            "skew_us": top - low, "slowest": p.members[last],
            "exposed_us": p.dur_us + top - low - min(p.covered_us, p.dur_us)}
