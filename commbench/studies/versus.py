"""``commbench run versus``: the transport's own all-reduce against the algorithms built here,
measured side by side.

The collectives sweep times one series at a time (every size of the transport's own call, then
every size of the next algorithm), minutes apart on a shared machine. This study answers the
collectives issue's question, "is the best algorithm built here at least as fast as the
transport's own all-reduce, at each size?", with both measured in the same minute:

* per size, ``rounds`` rounds; each round times the transport's own all-reduce and every compiled
  schedule (:mod:`commbench.collectives.compiled.schedule`) once each, in an order rotated by one every
  round, so that neither always runs first after a size change;
* each timing is the collectives sweep's (:func:`commbench.collectives.measure.measure`: barrier before every
  call, per-iteration maximum over ranks, the result checked), with ``iters_for(size, iters)``
  iterations (more below 4 MiB, OSU's practice);
* per algorithm, the median of all rounds' samples; the best algorithm is the one with the
  smallest; ``native/best`` is the ratio of medians (> 1: the algorithm built here is faster);
  its spread is the range of the same ratio taken round by round, and ``wins`` counts the rounds
  in which the best algorithm's median beat the transport's;
* over MPI the record's measurement names how the compiled schedules waited on the ranks
  (``compiled_wait``: spin or yield, :mod:`commbench.collectives.compiled.waiting`).

Shapes: each rank's vector [size / 4] float32, summed.
"""

from __future__ import annotations

import statistics

from commbench.collectives.compiled.steps import SCHEDULES
from commbench.collectives.compiled.waiting import recorded
from commbench.collectives.measure import Case, cadence, measure, placement
from commbench.results import records as res
from commbench.results.pieces import or_none, study_pieces
from commbench.studies.model import SMALL, iters_for
from commbench.studies.settings import StudySettings
from commbench.timing.loop import slowest

__all__ = ["ALGOS", "order", "versus", "versus_markdown"]

ALGOS = ["native"] + [f"{a}_compiled" for a in SCHEDULES]


def order(algos: list[str], k: int) -> list[str]:
    """Round ``k``'s order: ``algos`` rotated left by ``k``."""
    k %= len(algos)
    return algos[k:] + algos[:k]


def _time(world, transport: str, algo: str, nbytes: int, iters: int, warmup: int) -> list[float]:
    """Per-iteration max over ranks of one timing (seconds); a wrong element is an error."""
    case = Case("all_reduce", transport, algo, iters=iters, warmup=warmup, check=True)
    outs = world.run(measure, case, nbytes)
    bad = sum(o["wrong"] for o in outs)
    if bad:
        raise RuntimeError(f"all_reduce/{algo} over {transport} at {nbytes} B: {bad} wrong "
                           "elements")
    return slowest([o["times"] for o in outs])


def versus(world, transport: str, sizes: list[int], iters: int = 20, warmup: int = 5,
           rounds: int = 4, emit=print, algos: list[str] | None = None,
           pieces=None) -> list[dict]:
    """One row per size: every algorithm's median and lower decile, the best, native/best and
    its round-by-round range. ``pieces``: a :class:`~commbench.results.pieces.Pieces` keeping
    each finished size's row (and giving back an interrupted run's)."""
    algos = list(algos or ALGOS)
    if algos[0] != "native" or len(algos) < 2:
        raise ValueError(f"algos={algos}: must start with 'native' and name at least one other")
    if rounds < 1:
        raise ValueError(f"rounds={rounds}: must be >= 1")
    emit(f"#{'size':>11} {'native(us)':>11} {'best':>28} {'best(us)':>10} {'native/best':>12} "
         f"{'range':>12} {'wins':>6}")
    rows, pieces = [], or_none(pieces)
    for nbytes in sizes:
        r = pieces.get(str(nbytes))
        if r is None:
            n_it = iters_for(nbytes, iters)
            per_round: dict[str, list[list[float]]] = {a: [] for a in algos}
            for k in range(rounds):
                for algo in order(algos, k):
                    per_round[algo].append(_time(world, transport, algo, nbytes, n_it, warmup))
            r = _row(nbytes, n_it, per_round)
            pieces.put(str(nbytes), r)
        rows.append(r)
        emit(f" {nbytes:>11} {r['native_us']:>11.1f} {r['best_algo']:>28} {r['best_us']:>10.1f} "
             f"{r['native_over_best']:>12.2f} {r['ratio_lo']:>5.2f}..{r['ratio_hi']:<5.2f} "
             f"{r['wins']:>3}/{rounds}")
    return rows


