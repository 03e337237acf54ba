"""``commbench gpu-check`` (``make gpu-check``): every collective, algorithm and pattern on one
GPU, over NCCL, a line per check.

A world of one rank with the NCCL backend and CUDA tensors runs every collective and every
algorithm that runs at one rank (8 B and 1 MiB, results checked on the device: ``#wrong`` 0),
a 1 GiB all-reduce made, run and checked on the device within :data:`BIG_LIMIT_S`, and each
pattern's variants: at the
simplest config its strategy draws (hypothesis' ``find``, derandomized), judged against the oracle and the
prediction under the device guard, and at its first study config, where every booked call must
equal the prediction. A world of one cannot test NCCL across ranks; it does run every pattern's
code on the device end to end. Without a CUDA device it says so and exits 3: nothing passes
unchecked.
"""

from __future__ import annotations

import os
import sys
import time

from commbench.collectives import ALGORITHMS
from commbench.patterns.base import calls_match
from commbench.patterns.registry import PATTERNS
from commbench.runtime.launch import LaunchError, detect
from commbench.world.local import LocalWorld

__all__ = ["BIG", "BIG_LIMIT_S", "check_every_collective", "check_every_pattern", "gpu_check",
           "launched_gpu"]

BIG = 1 << 30  # bytes of the large all-reduce
BIG_LIMIT_S = 60.0  # its input, its call and its check on the device, a stated bound


def _smallest(pattern, variant: str):
    """The first config the pattern's strategy draws, derandomized: the simplest it has."""
    # lazy: imports hypothesis
    from hypothesis import HealthCheck, Phase, find, settings

    return find(pattern.configs(1, variant), lambda cfg: True,
                settings=settings(database=None, derandomize=True, phases=[Phase.generate],
                                  suppress_health_check=list(HealthCheck)))


def launched_gpu(info, count: int, visible: str | None) -> tuple[int, str | None]:
    """The GPU this process checks: (its index among the ``count`` it sees, the
    ``CUDA_VISIBLE_DEVICES`` its world of one is given: that GPU alone). Under a launcher a
    rank checks its own local rank's GPU (eight ranks of a node on one GPU would check one GPU
    eight times over and leave seven unchecked); with none, the first GPU, as ever."""
    if not info.launched or count < 1:
        return 0, None
    i = info.device(count)
    ids = [x.strip() for x in visible.split(",") if x.strip()] if visible else []
    return i, ids[i] if i < len(ids) else str(i)


