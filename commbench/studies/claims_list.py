"""The notes' claims as data: the runs that test each, and its verdict from their figures.

The notes' own figures (4x the parameters, 8Nd/P, ...) appear here as what the notes claim;
every figure commbench sets beside them comes from a pattern's prediction or the ledger.
"""

from __future__ import annotations

from commbench.patterns.dp.configs import STAGES, ZeroConfig, flat_size
from commbench.patterns.dp.ddp import DDPConfig
from commbench.patterns.moe.configs import MoEConfig, capacity
from commbench.patterns.seq.configs import AttnConfig
from commbench.patterns.seq.ring_attention_comms import causal_work
from commbench.patterns.tp.configs import TPConfig, param_sizes
from commbench.patterns.tp.vocab import VocabConfig
from commbench.studies.claims import Claim, Run

__all__ = ["CLAIMS"]


def _tp(P: int) -> TPConfig:
    return TPConfig(batch=2, seq=8 * P, hidden=16 * P, ffn=64 * P, heads=P, vocab=64 * P, tp=P,
                    dtype="float32")


def _mlp(m, P):
    cfg = _tp(P)
    r = m["mlp"]
    params = 2 * cfg.hidden * cfg.ffn * 4  # the MLP's two weight matrices, float32
    holds = r.count("all_reduce", "tp") == 2
    return (f"{r.calls('tp')}; {r.sent('tp')} B sent per rank; 4x the MLP's parameters would be "
            f"{4 * params} B",
            "count right, unit wrong: the all-reduced tensors are activations (b*s*h), not "
            "parameters; the volume does not depend on the parameter count",
            "partly" if holds else "no")


def _layer(m, P):
    cfg = _tp(P)
    r = m["layer"]
    params = (2 * cfg.hidden * cfg.ffn + 4 * cfg.hidden ** 2) * 4
    return (f"{r.calls('tp')}; {r.sent('tp')} B sent per rank; 8x the layer's parameters would be "
            f"{8 * params} B", "count right, unit wrong (activations, not parameters)",
            "partly" if r.count("all_reduce", "tp") == 4 else "no")


def _sp(m, P):
    tp, sp, rg = (m[k].sent("tp") for k in ("tp", "sp", "regather"))
    return (f"TP {tp} B; TP+SP {sp} B ({m['sp'].calls('tp')}); with the backward re-gather {rg} B "
            f"({rg / tp:.2f}x TP)",
            f"holds when the gathered input is kept ({sp / tp:.3f}x TP: the extra is the "
            f"all-reduce of the LayerNorm and bias gradients); Megatron's backward re-gather costs "
            f"{(rg - tp) / tp:.0%} more", "yes" if sp / tp < 1.05 else "partly")


def _ce(m, P):
    def ce(k):  # the cross-entropy's own calls, booked while it ran
        calls = m[k].outs[0]["outputs"]["stats"]["cross_entropy"]
        return f"{len(calls)} {'/'.join(sorted({c[0] for c in calls}))} of " \
            f"{[c[1] for c in calls]} elements ({sum(c[2] for c in calls)} B)"
    cfg = VocabConfig(batch=2, seq=8 * P, hidden=16 * P, vocab=64 * P, tp=P, dtype="float32")
    parts = [f"{k}: {ce(k)}" for k in ("megatron", "fused", "naive")]
    return ("; ".join(parts) + f" with V = {cfg.vocab}",
            "partly wrong: 3 all-reduces (2 fused), every one over the b*s token grid; there is no "
            "N-sized term; the drop is from O(b*s*V) to O(b*s)", "partly")


def _ring(m, P):
    r = m["ddp"]
    psi = sum(param_sizes(TPConfig(hidden=16, ffn=64, heads=2, tp=1)).values()) * 4
    sent = r.sent("dp")
    return (f"per rank {sent} B = {sent / psi:.3f} x the gradients' {psi} B ({r.calls('dp')}); "
            f"all ranks together {sent * P} B",
            f"correct per rank, imprecise: {sent / psi:.3f} = 2(P-1)/P, tending to 2; the sum over "
            "ranks is 2(P-1) times the parameters", "yes")


def _attn(P: int, layout: str = "zigzag") -> AttnConfig:
    return AttnConfig(batch=2, seq=16 * P, heads=2 * P, head_dim=8, sp=P, causal=True,
                      layout=layout, dtype="float32")


