"""How ``commbench analyze`` reads a big trace: peak memory and time of the one-pass reader
against ``json.load`` of the same file, each in a fresh process, side by side.

    .venv/bin/python suites/trace_read.py --mb 300 > results/trace_read_<machine>.md

The trace is one rank's Kineto file written event by event (never held whole): per call a
``record_param_comms`` op, its launch and its NCCL kernel with torch's arguments, and 18 other
events (operators, launches, computation kernels), until it reaches ``--mb`` (:func:`write`).
Peak memory is the child's own peak resident set since its start (``VmHWM``; ``ru_maxrss`` would
carry the suite's own peak over the fork), whole interpreter included.
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

READ = ("import sys; from commbench.traces.kineto import read; t = read(sys.argv[1], False); "
        "print(len(t.calls), len(t.compute_ts))")
LOAD = ("import json, sys; d = json.load(open(sys.argv[1])); "
        "print(sum(1 for e in d['traceEvents'] if e.get('cat') == 'kernel'))")
EMPTY = "import sys; from commbench.traces import kineto"
OTHERS = 18  # events beside each call: most of a real trace is computation
PID = 4242  # the process the CPU events are on


def write(path: str, mb: int) -> int:
    """A trace of about ``mb`` MB; the number of calls in it.

    Laid out as torch 2.x's profiler writes a training job's rank: per call (20 us apart, on
    whole microseconds) a ``record_param_comms`` op with torch's arguments, its launch
    (``cudaLaunchKernel``) and its NCCL kernel on NCCL's stream; and six computation kernels on
    the compute stream, each with its ``aten::mm`` op and its launch. GPU events carry what
    CUPTI gives Kineto (device, stream, correlation, grid, block, occupancy): trace-analysis
    tools tell GPU kernels by their stream. The NCCL kernel [5, 15) and the computation
    kernels [3i, 3i + 2) overlap for 6 of its 10 us: an overlap of 0.6 on every rank."""
    limit, k = mb << 20, 0
    with open(path, "w") as f:
        f.write('{"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, '
                '"world_size": 8, "pg_config": []}, "traceEvents": [\n')
        first = True
        while f.tell() < limit:
            t, corr = 20 * k, (OTHERS // 3 + 1) * k
            args = {"Collective name": "allreduce", "In msg nelems": 1 << 20,
                    "Out msg nelems": 1 << 20, "Group size": 8, "dtype": "BFloat16",
                    "Process Group Name": "0", "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]",
                    "Seq": k, "External id": k}
            events = [{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": PID,
                       "tid": PID, "ts": t, "dur": 2, "args": args},
                      {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID,
                       "tid": PID, "ts": t + 1, "dur": 1,
                       "args": {"External id": k, "cbid": 211, "correlation": corr}},
                      {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_"
                       "RING_LL(ncclDevKernelArgsStorage<4096ul>)", "pid": 0, "tid": 20,
                       "ts": t + 5, "dur": 10, "args": {**args, **_gpu(20, corr)}}]
            for j in range(OTHERS // 3):  # a step's computation: operator, launch, kernel
                ext, c = 10**7 + k * OTHERS + j, corr + 1 + j
                events += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": PID,
                            "tid": PID, "ts": t + 3 * j, "dur": 1,
                            "args": {"External id": ext, "Sequence number": k,
                                     "Input Dims": [[4096, 4096], [4096, 4096]],
                                     "Input type": ["c10::BFloat16", "c10::BFloat16"]}},
                           {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                            "pid": PID, "tid": PID, "ts": t + 3 * j, "dur": 1,
                            "args": {"External id": ext, "cbid": 211, "correlation": c}},
                           {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32",
                            "pid": 0, "tid": 7, "ts": t + 3 * j, "dur": 2,
                            "args": {"External id": ext, **_gpu(7, c)}}]
            for e in events:
                f.write(("" if first else ",\n") + json.dumps(e))
                first = False
            k += 1
        f.write("\n]}\n")
    return k


def _gpu(stream: int, correlation: int) -> dict:
    """A GPU kernel's arguments as Kineto writes them from CUPTI's record."""
    return {"queued": 0, "device": 0, "context": 1, "stream": stream,
            "correlation": correlation, "registers per thread": 168, "shared memory": 213248,
            "blocks per SM": 1.0, "warps per SM": 12.0, "grid": [132, 1, 1],
            "block": [384, 1, 1], "est. achieved occupancy %": 19}


def child(code: str, path: str) -> tuple[float, float, str]:
    """(seconds, peak MB, what it printed) of ``code`` in a fresh interpreter."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", f"{code}\nprint('RSS', next(int(x.split()[1]) "
                        "for x in open('/proc/self/status') if x.startswith('VmHWM:')))", path],
                       capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - t0
    out = p.stdout.split()
    return seconds, int(out[-1]) / 1024, " ".join(out[:-2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "rank0.pt.trace.json")
    calls = write(path, a.mb)
    size = os.path.getsize(path) / 2**20
    rows = {"interpreter + commbench.traces (nothing read)": EMPTY,
            "commbench's one-pass reader": READ, "json.load of the whole file": LOAD}
    got: dict[str, list] = {k: [] for k in rows}
    for _ in range(a.repeat):  # interleaved, so that a busy moment falls on every row alike
        for name, code in rows.items():
            got[name].append(child(code, path))
    os.remove(path)
    print(f"# Reading one rank's Kineto trace of {size:.0f} MB ({calls} NCCL kernels among "
          f"{calls * (OTHERS + 3)} events)\n")
    print(f"`python suites/trace_read.py --mb {a.mb} --repeat {a.repeat}`; each row a fresh "
          f"interpreter, the rows interleaved; medians of {a.repeat} runs, the range in "
          "brackets; peak memory is the process's maximum resident set.\n")
    print("| how | seconds | peak MB | read |")
    print("|-----|---------|---------|------|")
    for name, runs in got.items():
        secs, mbs = [r[0] for r in runs], [r[1] for r in runs]
        print(f"| {name} | {statistics.median(secs):.2f} [{min(secs):.2f}..{max(secs):.2f}] | "
              f"{statistics.median(mbs):.0f} [{min(mbs):.0f}..{max(mbs):.0f}] | {runs[0][2]} |")


if __name__ == "__main__":
    main()
