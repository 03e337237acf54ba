"""Pipeline schedules: loss and gradients equal single-process training; schedule invariants;
bytes; activation memory with and without checkpointing. (The bubble is timed in the benchmark,
`commbench run pp`, not here.)

Tolerance: float64, rtol = atol = 1e-10: only the order of the sum over micro-batches differs.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from commbench.patterns.pp import PPConfig, oracle_pp, run_pipeline
from commbench.patterns.pp_schedule import SCHEDULES, schedule
from commbench.runtime.errors import SPMDError

pytestmark = pytest.mark.pp


def judge(world, cfg: PPConfig, seed: int, mutant: str | None = None) -> list[str]:
    want = oracle_pp(cfg, seed)
    outs = world.run(run_pipeline, cfg, seed, mutant)
    p, per = cfg.stages, cfg.layers // (cfg.stages * cfg.virtual)
    problems = []
    loss = sum(o["loss"] for o in outs)
    if abs(loss - want["loss"]) > 1e-10 * (1 + abs(want["loss"])):
        problems.append(f"loss {loss} != {want['loss']}")
    for r, out in enumerate(outs):
        for c, grads in out["grads"].items():
            for k, got in enumerate(grads):
                w = want["grads"][c * per + k]
                if not torch.allclose(got, w, rtol=1e-10, atol=1e-10):
                    problems.append(f"rank {r}: chunk {c} layer {k} gradient differs")
        act = cfg.batch // cfg.micro * cfg.hidden * 8
        boundaries = 0 if p == 1 else sum(1 for c in out["grads"] if c < p * cfg.virtual - 1) + \
            sum(1 for c in out["grads"] if c > 0)
        sent = sum(e[2] for e in out["ledger"])
        if sent != boundaries * cfg.micro * act:
            problems.append(f"rank {r}: sent {sent} B, predicted {boundaries * cfg.micro * act}")
    return problems


@st.composite
def configs(draw, p: int):
    name = draw(st.sampled_from(SCHEDULES))
    v = draw(st.integers(2, 3)) if name == "interleaved" else 1
    m = p * draw(st.integers(1, 3)) if name == "interleaved" else draw(st.integers(1, 6))
    return PPConfig(stages=p, layers=p * v * draw(st.integers(1, 2)), hidden=draw(st.integers(1, 5)),
                    batch=m * draw(st.integers(1, 2)), micro=m, virtual=v, schedule=name,
                    checkpoint=draw(st.booleans()))


@pytest.mark.world(sizes=[1, 2, 3, 4])
@given(data=st.data(), seed=st.integers(0, 999))
def test_pipeline_trains_like_one_process(world, data, seed):
    assert judge(world, data.draw(configs(world.size), label="cfg"), seed) == []


@given(name=st.sampled_from(SCHEDULES), p=st.integers(1, 6), k=st.integers(1, 4),
       v=st.integers(2, 3))
def test_schedules_run_every_pass_once_in_a_valid_order(name, p, k, v):
    v = v if name == "interleaved" else 1
    m = p * k if name == "interleaved" else k
    for r in range(p):
        acts = schedule(name, p, r, m, v)
        chunks = range(r, p * v, p)
        assert sorted(acts) == sorted((a, c, j) for a in "FB" for c in chunks for j in range(m))
        assert all(acts.index(("F", c, j)) < acts.index(("B", c, j))
                   for c in chunks for j in range(m))
        alive = peak = 0
        for a, _, _ in acts:
            alive += 1 if a == "F" else -1
            peak = max(peak, alive)
        if name == "gpipe":
            assert peak == m
        elif name == "1f1b":  # the point of 1F1B: at most p - r micro-batches in flight
            assert peak == min(p - r, m)


@pytest.mark.world(sizes=[2, 4])
def test_activation_memory_gpipe_1f1b_and_checkpointing(world):
    p = world.size
    peaks = {}
    for name in ("gpipe", "1f1b"):
        for ckpt in (False, True):
            cfg = PPConfig(stages=p, layers=2 * p, hidden=8, batch=16, micro=8, schedule=name,
                           checkpoint=ckpt)
            peaks[name, ckpt] = world.run(run_pipeline, cfg, 0)[0]["peak_activation_bytes"]
    assert peaks["1f1b", False] < peaks["gpipe", False]  # rank 0: p of 8 micro-batches alive
    assert peaks["gpipe", True] < peaks["gpipe", False]  # inputs only, plus one re-materialised
    assert peaks["1f1b", True] <= peaks["1f1b", False]


@pytest.mark.world(sizes=[2])
@pytest.mark.parametrize(("bad", "rule"), [
    (dict(layers=3), "layers=3"), (dict(batch=3), "batch=3"), (dict(schedule="zigzag"), "zigzag"),
    (dict(virtual=2), "virtual=2"), (dict(schedule="interleaved", virtual=2, micro=3), "micro=3"),
    (dict(stages=3, layers=6), "stages=3")])
def test_bad_configs_are_refused(world, bad, rule):
    cfg = PPConfig(**{**dict(stages=world.size, layers=2 * world.size, batch=4, micro=2), **bad})
    with pytest.raises(SPMDError, match=rule):
        world.run(run_pipeline, cfg, 0)


@pytest.mark.world(sizes=[2, 3])
@pytest.mark.parametrize("mutant", ["wrong_chunk_weights", "no_grad_accumulation"])
def test_properties_catch_broken_variants(world, mutant):
    cfg = PPConfig(stages=world.size, layers=2 * world.size, hidden=3, batch=4, micro=4)
    assert judge(world, cfg, 1, mutant), f"{mutant} went unnoticed"
