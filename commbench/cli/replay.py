"""``commbench replay RECORDING --np N``: a recorded job's calls re-issued in their order on their
groups, timed as ``commbench run`` times, the ledger checked against the recording call by
call (commbench/traces/replay.py)."""

from __future__ import annotations

import os

from tabulate import tabulate

from commbench.cli import checks
from commbench.cli.common import UsageError
from commbench.names import ITEMSIZE
from commbench.ops import OPS
from commbench.results import records as res
from commbench.results.busbw import factor
from commbench.results.machine import machine_class
from commbench.results.records import summarize_iters
from commbench.traces.calls import MAX_WORLD, P2P, TraceError
from commbench.traces.recorded import Rec, check, complete, scale, unsplit
from commbench.traces.sources import load

__all__ = ["add_parser", "command", "rows_of"]


def add_parser(sub) -> None:
    a = sub.add_parser("replay", help="re-issue a recorded job's collectives, timed, without "
                       "the model",
                       description="RECORDING: a folder of Kineto traces (one per rank), or a "
                       "commbench audit result (results/audit_*.json). Every rank re-issues its "
                       "recorded calls in order on the recorded groups (by ranks) with their "
                       "ops, dtypes and sizes; each is booked once and checked against the "
                       "recording, then timed. Example: commbench replay traces/ --np 4")
    a.add_argument("recording", nargs="+", help="trace files or folder, or an audit result")
    checks.world_options(a, np=0, timeout=120.0)
    a.add_argument("--iters", type=int, default=5, help="timed samples per call")
    a.add_argument("--warmup", type=int, default=1, help="untimed samples before them")
    a.add_argument("--max-size", type=float, default=16.0, metavar="GB",
                   help="read at most this many GiB of text from one trace (default 16)")
    a.add_argument("--world", type=int, default=0, metavar="N",
                   help="the recorded job's world size, where its traces state none (a torch "
                        "< 2.1 trace's calls are on the world; default: as the traces state it)")
    a.add_argument("--scale", action="store_true",
                   help="a smaller world: rank 0's groups of at most --np members, member i "
                        "played by rank i")


def rows_of(per_rank: list[list[dict]]) -> tuple[list[dict], list[str]]:
    """One row per recorded call (a collective over its members: per-sample max over them;
    a run of point-to-point calls per rank), and every booking that differs."""
    # lazy: imports torch
    from commbench.traces.replay import mismatches

    bad: list[str] = []
    merged: dict[tuple, dict] = {}
    order: list[tuple] = []
    for rank, units in enumerate(per_rank):
        seen: dict[tuple, int] = {}
        for u in units:
            recs = [Rec(*t) for t in u["recs"]]
            r = recs[0]
            bad += [f"rank {rank}, call {u['unit']}: {m}" for m in mismatches(u)]
            if r.op in P2P:
                key = ("p2p", rank, u["unit"])
            else:
                k = seen.get(r.group, 0)
                seen[r.group] = k + 1
                key = ("coll", r.group, k)
            if key not in merged:
                merged[key] = {"recs": recs, "times": list(u["times"]), "ranks": [rank]}
                order.append(key)
            else:
                m = merged[key]
                m["times"] = [max(a, b) for a, b in zip(m["times"], u["times"], strict=True)]
                m["ranks"].append(rank)
    rows = []
    for i, key in enumerate(order):
        m = merged[key]
        r, n = m["recs"][0], len(m["recs"][0].group)
        item = ITEMSIZE.get(r.dtype, 1)
        if r.op in P2P:
            op, size = "sendrecv", sum(x.count for x in m["recs"]) * item
            what = "+".join(f"{x.op}->{x.peer}" if x.op == "send" else f"{x.op}<-{x.peer}"
                            for x in m["recs"])
        else:
            op, what = r.op, r.op
            size = r.count * item * (n if r.op in OPS and OPS[r.op].input == "block" else 1)
        stats = summarize_iters(m["times"]) if m["times"] else {"time_us": 0.0}
        t = stats["time_us"]
        algbw = size / t / 1e3 if t > 0 else 0.0
        busbw = algbw * factor(op, n) if op in OPS and OPS[op].bus is not None and n > 1 \
            else None
        rows.append({"call": i, "op": what, "group": list(r.group), "type": r.dtype,
                     "count": r.count, "size": size, "ranks": m["ranks"], **stats,
                     "algbw": algbw, "busbw": busbw, "step": r.step})
    return rows, bad


