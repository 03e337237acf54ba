"""commbench's own sweep beside nccl-tests on the same GPUs, side by side in one run: each row's
time by both tools, and their ratio.

    python suites/beside_nccl_tests.py --nccl-tests BUILD_DIR --np 1 > results/beside_nccl_tests_<machine>.md

``BUILD_DIR`` holds nccl-tests' binaries (``all_reduce_perf``, ...), built against the NCCL that
torch loads. For each pass (``--pairs``), nccl-tests runs each op over the sizes (``-g NP``),
then ``commbench run`` runs the same ops over the same sizes on NCCL at ``--np`` ranks (under
torchrun, ``COMMBENCH_BACKEND=nccl``) with
nccl-tests' cadence (``--batch ITERS``: the calls of a sample back to back, its time their
mean); the two alternate, and each row keeps its median over the passes and their spread.
Both of nccl-tests' times are shown; the ratio is taken against the one that does what
commbench's call does: in place for the all-reduce (commbench reduces a work buffer in place,
copied before the timed call), out of place for the all-gather and reduce-scatter (a new
buffer). Needs as many GPUs as ``--np``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from commbench.results.nccl_tests import parse

OPS = ("all_reduce", "all_gather", "reduce_scatter")


def nccl_tests(build: str, op: str, a) -> dict[int, tuple[float, float]]:
    """size -> nccl-tests' out-of-place and in-place times (us) of ``op``."""
    out = subprocess.run([os.path.join(build, f"{op}_perf"), "-b", a.b, "-e", a.e, "-f", a.f,
                          "-g", str(a.np), "-n", str(a.iters), "-w", str(a.warmup)],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    (run,) = parse(out, f"{op}_perf.log")
    return {r.size: (r.out.time_us, r.inplace.time_us if r.inplace else float("nan"))
            for r in run.rows}


def commbench(a) -> dict[tuple[str, int], float]:
    """(op, size) -> commbench's time (us), the median of its samples."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.json")
        sweep = ["run", *OPS, "--transport", a.transport, "--algo", "native", "-b", a.b,
                 "-e", a.e, "-f", a.f, "-n", str(a.iters), "-w", str(a.warmup), "--batch",
                 str(a.iters), "--no-write", "-J", path]
        # NCCL under torchrun, as on a cluster (a local world runs gloo and MPI)
        launch = ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                   str(a.np), "-m", "commbench"] if a.transport == "nccl" else
                  [sys.executable, "-m", "commbench"])
        extra = ["--np", str(a.np)] if a.transport != "nccl" else []
        out = subprocess.run(launch + sweep + extra, capture_output=True, text=True, timeout=600,
                             env=dict(os.environ, COMMBENCH_BACKEND=a.transport)
                             if a.transport == "nccl" else None)
        if out.returncode:
            raise SystemExit(f"commbench run: exit {out.returncode}: {out.stderr[-800:]}")
        with open(path) as f:
            rows = json.load(f)["rows"]
    return {(r["op"], r["size"]): r["time_us"] for r in rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nccl-tests", required=True, metavar="BUILD_DIR")
    p.add_argument("--np", type=int, default=1)
    p.add_argument("--transport", default="nccl", help="commbench's (gloo: a dry run on CPU)")
    p.add_argument("-b", default="8")
    p.add_argument("-e", default="1G")
    p.add_argument("-f", default="4")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--pairs", type=int, default=2)
    a = p.parse_args(argv)
    theirs: dict[tuple[str, int], list[tuple[float, float]]] = {}
    ours: dict[tuple[str, int], list[float]] = {}
    for _ in range(a.pairs):
        for op in OPS:
            for size, us in nccl_tests(a.nccl_tests, op, a).items():
                theirs.setdefault((op, size), []).append(us)
        for key, us in commbench(a).items():
            ours.setdefault(key, []).append(us)
    print(f"# commbench beside nccl-tests, {a.np} GPU(s), {a.pairs} alternating passes, "
          f"{a.iters} iterations back to back per sample, {a.warmup} warm-up\n")
    print("| op | size (B) | nccl-tests out of place (us) | in place (us) | commbench (us) | "
          "commbench / nccl-tests' like | spread over passes (ours, theirs) |")
    print("|---|---|---|---|---|---|---|")
    for key in sorted(set(theirs) & set(ours)):
        out = statistics.median(x for x, _ in theirs[key])
        inp = statistics.median(y for _, y in theirs[key])
        # commbench's all-reduce reduces its work buffer in place (the copy is made before the
        # timed call); its all-gather and reduce-scatter write a new buffer
        like = [y if key[0] == "all_reduce" else x for x, y in theirs[key]]
        t, o = statistics.median(like), statistics.median(ours[key])
        spread = (f"{max(ours[key]) / min(ours[key]):.2f}x, {max(like) / min(like):.2f}x"
                  if min(ours[key]) > 0 and min(like) > 0 else "-")
        print(f"| {key[0]} | {key[1]} | {out:.2f} | {inp:.2f} | {o:.2f} | "
              f"{o / t if t > 0 else float('nan'):.2f} | {spread} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
