"""The notes' claims, measured: each row states a claim, the formula, what the ledger counted on a
real run, and a verdict. ``commbench claims`` writes ``results/claims_<hw>-x<ranks>.{md,json}``.

The notes (shared/seed, in Chinese) state the claims in model *parameters*; most of this traffic
is activations, whose size does not depend on the parameter count. Each row gives both numbers.
"""

from __future__ import annotations

import torch

from commbench.collectives import ALGORITHMS
from commbench.patterns.tp_model import TPConfig
from commbench.patterns.tp_run import run_head, run_layer

__all__ = ["claims_markdown", "tp_claims", "zero_claims"]


def _ring(ctx, count: int):
    with ctx.ledger.capture() as cap:
        ALGORITHMS[("all_reduce", "ring")](ctx.comm(), torch.ones(count), ctx.world)
    return cap.sent


def _sent(ledger, group) -> int:
    return sum(e[4] for e in ledger if e[1] == group)


def _calls(ledger, group) -> str:
    counts: dict[str, int] = {}
    for e in ledger:
        if e[1] == group:
            counts[e[0]] = counts.get(e[0], 0) + 1
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))


def tp_claims(world) -> list[dict]:
    """Rows for the tensor-parallel claims, measured on ``world`` (TP over the whole world)."""
    P = world.size
    cfg = TPConfig(batch=2, seq=8 * P, hidden=16 * P, ffn=64 * P, heads=P, vocab=64 * P, tp=P,
                   dtype="float32")
    A = cfg.batch * cfg.seq * cfg.hidden  # activation elements of one layer
    mlp_params, attn_params = 2 * cfg.hidden * cfg.ffn, 4 * cfg.hidden * cfg.hidden
    ring = 2 * (P - 1) / P
    rows = []

    mlp = world.run(run_layer, cfg, 1, False, 1 << 20, False)[0]
    g = mlp["tp"]
    rows.append(_row(
        "TP MLP forward+backward: 2 all-reduces, 4x the model parameters",
        f"2 all-reduces of A = b*s*h; per rank 2 * 2(P-1)/P * A * 4 B = {2 * ring * A * 4:.0f} B",
        f"{_calls(mlp['ledger'], g)}; {_sent(mlp['ledger'], g)} B sent per rank; 4x MLP "
        f"parameters would be {4 * mlp_params * 4} B",
        "count right, unit wrong: the all-reduced tensors are activations (b*s*h), not "
        "parameters; the volume does not depend on the parameter count",
        _sent(mlp["ledger"], g) == round(2 * ring * A * 4)))

    layer = world.run(run_layer, cfg, 1)[0]
    rows.append(_row(
        "TP attention + MLP: 4 all-reduces, 8x the model parameters",
        f"4 all-reduces of A; per rank 8(P-1)/P * A * 4 B = {4 * ring * A * 4:.0f} B",
        f"{_calls(layer['ledger'], g)}; {_sent(layer['ledger'], g)} B sent; 8x layer parameters "
        f"would be {8 * (mlp_params + attn_params) * 4} B",
        "count right, unit wrong (activations, not parameters)",
        _sent(layer["ledger"], g) == round(4 * ring * A * 4)))

    sp = world.run(run_layer, TPConfig(**{**cfg.as_dict(), "sequence_parallel": True}), 1)[0]
    rg = world.run(run_layer, TPConfig(**{**cfg.as_dict(), "sequence_parallel": True,
                                          "regather": True}), 1)[0]
    tp_b, sp_b, rg_b = (_sent(x["ledger"], g) for x in (layer, sp, rg))
    rows.append(_row(
        "SP: all-gather + reduce-scatter equal one ring all-reduce, so SP comes free",
        "4 AG + 4 RS of A = 4 ring all-reduces of A; Megatron's regather adds 2 AG",
        f"TP {tp_b} B; TP+SP {sp_b} B ({_calls(sp['ledger'], g)}); with regather {rg_b} B "
        f"({rg_b / tp_b:.2f}x TP)",
        f"holds when the gathered input is kept ({sp_b / tp_b:.3f}x TP: the extra is the "
        f"LayerNorm/bias all-reduce of 6h); Megatron's backward re-gather costs "
        f"{(rg_b - tp_b) / tp_b:.0%} more", abs(sp_b - tp_b) <= 6 * cfg.hidden * 4 * 2))

    head = world.run(run_head, cfg, 1, False)[0]
    fused = world.run(run_head, cfg, 1, True)[0]
    naive = world.run(run_head, cfg, 1, False, True)[0]
    bs = cfg.batch * cfg.seq
    rows.append(_row(
        "cross-entropy needs two all-reduces, of batch size and of N: cost drops from b*s*V to "
        "b*s + N",
        f"Megatron: 3 all-reduces of b*s = {bs} float32 (fused: 2); naive: all-gather b*s*V",
        f"unfused: {_calls(head['ce'], g)} ({_sent(head['ce'], g)} B); fused: "
        f"{_calls(fused['ce'], g)} ({_sent(fused['ce'], g)} B); naive: "
        f"{_calls(naive['ce'], g)} ({_sent(naive['ce'], g)} B) with V = {cfg.vocab}",
        "partly wrong: 3 all-reduces (2 fused), every one over the b*s token grid; there is no "
        "N-sized term; the drop is from O(b*s*V) to O(b*s)",
        len(head["ce"]) == 3 and len(fused["ce"]) == 2))

    count = 1 << 12
    sent = world.run(_ring, count)
    rows.append(_row(
        "ring all-reduce costs about 2x the parameters",
        f"per rank 2(P-1)/P * S; S = {count * 4} B",
        f"per rank {sent[0]} B = {sent[0] / (count * 4):.3f} S; all ranks together {sum(sent)} B",
        f"correct per rank, imprecise: 2(P-1)/P = {ring:.3f}, tending to 2; the sum over ranks "
        f"is 2(P-1) S", sent[0] == round(ring * count * 4)))
    return rows


