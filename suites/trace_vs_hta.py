"""``commbench analyze`` beside Holistic Trace Analysis on the same multi-rank trace set: time,
peak memory and each rank's communication/computation overlap, each tool in a fresh process,
the rounds interleaved.

    .venv/bin/python suites/trace_vs_hta.py --hta-python HTA_ENV/bin/python \\
        > results/trace_vs_hta_<machine>.md

HTA is not a dependency of commbench: give the interpreter of an environment it is installed in
(``python -m venv hta && hta/bin/pip install HolisticTraceAnalysis``). The trace sets: PARAM's
8-rank DLRM job (tests/data/traces/param/dlrm_kineto, torch < 2.1), and ``--ranks`` ranks of a
generated torch 2.x trace of ``--mb`` MB each (suites/trace_read.py's writer). Overlap: HTA's
``get_comm_comp_overlap`` (the share of communication kernels' time that computation kernels
overlap, per rank) and commbench's per-step ``overlap`` (1 - exposed / communication time), the
same quantity; HTA rounds every event inward to whole microseconds, commbench keeps the trace's
resolution.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from trace_read import write  # noqa: E402  (the suites are scripts, run from the repository)

HERE = os.path.dirname(os.path.abspath(__file__))
DLRM = os.path.join(HERE, "..", "tests", "data", "traces", "param", "dlrm_kineto")
# the command as a user gives it, writing its record; the overlap is read from that record
# afterwards, by the harness, untimed (as HTA's child hands back its frame's figures only)
OURS = ("import sys\n"
        "from commbench.cli.main import main\n"
        "main(['analyze', sys.argv[1], '--json', sys.argv[2]])\n")
HTA = ("import json, sys, logging\n"
       "logging.disable(logging.WARNING)\n"
       "from hta.trace_analysis import TraceAnalysis\n"
       "df = TraceAnalysis(trace_dir=sys.argv[1]).get_comm_comp_overlap(visualize=False)\n"
       "print(json.dumps({int(r): round(float(p) / 100, 4) for r, p in "
       "zip(df['rank'], df['comp_comm_overlap_pctg'])}))\n")
# the process' own peak since its exec (ru_maxrss would carry the forking parent's over)
SELF = ("\nprint(next(int(x.split()[1]) for x in open('/proc/self/status') "
        "if x.startswith('VmHWM:')))")


def child(python: str, code: str, folder: str) -> tuple[float, dict]:
    """(seconds, per-rank overlap) of ``code`` in a fresh ``python``: HTA's printed by the
    child, commbench's read from the record its command wrote (after the clock stops)."""
    with tempfile.TemporaryDirectory() as out:
        record = os.path.join(out, "analyze.json")
        t0 = time.perf_counter()
        p = subprocess.run([python, "-c", code, folder, record], capture_output=True, text=True,
                           check=True)
        seconds = time.perf_counter() - t0
        if code is not OURS:
            return seconds, json.loads(p.stdout.strip().splitlines()[-1])
        with open(record) as f:
            steps = json.load(f)["steps"]
    return seconds, {s["rank"]: round(s["overlap"], 4) for s in steps}


