"""Low-precision reductions, measured: how far each all-reduce and reduce-scatter lands from the
exact sum, whether every rank holds the same bits, whether a repeated call does.

Error unit: for element k, ``|got_k - exact_k| / (eps * sum_i |x_ik|)``, eps the dtype's machine
epsilon (2u, u the unit roundoff) and the exact sum taken in float64 of the very inputs each rank
held. A sum computed by a chain of additions of depth d, each rounded to the dtype, is within
``gamma_d = d u / (1 - d u)`` of the exact sum relative to ``sum |x|`` (Higham, *Accuracy and
Stability of Numerical Algorithms*, 4.2), i.e. ``gamma_d / eps`` in this unit. The depth is read
off each algorithm's schedule (:func:`depth`).

Accumulating in float32 (``accumulate="float32"``: the input widened, reduced, and rounded to the
dtype once at the end) bounds the error by ``u`` relative to ``|sum|`` plus ``gamma_d`` of float32:
what a gradient reduction in bf16 gains from an fp32 accumulator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from commbench.collectives import ALGORITHMS
from commbench.collectives.compiled.steps import SCHEDULES
from commbench.collectives.simulate import simulate
from commbench.ops import split_sizes
from commbench.results.records import study_markdown
from commbench.studies.settings import StudySettings, write_study

__all__ = ["ALGOS", "DISTRIBUTIONS", "NumericsCase", "bound", "depth", "draw", "judge_numerics",
           "numerics_case", "run_numerics_study"]

# op -> algorithms measured; "native" is the transport's own (its order is not documented)
ALGOS = {"all_reduce": ("native", "ring", "recursive_doubling", "rabenseifner", "naive",
                        "hierarchical"),
         "reduce_scatter": ("native", "ring")}
DISTRIBUTIONS = ("normal", "heavy", "positive", "mixed")
EPS = {"float32": torch.finfo(torch.float32).eps, "bfloat16": torch.finfo(torch.bfloat16).eps,
       "float16": torch.finfo(torch.float16).eps}


def depth(algo: str, p: int, local: int | None = None) -> int:
    """Additions on the longest chain that builds one element of the result, on ``p`` ranks.

    An algorithm with a schedule (ring, recursive doubling, Rabenseifner, naive; the ring's
    reduce-scatter is the ring's first half) is read off it, every member's steps run together
    on paper (:func:`commbench.collectives.simulate.simulate`): the ring p - 1, the butterflies
    ceil(log2 p), the naive p - 1. Hierarchical (nodes of L, ``local``, 2 by default): a ring
    inside the node, then a ring of p/L nodes. native: not documented, so any order of p - 1
    additions."""
    if p <= 1:
        return 0
    if algo in SCHEDULES:
        return simulate([SCHEDULES[algo](p, i, p) for i in range(p)], p).depth
    if algo == "hierarchical":
        L = local or 2
        return depth("ring", L) + depth("ring", p // L)
    return p - 1


def bound(algo: str, p: int, dtype: str, accumulate: str = "", local: int | None = None) -> float:
    """The most error :func:`judge` may find, in units of eps * sum |x| (module docstring)."""
    d = depth(algo, p, local)
    if accumulate == "float32" and dtype != "float32":
        u32 = EPS["float32"] / 2
        return 0.5 + (d * u32 / (1 - d * u32)) / EPS[dtype]  # one rounding to the dtype at the end
    u = EPS[dtype] / 2
    return d * u / (1 - d * u) / EPS[dtype]


def draw(dist: str, seed: int, rank: int, count: int) -> torch.Tensor:
    """Rank ``rank``'s gradient-like float64 values: normal, heavy-tailed (Student t, 2 degrees
    of freedom), all positive (|normal|), or mixed magnitudes (normal x 10^U(-4, 4))."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    x = torch.randn(count, generator=g, dtype=torch.float64, device="cpu")
    if dist == "heavy":
        chi2 = torch.randn(count, generator=g, dtype=torch.float64, device="cpu") ** 2 + \
            torch.randn(count, generator=g, dtype=torch.float64, device="cpu") ** 2
        return x / torch.sqrt(chi2 / 2)
    if dist == "positive":
        return x.abs()
    if dist == "mixed":
        return x * 10 ** (torch.rand(count, generator=g, dtype=torch.float64, device="cpu") * 8 - 4)
    if dist != "normal":
        raise ValueError(f"dist={dist!r}: must be one of {', '.join(DISTRIBUTIONS)}")
    return x


