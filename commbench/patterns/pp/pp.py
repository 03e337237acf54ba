"""Pipeline parallelism as a pattern: GPipe, 1F1B and interleaved 1F1B (Megatron's virtual
stages), with activation checkpointing, against the naive pipeline of one micro-batch.

Predicted calls per rank and step, per micro-batch (one for the naive pipeline), with b/m rows
of h float64: a chunk that is not the last sends its activation forward and receives the
gradient back; a chunk that is not the first receives the activation and sends the gradient
back. The bubble, measured on the ranks, stands beside (p-1)/(v*m + p-1). Contract runs are
float64 (the oracle's dtype); the layout model asks for the calls in other dtypes. The step,
its parts, the broken ones and the oracle: pp/pp_comms.py; the schedules: pp/schedule.py.
"""

from __future__ import annotations

import statistics

from commbench.names import ITEMSIZE
from commbench.patterns.base import Broken, Call, Pattern, Tolerance, drawn
from commbench.patterns.pp.configs import PPConfig
from commbench.patterns.pp.schedule import SCHEDULES, bubble_fraction
from commbench.results.trace import chrome_trace, idle_fraction

__all__ = ["Pipeline"]


def pp_configs(p: int, variant: str):
    """A hypothesis strategy of pipelines of ``p`` stages for ``variant``."""
    return drawn(_draw, p, variant)


def _draw(draw, st, p: int, variant: str) -> PPConfig:
    v = draw(st.integers(2, 3)) if variant == "interleaved" else 1
    m = p * draw(st.integers(1, 3)) if variant == "interleaved" else draw(st.integers(1, 6))
    return PPConfig(stages=p, layers=p * v * draw(st.integers(1, 2)), hidden=draw(st.integers(1, 5)),
                    batch=m * draw(st.integers(1, 2)), micro=m, virtual=v,
                    checkpoint=draw(st.booleans()))


