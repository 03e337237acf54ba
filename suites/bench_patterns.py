"""Every registered pattern's study as a benchmark suite, recorded by pytest-benchmark.

    make suites          # records under results/pytest-benchmark/
    pytest suites -m bench --benchmark-enable --benchmark-compare --benchmark-compare-fail=median:10%

One case per pattern x variant x config of the pattern's ``bench_configs`` (its first two), on
worlds of 2 and 4 ranks; pytest-benchmark gets the per-iteration maximum over ranks
(commbench.timing.clock), and every case checks that each rank's booked calls equal the
pattern's prediction.
"""

from __future__ import annotations

import pytest

from commbench.patterns.base import calls_match
from commbench.patterns.registry import PATTERNS
from commbench.patterns.run import run_pattern
from commbench.timing.clock import CLOCK, feed
from commbench.timing.loop import slowest

ITERS, WARMUP = 10, 3
CASES = [pytest.param(name, v, k, marks=[getattr(pytest.mark, m) for m in p.markers],
                      id=f"{name}-{v}-c{k}")
         for name, p in PATTERNS.items() for v in p.variants for k in range(2)]


@pytest.mark.bench
@pytest.mark.world(sizes=[2, 4])
@pytest.mark.benchmark(timer=CLOCK, group="patterns")
@pytest.mark.parametrize(("name", "variant", "k"), CASES)
def test_pattern(world, benchmark, name, variant, k):
    pattern = PATTERNS[name]
    configs = pattern.bench_configs(world.size)
    if k >= len(configs):
        pytest.skip(f"{name} declares {len(configs)} study configs")
    cfg = configs[k]
    try:
        pattern.check(cfg, world.size, variant)
    except ValueError as exc:
        pytest.skip(f"{variant} does not run at this config: {exc}")
    outs = world.run(run_pattern, name, cfg, variant, 0, None, ITERS, WARMUP)
    feed(benchmark, slowest([o["times"] for o in outs]), pattern=name, variant=variant,
         config=cfg.label(), ranks=world.size,
         sent=max(sum(c[3] for c in o["ledger"]) for o in outs),
         **pattern.metrics(cfg, variant, outs))
    for r, out in enumerate(outs):
        assert calls_match(out["ledger"], pattern.predicted(cfg, variant, r, 0))