@dataclass(frozen=True)
class NumericsCase:
    op: str = "all_reduce"
    algo: str = "ring"
    dtype: str = "bfloat16"
    dist: str = "normal"
    count: int = 3360  # divides by every world size 1..8 (the transports' reduce-scatter)
    seed: int = 0
    accumulate: str = ""  # "float32": widen, reduce, round once
    transport: str = "gloo"


def numerics_case(ctx, case: NumericsCase, broken: bool = False) -> dict:
    """On every rank: its input (float64), its result twice (float64), both as bits.

    ``broken``: a schedule that adds in bfloat16 whatever the dtype (the negative test's)."""
    dt = getattr(torch, case.dtype)
    x = draw(case.dist, case.seed, ctx.rank, case.count).to(dt)
    work = x.to(torch.float32) if case.accumulate == "float32" else x
    if broken:
        work = x.to(torch.bfloat16)
    comm = ctx.comm(case.transport)
    results = []
    for _ in range(2):
        src = work.clone()
        if case.algo == "native":
            y = comm.all_reduce(src, ctx.world) if case.op == "all_reduce" else \
                comm.reduce_scatter(src, ctx.world)
        else:
            y = ALGORITHMS[(case.op, case.algo)].bind(ctx, comm, src, redop="sum")()
        results.append(y.to(dt))
    bits = [r.view(torch.int16 if r.element_size() == 2 else torch.int32) for r in results]
    return {"input": x.to(torch.float64), "result": results[0].to(torch.float64),
            "repeat_same": bool(torch.equal(bits[0], bits[1])), "bits": bits[0],
            "node_size": ctx.node_size}


def judge_numerics(case: NumericsCase, outs: list[dict]) -> dict:
    """Error against the exact float64 sum (max and median, eps * sum |x| units), the bound,
    whether ranks agree bitwise and calls repeat bitwise."""
    p = len(outs)
    xs = torch.stack([o["input"] for o in outs])
    exact, scale = xs.sum(0), xs.abs().sum(0)
    if case.op == "reduce_scatter":
        c = split_sizes(case.count, p)
        starts = [sum(c[:r]) for r in range(p)]
        parts = [(o["result"], slice(s, s + n)) for o, s, n in zip(outs, starts, c, strict=True)]
        errs = torch.cat([(got - exact[sl]).abs() / (EPS[case.dtype] * scale[sl])
                          for got, sl in parts])
        same = True  # each rank holds its own chunk
    else:
        errs = torch.stack([(o["result"] - exact).abs() / (EPS[case.dtype] * scale)
                            for o in outs]).flatten()
        same = all(torch.equal(o["bits"], outs[0]["bits"]) for o in outs)
    errs = errs[torch.isfinite(errs)]
    return {"op": case.op, "algo": case.algo, "dtype": case.dtype, "dist": case.dist,
            "accumulate": case.accumulate or case.dtype, "ranks": p,
            "max_err": float(errs.max()) if errs.numel() else 0.0,
            "median_err": float(errs.median()) if errs.numel() else 0.0,
            "bound": bound(case.algo, p, case.dtype, case.accumulate, outs[0].get("node_size")),
            "ranks_bitwise_same": same, "repeat_bitwise_same": all(o["repeat_same"] for o in outs)}


def cases(world_size: int, seed: int = 0) -> list[NumericsCase]:
    """The study's grid on one world: every op x algorithm (that this world can run) x dtype x
    distribution, low-precision dtypes also with float32 accumulation."""
    out = []
    for op, algos in ALGOS.items():
        for algo in algos:
            if algo != "native" and ALGORITHMS[(op, algo)].needs(world_size):
                continue
            for dtype in ("float32", "bfloat16", "float16"):
                for acc in ("", "float32") if dtype != "float32" else ("",):
                    out += [NumericsCase(op, algo, dtype, dist, seed=seed, accumulate=acc)
                            for dist in DISTRIBUTIONS]
    return out


