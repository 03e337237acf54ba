"""The claims of the families not yet on the pattern interface (ZeRO, expert parallelism),
measured by the ledger as before; they move to claims_list as their families move."""

from __future__ import annotations

from commbench.patterns.moe_gating import MoEConfig, capacity
from commbench.patterns.moe_run import run_moe

__all__ = ["a2a_claims", "zero_claims"]


def _row(claim: str, formula: str, measured: str, verdict: str, matches: bool) -> dict:
    return {"claim": claim, "predicted": formula, "measured": measured, "verdict": verdict,
            "holds": "-", "ledger_matches_prediction": matches}


def _calls(ledger, group) -> str:
    counts: dict[str, int] = {}
    for e in ledger:
        if e[1] == group:
            counts[e[0]] = counts.get(e[0], 0) + 1
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))


def _sent(ledger, op: str | None = None) -> int:
    return sum(e[4] for e in ledger if op is None or e[0] == op)


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


def a2a_claims(world) -> list[dict]:
    P = world.size
    rows = []
    ep, dp = (P // 2, 2) if P >= 4 else (P, 1)
    moe = MoEConfig(tokens=(32,) * (ep * dp), model=16, ffn=32, experts=2 * ep, top_k=2,
                    capacity_factor=1.0, ep=ep, dp=dp, dtype="float32")
    out = world.run(run_moe, moe, 1, "capacity")[0]
    groups = {tuple(v): k for k, v in out["groups"].items()}
    by = {}
    for op, g, *_ in out["ledger"]:
        by.setdefault(groups.get(g, str(g)), []).append(op)
    summary = "; ".join(f"{k}: " + ", ".join(f"{ops.count(o)} {o}" for o in sorted(set(ops)))
                        for k, ops in sorted(by.items()))
    kept = int(out["kept"].sum())
    C = capacity(moe, 32)
    rows.append(_row(
        "EP: all-to-all dispatch, expert compute, all-to-all combine; backward is an "
        "all-reduce over ep_dp_group",
        "forward 2 all-to-alls of E*C*M on the EP group; backward 2 more (the mirror of each); "
        "expert gradients all-reduced over the ranks holding the same experts (dp), dense "
        "(gate) gradients over every data rank (dp x ep)",
        f"ep={ep}, dp={dp}: {summary}; rank 0 kept {kept} of {2 * 32} choices in "
        f"{moe.experts}x{C} slots: the all-to-alls carry the padding too",
        "incomplete: backward has 2 all-to-alls besides the ep_dp all-reduce, the dense "
        "parameters need their own all-reduce over all data ranks, and the capacity needs the "
        "largest token count of the EP group (1 all-reduce MAX)",
        by.get("ep", []).count("all_to_all") == 4 and "all_reduce" in by.get("dp", ["x"])
        if dp > 1 else by.get("ep", []).count("all_to_all") == 4))

    if P >= 4:  # needs ep > 1 and tp > 1
        tp = 2
        ept = MoEConfig(tokens=(32,) * (P // tp), model=16, ffn=32, experts=2 * (P // tp),
                        capacity_factor=1.0, ep=P // tp, tp=tp, dtype="float32")
        o = world.run(run_moe, ept, 1, "capacity")[0]
        a2a = _sent([e for e in o["ledger"] if e[1] == o["groups"]["ep"]], "all_to_all")
        ag = _sent([e for e in o["ledger"] if e[1] == o["groups"]["tp"]], "all_gather")
        C2 = capacity(ept, 32)
        full = 4 * (ept.ep - 1) * (ept.experts // ept.ep) * C2 * ept.model * 4
        rows.append(_row(
            "EP+TP: split the capacity dim C of (E, C, M) over TP so each rank sends only its "
            "share into the EP all-to-all, then all-gather in TP: communication for memory; "
            "the MoE input under TP must not drop tokens independently",
            f"EP all-to-all bytes / TP = {full} / {tp} B per rank; plus 4 TP all-gathers of "
            f"E*C/t*M; a routing fingerprint (2 int64) all-gathered in TP enforces the rule",
            f"EP all-to-alls {a2a} B per rank (unsplit would be {full} B); TP all-gathers "
            f"{ag} B (incl. the 16 B fingerprint); a run whose TP ranks draw their own random "
            "routing is refused (tests/test_moe.py)",
            "holds: the EP bytes fall by t; the TP all-gathers add them back on the (faster) TP "
            "links, so it trades intra-node for inter-node bytes, not bytes for memory alone",
            a2a * tp == full))
    return rows