def _tree_kb(root: int) -> tuple[int, int]:
    """(resident KB, proportional KB) of ``root`` and every process descended from it (its
    workers), from /proc. Resident sets summed count the pages a forked worker shares with its
    parent once per process; proportional sets (PSS: each shared page split between the
    processes sharing it) sum to what the tree occupies."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += [c for c, pp in parent.items() if pp == pid and c not in tree]
    rss = pss = 0
    for pid in tree:
        try:
            with open(f"/proc/{pid}/status") as f:
                rss += next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
            with open(f"/proc/{pid}/smaps_rollup") as f:
                pss += next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
        except OSError:
            pass
    return rss, pss


def peak_mb(python: str, code: str, folder: str) -> tuple[float, float]:
    """The peak memory of ``code``'s process and its workers together, sampled every 10 ms in a
    run of its own (the sampling costs CPU: it is not the timed run): resident sets summed, at
    least the process' own peak (``VmHWM``: a sample may miss it), and proportional sets
    summed (:func:`_tree_kb`)."""
    out_dir = tempfile.mkdtemp()
    p = subprocess.Popen([python, "-c", code + SELF, folder, os.path.join(out_dir, "a.json")],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    rss = pss = 0
    while p.poll() is None:
        now = _tree_kb(p.pid)
        rss, pss = max(rss, now[0]), max(pss, now[1])
        time.sleep(0.01)
    out = p.stdout.read().split()
    shutil.rmtree(out_dir, ignore_errors=True)
    if p.returncode or not out:
        raise SystemExit(f"{python} -c ... {folder}: exit {p.returncode}")
    return max(rss, int(out[-1])) / 1024, pss / 1024  # a sample may miss the main one's peak


def generated(folder: str, ranks: int, mb: int) -> None:
    """``ranks`` ranks of suites/trace_read.py's trace, each with its own rank."""
    one = os.path.join(folder, "rank0.pt.trace.json")
    write(one, mb)
    with open(one) as f:
        text = f.read()
    for r in range(1, ranks):
        with open(os.path.join(folder, f"rank{r}.pt.trace.json"), "w") as f:
            f.write(text.replace('"rank": 0,', f'"rank": {r},', 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hta-python", required=True, help="an interpreter with HTA installed")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mb", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    made = tempfile.mkdtemp()
    generated(made, a.ranks, a.mb)
    sets = {"PARAM DLRM, 8 ranks (tests/data)": DLRM,
            f"generated torch 2.x, {a.ranks} ranks x {a.mb} MB": made}
    hta = subprocess.run([a.hta_python, "-c", "import importlib.metadata as m; "
                          "print(m.version('HolisticTraceAnalysis'))"], capture_output=True,
                         text=True, check=True).stdout.strip()
    print("# commbench analyze beside Holistic Trace Analysis\n")
    print(f"HTA {hta}; {os.cpu_count()} cores.\n")
    print(f"`python suites/trace_vs_hta.py --hta-python HTA --ranks {a.ranks} --mb {a.mb} "
          f"--repeat {a.repeat}`; each tool a fresh interpreter per run, the runs interleaved "
          "(commbench: `commbench analyze DIR --json FILE`, the overlap read from FILE after "
          "the clock stops; HTA: `get_comm_comp_overlap`, its figures printed by the child); "
          "medians with the range in brackets; peak memory is that of the tool's process and "
          "its workers together (both read ranks in forked workers), interpreters included, "
          "sampled every 10 ms in a separate run: their resident sets summed (at least the "
          "main process' own peak, its VmHWM), which counts the pages a worker shares with its "
          "parent once per process, and their proportional sets summed (PSS: a shared page "
          "split between its sharers), what the tree occupies.\n")
    print("| trace set | tool | seconds | peak MB, RSS summed | peak MB, PSS summed | "
          "HTA/commbench time | overlap per rank |")
    print("|---|---|---|---|---|---|---|")
    for label, folder in sets.items():
        got: dict[str, list] = {"commbench": [], "HTA": []}
        for _ in range(a.repeat):
            got["commbench"].append(child(sys.executable, OURS, folder))
            got["HTA"].append(child(a.hta_python, HTA, folder))
        mem = {"commbench": peak_mb(sys.executable, OURS, folder),
               "HTA": peak_mb(a.hta_python, HTA, folder)}
        med = {k: statistics.median(r[0] for r in v) for k, v in got.items()}
        for tool, runs in got.items():
            secs = [r[0] for r in runs]
            ratio = f"{med['HTA'] / med['commbench']:.1f}" if tool == "commbench" else ""
            mb = " | ".join(f"{mem[tool][i]:.0f}" + (
                f" (1/{mem['HTA'][i] / mem['commbench'][i]:.1f})" if tool == "commbench" else "")
                for i in (0, 1))
            overlap = ", ".join(f"{r}: {v:.3f}" for r, v in sorted(runs[0][1].items(),
                                                                 key=lambda kv: int(kv[0])))
            print(f"| {label} | {tool} | {statistics.median(secs):.2f} "
                  f"[{min(secs):.2f}..{max(secs):.2f}] | {mb} | {ratio} | {overlap} |")
    shutil.rmtree(made, ignore_errors=True)


if __name__ == "__main__":
    main()
