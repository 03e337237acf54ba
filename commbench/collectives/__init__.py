"""Collectives and their algorithms, one :class:`~commbench.collectives.algorithm.Algorithm`
record per (collective, algorithm): ``ALGORITHMS[(op, name)]``.

``native`` is the transport's own collective (gloo's, MPI's, NCCL's), booked at the volume of
the bandwidth-optimal schedule (:mod:`commbench.wire.volume`). The others are built here from
send/recv, every message through the comm layer, one family per file: ``ring``, ``doubling``
(recursive doubling, Rabenseifner), ``tree`` (binomial broadcast and reduce, the naive
all-reduce), ``alltoall`` (pairwise, Bruck), ``hierarchical`` (two-level all-reduce over a rank
grid). ``<name>_compiled``: the same all-reduce schedule as a step list, compiled onto fixed
buffers (:mod:`commbench.collectives.compiled`). ``sendrecv`` and ``pingpong`` are the
point-to-point benchmarks.
"""

from functools import partial

from commbench.collectives import alltoall, doubling, hierarchical, ring, tree
from commbench.collectives.algorithm import Algorithm, lg
from commbench.collectives.compiled.schedule import compiled_all_reduce
from commbench.collectives.compiled.steps import SCHEDULES
from commbench.wire.volume import booked

__all__ = ["ALGORITHMS", "Algorithm", "algorithms_of"]


def _native(op: str):
    def elements(n: int, i: int, count: int, **kw) -> tuple[int, int]:
        return booked(op, n, i, count, 1, **kw)
    return elements


def _p2p(n: int, i: int, count: int, **kw) -> tuple[int, int]:  # a ring exchange: one each way
    return (count, count) if n > 1 else (0, 0)


def _pingpong(n: int, i: int, count: int, **kw) -> tuple[int, int]:  # members 0 and 1 bounce
    return (count, count) if i in (0, 1) else (0, 0)


# bandwidth-optimal schedules at log latency (what MPICH and gloo use): steps, sent, reduced
_NATIVE_TERMS = {
    "all_reduce": lambda n, S: (2 * lg(n), 2 * (n - 1) / n * S, (n - 1) / n * S),
    "all_gather": lambda n, S: (lg(n), (n - 1) / n * S, 0.0),
    "reduce_scatter": lambda n, S: (lg(n), (n - 1) / n * S, (n - 1) / n * S),
    "all_to_all": lambda n, S: (n - 1, (n - 1) / n * S, 0.0),
    "broadcast": lambda n, S: (lg(n), lg(n) * S, 0.0),
    "reduce": lambda n, S: (lg(n), lg(n) * S, lg(n) * S),
    "gather": lambda n, S: (lg(n), (n - 1) / n * S, 0.0),
    "scatter": lambda n, S: (lg(n), (n - 1) / n * S, 0.0),
}
_RECORDS = [Algorithm(op, "native", None, _native(op), terms) for op, terms in _NATIVE_TERMS.items()]
_RECORDS += [
    Algorithm("sendrecv", "native", None, _p2p, lambda n, S: (1, S, 0.0)),
    Algorithm("pingpong", "native", None, _pingpong, lambda n, S: (1, S, 0.0),
              needs=lambda n: "" if n >= 2 else "needs 2 ranks"),
]
_RECORDS += [*tree.RECORDS, *ring.RECORDS, *doubling.RECORDS, *hierarchical.RECORDS,
             *alltoall.RECORDS]
ALGORITHMS: dict[tuple[str, str], Algorithm] = {(r.op, r.name): r for r in _RECORDS}
ALGORITHMS |= {  # a compiled schedule moves what its source does, in the same steps
    ("all_reduce", f"{a}_compiled"): Algorithm(
        "all_reduce", f"{a}_compiled", partial(compiled_all_reduce, algo=a),
        ALGORITHMS[("all_reduce", a)].elements, ALGORITHMS[("all_reduce", a)].terms, compiled=a)
    for a in SCHEDULES}


def algorithms_of(op: str) -> list[str]:
    """The algorithms of ``op``, the transport's own first."""
    return [name for o, name in ALGORITHMS if o == op]
