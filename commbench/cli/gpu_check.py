"""``commbench gpu-check`` (``make gpu-check``): every registered pattern on one GPU, over NCCL.

A world of one rank with the NCCL backend and CUDA tensors runs each pattern's variants: at the
simplest config its strategy draws (hypothesis' ``find``, derandomized), judged against the oracle and the
prediction under the device guard, and at its first study config, where every booked call must
equal the prediction. A world of one cannot test NCCL across ranks; it does run every pattern's
code on the device end to end. Without a CUDA device it says so and exits 3: nothing passes
unchecked.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import astuple

__all__ = ["check_every_pattern", "gpu_check"]


def _smallest(pattern, variant: str):
    """The first config the pattern's strategy draws, derandomized: the simplest it has."""
    from hypothesis import HealthCheck, Phase, find, settings

    return find(pattern.configs(1, variant), lambda cfg: True,
                settings=settings(database=None, derandomize=True, phases=[Phase.generate],
                                  suppress_health_check=list(HealthCheck)))


def gpu_check(emit=print) -> int:
    import torch

    if not torch.cuda.is_available():
        print(f"commbench gpu-check: no CUDA device here (torch {torch.__version__}, CUDA "
              f"{torch.version.cuda or 'not built in'}): nothing was checked", file=sys.stderr)
        return 3
    from commbench.runtime.local import LocalWorld


    emit(f"# commbench gpu-check: {torch.cuda.get_device_name()}, one rank, NCCL")
    with LocalWorld(1, backend="nccl") as world:
        if world.transports[0] != "nccl":
            print(f"commbench gpu-check: the world started {world.transports}, not NCCL",
                  file=sys.stderr)
            return 3
        failed = check_every_pattern(world, emit)
    return 1 if failed else 0


def check_every_pattern(world, emit=print, study: bool = True) -> int:
    """Run every pattern's variants on ``world`` (module docstring; ``study``: its first study
    config too); the number that failed."""
    from commbench.patterns.judge import check
    from commbench.patterns.registry import PATTERNS
    from commbench.patterns.run import run_pattern

    failed = 0
    emit(f"#{'pattern':>14} {'variant':>12} {'smallest config':>16} {'study config':>13}")
    for name, pattern in PATTERNS.items():
        for variant in pattern.variants:
            small = check(world, pattern, _smallest(pattern, variant), variant, 0)
            calls = True
            if study:
                cfg = pattern.bench_configs(world.size)[0]
                out = world.run(run_pattern, name, cfg, variant, 0, None, 0, 0, True)[0]
                calls = Counter(map(tuple, out["ledger"])) == \
                    Counter(astuple(c) for c in pattern.predicted(cfg, variant, 0, 0))
            failed += bool(small) + (not calls)
            emit(f" {name:>14} {variant:>12} {'ok' if not small else 'FAILED':>16} "
                 f"{'ok' if calls else 'FAILED':>13}")
            for line in small:
                emit(f"#   {line}")
    emit(f"# {failed} failed")
    return failed


def add_parser(sub) -> None:
    sub.add_parser("gpu-check", help="every pattern on one GPU over NCCL; exit 3 without CUDA")


def command(a) -> int:
    return gpu_check()
