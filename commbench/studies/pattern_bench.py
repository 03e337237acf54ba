"""Pattern benchmarks: a layer's forward + backward timed on the ranks, its bytes counted by the
ledger next to the prediction, naive and optimized side by side, at several model sizes.

``commbench run tp`` prints and writes ``results/tp_<hw>-<transport>-x<ranks>.{json,md}``.
Time is the median over iterations of the per-iteration maximum over ranks (a barrier before
each iteration, outside the timer), as for the collectives.
"""

from __future__ import annotations

import statistics

from commbench.patterns.tp_model import TPConfig
from commbench.patterns.tp_run import predicted_layer, run_layer
from commbench.results import records as res
from commbench.wire.volume import booked

__all__ = ["MODELS", "VARIANTS", "per_iteration", "timing", "tp_bench"]

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
            t, p99, sent = timing(outs)
            pred = _predicted_sent(cfg, naive) if dp == 1 else \
                max(sum(booked("all_reduce", dp, i, c, 4)[0] for c in _dp_counts(outs[0]))
                    for i in range(dp))
            base = t if name == "tp" else base
            row = {"variant": name, "model": f"{b},{s},{h},{f}", "tp": tp, "dp": dp,
                   "time_us": t, "p99_us": p99,
                   "sent": sent, "pred_sent": pred,
                   "vs_tp": t / base if base and dp == 1 else None}
            rows.append(row)
            vs = f"{row['vs_tp']:.2f}" if row["vs_tp"] else "-"
            emit(f" {name:>15} {row['model']:>16} {t:>10.1f} {row['p99_us']:>10.1f} "
                 f"{sent:>10} {pred:>10} {vs:>6}")
    return rows


def per_iteration(outs: list[dict], key: str = "times") -> list[float]:
    """Per iteration, the seconds of the slowest rank (the iteration ends with it)."""
    return [max(ts) for ts in zip(*(o[key] for o in outs), strict=True)]


def timing(outs: list[dict]) -> tuple[float, float, int]:
    """(median us, p99 us) of the per-iteration maximum over ranks, and the bytes the busiest
    rank's ledger counted."""
    per_iter = per_iteration(outs)
    return (statistics.median(per_iter) * 1e6, res.percentile(per_iter, 99) * 1e6,
            max(sum(e[4] for e in o["ledger"]) for o in outs))


def _dp_counts(out: dict) -> list[int]:
    return [e[2] for e in out["ledger"] if e[1] == out["dp"]]


def tp_markdown(record: dict) -> str:
    return res.study_markdown(
        record, ["variant", "b,s,h,f", "TP", "DP", "time(us)", "p99(us)", "sent(B)/rank",
                 "predicted(B)", "time vs tp"],
        [[r["variant"], r["model"], r["tp"], r["dp"], f"{r['time_us']:.1f}", f"{r['p99_us']:.1f}",
          r["sent"], r["pred_sent"], f"{r['vs_tp']:.2f}" if r["vs_tp"] else ""]
         for r in record["rows"]],
        "One transformer layer, forward + backward, float32. sent: the bytes the ledger counted "
        "on the busiest rank (every group); predicted: the formula "
        "(commbench.patterns.tp.predicted_layer; DDP: one all-reduce per bucket).")


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


def zero_bench(world, steps: int = 5, emit=print) -> list[dict]:
    """DDP and ZeRO-1/2/3 per step: time, bytes counted against predicted, memory per rank."""
    from commbench.patterns.zero import predicted_calls, train
    from commbench.patterns.zero_model import ZeroConfig

    P = world.size
    rows = []
    emit(f"#{'stage':>6} {'layers x h':>11} {'m':>2} {'step(ms)':>9} {'sent/step(B)':>13} "
         f"{'predicted':>10} {'params(B)':>10} {'grads(B)':>9} {'optim(B)':>9}")
    for layers, h in ((4, 64), (4, 256)):
        for micro in (1, 4):
            for stage in range(4):
                cfg = ZeroConfig(stage=stage, layers=layers, hidden=h, batch=4 * P, micro=micro,
                                 steps=steps, dtype="float32")
                outs = world.run(train, cfg, 0)
                sent = max(sum(e[2] for e in o["ledger"]) for o in outs) // steps
                pred = max(sum(booked(op, P, i, c, 4)[0] for op, c in predicted_calls(cfg, P))
                           for i in range(P)) // steps
                mem = outs[0]["memory"]
                row = {"stage": stage, "model": f"{layers}x{h}", "micro": micro,
                       "step_ms": max(o["step_s"] for o in outs) * 1e3, "sent": sent,
                       "pred_sent": pred, **{f"mem_{k}": v for k, v in mem.items()}}
                rows.append(row)
                emit(f" {stage:>6} {row['model']:>11} {micro:>2} {row['step_ms']:>9.2f} "
                     f"{sent:>13} {pred:>10} {mem['params']:>10} {mem['grads']:>9} "
                     f"{mem['optimizer']:>9}")
    return rows


def zero_markdown(record: dict) -> str:
    return res.study_markdown(
        record, ["stage", "layers x h", "micro-batches", "step(ms)", "sent/step(B)/rank",
                 "predicted(B)", "params(B)", "grads(B)", "optimizer(B)"],
        [[f"ZeRO-{r['stage']}" if r["stage"] else "DDP", r["model"], r["micro"],
          f"{r['step_ms']:.2f}", r["sent"], r["pred_sent"], r["mem_params"], r["mem_grads"],
          r["mem_optimizer"]] for r in record["rows"]],
        "float32 Adam; step time is the slowest rank's mean over the steps; memory is what one "
        "rank holds.")
