"""The one judge: every rank's outputs and gradients against the oracle, its ledger against the
prediction, for any pattern.

Values: :class:`~commbench.patterns.base.Tolerance` (float64 runs to a fixed rtol/atol; lower
precision within ``factor`` times the spread of equally right unsharded answers). Integer and
boolean outputs (routing masks) must be equal. Calls: the ledger's booked calls, as (op, axis,
size, sent, recv), must equal the prediction as a multiset, to the byte. Posts: every rank's
record of the first step, replayed under NCCL's rules (:mod:`commbench.wire.nccl_rules`), must
neither deadlock nor issue collectives out of order.
"""

from __future__ import annotations

import torch

from commbench.patterns.base import Pattern, Tolerance, calls_diff
from commbench.verdict import Verdict
from commbench.wire import nccl_rules

__all__ = ["close", "judge"]


def close(got: torch.Tensor, want: torch.Tensor, refs: list[torch.Tensor], tol: Tolerance) -> str:
    """'' when ``got`` is as close to ``want`` as ``tol`` asks, else what is wrong."""
    if not isinstance(got, torch.Tensor):
        return f"is {type(got).__name__}, not a tensor"
    if tuple(got.shape) != tuple(want.shape):
        return f"has shape {list(got.shape)}, the oracle {list(want.shape)}"
    if not (want.is_floating_point() or want.is_complex()):
        return "" if torch.equal(got, want) else "differs (exact values)"
    if not got.numel():
        return ""
    got = got.double()
    err = (got - want).abs()
    if not torch.isfinite(got).all():
        return "is not finite"
    if not refs:
        bad = err > tol.atol + tol.rtol * want.abs()
        return f"differs by {float(err.max()):.3g}" if bad.any() else ""
    scale = max(float((r.double() - want).abs().max()) for r in refs)
    bound = tol.factor * scale + tol.floor * max(1.0, float(want.abs().max()))
    return f"differs by {float(err.max()):.3g} (bound {bound:.3g})" if err.max() > bound else ""


def judge(pattern: Pattern, cfg, variant: str, seed: int, outs: list[dict],
          oracle: dict | None = None, refs: list[dict] | None = None) -> Verdict:
    """Every problem of a run, one line each; [] when every rank is right (a :class:`Verdict`:
    a test must read it)."""
    oracle = pattern.oracle(cfg, seed) if oracle is None else oracle
    refs = pattern.references(cfg, seed) if refs is None else refs
    problems = []
    for r, out in enumerate(outs):
        ref_r = [pattern.expected(ref, cfg, r, variant) for ref in refs]
        for name, want in pattern.expected(oracle, cfg, r, variant).items():
            got = out["outputs"].get(name)
            why = "is missing" if got is None else close(got, want, [x[name] for x in ref_r],
                                                         pattern.tolerance)
            if why:
                problems.append(f"rank {r}: {name} {why}")
        diff = calls_diff(out["ledger"], pattern.predicted(cfg, variant, r, seed))
        if diff:
            problems.append(f"rank {r}: ledger != prediction: {diff}")
    if all("posts" in out for out in outs):  # what NCCL would do with the same posts
        problems += nccl_rules.check([out["posts"] for out in outs])
    return Verdict(problems, f"judge of {pattern.name}/{variant}")
