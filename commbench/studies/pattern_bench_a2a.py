"""Benchmarks of the all-to-all patterns: Ulysses, ring attention and the naive all-gather of K/V
(``commbench run seqpar``), and MoE dispatch/combine in three layouts (``commbench run moe``).

Each row: median over iterations of the per-iteration maximum over ranks (a barrier before each
iteration, outside the timer), its p99, the bytes the busiest rank sent (ledger) and the bytes
predicted for it, and the time against the optimized variant of the same row group, measured
side by side in one run.
"""

from __future__ import annotations

from commbench.patterns.attention import AttnConfig
from commbench.patterns.moe_gating import MoEConfig
from commbench.patterns.moe_run import predicted, run_moe
from commbench.patterns.ring_attention import causal_work
from commbench.patterns.seqpar import predicted as sp_predicted
from commbench.patterns.seqpar import run_attention
from commbench.results import records as res
from commbench.studies.pattern_bench import timing

__all__ = ["moe_bench", "moe_markdown", "seqpar_bench", "seqpar_markdown"]

# (batch, seq, heads, kv_heads, head_dim) per size; seq is scaled by the world size
ATTN_MODELS = [(2, 64, 8, 8, 32), (2, 256, 8, 8, 32), (2, 256, 8, 2, 32)]
# (tokens per rank, model, ffn, experts per rank)
MOE_MODELS = [(256, 64, 256, 2), (1024, 128, 512, 2)]


def seqpar_bench(world, iters: int = 10, warmup: int = 3, emit=print) -> list[dict]:
    P = world.size
    rows = []
    emit(f"#{'variant':>8} {'layout':>10} {'b,s,H,Hkv,d':>18} {'time(us)':>10} {'p99(us)':>10} "
         f"{'sent(B)':>9} {'pred(B)':>9} {'vs uly':>6} {'work max/min':>12}")
    for b, s, H, K, d in ATTN_MODELS:
        base = None
        for variant, layout in (("ulysses", "contiguous"), ("ring", "zigzag"),
                                ("ring", "contiguous"), ("naive", "zigzag")):
            cfg = AttnConfig(batch=b, seq=s * P, heads=H, kv_heads=K, head_dim=d, sp=P,
                             causal=True, layout=layout, dtype="float32")
            outs = world.run(run_attention, cfg, 0, variant, iters, warmup)
            t, p99, sent = timing(outs)
            pred = max(sum(x[1] for x in sp_predicted(cfg, variant, r)) for r in range(P))
            work = causal_work(cfg)
            base = t if variant == "ulysses" else base
            row = {"variant": variant, "layout": layout, "model": f"{b},{s * P},{H},{K},{d}",
                   "time_us": t, "p99_us": p99, "sent": sent, "pred_sent": pred,
                   "vs_ulysses": t / base, "work_imbalance": max(work) / min(work)}
            rows.append(row)
            emit(f" {variant:>8} {layout:>10} {row['model']:>18} {t:>10.1f} {p99:>10.1f} "
                 f"{sent:>9} {pred:>9} {row['vs_ulysses']:>6.2f} {row['work_imbalance']:>12.2f}")
    return rows


def seqpar_markdown(record: dict) -> str:
    return res.study_markdown(
        record, ["variant", "layout", "b,s,H,H_kv,d", "time(us)", "p99(us)", "sent(B)/rank",
                 "predicted(B)", "time vs ulysses", "causal work max/min"],
        [[r["variant"], r["layout"], r["model"], f"{r['time_us']:.1f}", f"{r['p99_us']:.1f}",
          r["sent"], r["pred_sent"], f"{r['vs_ulysses']:.2f}", f"{r['work_imbalance']:.2f}"]
         for r in record["rows"]],
        "One causal attention forward + backward, float32, the sequence over all ranks. "
        "Ulysses: 4 all-to-alls each way; ring: K/V point-to-point round the ring (zigzag = "
        "load-balanced chunks; wholly masked chunk pairs are skipped, so the contiguous split's "
        "imbalance shows in time); naive: all-gather of K and V. predicted: "
        "commbench.patterns.seqpar.predicted.")


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