class Pipeline(Pattern):
    """Stages on ranks; activations forward and gradients backward, point to point."""

    name, markers = "pp", ("pp",)
    variants, naive, optimized = ("naive", *SCHEDULES), "naive", "interleaved"
    axes = ("pp",)
    Config = PPConfig
    tolerance = Tolerance("float64: only the order of the sum over micro-batches differs from "
                          "the oracle's single pass.")
    parts_from = "pp.pp_comms:PPParts"
    dtypes = ("float64",)
    broken = (
        Broken("wrong_chunk_weights", "1f1b", {"chunk_layers": "pp.pp_comms:last_rank_shifted_layers"},
               "the last rank takes its layers one too late",
               lambda P: [PPConfig(stages=P, layers=2 * P, hidden=3, batch=4, micro=4)], (2, 3)),
        Broken("no_grad_accumulation", "1f1b", {"before_backward": "pp.pp_comms:no_grad_accumulation"},
               "each micro-batch's backward drops the gradients of the earlier ones",
               lambda P: [PPConfig(stages=P, layers=2 * P, hidden=3, batch=4, micro=4)], (2, 3)),
    )

    def grid(self, cfg: PPConfig) -> str:
        return f"pp={cfg.stages}"

    def configs(self, world_size: int, variant: str):
        return pp_configs(world_size, variant)

    def bench_configs(self, world_size: int) -> list[PPConfig]:
        """Stages of equal synthetic compute: 4 layers per rank, 16 ms per layer forward for
        the whole batch (32 ms backward), so that the bubble is the schedule's and not the
        machine's."""
        p = world_size
        return [PPConfig(stages=p, layers=4 * p, hidden=32, batch=4 * m, micro=m, virtual=2,
                         checkpoint=ckpt, compute_s=0.016)
                for m in (2 * p, 4 * p) for ckpt in (False, True)]

    def inputs(self, cfg: PPConfig, seed: int, device) -> dict:
        # lazy: imports torch
        from commbench.patterns.pp.pp_comms import weights_and_data

        # lazy: imports torch
        from commbench.wire.dtypes import DTYPES

        ws, x, t = weights_and_data(cfg, seed)
        dt = DTYPES[cfg.dtype]
        return {"w": [w.to(device, dt) for w in ws], "x": x.to(device, dt), "t": t.to(device, dt)}

    def oracle(self, cfg: PPConfig, seed: int) -> dict:
        # lazy: imports torch
        from commbench.patterns.pp.pp_comms import oracle_pp

        return oracle_pp(cfg, seed)

    def expected(self, oracle: dict, cfg: PPConfig, rank: int, variant: str) -> dict:
        p, v = cfg.stages, cfg.chunks(variant)
        per = cfg.layers // (p * v)
        mine = [c * per + k for c in range(rank, p * v, p) for k in range(per)]
        loss = oracle["loss"] if rank == p - 1 else oracle["loss"].new_zeros(())
        return {"loss": loss, **{f"dw{i}": oracle[f"dw{i}"] for i in mine}}

    def step(self, ctx, cfg: PPConfig, local: dict, variant: str, groups: dict, parts) -> dict:
        # lazy: imports torch
        from commbench.patterns.pp.pp_comms import pipeline

        return pipeline(ctx, cfg, variant, local, groups["pp"], parts)

    def layout_calls(self, lay, stage: int | None) -> dict[str, list[tuple[Call, int]]]:
        """1F1B's sends and receives of stage ``stage`` (None: the busiest), m micro-batches of
        the activation A/t (SP) or A."""
        if lay.pp < 2:
            return {}
        m = lay.micro_batches
        rows = lay.tokens // lay.tp if lay.sp else lay.tokens
        cfg = PPConfig(stages=lay.pp, layers=lay.pp, hidden=lay.hidden, batch=rows * m, micro=m,
                       dtype=lay.act_dtype)
        if stage is None:
            stage = max(range(lay.pp), key=lambda r: sum(
                c.sent for c in self.predicted(cfg, "1f1b", r)))
        return {"pp": [(c, 1) for c in self.predicted(cfg, "1f1b", stage)]}

    def predicted(self, cfg: PPConfig, variant: str, rank: int, seed=None) -> list[Call]:
        p, v = cfg.stages, cfg.chunks(variant)
        if p == 1:
            return []
        m = 1 if variant == "naive" else cfg.micro
        act = cfg.batch // m * cfg.hidden * ITEMSIZE[cfg.dtype]
        send, recv = Call("isend", "pp", act, act, 0), Call("recv", "pp", act, 0, act)
        out = []
        for c in range(rank, p * v, p):
            if c < p * v - 1:  # activation out, its gradient back
                out += [send, recv] * m
            if c > 0:  # activation in, its gradient out
                out += [recv, send] * m
        return out

    def metrics(self, cfg: PPConfig, variant: str, outs: list[dict]) -> dict:
        """The bubble: per iteration, the mean over ranks of 1 - compute time / the slowest
        rank's time (the pipeline ends with its last rank); the median over iterations."""
        walls = [max(ts) for ts in zip(*(o["times"] for o in outs), strict=True)]
        bubbles = [sum(1 - o["stats"][k]["busy_s"] / wall for o in outs) / len(outs)
                   for k, wall in enumerate(walls)]
        m = 1 if variant == "naive" else cfg.micro
        name = "gpipe" if variant == "naive" else variant
        return {"bubble": round(statistics.median(bubbles), 3) if bubbles else None,
                "(p-1)/(vm+p-1)": round(bubble_fraction(name, cfg.stages, m,
                                                        cfg.chunks(variant)), 3),
                "bubble in the trace": round(trace_bubble(outs), 3),
                "peak activations(B)": max(o["outputs"]["stats"]["peak_activation_bytes"]
                                           for o in outs)}


def trace_bubble(outs: list[dict]) -> float:
    """The traced step's bubble read off its Chrome trace (``--trace``): the ranks' blocking
    receives and their wait for the slowest, over the slowest rank's step."""
    trace = chrome_trace([("step", [o["timeline"] for o in outs], [o["span"] for o in outs])])
    return idle_fraction(trace, "step")
