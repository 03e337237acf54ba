"""Collectives and their algorithms, one :class:`~commbench.collectives.algorithm.Algorithm`
record per (collective, algorithm): ``ALGORITHMS[(op, name)]``.

``native`` is the transport's own collective (gloo's, MPI's, NCCL's): its bytes and terms are
its record's (:mod:`commbench.ops`). The others are built here from send/recv, every
message through the comm layer, one family per file: ``ring``, ``doubling``
(recursive doubling, Rabenseifner), ``tree`` (binomial broadcast and reduce, the naive
all-reduce), ``alltoall`` (pairwise, Bruck), ``hierarchical`` (two-level all-reduce over a rank
grid). ``<name>_compiled``: the same all-reduce schedule as a step list, compiled onto fixed
buffers (:mod:`commbench.collectives.compiled`). ``sendrecv`` and ``pingpong`` are the
point-to-point benchmarks.

Each family's records (bytes, terms, step list, broken variants) are in ``<family>.py`` and
import no torch; its send/recv code is in ``<family>_comms.py``, named by the records and
imported when an algorithm runs.
"""

from commbench.collectives import alltoall, doubling, hierarchical, ring, tree
from commbench.collectives.algorithm import Algorithm
from commbench.collectives.compiled.steps import BROKEN, CHUNKED
from commbench.names import COLLECTIVES
from commbench.ops import OPS

__all__ = ["ALGORITHMS", "Algorithm", "algorithms_of"]


_RECORDS = [Algorithm(op, "native", None, OPS[op].elements, OPS[op].terms, needs=OPS[op].needs)
            for op in COLLECTIVES]
_RECORDS += [*tree.RECORDS, *ring.RECORDS, *doubling.RECORDS, *hierarchical.RECORDS,
             *alltoall.RECORDS]
ALGORITHMS: dict[tuple[str, str], Algorithm] = {(r.op, r.name): r for r in _RECORDS}


def compiled_record(source: Algorithm) -> Algorithm:
    """The record of ``source``'s schedule compiled: it moves what its source does, in the same
    steps; its broken variants are the engine's (and cut chunks, where the source cuts blocks)."""
    chunked = source.name in ("ring", "rabenseifner")
    return Algorithm(source.op, f"{source.name}_compiled",
                     "compiled.schedule:compiled_all_reduce", source.elements, source.terms,
                     compiled=source.name, parts="compiled.schedule:COMPILED",
                     broken=BROKEN + ((CHUNKED,) if chunked else ()))


ALGORITHMS |= {(r.op, r.name): r for r in
               (compiled_record(s) for s in _RECORDS if s.steps is not None)}


def algorithms_of(op: str) -> list[str]:
    """The algorithms of ``op``, the transport's own first."""
    return [name for o, name in ALGORITHMS if o == op]
