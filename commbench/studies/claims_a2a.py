"""The notes' claims about Ulysses, context parallelism and expert parallelism, measured by the
ledger on a real run (rows of the same claims table as :mod:`commbench.studies.claims`)."""

from __future__ import annotations

from commbench.patterns.moe_gating import MoEConfig, capacity
from commbench.patterns.moe_run import run_moe
from commbench.patterns.run import run_pattern
from commbench.patterns.seq.attention import AttnConfig
from commbench.patterns.seq.ring import causal_work
from commbench.studies.claims import _calls, _row

__all__ = ["a2a_claims"]


def _sent(ledger, op: str | None = None) -> int:
    return sum(e[4] for e in ledger if op is None or e[0] == op)


def a2a_claims(world) -> list[dict]:
    P = world.size
    rows = []
    cfg = AttnConfig(batch=2, seq=16 * P, heads=2 * P, head_dim=8, sp=P, causal=True,
                     layout="zigzag", dtype="float32")
    N, h = cfg.batch * cfg.seq, cfg.heads * cfg.head_dim
    runs = {v: world.run(run_pattern, "ring_attention" if v == "ring" else "ulysses", cfg, v, 1)[0]
            for v in ("ulysses", "ring", "naive")}
    uly = [(op, axis, None, None, sent, recv) for op, axis, _, sent, recv in runs["ulysses"]["ledger"]]
    per_rank = 8 * N * h * (P - 1) // P ** 2 * 4
    rows.append(_row(
        "Ulysses: 4 all-to-alls forward, 4 backward, each (N*d)/P: 8Nd/P in total, a P-fold "
        "saving that does not grow with N",
        f"each all-to-all: a rank keeps 1/P of its N*h/P shard and sends the rest: "
        f"(P-1)/P^2 * N*h; per rank 8(P-1)/P^2 * N*h*4 B = {per_rank} B",
        f"{_calls(uly, 'sp')}; {_sent(uly)} B sent per rank, "
        f"{_sent(uly) * P} B by all {P} ranks (N = {N} tokens, h = {h}); ring attention "
        f"{sum(c[3] for c in runs['ring']['ledger'])} B, naive all-gather of K,V "
        f"{sum(c[3] for c in runs['naive']['ledger'])} B per rank",
        f"right in count, loose in size: per rank it is 8(P-1)/P^2 * N*h ({(P - 1) / P:.2f}x the "
        f"notes' 8Nh/P, the 1/P that stays home is not sent), and summed over ranks "
        f"8(P-1)/P * N*h, which does grow with N; what falls with P is the per-rank volume",
        _sent(uly) == per_rank))

    ring = runs["ring"]
    fwd, total = ring["outputs"]["stats"]["forward_sent"], sum(c[3] for c in ring["ledger"])
    want = 2 * N * cfg.kv * cfg.head_dim * (P - 1) // P * 4
    zig = causal_work(cfg)
    flat = causal_work(AttnConfig(**{**cfg.as_dict(), "layout": "contiguous"}))
    rows.append(_row(
        "context parallelism: K/V blocks pass round a ring; causal attention needs the "
        "load-balanced split",
        f"forward 2*N*h_kv*(P-1)/P*4 B = {want} B per rank, backward K/V again plus dK/dV = 2x; "
        f"zigzag: rank r holds chunks r and 2P-1-r",
        f"forward {fwd} B, backward {total - fwd} B per rank; causal scores per rank: zigzag "
        f"{zig}, contiguous {flat} (max/min {max(flat) / min(flat):.1f})",
        "holds: bytes as stated; the contiguous split leaves the last rank "
        f"{max(flat) / min(flat):.1f}x the first rank's work, the zigzag split none",
        fwd == want and total == 3 * want and len(set(zig)) == 1))

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
