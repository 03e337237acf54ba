"""The pipeline benchmark of the family not yet on the pattern interface."""

from __future__ import annotations

import statistics

from commbench.results import records as res

__all__ = ["per_iteration", "pp_bench", "timing"]


def per_iteration(outs: list[dict], key: str = "times") -> list[float]:
    """Per iteration, the seconds of the slowest rank (the iteration ends with it)."""
    return [max(ts) for ts in zip(*(o[key] for o in outs), strict=True)]


def timing(outs: list[dict]) -> tuple[float, float, int]:
    """(median us, p99 us) of the per-iteration maximum over ranks, and the bytes the busiest
    rank's ledger counted."""
    per_iter = per_iteration(outs)
    return (statistics.median(per_iter) * 1e6, res.percentile(per_iter, 99) * 1e6,
            max(sum(e[4] for e in o["ledger"]) for o in outs))


def pp_bench(world, compute_s: float = 0.005, emit=print) -> list[dict]:
    """Bubble measured against the formula, and activation memory with and without checkpointing.

    Stages of equal synthetic compute: 4 layers per rank (4/v per chunk), a sleep of ``compute_s``
    per layer forward and twice that backward, so the bubble is the schedule's and not the
    machine's. Each case runs twice and the second run counts (the first opens the point-to-point
    connections). Measured bubble on a rank: 1 - its compute time / the pipeline's wall time (the
    longest rank's, from the common barrier); the row gives the mean over ranks.
    """
    from commbench.patterns.pp import PPConfig, run_pipeline
    from commbench.patterns.pp_schedule import bubble_fraction

    p = world.size
    rows = []
    emit(f"#{'schedule':>12} {'m':>3} {'v':>2} {'ckpt':>5} {'bubble':>7} {'predicted':>9} "
         f"{'time(ms)':>9} {'peak act(B)':>11} {'sent(B)':>8}")
    cases = [("gpipe", 1, 1), ("gpipe", 4, 1), ("gpipe", 8, 1), ("1f1b", 4, 1), ("1f1b", 8, 1),
             ("interleaved", p * 2, 2), ("interleaved", p * 2, 4)]
    for name, m, v in cases:
        for ckpt in (False, True):
            cfg = PPConfig(stages=p, layers=4 * p, hidden=32, batch=m * 4, micro=m, virtual=v,
                           schedule=name, checkpoint=ckpt, compute_s=compute_s)
            world.run(run_pipeline, cfg, 0)
            outs = world.run(run_pipeline, cfg, 0)
            wall = max(o["total_s"] for o in outs)  # the pipeline ends with its last rank
            bubble = sum(1 - o["busy_s"] / wall for o in outs) / p
            row = {"schedule": name if m > 1 else "naive (m=1)", "micro": m, "virtual": v,
                   "checkpoint": ckpt, "bubble": bubble,
                   "predicted": bubble_fraction(name, p, m, v),
                   "time_ms": max(o["total_s"] for o in outs) * 1e3,
                   "peak_activation_bytes": max(o["peak_activation_bytes"] for o in outs),
                   "sent": max(sum(e[2] for e in o["ledger"]) for o in outs)}
            rows.append(row)
            emit(f" {row['schedule']:>12} {m:>3} {v:>2} {str(ckpt):>5} {bubble:>7.3f} "
                 f"{row['predicted']:>9.3f} {row['time_ms']:>9.1f} "
                 f"{row['peak_activation_bytes']:>11} {row['sent']:>8}")
    return rows


def pp_markdown(record: dict) -> str:
    return res.study_markdown(
        record, ["schedule", "m", "v", "checkpoint", "bubble (measured)", "(p-1)/(vm+p-1)",
                 "time(ms)", "peak activations(B)", "sent(B)/rank"],
        [[r["schedule"], r["micro"], r["virtual"], r["checkpoint"], f"{r['bubble']:.3f}",
          f"{r['predicted']:.3f}", f"{r['time_ms']:.1f}", r["peak_activation_bytes"], r["sent"]]
         for r in record["rows"]],
        "Stages of equal synthetic compute (sleeps of 5 ms per layer forward, 10 ms backward, "
        "4 layers per rank). Bubble: mean over ranks of 1 - compute time / the pipeline's wall "
        "time. The formula takes communication as free; here each point-to-point message over "
        "gloo costs about half a millisecond, which the interleaved schedule, with v times more "
        "messages, pays most.")