def _row(nbytes: int, iters: int, per_round: dict[str, list[list[float]]]) -> dict:
    pooled = {a: [t for rnd in rs for t in rnd] for a, rs in per_round.items()}
    med = {a: statistics.median(ts) * 1e6 for a, ts in pooled.items()}
    best = min((a for a in med if a != "native"), key=med.get)
    ratios = [statistics.median(n) / statistics.median(b)
              for n, b in zip(per_round["native"], per_round[best], strict=True)]
    return {"size": nbytes, "iters": iters, "rounds": len(ratios),
            "native_us": med["native"], "best_algo": best, "best_us": med[best],
            "native_over_best": med["native"] / med[best],
            "ratio_lo": min(ratios), "ratio_hi": max(ratios),
            "wins": sum(x > 1 for x in ratios),
            "median_us": med,
            "p10_us": {a: res.percentile(ts, 10) * 1e6 for a, ts in pooled.items()}}


def versus_markdown(record: dict) -> str:
    rows = record["rows"]
    algos = list(rows[0]["median_us"]) if rows else []
    cells = [[r["size"], f"{r['native_us']:.1f}", r["best_algo"], f"{r['best_us']:.1f}",
              f"{r['native_over_best']:.2f}", f"{r['ratio_lo']:.2f}..{r['ratio_hi']:.2f}",
              f"{r['wins']}/{r['rounds']}", r["iters"] * r["rounds"]]
             + [f"{r['median_us'][a]:.1f}" for a in algos[1:]] for r in rows]
    met = sum(r["native_over_best"] >= 1 for r in rows)
    note = (f"## all_reduce over {record['transport']}: the transport's own against the fastest "
            "compiled algorithm, side by side\n\nnative/best > 1: the algorithm built here is "
            "faster (ratio of medians over all rounds); range: the same ratio round by round; "
            "wins: rounds in which the best algorithm's median beat the transport's. "
            f"At least as fast at {met} of {len(rows)} sizes.")
    return res.study_markdown(record, ["size(B)", "native(us)", "best", "best(us)",
                                       "native/best", "range", "wins", "samples each"]
                              + [f"{a}(us)" for a in algos[1:]], cells, note)


def run_versus(s: StudySettings, world, transports: list[str], sizes: list[int], launch: str,
               prints: bool, emit) -> int:
    """The ``commbench run versus`` study, per transport; writes results/versus_*."""

    n = world.size
    for transport in transports:
        emit(f"# commbench run versus: all_reduce, {n} ranks ({launch}), transport {transport}; "
             f"{s.rounds} rounds per size, order rotated each round")
        measurement = dict(cadence(1), iters=s.iters, warmup=s.warmup, rounds=s.rounds,
                           order="per size, every algorithm once per round, rotated by one each "
                                 "round",
                           iters_by_size=f"{s.iters} from {SMALL >> 20} MiB up, {s.iters} * "
                                         f"min(10, {SMALL >> 20} MiB / size) below")
        if transport == "mpi":
            measurement.update(compiled_wait=recorded(world), binding=placement(world))
        stem = s.stem("versus", transport, n)
        pieces = study_pieces(world, stem, emit, write=s.write, resume=s.resume, prints=prints,
                              sizes=sizes, **measurement)
        rows = versus(world, transport, sizes, s.iters, s.warmup, s.rounds, emit,
                      pieces=pieces)
        met = sum(r["native_over_best"] >= 1 for r in rows)
        emit(f"# best algorithm at least as fast as {transport}'s own at {met} of {len(rows)} "
             "sizes")
        if not (s.write and prints):
            continue
        record = res.header("versus", n, launch, s.machine, measurement)
        record.update(transport=transport, rows=rows)
        res.write_study(stem, record, versus_markdown, emit)
        pieces.finish()
    return 0