def command(a) -> int:
    if not (1 <= a.iters <= checks.MAX_COUNT and 0 <= a.warmup <= checks.MAX_COUNT):
        raise UsageError(f"--iters {a.iters} --warmup {a.warmup}: must be 1 to "
                         f"{checks.MAX_COUNT} and 0 to {checks.MAX_COUNT}")
    if not 0 <= a.world <= MAX_WORLD:
        raise UsageError(f"--world {a.world}: must be 1 to {MAX_WORLD} (0: as the traces "
                         "state it)")
    try:
        left_out: list[str] = []
        world, plan = load(a.recording, checks.max_chars(a.max_size), left_out, a.world)
        left_out += unsplit(plan)
        if not any(plan.values()):  # said before any world is asked of the user
            raise UsageError(f"{', '.join(a.recording)}: no call to re-issue"
                             + (f" ({'; '.join(left_out)})" if left_out else ""))
        if a.np == 0:
            a.np = world
        if a.scale:
            plan, world = scale(world, plan, a.np), a.np
        elif a.np != world:
            raise UsageError(f"--np {a.np}: the recording has {world} ranks; give --np {world}, "
                             "or --scale to keep its groups' shapes on fewer ranks")
        completed = left_out + complete(world, plan)
        check(world, plan)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    if not any(plan.values()):
        raise UsageError(f"{', '.join(a.recording)}: no call to re-issue"
                         + (f" ({'; '.join(left_out)})" if left_out else ""))
    checks.check_world(a)
    # lazy: imports torch
    from commbench.traces.replay import replay_rank

    world_, prints = checks.open_world(a)
    try:
        world_.start()
        per_rank = world_.run(replay_rank, plan, a.iters, a.warmup)
    finally:
        world_.close()
    rows, bad = rows_of(per_rank)
    machine = machine_class(a.label)
    record = res.header("replay", a.np, a.launcher or f"local-{world_.launch}", machine,
                        {"cadence": "isolated (the group's barrier before each sample)",
                         "rank_aggregation": "per-iteration max over the call's members",
                         "statistic": "median", "iters": a.iters, "warmup": a.warmup})
    record.update(recording=[os.path.basename(os.path.normpath(p)) for p in a.recording],
                  rows=rows, mismatches=bad, scaled=a.scale, completed=completed)
    text = _markdown(record)
    if prints:
        for line in completed:
            print(f"# {line}")
        print(text)
        if not a.no_write:
            stem = os.path.join(a.out, f"replay_{machine}-x{a.np}")
            res.write_json(stem + ".json", record)
            res.write_atomic(stem + ".md", text)
            print(f"# wrote {stem}.json and {stem}.md")
        if bad:
            print(f"# {len(bad)} call(s) booked otherwise than recorded:", *bad[:10],
                  sep="\n#   ")
    return 1 if bad else 0


def _markdown(record: dict) -> str:
    cells = [[r["call"], r["op"], ",".join(map(str, r["group"])), r["type"], r["size"],
              f"{r['time_us']:.1f}", f"{r['algbw']:.4f}",
              "-" if r["busbw"] is None else f"{r['busbw']:.4f}"] for r in record["rows"]]
    table = tabulate(cells, headers=["call", "op", "group", "type", "size(B)", "time(us)",
                                     "algbw(GB/s)", "busbw(GB/s)"], tablefmt="github")
    verdict = (f"{len(record['mismatches'])} call(s) booked otherwise than recorded"
               if record["mismatches"] else "every call booked as recorded")
    return (f"# commbench replay of {', '.join(record['recording'])}: {len(record['rows'])} "
            f"calls on {record['world_size']} ranks ({record['launch']}); {verdict}\n"
            f"# time: median over {record['measurement']['iters']} samples of the slowest "
            f"member\n\n{table}\n")