def _ulysses(m, P):
    cfg = _attn(P)
    N, h = cfg.batch * cfg.seq, cfg.heads * cfg.head_dim
    sent = m["ulysses"].sent("sp")
    notes = 8 * N * h * 4 // P  # the notes' 8Nd/P, float32
    return (f"{m['ulysses'].calls('sp')}; {sent} B sent per rank, {sent * P} B by all {P} ranks "
            f"(N = {N} tokens, h = {h}); the notes' 8Nh/P would be {notes} B; ring attention "
            f"{m['ring'].sent('sp')} B, naive all-gather of K,V {m['naive'].sent('sp')} B per rank",
            f"right in count, loose in size: per rank {sent / notes:.2f}x the notes' 8Nh/P (the 1/P "
            "that stays home is not sent), and summed over ranks it does grow with N; what falls "
            "with P is the per-rank volume", "partly")


def _cp(m, P):
    r = m["ring"]
    fwd = r.outs[0]["outputs"]["stats"]["forward_sent"]
    total = r.sent("sp")
    zig, flat = causal_work(_attn(P)), causal_work(_attn(P, "contiguous"))
    return (f"forward {fwd} B, backward {total - fwd} B per rank; causal scores per rank: zigzag "
            f"{zig}, contiguous {flat} (max/min {max(flat) / min(flat):.1f})",
            f"holds: backward moves {(total - fwd) / fwd:.0f}x the forward (K/V again, then "
            f"dK/dV); the contiguous split leaves the last rank {max(flat) / min(flat):.1f}x the "
            "first rank's work, the zigzag split none",
            "yes" if len(set(zig)) == 1 else "partly")


def _zero_cfg(P: int, micro: int = 1, dtype: str = "float32") -> ZeroConfig:
    return ZeroConfig(layers=4, hidden=32, batch=P, micro=micro, steps=1, dp=P, dtype=dtype)


def _zero_bytes(m, P):
    s = {k: r.sent("dp") for k, r in m.items()}  # (stage, micro-batches) -> bytes sent on dp
    one, four = (lambda stage: s[stage, 1]), (lambda stage: s[stage, 4])
    return (f"one micro-batch: DDP {one('ddp')} B, ZeRO-1 {one('zero1')}, ZeRO-2 {one('zero2')}, "
            f"ZeRO-3 {one('zero3')} ({one('zero3') / one('ddp'):.2f}x DDP); 4 micro-batches: DDP "
            f"{four('ddp')}, ZeRO-2 {four('zero2')} ({four('zero2') / four('ddp'):.2f}x), ZeRO-3 "
            f"{four('zero3')} ({four('zero3') / four('ddp'):.2f}x)",
            f"correct for one micro-batch (ZeRO-1/2 move what DDP moves, ZeRO-3 "
            f"{one('zero3') / one('ddp'):.2f}x, not the notes' 3x/2x); under gradient accumulation "
            "ZeRO-2 reduce-scatters every micro-batch and ZeRO-3 re-gathers every micro-batch, so "
            "both grow with m while DDP and ZeRO-1 do not", "partly")


def _zero_memory(m, P):
    psi = 4 * flat_size(_zero_cfg(P), P)[1]  # parameters of the 4 layers, padded
    per = {k: {n: round(v / psi, 2) for n, v in r.outs[0]["outputs"]["stats"]["memory"].items()}
           for k, r in m.items()}
    fp32 = per["ddp float32"]
    return ("bytes per parameter per rank (params/grads/optimizer): " + "; ".join(
                f"{k}: {v['params']}/{v['grads']}/{v['optimizer']}" for k, v in per.items()),
            f"{fp32['params'] + fp32['optimizer']} B (fp32) holds without gradients; the notes' "
            "16 B for mixed precision counts fp16 gradients (2 B); commbench accumulates them in "
            f"fp32 (4 B), so 18 B; each stage divides its part by P = {P} as stated",
            "partly")