def zero_claims(world) -> list[dict]:
    """Rows for the notes' ZeRO claims: bytes per step and memory per parameter."""
    from commbench.patterns.zero import train
    from commbench.patterns.zero_model import ZeroConfig, flat_size

    P = world.size
    sent = {}
    for stage in range(4):
        for micro in (1, 4):
            cfg = ZeroConfig(stage=stage, layers=4, hidden=32, batch=P, micro=micro, steps=1,
                             dtype="float32")
            sent[stage, micro] = sum(e[2] for e in world.run(train, cfg, 0)[0]["ledger"])
    psi = 4 * flat_size(ZeroConfig(layers=4, hidden=32), P)[1]
    unit = (P - 1) / P * psi * 4  # (P-1)/P * Psi, in bytes (float32)
    rows = [_row(
        "ZeRO-1 and ZeRO-2 come almost free; ZeRO-3 costs 3x instead of 2x",
        "per rank per step: DDP 2(P-1)/P*Psi; ZeRO-1/2 RS + AG = the same; ZeRO-3 AG fwd + AG bwd "
        "+ RS = 3(P-1)/P*Psi",
        f"one micro-batch: DDP {sent[0, 1]} B, ZeRO-1 {sent[1, 1]}, ZeRO-2 {sent[2, 1]}, "
        f"ZeRO-3 {sent[3, 1]} ({sent[3, 1] / sent[0, 1]:.2f}x DDP); 4 micro-batches: DDP "
        f"{sent[0, 4]}, ZeRO-2 {sent[2, 4]} ({sent[2, 4] / sent[0, 4]:.2f}x), ZeRO-3 "
        f"{sent[3, 4]} ({sent[3, 4] / sent[0, 4]:.2f}x)",
        "correct for one micro-batch (2 vs 3 units of (P-1)/P*Psi: ZeRO-1/2 add nothing, "
        "ZeRO-3 is 1.5x DDP); under gradient accumulation ZeRO-2 reduce-scatters every "
        "micro-batch and ZeRO-3 re-gathers every micro-batch, so both grow with m while DDP "
        "and ZeRO-1 do not",
        sent[0, 1] == sent[1, 1] == sent[2, 1] == round(2 * unit) and
        sent[3, 1] == round(3 * unit))]
    mem = {}
    for stage in range(4):
        for dtype in ("float32", "bfloat16"):
            cfg = ZeroConfig(stage=stage, layers=4, hidden=32, batch=P, dtype=dtype)
            mem[stage, dtype] = world.run(train, cfg, 0)[0]["memory"]
    per = {k: {n: round(v / psi, 2) for n, v in m.items()} for k, m in mem.items()}
    rows.append(_row(
        "memory: fp32 weights and two fp32 moments are 12 bytes per parameter (16 with mixed "
        "precision); ZeRO-1/2/3 cut optimizer states, then gradients, then weights to 1/N",
        "float32: weights 4 + moments 8 (+ gradients 4); bf16: weights 2 + master 4 + moments 8 "
        "(+ gradients); stage k divides one more of them by P",
        "bytes per parameter per rank (params/grads/optimizer): " + "; ".join(
            f"stage {s} {d}: {per[s, d]['params']}/{per[s, d]['grads']}/{per[s, d]['optimizer']}"
            for s in range(4) for d in ("float32", "bfloat16")),
        f"12 B (fp32) holds without gradients; the notes' 16 B for mixed precision counts fp16 "
        f"gradients (2 B); commbench accumulates them in fp32 (4 B), so 18 B; each stage "
        f"divides its part by P = {P} as stated",
        per[0, "float32"]["params"] + per[0, "float32"]["optimizer"] == 12))
    return rows


def _row(claim: str, formula: str, measured: str, verdict: str, matches: bool) -> dict:
    return {"claim": claim, "formula": formula, "measured": measured, "verdict": verdict,
            "ledger_matches_formula": matches}


def claims_markdown(record: dict) -> str:
    from tabulate import tabulate

    from commbench.results.records import markdown

    head = markdown(dict(record, rows=[])).rstrip()
    table = tabulate([[r["claim"], r["formula"], r["measured"], r["verdict"],
                       "yes" if r["ledger_matches_formula"] else "NO"] for r in record["rows"]],
                     headers=["claim (the notes)", "formula", "measured (ledger)", "verdict",
                              "ledger = formula"], tablefmt="github")
    return f"{head}\n\n{table}\n"
