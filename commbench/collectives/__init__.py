"""Collective algorithms built from send/recv in commbench itself, and their byte formulas.

``ALGORITHMS[(op, name)]`` is a function ``f(comm, x, group, ...)``; every message goes through the
comm layer, so the ledger books each one. One algorithm family per file: ``ring``, ``doubling``
(recursive doubling, Rabenseifner), ``tree`` (binomial broadcast and reduce, the naive all-reduce),
``alltoall`` (pairwise, Bruck), ``hierarchical`` (two-level all-reduce over a rank grid).
``<name>_compiled``: the same all-reduce schedule as a step list (``steps``), compiled onto fixed
buffers (``schedule``).
"""

from functools import partial

from commbench.collectives.alltoall import bruck_all_to_all, pairwise_all_to_all
from commbench.collectives.compiled.schedule import compiled_all_reduce
from commbench.collectives.compiled.steps import SCHEDULES
from commbench.collectives.doubling import rabenseifner_all_reduce, recursive_doubling_all_reduce
from commbench.collectives.hierarchical import hierarchical_all_reduce
from commbench.collectives.predict import predict
from commbench.collectives.ring import ring_all_gather, ring_all_reduce, ring_reduce_scatter
from commbench.collectives.tree import binomial_broadcast, binomial_reduce, naive_all_reduce

ALGORITHMS = {
    ("all_reduce", "naive"): naive_all_reduce,
    ("all_reduce", "ring"): ring_all_reduce,
    ("all_reduce", "recursive_doubling"): recursive_doubling_all_reduce,
    ("all_reduce", "rabenseifner"): rabenseifner_all_reduce,
    ("all_reduce", "hierarchical"): hierarchical_all_reduce,
    ("reduce_scatter", "ring"): ring_reduce_scatter,
    ("all_gather", "ring"): ring_all_gather,
    ("broadcast", "binomial"): binomial_broadcast,
    ("reduce", "binomial"): binomial_reduce,
    ("all_to_all", "pairwise"): pairwise_all_to_all,
    ("all_to_all", "bruck"): bruck_all_to_all,
}
ALGORITHMS |= {("all_reduce", f"{a}_compiled"): partial(compiled_all_reduce, algo=a)
               for a in SCHEDULES}

__all__ = ["ALGORITHMS", "predict"]