def _ep_grid(P: int) -> tuple[int, int]:
    return (P // 2, 2) if P >= 4 else (P, 1)


def _moe(P: int, ep: int, dp: int, tp: int = 1) -> MoEConfig:
    return MoEConfig(tokens=(32,) * (ep * dp), model=16, ffn=32, experts=2 * ep, top_k=2,
                     capacity_factor=1.0, ep=ep, dp=dp, tp=tp, dtype="float32")


def _ep(m, P):
    r = m["moe"]
    ep, dp = _ep_grid(P)
    cfg = _moe(P, ep, dp)
    by_axis = "; ".join(f"{a}: {r.calls(a)}" for a in sorted({c[1] for c in r.booked}))
    kept = int(r.outs[0]["outputs"]["kept"].sum())
    return (f"ep={ep}, dp={dp}: {by_axis}; rank 0 kept {kept} of {2 * 32} choices in "
            f"{cfg.experts}x{capacity(cfg, 32)} slots: the all-to-alls carry the padding too",
            "incomplete: backward has 2 all-to-alls besides the ep_dp all-reduce, the dense "
            "parameters need their own all-reduce over all data ranks, and the capacity needs the "
            "largest token count of the EP group (1 all-reduce MAX)", "partly")


def _ep_tp(m, P):
    split, whole = m["ep+tp"].sent("ep", "all_to_all"), m["ep"].sent("ep", "all_to_all")
    return (f"EP all-to-alls {split} B per rank with the capacity split over tp=2, {whole} B "
            f"without; TP all-gathers {m['ep+tp'].sent('tp', 'all_gather')} B (with the 16 B "
            "routing fingerprint); a run whose TP ranks draw their own random routing is refused",
            f"holds: the EP bytes fall by {whole / split:.1f}x; the TP all-gathers add them back "
            "on the (faster) TP links, so it trades intra-node for inter-node bytes, not bytes "
            "for memory alone", "yes" if whole == 2 * split else "partly")


CLAIMS = [
    Claim("TP MLP forward+backward: 2 all-reduces, 4x the model parameters",
          lambda P: {"mlp": Run("tp_mlp", "tp", _tp(P))}, _mlp),
    Claim("TP attention + MLP: 4 all-reduces, 8x the model parameters",
          lambda P: {"layer": Run("tp_layer", "tp", _tp(P))}, _layer),
    Claim("SP: all-gather + reduce-scatter equal one ring all-reduce, so SP comes free",
          lambda P: {k: Run("tp_layer", v, _tp(P)) for k, v in
                     (("tp", "tp"), ("sp", "sp"), ("regather", "sp_regather"))}, _sp),
    Claim("cross-entropy needs two all-reduces, of batch size and of N: cost drops from b*s*V to "
          "b*s + N",
          lambda P: {v: Run("vocab", v, VocabConfig(batch=2, seq=8 * P, hidden=16 * P,
                                                    vocab=64 * P, tp=P, dtype="float32"))
                     for v in ("megatron", "fused", "naive")}, _ce),
    Claim("ring all-reduce costs about 2x the parameters",
          lambda P: {"ddp": Run("ddp", "ddp", DDPConfig(batch=2 * P, seq=4, hidden=16, ffn=64,
                                                        heads=2, vocab=1, dp=P, tp=1,
                                                        dtype="float32", bucket_bytes=1 << 30))},
          _ring),
    Claim("ZeRO-1 and ZeRO-2 come almost free; ZeRO-3 costs 3x instead of 2x",
          lambda P: {(v, m): Run("zero", v, _zero_cfg(P, m)) for v in STAGES for m in (1, 4)},
          _zero_bytes),
    Claim("memory: fp32 weights and two fp32 moments are 12 bytes per parameter (16 with mixed "
          "precision); ZeRO-1/2/3 cut optimizer states, then gradients, then weights to 1/N",
          lambda P: {f"{v} {d}": Run("zero", v, _zero_cfg(P, dtype=d)) for v in STAGES
                     for d in ("float32", "bfloat16")}, _zero_memory),
    Claim("Ulysses: 4 all-to-alls forward, 4 backward, each (N*d)/P: 8Nd/P in total, a P-fold "
          "saving that does not grow with N",
          lambda P: {"ulysses": Run("ulysses", "ulysses", _attn(P)),
                     "ring": Run("ring_attention", "ring", _attn(P)),
                     "naive": Run("ulysses", "naive", _attn(P))}, _ulysses),
    Claim("context parallelism: K/V blocks pass round a ring; causal attention needs the "
          "load-balanced split",
          lambda P: {"ring": Run("ring_attention", "ring", _attn(P))}, _cp),
    Claim("EP: all-to-all dispatch, expert compute, all-to-all combine; backward is an "
          "all-reduce over ep_dp_group",
          lambda P: {"moe": Run("moe", "capacity", _moe(P, *_ep_grid(P)))}, _ep),
    Claim("EP+TP: split the capacity dim C of (E, C, M) over TP so each rank sends only its share "
          "into the EP all-to-all, then all-gather in TP: communication for memory; the MoE input "
          "under TP must not drop tokens independently",
          lambda P: {"ep": Run("moe", "capacity", _moe(P, P // 2, 2)),
                     "ep+tp": Run("moe", "capacity", _moe(P, P // 2, 1, tp=2))}, _ep_tp,
          min_ranks=4),
]
