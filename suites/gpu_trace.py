"""A Kineto trace and an execution trace of a real NCCL job on one GPU, for ``commbench analyze``
and ``commbench replay`` to be tried on what today's torch writes on a GPU.

    python suites/gpu_trace.py --out DIR    # on a machine with a CUDA GPU

A world of one rank over NCCL (``device_id`` given: eager init), three profiled steps, each with
a matrix product and the collectives a training step issues (all-reduce, all-gather,
reduce-scatter, all-to-all with and without splits, broadcast), sizes that differ per op so that
each call can be told apart. Writes ``DIR/kineto_rank0.json.gz`` and ``DIR/et_rank0.json.gz``,
and ``DIR/expected.json``: per call the op, its element count and dtype as issued, from the
script's own list and not from any trace. The Kineto file's ``traceName`` is cut to its file
name (the profiler writes the path it was given).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys

STEPS = 3  # profiled steps; one wait and one warm-up step before them


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, metavar="DIR")
    a = p.parse_args(argv)
    import torch
    import torch.distributed as dist
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

    if not torch.cuda.is_available():
        print("gpu_trace: no CUDA device here", file=sys.stderr)
        return 3
    os.makedirs(a.out, exist_ok=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    issued: list[dict] = []

    def step(k: int, record: bool) -> None:
        w = torch.randn(1024, 1024, device=dev)
        h = w @ w
        calls = [("all_reduce", 1 << 20, torch.float32), ("all_gather", 1 << 18, torch.bfloat16),
                 ("reduce_scatter", 1 << 19, torch.float32), ("all_to_all", 1 << 16, torch.float32),
                 ("all_to_all_splits", 3 << 12, torch.float32), ("broadcast", 1 << 14, torch.int64)]
        for op, n, dtype in calls:
            x = torch.ones(n, device=dev, dtype=dtype)
            if op == "all_reduce":
                dist.all_reduce(x)
            elif op == "all_gather":
                dist.all_gather_into_tensor(torch.empty_like(x), x)
            elif op == "reduce_scatter":
                dist.reduce_scatter_tensor(torch.empty_like(x), x)
            elif op == "all_to_all":
                dist.all_to_all_single(torch.empty_like(x), x)
            elif op == "all_to_all_splits":
                dist.all_to_all_single(torch.empty_like(x), x, [n], [n])
            else:
                dist.broadcast(x, 0)
            if record:
                issued.append({"step": k, "op": op, "numel": n, "dtype": str(dtype)})
        h.sum().item()

    et_path = os.path.join(a.out, "et_rank0.json")
    et = ExecutionTraceObserver().register_callback(et_path)
    kineto_path = os.path.join(a.out, "kineto_rank0.json")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=STEPS),
                 execution_trace_observer=et,
                 on_trace_ready=lambda prof: prof.export_chrome_trace(kineto_path)) as prof:
        for k in range(2 + STEPS):
            step(k, k >= 2)
            prof.step()
    torch.cuda.synchronize()
    dist.destroy_process_group()
    with open(kineto_path) as f:  # the profiler names the file by its path on this machine
        doc = json.load(f)
    doc["traceName"] = os.path.basename(kineto_path)
    with open(kineto_path, "w") as f:
        json.dump(doc, f)
    for path in (kineto_path, et_path):
        with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(path)
    meta = {"torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "device": torch.cuda.get_device_name(), "steps": STEPS, "calls": issued}
    with open(os.path.join(a.out, "expected.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps({k: v for k, v in meta.items() if k != "calls"}), f"{len(issued)} calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
