"""SPMD cases for the MoE tests, a loop-by-loop GShard reference, and the deliberately broken
variants the properties must catch."""

from __future__ import annotations

import contextlib
from unittest import mock

import torch

from commbench.patterns import moe, moe_gating, moe_run
from commbench.patterns.moe_run import expected, oracle_moe, predicted, run_moe

_A2A, _UNIFORMS = moe._a2a, moe_run.uniforms
_CAPACITY = moe_run.moe_capacity


def loop_gating(logits: torch.Tensor, cfg, cap: int, u: torch.Tensor):
    """GShard top-k gating written token by token, as the paper's Algorithm 1 reads."""
    T, E = logits.shape
    gates = logits.softmax(-1).tolist()
    combine = torch.zeros(T, E, cap, dtype=torch.float64)
    firsts = [max(range(E), key=lambda e: g[e]) for g in gates]
    seconds = [max((e for e in range(E) if e != f), key=lambda e: g[e]) if cfg.top_k == 2 else None
               for g, f in zip(gates, firsts, strict=True)]
    filled = [0] * E
    choices: list[list[tuple[int, int]]] = [[] for _ in range(T)]
    for t, e in enumerate(firsts):
        choices[t].append((e, filled[e]))
        filled[e] += 1
    for t, e in enumerate(seconds):
        if e is None:
            continue
        g1, g2 = gates[t][firsts[t]], gates[t][e]
        if cfg.random_routing and not float(u[t]) < 2 * g2 / (g1 + g2):
            continue
        choices[t].append((e, filled[e]))
        filled[e] += 1
    for t in range(T):
        kept = [(e, c) for e, c in choices[t] if c < cap]
        w = [gates[t][e] for e, _ in kept]
        if cfg.top_k == 2:
            w = [x / max(sum(w), torch.finfo(torch.float64).eps) for x in w]
        for (e, c), x in zip(kept, w, strict=True):
            combine[t, e, c] = x
    frac = [sum(1 for f in firsts if f == e) / T for e in range(E)] if T else [0.0] * E
    mean = [sum(g[e] for g in gates) / T for e in range(E)] if T else [0.0] * E
    return combine, E * sum(m * f for m, f in zip(mean, frac, strict=True))


def _roll_dispatch(x, comm, group, in_splits=None, out_splits=None):
    """The capacity buffer's expert blocks rotated by one rank before the dispatch."""
    if x.dim() == 3 and in_splits is None and group.size > 1 and x.requires_grad:
        x = x.roll(x.shape[0] // group.size, 0)
    return _A2A(x, comm, group, in_splits, out_splits)


def _pass_dropped(x, combine, dispatch, *args):
    """A token that lost every choice comes back as its input instead of zero."""
    y = _CAPACITY(x, combine, dispatch, *args)
    return y + x * (~dispatch.any(2).any(1)).to(x.dtype)[:, None]


def _experts_on_the_dense_group(comm, wg, experts, data, dp):
    """Expert gradients reduced over every data rank instead of the expert-data-parallel group."""
    if data.size > 1:
        wg.grad = comm.all_reduce(wg.grad, data)
        flat = comm.all_reduce(torch.cat([p.grad.flatten() for p in experts]), data)
        for p, part in zip(experts, flat.split([p.numel() for p in experts]), strict=True):
            p.grad = part.view_as(p)


def _mutation(mutant: str | None, rank: int):
    if mutant == "wrong_permutation":
        return mock.patch.object(moe, "_a2a", _roll_dispatch)
    if mutant == "dropped_not_zeroed":
        return mock.patch.object(moe_run, "moe_capacity", _pass_dropped)
    if mutant == "independent_drops":  # each TP rank draws its own random routing
        return mock.patch.object(moe_run, "uniforms",
                                 lambda cfg, seed, g: _UNIFORMS(cfg, seed + 1000 * rank, g))
    if mutant == "wrong_grad_group":
        return mock.patch.object(moe_run, "_reduce_grads", _experts_on_the_dense_group)
    if mutant == "no_second_offset":
        return mock.patch.object(moe_gating, "_positions",
                                 lambda mask, before: (torch.cumsum(mask, 0) - 1, before))
    if mutant is not None:
        raise ValueError(f"unknown mutant {mutant!r}")
    return contextlib.nullcontext()


def moe_case(ctx, cfg, seed: int, variant: str, mutant: str | None = None):
    with _mutation(mutant, ctx.rank):
        return run_moe(ctx, cfg, seed, variant)


def judge_moe(world, cfg, seed: int, variant: str, mutant: str | None = None) -> list[str]:
    """Outputs, gradients, l_aux and the kept choices equal the float64 oracle's to
    rtol = atol = 1e-10 (only the order of sums differs); the ledger equals the prediction, call
    by call and group by group. Judged in float64 only: in float32 a near-tie between two gates
    may route a token differently from the float64 oracle, which is not a bug."""
    if cfg.dtype != "float64":
        raise ValueError("judge_moe compares float64 runs only")
    oracle = oracle_moe(cfg, seed)
    tol = dict(rtol=1e-10, atol=1e-10)
    problems = []
    for r, out in enumerate(world.run(moe_case, cfg, seed, variant, mutant)):
        for name, want in expected(oracle, cfg, r).items():
            got = out[name]
            same = torch.equal(got, want) if name == "kept" else \
                got.shape == want.shape and torch.allclose(got.double(), want, **tol)
            if not same:
                problems.append(f"rank {r}: {name} differs from the oracle")
        names = out["groups"]
        got = sorted((op, g, s, rc) for op, g, _, _, s, rc in out["ledger"])
        want = sorted((op, names[a], s, rc) for op, a, s, rc in
                      predicted(cfg, variant, r, oracle["kept"]))
        if got != want:
            problems.append(f"rank {r}: ledger {got} != predicted {want}")
    return problems