def run_numerics(world, emit, seed: int = 0) -> list[dict]:
    """Measure every case of :func:`cases` on ``world``; print one line per case."""
    rows = []
    emit(f"#{'op':>14} {'algo':>18} {'dtype':>8} {'accum':>8} {'data':>8} {'max err':>8} "
         f"{'median':>7} {'bound':>6} {'ranks =':>7} {'repeat =':>8}")
    for case in cases(world.size, seed):
        row = judge_numerics(case, world.run(numerics_case, case))
        rows.append(row)
        emit(f" {row['op']:>14} {row['algo']:>18} {row['dtype']:>8} {row['accumulate']:>8} "
             f"{row['dist']:>8} {row['max_err']:>8.3f} {row['median_err']:>7.3f} "
             f"{row['bound']:>6.3f} {'yes' if row['ranks_bitwise_same'] else 'NO':>7} "
             f"{'yes' if row['repeat_bitwise_same'] else 'NO':>8}")
    return rows


def numerics_markdown(record: dict) -> str:
    note = ("Error of each result element against the exact (float64) sum of the inputs every "
            "rank held, in units of the dtype's eps times the sum of the magnitudes; `bound`: "
            "gamma_d / eps for the algorithm's summation depth d (commbench/studies/numerics.py); "
            "`accum float32`: the input widened, reduced and rounded once at the end. "
            f"{record['world_size']} ranks, {record['rows'][0]['ranks'] if record['rows'] else 0}"
            " ranks per sum, 3360 elements per rank.")
    cells = [[r["op"], r["algo"], r["dtype"], r["accumulate"], r["dist"], f"{r['max_err']:.3f}",
              f"{r['median_err']:.3f}", f"{r['bound']:.3f}",
              "yes" if r["max_err"] <= r["bound"] else "NO",
              "yes" if r["ranks_bitwise_same"] else "NO",
              "yes" if r["repeat_bitwise_same"] else "NO"] for r in record["rows"]]
    return study_markdown(record, ["op", "algorithm", "dtype", "accumulate", "data", "max err",
                                   "median err", "bound", "within", "ranks bitwise =",
                                   "repeat bitwise ="], cells, note)


def numerics_plot(record: dict, path: str) -> str | None:
    """Max error against the bound per all-reduce algorithm, one panel per dtype (worst over
    the data shapes); None without matplotlib."""
    try:
        # lazy: imports matplotlib
        import matplotlib

        matplotlib.use("Agg")
        # lazy: imports matplotlib
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in record["rows"] if r["op"] == "all_reduce"]
    dtypes = ("float32", "bfloat16", "float16")
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    for ax, dtype in zip(axes, dtypes, strict=True):
        algos = list(dict.fromkeys(r["algo"] for r in rows))
        for k, acc in enumerate((dtype, "float32") if dtype != "float32" else (dtype,)):
            worst = [max(r["max_err"] for r in rows if r["algo"] == a and r["dtype"] == dtype
                         and r["accumulate"] == acc) for a in algos]
            ax.bar([i + 0.38 * k for i in range(len(algos))], worst, width=0.38,
                   label=f"accumulate in {acc}")
        bounds = [next(r["bound"] for r in rows if r["algo"] == a and r["dtype"] == dtype
                       and r["accumulate"] == dtype) for a in algos]
        ax.scatter(range(len(algos)), bounds, marker="_", s=400, color="k", label="bound")
        ax.set_xticks(range(len(algos)), algos, rotation=30, ha="right", fontsize=8)
        ax.set_title(dtype)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("max error (eps x sum|x|)")
    fig.suptitle(f"all-reduce rounding error, {record['world_size']} ranks, worst data shape")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def run_numerics_study(s: StudySettings, world, transports, sizes, launch, prints, emit) -> int:
    """``commbench run numerics``: every all-reduce's rounding error against its bound."""

    emit(f"# commbench run numerics: {world.size} ranks ({launch}), gloo; error against the "
         "exact sum in eps x sum|x| units, the bound from each algorithm's summation depth")
    rows = run_numerics(world, emit)
    over = [r for r in rows if r["max_err"] > r["bound"]]
    emit(f"# within the bound: {len(rows) - len(over)} of {len(rows)} rows")
    write_study(s, prints, world, launch, "numerics", {"what": "rounding error, not time"},
                 rows, numerics_markdown, emit, numerics_plot)
    return 1 if over else 0
