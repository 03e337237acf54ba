"""Each algorithm's peak memory per rank, against the memory pre-check's arithmetic.

    .venv/bin/python suites/memory_bench.py [--np 4] [--sizes 16M,64M] [--iters 3]

On a local world of ``--np`` ranks, per collective x algorithm x transport x size: every rank
resets its peak resident size (``/proc/self/clear_refs``), notes its resident size, runs the
measurement a sweep runs at that size (``-c 1``: results checked), and reports its peak minus
what it held before. Writes ``results/memory_<machine class>-x<np>.json`` and ``.md``: per row,
the largest rank's extra peak in bytes and as a multiple of the size, beside what the
pre-check charges per rank (``commbench.cli.checks.memory_need``) in the same unit.
tests/test_memory_table.py holds the arithmetic to this table.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _peak(ctx, case, nbytes: int) -> int:
    """Run ``case`` at ``nbytes`` as a sweep does; this rank's peak resident bytes above its
    resident bytes before."""
    from commbench.collectives.measure import measure

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident size starts again from the current one
    before = _status("VmRSS")
    measure(ctx, case, nbytes)
    return _status("VmHWM") - before


def main() -> None:
    from commbench.collectives import ALGORITHMS, algorithms_of
    from commbench.collectives.measure import Case
    from commbench.names import COLLECTIVES, parse_size
    from commbench.results import records as res
    from commbench.results.machine import machine_class
    from commbench.world.local import LocalWorld

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--sizes", default="16M,64M")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--markdown", metavar="JSON", help="only write JSON's markdown table again")
    a = p.parse_args()
    if a.markdown:
        import json

        with open(a.markdown) as f:
            write_markdown(json.load(f), a.markdown.removesuffix(".json") + ".md")
        return
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    rows = []
    with LocalWorld(a.np) as world:
        for op in COLLECTIVES:
            if op == "pingpong":
                continue
            for algo in algorithms_of(op):
                if ALGORITHMS[(op, algo)].needs(a.np):
                    continue
                for transport in world.transports if algo == "native" else (world.transports[0],):
                    case = Case(op, transport, algo, iters=a.iters, warmup=1, check=True)
                    for nbytes in sizes:
                        peaks = world.run(_peak, case, nbytes)
                        rows.append({"op": op, "algo": algo, "transport": transport,
                                     "size": nbytes, "peak_bytes": max(peaks),
                                     "peak_factor": max(peaks) / nbytes})
                        print(f"{op:>15} {algo:>28} {transport:>5} {nbytes:>10} "
                              f"{max(peaks) / nbytes:6.2f} x size", flush=True)
    record = res.header("memory", a.np, "local", machine_class(""),
                        {"iters": a.iters, "warmup": 1, "check": True,
                         "what": "per rank, peak resident bytes above those before the series"})
    record["rows"] = rows
    stem = os.path.join(os.path.dirname(HERE), "results", f"memory_{machine_class('')}-x{a.np}")
    res.write_json(stem + ".json", record)
    write_markdown(record, stem + ".md")
    print(f"wrote {stem}.json and {stem}.md")


def write_markdown(record: dict, path: str) -> None:
    """The table beside what the pre-check charges now (``--markdown JSON`` redoes it)."""
    from commbench.cli.checks import memory_need
    from commbench.results import records as res

    rows = record["rows"]
    for r in rows:
        r["charged_factor"] = memory_need(r["size"], 4, True) / r["size"]
    cells = [[r["op"], r["algo"], r["transport"], r["size"], r["peak_bytes"],
              f"{r['peak_factor']:.2f}", f"{r['charged_factor']:.2f}",
              "yes" if r["charged_factor"] >= r["peak_factor"] else "NO"] for r in rows]
    res.write_atomic(path, res.study_markdown(
        record, ["op", "algo", "transport", "size(B)", "peak(B)", "peak / size",
                 "charged / size", "charged >= peak"], cells,
        "Per rank: the largest rank's peak resident bytes above its resident bytes before the "
        "series (a sweep's measurement at that size, results checked), as a multiple of the "
        "size, beside what the memory pre-check charges per rank (results checked, float32)."))


if __name__ == "__main__":
    main()
