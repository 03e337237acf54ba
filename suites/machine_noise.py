"""What the regression gate is up against on this machine: how its speed moves over time with
nothing else of ours running, measured two ways, one after the other.

    .venv/bin/python suites/machine_noise.py [--seconds 90] [--worlds 8] > results/machine_noise_<machine>.md

* **One process, one thread**: a memory-bound probe (a 4 MiB float32 ``add_``, 20 times) every
  50 ms for ``--seconds``; per second, the median probe over the run's lower decile. A machine
  whose speed is its own stays near 1.0 every second; one that shares its memory system or
  cores with other tenants shows slow stretches, whatever our own load.
* **Fresh MPI worlds**: ``commbench run all_reduce -b 1M -e 1M --np 2 --transport mpi --algo
  native,ring_compiled -n 100 --repeat 3`` ``--worlds`` times back to back; each world's three
  rounds (a few seconds apart) against the fastest round of any world. A slowdown that holds for
  whole rounds and worlds is what two back-to-back runs of one commit see as a regression.

Also the guest's steal time over the run (``/proc/stat``), which a hypervisor may not report.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

PROBE = """
import json, sys, time, torch
torch.set_num_threads(1)
a, b = torch.ones(1 << 20), torch.ones(1 << 20)
for _ in range(50):
    a.add_(b)
end, out = time.monotonic() + float(sys.argv[1]), []
while time.monotonic() < end:
    t = time.perf_counter()
    for _ in range(20):
        a.add_(b)
    out.append((time.monotonic(), (time.perf_counter() - t) / 20 * 1e6))
    time.sleep(0.05)
print(json.dumps(out))
"""


def _steal() -> int:
    with open("/proc/stat") as f:
        return int(f.readline().split()[8])


def probe(seconds: float) -> tuple[list[float], float]:
    """Per second, the median probe time over the run's lower decile; and the decile (us)."""
    out = subprocess.run([sys.executable, "-c", PROBE, str(seconds)], capture_output=True,
                         text=True, check=True, timeout=seconds + 120).stdout
    samples = json.loads(out)
    times = sorted(x for _, x in samples)
    floor = times[len(times) // 10]
    t0 = samples[0][0]
    per_second: dict[int, list[float]] = {}
    for t, x in samples:
        per_second.setdefault(int(t - t0), []).append(x)
    return [statistics.median(v) / floor for _, v in sorted(per_second.items())], floor


def worlds(n: int) -> list[dict[str, list[float]]]:
    """Each fresh world's rounds (us) per algorithm."""
    got = []
    for _ in range(n):
        with tempfile.TemporaryDirectory() as out:
            subprocess.run([sys.executable, "-m", "commbench", "run", "all_reduce", "-b", "1M",
                            "-e", "1M", "--np", "2", "--transport", "mpi", "--algo",
                            "native,ring_compiled", "-n", "100", "--repeat", "3", "--out", out,
                            "--label", "noise"], capture_output=True, text=True, check=True,
                           timeout=600)
            name = next(f for f in os.listdir(out) if f.endswith(".json"))
            with open(os.path.join(out, name)) as f:
                rows = json.load(f)["rows"]
        got.append({r["algo"]: r["rounds_us"] for r in rows})
    return got


def _bar(ratios: list[float]) -> str:
    return "".join("." if r < 1.3 else ("o" if r < 2.0 else "X") for r in ratios)


def main() -> None:
    from commbench.results.machine import machine_class
    from commbench.results.records import git_commit

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=90.0)
    p.add_argument("--worlds", type=int, default=8)
    a = p.parse_args()
    steal0, t0 = _steal(), time.monotonic()
    ratios, floor = probe(a.seconds)
    runs = worlds(a.worlds)
    steal = _steal() - steal0
    minutes = (time.monotonic() - t0) / 60
    hw = machine_class("")
    print(f"# How this machine's speed moves over time: {hw}\n")
    print(f"`.venv/bin/python suites/machine_noise.py --seconds {a.seconds:g} --worlds "
          f"{a.worlds}` ({minutes:.0f} min), commit `{git_commit()}`, nothing else of ours "
          f"running; steal time over the run: {steal} ticks of /proc/stat.\n")
    slow = sum(r >= 1.3 for r in ratios)
    print("## One process, one thread: a 4 MiB add every 50 ms\n")
    print(f"Lower decile {floor:.1f} us. Each second's median over it ('.' below 1.3x, 'o' "
          f"1.3-2x, 'X' 2x and more): {slow} of {len(ratios)} seconds at 1.3x or more, the "
          f"slowest {max(ratios):.2f}x.\n")
    print("```\n" + "\n".join(_bar(ratios[i:i + 60]) for i in range(0, len(ratios), 60))
          + "\n```\n")
    print("## Fresh 2-rank MPI worlds, 1 MiB all-reduce, three rounds each\n")
    best = {algo: min(min(w[algo]) for w in runs) for algo in runs[0]}
    print("Each round's median over the fastest round of any world.\n")
    print("| world | " + " | ".join(f"{algo} rounds" for algo in best) + " |")
    print("|---:|" + "---|" * len(best))
    for k, w in enumerate(runs, 1):
        print(f"| {k} | " + " | ".join(" ".join(f"{x / best[algo]:.2f}" for x in w[algo])
                                       for algo in best) + " |")
    worst = {algo: max(min(w[algo]) for w in runs) / best[algo] for algo in best}
    print("\nA world's best round over the fastest world's (what `--repeat 3` keeps, the "
          "figure the gate compares): " + ", ".join(f"{algo} up to {v:.2f}x"
                                                    for algo, v in worst.items()) + ".")


if __name__ == "__main__":
    main()