def gpu_check(emit=print) -> int:
    # lazy: imports torch
    import torch

    if not torch.cuda.is_available():
        print(f"commbench gpu-check: no CUDA device here (torch {torch.__version__}, CUDA "
              f"{torch.version.cuda or 'not built in'}): nothing was checked", file=sys.stderr)
        return 3

    try:
        info = detect()
    except LaunchError:
        info = None
    index, only = (0, None) if info is None else launched_gpu(
        info, torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    where = ""
    if only is not None:  # the world of one is started with this rank's GPU alone in sight
        os.environ["CUDA_VISIBLE_DEVICES"] = only
        where = f", rank {info.rank} of {info.size} (local {info.local_rank}: GPU {only})"
        if info.rank != 0:  # a rank's lines that differ from rank 0's alone: its failures
            emit = _failures_of(emit, info.rank)
    emit(f"# commbench gpu-check: {torch.cuda.get_device_name(index)}, one rank, NCCL{where}")
    with LocalWorld(1, backend="nccl") as world:
        if world.transports[0] != "nccl":
            print(f"commbench gpu-check: the world started {world.transports}, not NCCL",
                  file=sys.stderr)
            return 3
        failed = check_every_collective(world, emit)
        failed += check_big_all_reduce(world, emit)
        failed += check_every_pattern(world, emit)
    emit(f"# gpu-check: {failed} failed")
    return 1 if failed else 0


def _failures_of(emit, rank: int):
    """``emit`` for a rank other than 0 under a launcher: its header, its failed checks and
    its count, each marked with the rank; 512 ranks' passing lines would bury them."""
    def quiet(line: str) -> None:
        if "FAILED" in line or line.startswith(("# commbench gpu-check", "# gpu-check:")):
            emit(f"rank {rank}: {line}")
    return quiet


def _case(ctx, op: str, algo: str, nbytes: int) -> dict:
    # lazy: imports numpy, torch
    from commbench.collectives.measure import Case, measure

    out = measure(ctx, Case(op, transport=ctx.transports[0], algo=algo, iters=3, warmup=1),
                  nbytes)
    return {"wrong": out["wrong"], "sent": out["sent"], "pred": out["pred_sent"],
            "us": sorted(out["times"])[len(out["times"]) // 2] * 1e6}


def check_every_collective(world, emit=print, sizes=(8, 1 << 20)) -> int:
    """Every (collective, algorithm) that runs at this world's size, at ``sizes``: #wrong 0 and
    the bytes booked equal to the formula; the number that failed."""

    failed = 0
    emit(f"#{'collective':>16} {'algo':>26} {'bytes':>9} {'#wrong':>7} {'time (us)':>10}  check")
    for (op, algo), rec in ALGORITHMS.items():
        if rec.needs(world.size):
            continue
        for nbytes in sizes:
            try:
                out = world.run(_case, op, algo, nbytes)[0]
                ok = out["wrong"] == 0 and out["sent"] == out["pred"]
                line = f"{out['wrong']:>7} {out['us']:>10.1f}  {'ok' if ok else 'FAILED'}"
            except Exception as exc:  # noqa: BLE001 - a line per check, the run goes on
                ok, line = False, f"{'-':>7} {'-':>10}  FAILED: {str(exc).splitlines()[0][:120]}"
            failed += not ok
            emit(f" {op:>16} {algo:>26} {nbytes:>9} {line}")
    return failed


def _big(ctx, nbytes: int) -> dict:
    # lazy: imports torch
    import torch

    # lazy: imports torch
    from commbench.timing import verify

    sync = torch.cuda.synchronize if ctx.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    count = nbytes // 4
    x = verify.seeded(0, ctx.rank, count, torch.float32, "sum", ctx.device)
    y = ctx.comm().all_reduce(x, ctx.world)
    want = verify.expected("all_reduce", 0, ctx.rank, ctx.size, count, torch.float32, "sum", 0,
                           ctx.device)
    wrong = verify.wrong(y, want)
    sync()
    return {"wrong": wrong, "seconds": time.perf_counter() - t0, "device": str(y.device)}


def check_big_all_reduce(world, emit=print, nbytes: int = BIG, device: str = "cuda") -> int:
    """A 1 GiB float32 all-reduce: input, call and check on the ``device``, #wrong 0 within
    :data:`BIG_LIMIT_S`; 1 when it fails."""
    out = world.run(_big, nbytes)[0]
    ok = out["wrong"] == 0 and out["seconds"] <= BIG_LIMIT_S and out["device"].startswith(device)
    emit(f"# all_reduce {nbytes} B on {out['device']}: #wrong {out['wrong']}, "
         f"{out['seconds']:.2f} s made, run and checked (bound {BIG_LIMIT_S:.0f} s): "
         f"{'ok' if ok else 'FAILED'}")
    return int(not ok)


def check_every_pattern(world, emit=print, study: bool = True) -> int:
    """Run every pattern's variants on ``world`` (module docstring; ``study``: its first study
    config too); the number that failed."""
    # lazy: imports torch
    from commbench.patterns.run import check, run_pattern

    failed = 0
    emit(f"#{'pattern':>14} {'variant':>12} {'smallest config':>16} {'study config':>13}")
    for name, pattern in PATTERNS.items():
        for variant in pattern.variants:
            small = check(world, pattern, _smallest(pattern, variant), variant, 0)
            calls = True
            if study:
                cfg = pattern.bench_configs(world.size)[0]
                out = world.run(run_pattern, name, cfg, variant, 0, None, 0, 0, True)[0]
                calls = calls_match(out["ledger"], pattern.predicted(cfg, variant, 0, 0))
            failed += bool(small) + (not calls)
            emit(f" {name:>14} {variant:>12} {'ok' if not small else 'FAILED':>16} "
                 f"{'ok' if calls else 'FAILED':>13}")
            for line in small:
                emit(f"#   {line}")
    emit(f"# patterns: {failed} failed")
    return failed


def add_parser(sub) -> None:
    sub.add_parser("gpu-check", help="every pattern on one GPU over NCCL; exit 3 without CUDA",
                   description="Example: commbench gpu-check (on a machine with a CUDA GPU)")


def command(a) -> int:
    return gpu_check()
