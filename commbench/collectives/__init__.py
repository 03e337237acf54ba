"""Collectives and their algorithms, one :class:`~commbench.collectives.algorithm.Algorithm`
record per (collective, algorithm): ``ALGORITHMS[(op, name)]``.

``native`` is the transport's own collective (gloo's, MPI's, NCCL's): its bytes and terms are
its record's (:mod:`commbench.wire.ops`). The others are built here from send/recv, every
message through the comm layer, one family per file: ``ring``, ``doubling``
(recursive doubling, Rabenseifner), ``tree`` (binomial broadcast and reduce, the naive
all-reduce), ``alltoall`` (pairwise, Bruck), ``hierarchical`` (two-level all-reduce over a rank
grid). ``<name>_compiled``: the same all-reduce schedule as a step list, compiled onto fixed
buffers (:mod:`commbench.collectives.compiled`). ``sendrecv`` and ``pingpong`` are the
point-to-point benchmarks.
"""

from functools import partial

from commbench.collectives import alltoall, doubling, hierarchical, ring, tree
from commbench.collectives.algorithm import Algorithm
from commbench.collectives.compiled.broken import broken_of
from commbench.collectives.compiled.schedule import COMPILED, compiled_all_reduce
from commbench.collectives.compiled.steps import SCHEDULES
from commbench.names import COLLECTIVES
from commbench.wire.ops import OPS

__all__ = ["ALGORITHMS", "Algorithm", "algorithms_of"]


_RECORDS = [Algorithm(op, "native", None, OPS[op].elements, OPS[op].terms, needs=OPS[op].needs)
            for op in COLLECTIVES]
_RECORDS += [*tree.RECORDS, *ring.RECORDS, *doubling.RECORDS, *hierarchical.RECORDS,
             *alltoall.RECORDS]
ALGORITHMS: dict[tuple[str, str], Algorithm] = {(r.op, r.name): r for r in _RECORDS}
ALGORITHMS |= {  # a compiled schedule moves what its source does, in the same steps
    ("all_reduce", f"{a}_compiled"): Algorithm(
        "all_reduce", f"{a}_compiled", partial(compiled_all_reduce, algo=a),
        ALGORITHMS[("all_reduce", a)].elements, ALGORITHMS[("all_reduce", a)].terms, compiled=a,
        parts=COMPILED, broken=broken_of(a))
    for a in SCHEDULES}


def algorithms_of(op: str) -> list[str]:
    """The algorithms of ``op``, the transport's own first."""
    return [name for o, name in ALGORITHMS if o == op]
