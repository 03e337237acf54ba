"""The claims of the family not yet on the pattern interface (expert parallelism),
measured by the ledger as before; they move to claims_list as their families move."""

from __future__ import annotations

from commbench.patterns.moe_gating import MoEConfig, capacity
from commbench.patterns.moe_run import run_moe

__all__ = ["a2a_claims"]


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
