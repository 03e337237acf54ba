"""The cost of ``#wrong``: one rank's expected all-reduce result, the way it was first built
(every rank's input in float64, stacked, then reduced) against the way it is built now
(:func:`commbench.timing.verify.expected`: folded rank by rank in int64, a few buffers whatever
the world size), side by side, each in a fresh process so its peak resident memory is its own.

    .venv/bin/python suites/verify_bench.py [--count 67108864] [--ranks 8] [--reps 3]

Writes ``results/verify_<machine class>.md``: per way, the median and spread of its seconds and
its peak resident memory. Both ways must give the same tensor (checked on every run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _stacked(seed: int, n: int, count: int, dtype):
    """The first way: (3 + n) x 8 bytes per element (float64 inputs of every rank, stacked)."""
    import torch

    from commbench.timing import verify

    parts = [verify.seeded(seed, r, count, dtype) for r in range(n)]
    return torch.stack([q.to(torch.float64) for q in parts]).sum(0).to(dtype)


def _one(way: str, count: int, ranks: int) -> None:
    """Child process: build the expected result one way, print seconds, peak RSS and a digest."""
    import resource
    import time

    import torch

    from commbench.timing import verify

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    if way == "stacked":
        out = _stacked(3, ranks, count, torch.float32)
    else:
        out = verify.expected("all_reduce", 3, 0, ranks, count, torch.float32, "sum")
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    digest = float(out.double().mul(torch.arange(count, dtype=torch.float64, device="cpu")
                                    .remainder_(97)).sum())
    print(json.dumps({"seconds": seconds, "peak": peak, "digest": digest}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=1 << 26, help="float32 elements (default 2^26)")
    p.add_argument("--ranks", type=int, default=8, help="world size the result is for")
    p.add_argument("--reps", type=int, default=3, help="fresh processes per way")
    p.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "results"))
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        _one(a.child, a.count, a.ranks)
        return
    runs: dict[str, list[dict]] = {"stacked": [], "folded": []}
    for _ in range(a.reps):
        for way in runs:  # interleaved, so a busy minute hits both ways alike
            out = subprocess.run([sys.executable, __file__, "--child", way, "--count",
                                  str(a.count), "--ranks", str(a.ranks)], capture_output=True,
                                 text=True, check=True)
            runs[way].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(way, runs[way][-1], flush=True)
    digests = {r["digest"] for rs in runs.values() for r in rs}
    if len(digests) != 1:
        sys.exit(f"the two ways disagree: digests {sorted(digests)}")
    from commbench.results.machine import machine_class

    lines = [f"# Building the expected all-reduce result: {a.count} float32 elements, "
             f"{a.ranks} ranks",
             "",
             f"`python suites/verify_bench.py --count {a.count} --ranks {a.ranks} --reps "
             f"{a.reps}` on `{machine_class('')}`, one thread, each run a fresh process (ways "
             "interleaved). Both ways give the same tensor on every run.",
             "",
             "| way | median (s) | min (s) | max (s) | peak resident (GiB) |",
             "|---|---:|---:|---:|---:|"]
    for way, rs in runs.items():
        s = [r["seconds"] for r in rs]
        lines.append(f"| {way} | {statistics.median(s):.2f} | {min(s):.2f} | {max(s):.2f} | "
                     f"{max(r['peak'] for r in rs) / 2**30:.2f} |")
    ratio = statistics.median(r["seconds"] for r in runs["stacked"]) / statistics.median(
        r["seconds"] for r in runs["folded"])
    lines += ["", f"Stacked over folded, medians: {ratio:.2f}x the time. `stacked`: every "
              "rank's input in float64, stacked and summed (the first way); `folded`: "
              "`commbench.timing.verify.expected` (int64, rank by rank, in place)."]
    path = os.path.join(a.out, f"verify_{machine_class('')}.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"# wrote {path}")


if __name__ == "__main__":
    main()
