"""Benchmark of MoE dispatch/combine in three layouts (``commbench run moe``).

Each row: median over iterations of the per-iteration maximum over ranks (a barrier before each
iteration, outside the timer), its p99, the bytes the busiest rank sent (ledger) and the bytes
predicted for it, and the time against the optimized variant of the same row group, measured
side by side in one run.
"""

from __future__ import annotations

from commbench.patterns.moe_gating import MoEConfig
from commbench.patterns.moe_run import predicted, run_moe
from commbench.results import records as res
from commbench.studies.pattern_bench import timing

__all__ = ["moe_bench", "moe_markdown"]

# (tokens per rank, model, ffn, experts per rank)
MOE_MODELS = [(256, 64, 256, 2), (1024, 128, 512, 2)]


def moe_bench(world, iters: int = 10, warmup: int = 3, emit=print) -> list[dict]:
    n = world.size
    grids = [("ep", n, 1, 1)] + ([("ep+dp", n // 2, 2, 1), ("ep+tp", n // 2, 1, 2)]
                                 if n >= 4 and n % 2 == 0 else [])
    rows = []
    emit(f"#{'grid':>6} {'variant':>9} {'T,M,F,E':>16} {'cf':>4} {'kept':>6} {'time(us)':>10} "
         f"{'p99(us)':>10} {'sent(B)':>9} {'pred(B)':>9} {'vs cap':>6}")
    for T, M, F, per in MOE_MODELS:
        for grid, ep, dp, tp in grids:
            for cf in (0.5, 2.0):
                base = None
                for variant in ("capacity", "variable", "naive") if tp == 1 else ("capacity",):
                    cfg = MoEConfig(tokens=(T,) * (ep * dp), model=M, ffn=F, experts=per * ep,
                                    capacity_factor=cf, ep=ep, dp=dp, tp=tp, dtype="float32")
                    outs = world.run(run_moe, cfg, 0, variant, iters, warmup)
                    kept = [o["kept"] for o in outs[::tp]]  # the routing of each data group
                    t, p99, sent = timing(outs)
                    pred = max(sum(x[2] for x in predicted(cfg, variant, r, kept))
                               for r in range(n))
                    frac = sum(int(o["kept"].sum()) for o in outs) / (2 * T * len(outs))
                    base = t if variant == "capacity" else base
                    row = {"grid": grid, "variant": variant, "model": f"{T},{M},{F},{per * ep}",
                           "capacity_factor": cf, "kept": frac, "time_us": t, "p99_us": p99,
                           "sent": sent, "pred_sent": pred, "vs_capacity": t / base}
                    rows.append(row)
                    emit(f" {grid:>6} {variant:>9} {row['model']:>16} {cf:>4} {frac:>6.2f} "
                         f"{t:>10.1f} {p99:>10.1f} {sent:>9} {pred:>9} {t / base:>6.2f}")
    return rows


def moe_markdown(record: dict) -> str:
    return res.study_markdown(
        record, ["grid", "variant", "T,M,F,E", "capacity factor", "choices kept", "time(us)",
                 "p99(us)", "sent(B)/rank", "predicted(B)", "time vs capacity"],
        [[r["grid"], r["variant"], r["model"], r["capacity_factor"], f"{r['kept']:.2f}",
          f"{r['time_us']:.1f}", f"{r['p99_us']:.1f}", r["sent"], r["pred_sent"],
          f"{r['vs_capacity']:.2f}"] for r in record["rows"]],
        "One MoE layer (GShard top-2, experts relu(x W1) W2) forward + backward + gradient "
        "all-reduces, float32, T tokens per data rank. capacity: (E, C, M) all-to-alls, padding "
        "included; variable: counts first, each token once per destination rank; naive: "
        "all-gather every token. The variable layout's prediction takes the routing the run chose.")
