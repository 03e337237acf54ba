"""Two-level all-reduce over a rank grid that stands for nodes: its record; the send/recv code
is :mod:`commbench.collectives.hierarchical_comms`.

With the grid ``node=N,local=L`` (L ranks per node, adjacent ranks on one node: a launched world's
own nodes when it spans several hosts of as many ranks each, else nodes of 2 that stand for
nodes on one host; ``terms`` prices nodes of 2): ring reduce-scatter
inside each node, ring all-reduce of each rank's chunk across nodes (among the ranks with the same
local index), ring all-gather inside the node. Only 1/L of the data crosses the slow inter-node
links: each rank sends 2(N-1)/N * S/L across nodes instead of 2(NL-1)/(NL) * S, which is how NCCL
runs its tree and ring across nodes and what the notes' "TP inside a node" relies on.

Shapes: x [*] -> out [*] on every rank; chunk [c_l] inside the node, c from split_sizes(S, L).
"""

from __future__ import annotations

from commbench.collectives.algorithm import Algorithm
from commbench.collectives.ring import ar_elements, rs_elements
from commbench.ops import split_sizes

__all__ = ["LOCAL", "RECORDS"]


LOCAL = 2  # ranks per node of the grid on one host, where nodes of 2 ranks stand for nodes


def _local(local: int | None) -> int:
    """Ranks per node: the launched world's own (``Context.node_size``) or nodes of 2."""
    return local or LOCAL


def _elements(n: int, i: int, count: int, local: int | None = None, **kw) -> tuple[int, int]:
    L = _local(local)
    nodes, li = n // L, i % L
    c = split_sizes(count, L)
    s1, r1 = rs_elements(L, li, count)
    s2, r2 = ar_elements(nodes, i // L, c[li])
    s3, r3 = count - c[(li + 1) % L], count - c[li]
    return s1 + s2 + s3, r1 + r2 + r3


def _terms(n: int, S: float) -> tuple[float, float, float]:
    L, N = LOCAL, n // LOCAL
    return (2 * (L - 1) + 2 * (N - 1), 2 * (L - 1) / L * S + 2 * (N - 1) / N * S / L,
            (L - 1) / L * S + (N - 1) / N * S / L)


def _needs(n: int, local: int | None = None) -> str:
    L = _local(local)
    return "" if n % L == 0 else f"needs whole nodes of {L} ranks, not a world of {n}"


RECORDS = (Algorithm(
    "all_reduce", "hierarchical", "hierarchical_comms:hierarchical_all_reduce", _elements, _terms,
    grid=lambda n, local=None: f"node={n // _local(local)},local={_local(local)}",
    needs=_needs, per_node=True,
    call=lambda fn, comm, x, grid, root, redop, splits: fn(comm, x, grid["local"], grid["node"],
                                                            op=redop)),)
