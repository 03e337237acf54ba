"""Pattern benchmarks: a layer's forward + backward timed on the ranks, its bytes counted by the
ledger next to the prediction, naive and optimized side by side, at several model sizes.

``commbench run tp`` prints and writes ``results/tp_<hw>-<transport>-x<ranks>.{json,md}``.
Time is the median over iterations of the per-iteration maximum over ranks (a barrier before
each iteration, outside the timer), as for the collectives.
"""

from __future__ import annotations

import statistics

from commbench import results as res
from commbench.patterns.tp import predicted_layer, run_layer
from commbench.patterns.tp_model import TPConfig
from commbench.volume import booked

__all__ = ["MODELS", "VARIANTS", "tp_bench"]

# (batch, seq, hidden, ffn) per model size; heads = hidden / 16
MODELS = [(2, 64, 64, 256), (2, 128, 128, 512), (2, 256, 256, 1024)]
# name -> (sequence_parallel, regather, naive, dp, naive_ddp)
VARIANTS = {
    "tp": (False, False, False, 1, False), "tp naive": (False, False, True, 1, False),
    "tp+sp": (True, False, False, 1, False), "tp+sp regather": (True, True, False, 1, False),
    "dp ddp": (False, False, False, 0, False), "dp naive": (False, False, False, 0, True),
}


def _predicted_sent(cfg: TPConfig, naive: bool) -> int:
    P = cfg.tp
    return max(sum(booked(op, P, i, c, 4)[0] for op, c in predicted_layer(cfg, naive))
               for i in range(P)) if P > 1 else 0


def tp_bench(world, iters: int = 10, warmup: int = 3, emit=print) -> list[dict]:
    n = world.size
    rows = []
    emit(f"#{'variant':>15} {'b,s,h,f':>16} {'time(us)':>10} {'p99(us)':>10} {'sent(B)':>10} "
         f"{'pred(B)':>10} {'vs tp':>6}")
    for b, s, h, f in MODELS:
        base = None
        for name, (sp, regather, naive, dp, naive_ddp) in VARIANTS.items():
            tp = n if dp == 1 else 1
            dp = 1 if dp == 1 else n
            if sp and tp == 1:
                continue
            cfg = TPConfig(batch=b * dp, seq=s, hidden=h, ffn=f, heads=h // 16, vocab=tp, tp=tp,
                           dp=dp, sequence_parallel=sp, regather=regather, dtype="float32")
            outs = world.run(run_layer, cfg, 0, naive, 25 << 20, True, iters, warmup, naive_ddp)
            per_iter = [max(ts) for ts in zip(*(o["times"] for o in outs))]
            sent = max(sum(e[4] for e in o["ledger"]) for o in outs)
            pred = _predicted_sent(cfg, naive) if dp == 1 else \
                max(sum(booked("all_reduce", dp, i, c, 4)[0] for c in _dp_counts(outs[0]))
                    for i in range(dp))
            t = statistics.median(per_iter) * 1e6
            base = t if name == "tp" else base
            row = {"variant": name, "model": f"{b},{s},{h},{f}", "tp": tp, "dp": dp,
                   "time_us": t, "p99_us": res.percentile(per_iter, 99) * 1e6,
                   "sent": sent, "pred_sent": pred,
                   "vs_tp": t / base if base and dp == 1 else None}
            rows.append(row)
            vs = f"{row['vs_tp']:.2f}" if row["vs_tp"] else "-"
            emit(f" {name:>15} {row['model']:>16} {t:>10.1f} {row['p99_us']:>10.1f} "
                 f"{sent:>10} {pred:>10} {vs:>6}")
    return rows


def _dp_counts(out: dict) -> list[int]:
    return [e[2] for e in out["ledger"] if e[1] == out["dp"]]


def tp_markdown(record: dict) -> str:
    from tabulate import tabulate

    head = res.markdown(dict(record, rows=[])).rstrip()
    table = tabulate([[r["variant"], r["model"], r["tp"], r["dp"], f"{r['time_us']:.1f}",
                       f"{r['p99_us']:.1f}", r["sent"], r["pred_sent"],
                       f"{r['vs_tp']:.2f}" if r["vs_tp"] else ""] for r in record["rows"]],
                     headers=["variant", "b,s,h,f", "TP", "DP", "time(us)", "p99(us)",
                              "sent(B)/rank", "predicted(B)", "time vs tp"], tablefmt="github")
    return (f"{head}\n\nOne transformer layer, forward + backward, float32. sent: the bytes "
            "the ledger counted on the busiest rank (every group); predicted: the formula "
            f"(commbench.patterns.tp.predicted_layer; DDP: one all-reduce per bucket).\n\n{table}\n")
