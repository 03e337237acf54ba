"""The vocab-parallel head as a pattern: input embedding, tied LM head and cross-entropy over a
``dp x tp`` grid (Shoeybi 2019 §3).

Predicted calls per rank and step, A = b s h (b = batch / dp), e the dtype's bytes, c the
cross-entropy's (float32, float64 for float64 runs):

    embedding   all-reduce of A forward (SP: reduce-scatter of A, all-gather of A/P backward)
    LM head     all-reduce of A backward, f (SP: all-gather of A/P forward, reduce-scatter of A)
    megatron    3 all-reduces of b s, c bytes each (max, target logit, sum of exponentials)
    fused       2: the max, then [2, b, s]
    naive       an all-gather of the logits, b s V/P
    dp          one all-reduce of the embedding gradient, V/P h, on the DP group
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from commbench.names import ITEMSIZE, check_dtype
from commbench.ops import booked
from commbench.patterns.base import Broken, Call, Pattern, drawn, float32_references
from commbench.patterns.tp.layer_pattern import TOLERANCE

__all__ = ["VocabConfig", "VocabHead"]


@dataclass(frozen=True)
class VocabConfig:
    """b batch, s sequence, h hidden, V vocabulary over ``dp x tp``; SP shards the sequence of
    the hidden states between the embedding and the head."""

    batch: int = 2
    seq: int = 4
    hidden: int = 8
    vocab: int = 16
    tp: int = 1
    dp: int = 1
    sequence_parallel: bool = False
    dtype: str = "float64"

    def label(self) -> str:
        sp = " sp" if self.sequence_parallel else ""
        return f"tp{self.tp} dp{self.dp} b{self.batch} s{self.seq} h{self.hidden} V{self.vocab}{sp}"

    def as_dict(self) -> dict:
        return asdict(self)

    def validate(self, world_size: int, variant: str = "") -> None:
        for name in ("batch", "seq", "hidden", "vocab", "tp", "dp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.vocab % self.tp:
            raise ValueError(f"vocab={self.vocab}: must be a multiple of tp={self.tp}")
        if self.batch % self.dp:
            raise ValueError(f"batch={self.batch}: must be a multiple of dp={self.dp}")
        if self.sequence_parallel and self.seq % self.tp:
            raise ValueError(f"seq={self.seq}: must be a multiple of tp={self.tp} under "
                             "sequence parallelism")
        if self.tp * self.dp != world_size:
            raise ValueError(f"tp={self.tp} x dp={self.dp} = {self.tp * self.dp}: must equal the "
                             f"world size {world_size}")
        check_dtype(self.dtype, ("float64", "float32"))


def head_configs(world_size: int, dtypes=("float64", "float32")):
    """A hypothesis strategy of heads on ``world_size`` ranks."""
    return drawn(_draw, world_size, dtypes)


def _draw(draw, st, world_size: int, dtypes) -> VocabConfig:
    tp = draw(st.sampled_from([d for d in range(1, world_size + 1) if world_size % d == 0]))
    dp = world_size // tp
    return VocabConfig(batch=dp * draw(st.integers(1, 2)), seq=tp * draw(st.integers(1, 3)),
                       hidden=draw(st.integers(1, 8)), vocab=tp * draw(st.integers(1, 5)), tp=tp,
                       dp=dp, sequence_parallel=draw(st.booleans()),
                       dtype=draw(st.sampled_from(dtypes)))


class VocabHead(Pattern):
    """Vocab-parallel embedding, tied LM head and cross-entropy: Megatron's 3 all-reduces, fused
    to 2, against all-gathered logits."""

    name, markers = "vocab", ("tp",)
    variants, naive, optimized = ("naive", "megatron", "fused"), "naive", "fused"
    axes = ("tp", "dp")
    Config = VocabConfig
    tolerance = TOLERANCE
    parts_from = "tp.vocab_comms:VocabParts"
    broken = (Broken("unmasked_embedding", "megatron", {"embed": "tp.vocab_comms:unmasked_embedding"},
                     "a vocab-parallel lookup that does not zero ids outside its range",
                     lambda P: [VocabConfig(batch=2, seq=3, hidden=4, vocab=4 * P, tp=P, dtype=dt)
                                for dt in ("float64", "float32")]),)

    def grid(self, cfg: VocabConfig) -> str:
        return f"dp={cfg.dp},tp={cfg.tp}"

    def configs(self, world_size: int, variant: str):
        return head_configs(world_size, self.dtypes)

    def bench_configs(self, world_size: int) -> list[VocabConfig]:
        return [VocabConfig(batch=2, seq=s, hidden=h, vocab=V, tp=world_size, dtype="float32")
                for s, h, V in ((128, 128, 8192), (256, 256, 16384))]

    def inputs(self, cfg: VocabConfig, seed: int, device) -> dict:
        # lazy: imports torch
        from commbench.patterns.tp.vocab_comms import vocab_data

        # lazy: imports torch
        from commbench.wire.dtypes import DTYPES

        d = vocab_data(cfg, seed)
        d["embedding"] = d["embedding"].to(DTYPES[cfg.dtype])
        return {k: v.to(device) for k, v in d.items()}

    def shard(self, cfg: VocabConfig, data: dict, groups: dict, variant: str, parts) -> dict:
        tp, dp = groups["tp"], groups["dp"]
        vp, b = cfg.vocab // cfg.tp, cfg.batch // cfg.dp
        return {"ids": data["ids"][dp.index * b:(dp.index + 1) * b],
                "targets": data["targets"][dp.index * b:(dp.index + 1) * b],
                "e": data["embedding"][tp.index * vp:(tp.index + 1) * vp].clone()}

    def oracle(self, cfg: VocabConfig, seed: int) -> dict:
        # lazy: imports torch
        from commbench.patterns.tp.vocab_comms import vocab_oracle

        return vocab_oracle(cfg, seed)

    def references(self, cfg: VocabConfig, seed: int) -> list[dict]:
        # lazy: imports torch
        from commbench.patterns.tp.vocab_comms import vocab_oracle

        return float32_references(cfg, lambda dt, n: vocab_oracle(cfg, seed, dt, n))

    def expected(self, oracle: dict, cfg: VocabConfig, rank: int, variant: str) -> dict:
        at = self.coords(cfg, rank)
        t, d = at["tp"], at["dp"]
        vp, b = cfg.vocab // cfg.tp, cfg.batch // cfg.dp
        return {"loss": oracle["loss"][d * b:(d + 1) * b], "de": oracle["de"][t * vp:(t + 1) * vp]}

    def step(self, ctx, cfg: VocabConfig, local: dict, variant: str, groups: dict, parts) -> dict:
        # lazy: imports torch
        from commbench.patterns.tp.vocab_comms import (
            lm_head,
            vocab_parallel_cross_entropy,
            vocab_parallel_embedding,
        )

        comm, tp, dp, sp = ctx.comm(), groups["tp"], groups["dp"], cfg.sequence_parallel
        e = local["e"].detach().requires_grad_()
        hidden = vocab_parallel_embedding(local["ids"], e, comm, tp, sp, parts)
        logits = lm_head(hidden, e, comm, tp, sp, parts)
        with ctx.ledger.capture() as ce:  # its backward is local: grad = softmax - onehot
            loss = vocab_parallel_cross_entropy(logits, local["targets"], comm, tp, variant, parts)
        loss.sum().backward()
        grad = comm.all_reduce(e.grad, dp) if dp.size > 1 else e.grad
        return {"loss": loss.detach(), "de": grad,
                "stats": {"cross_entropy": [(x.op, x.count, x.sent) for x in ce.entries]}}

    def layout_calls(self, lay, stage: int | None) -> dict[str, list[tuple[Call, int]]]:
        """The embedding, head and loss (``lay.loss`` is the variant) per micro-batch; with
        pp > 1 the last stage's, the busiest: the head's half and the loss (the first stage's
        embedding, and Megatron's all-reduce of tied embeddings between the two, are not
        priced)."""
        if lay.loss == "none" or lay.tp < 2:
            return {}
        head = VocabConfig(batch=lay.micro_batch, seq=lay.seq // lay.cp, hidden=lay.hidden,
                           vocab=lay.vocab, tp=lay.tp, sequence_parallel=lay.sp,
                           dtype=lay.act_dtype)
        calls = [c for c in self.predicted(head, lay.loss, 0) if c.axis == "tp"]
        if lay.pp > 1:
            acts = 4 if lay.sp else 2  # embedding and head: RS+AG each (SP), or one all-reduce
            calls = calls[:acts // 2] + calls[acts:] if stage in (None, lay.pp - 1) else []
        return {"tp": [(c, lay.micro_batches) for c in calls]}

    def predicted(self, cfg: VocabConfig, variant: str, rank: int, seed=None) -> list[Call]:
        at = self.coords(cfg, rank)
        P, D, t, d = cfg.tp, cfg.dp, at["tp"], at["dp"]
        e = ITEMSIZE[cfg.dtype]
        c = 8 if cfg.dtype == "float64" else 4
        bs = cfg.batch // D * cfg.seq
        A = bs * cfg.hidden

        def call(op: str, count: int, size: int = e, axis: str = "tp") -> Call:
            n, i = (P, t) if axis == "tp" else (D, d)
            return Call(op, axis, count * size, *booked(op, n, i, count, size))

        out = []
        if P > 1:
            out += [call("reduce_scatter", A), call("all_gather", A // P)] * 2 \
                if cfg.sequence_parallel else [call("all_reduce", A)] * 2
            out += {"megatron": [call("all_reduce", bs, c)] * 3,
                    "fused": [call("all_reduce", bs, c), call("all_reduce", 2 * bs, c)],
                    "naive": [call("all_gather", bs * cfg.vocab // P)]}[variant]
        if D > 1:
            out.append(call("all_reduce", cfg.vocab // P * cfg.hidden, axis="dp"))
        return out
