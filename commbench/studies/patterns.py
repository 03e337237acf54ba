"""The study of any registered pattern: each config it sweeps, every variant timed side by side.

``commbench run <pattern>`` (or a marker: ``commbench run tp``) runs, per config of the
pattern's ``bench_configs``, its optimized variant first and then the others, each one step
under the ledger and ``-n`` timed steps (:mod:`commbench.timing.loop`: a barrier before each,
outside the timer; the per-iteration maximum over ranks). A row gives the median and p99 of
those, the bytes the busiest rank sent by the ledger and by the prediction, whether every
rank's booked calls equal its predicted calls, the time against the optimized variant, and the
pattern's own columns (bubble, memory, ...). Every pattern's results have these columns.
"""

from __future__ import annotations

import statistics

from commbench.patterns.base import calls_match
from commbench.patterns.registry import get
from commbench.patterns.run import run_pattern
from commbench.results import records as res
from commbench.results.pieces import or_none, study_pieces
from commbench.results.trace import chrome_trace
from commbench.studies.settings import StudySettings, write_study
from commbench.timing.loop import slowest

__all__ = ["HEADER", "pattern_markdown", "pattern_study", "run_patterns"]

HEADER = (f"#{'pattern':>14} {'variant':>12} {'config':>34} {'time(us)':>10} {'p99(us)':>10} "
          f"{'sent(B)':>10} {'pred(B)':>10} {'=pred':>5} {'vs opt':>6}  notes")


def _row_line(r: dict) -> str:
    vs = f"{r['vs_optimized']:.2f}" if r["vs_optimized"] is not None else "-"
    notes = ", ".join(f"{k} {v}" for k, v in r["metrics"].items())
    return (f" {r['pattern']:>14} {r['variant']:>12} {r['config'][-34:]:>34} "
            f"{r['time_us']:>10.1f} {r['p99_us']:>10.1f} {r['sent']:>10} {r['pred_sent']:>10} "
            f"{'yes' if r['calls_match'] else 'NO':>5} {vs:>6}  {notes}")


def pattern_study(world, names: list[str], iters: int = 10, warmup: int = 3, emit=print,
                  seed: int = 0, timeline: list | None = None, pieces=None) -> list[dict]:
    """Rows of the study of ``names`` on ``world`` (module docstring). ``timeline``: a list that
    gains, per run, (label, every rank's booked calls of a warm step, every rank's (start, end)
    of that step) for a trace. ``pieces``: a :class:`~commbench.results.pieces.Pieces` that
    keeps each finished row (saved at once) and gives back those of an interrupted run."""
    rows = []
    pieces = or_none(pieces)
    emit(HEADER)
    for name in names:
        pattern = get(name)
        order = [pattern.optimized] + [v for v in pattern.variants if v != pattern.optimized]
        for cfg in pattern.bench_configs(world.size):
            base = None
            for variant in order:
                try:
                    pattern.check(cfg, world.size, variant)
                except ValueError as exc:
                    emit(f"# {name}/{variant} at {cfg.label()}: skipped: {exc}")
                    continue
                key = f"{name}|{variant}|{cfg.label()}"
                kept = pieces.get(key)
                if kept is not None:  # measured by the interrupted run
                    base = kept["time_us"] if variant == pattern.optimized else base
                    rows.append(kept)
                    emit(_row_line(kept) + "  (kept)")
                    continue
                outs = world.run(run_pattern, name, cfg, variant, seed, None, iters, warmup)
                if timeline is not None:
                    timeline.append((f"{name}/{variant} {cfg.label()}",
                                     [o["timeline"] for o in outs], [o["span"] for o in outs]))
                per = slowest([o["times"] for o in outs])
                t = statistics.median(per) * 1e6
                base = t if variant == pattern.optimized else base
                predicted = [pattern.predicted(cfg, variant, r, seed) for r in range(world.size)]
                row = {"pattern": name, "variant": variant, "config": cfg.label(),
                       "time_us": t, "p99_us": res.percentile(per, 99) * 1e6,
                       "min_us": min(per) * 1e6, "max_us": max(per) * 1e6,
                       "sent": max(sum(c[3] for c in o["ledger"]) for o in outs),
                       "pred_sent": max(sum(c.sent for c in p) for p in predicted),
                       "calls_match": all(calls_match(o["ledger"], p)
                                          for o, p in zip(outs, predicted, strict=True)),
                       "vs_optimized": t / base if base else None,
                       "metrics": pattern.metrics(cfg, variant, outs)}
                rows.append(row)
                pieces.put(key, row)
                emit(_row_line(row))
    return rows


def pattern_markdown(record: dict) -> str:
    cells = [[r["pattern"], r["variant"], r["config"], f"{r['time_us']:.1f}", f"{r['p99_us']:.1f}",
              r["sent"], r["pred_sent"], "yes" if r["calls_match"] else "NO",
              f"{r['vs_optimized']:.2f}" if r["vs_optimized"] is not None else "",
              ", ".join(f"{k} {v}" for k, v in r["metrics"].items())] for r in record["rows"]]
    return res.study_markdown(
        record, ["pattern", "variant", "config", "time(us)", "p99(us)", "sent(B)/rank",
                 "predicted(B)", "calls = predicted", "time vs optimized", "notes"], cells,
        "One step per sample (forward + backward and the pattern's gradient reduction): median "
        "and p99 over iterations of the per-iteration maximum over ranks. sent: bytes the "
        "busiest rank's ledger booked; predicted: the pattern's prediction for it; calls = "
        "predicted: every rank's booked calls equal its predicted calls (op, group, bytes).")


def run_patterns(s: StudySettings, targets, patterns, world, launch, prints, emit) -> int:
    """``commbench run PATTERN...``: each pattern's variants timed, booked and judged."""
    # lazy: imports numpy
    from commbench.collectives.measure import MEASUREMENT

    measurement = dict(MEASUREMENT, iters=s.iters, warmup=s.warmup)
    transport = world.transports[0]
    emit(f"# commbench run {' '.join(targets)}: {', '.join(patterns)}; {world.size} ranks "
         f"({launch}), transport {transport}")
    timeline: list | None = [] if s.trace else None
    pieces = study_pieces(world, s.stem("patterns", transport, world.size), emit, write=s.write,
                          resume=s.resume, prints=prints, patterns=patterns, iters=s.iters,
                          warmup=s.warmup)
    rows = pattern_study(world, patterns, s.iters, s.warmup, emit, timeline=timeline,
                         pieces=pieces)
    if s.trace and prints:
        res.write_json(s.trace, chrome_trace(timeline))
        emit(f"# wrote {s.trace}")
    bad = [r for r in rows if not r["calls_match"]]
    emit(f"# calls booked = predicted in {len(rows) - len(bad)} of {len(rows)} rows")
    for name in patterns:
        write_study(s, prints, world, launch, name, measurement,
                     [r for r in rows if r["pattern"] == name], pattern_markdown, emit)
    pieces.finish()
    return 1 if bad else 0
