"""Which ranks share a host: the node layout a launched world runs on.

Built from every rank's host name (gathered by the caller), so it is pure and tested from lists.
A node is a host name; its ranks are the node-local group (shared memory between them), and the
ranks with the same local index on every node form the cross-node groups, the two levels of the
hierarchical all-reduce, which runs on them when :meth:`NodeLayout.node_size` gives a size
(``Context.node_size``).
"""

from __future__ import annotations

from dataclasses import dataclass

from commbench.rankset import ranks_text

__all__ = ["NodeLayout"]


@dataclass(frozen=True)
class NodeLayout:
    hosts: tuple[str, ...]  # the host of each rank, by rank

    @property
    def nodes(self) -> dict[str, tuple[int, ...]]:
        """Host -> its ranks, hosts in the order of their first rank."""
        out: dict[str, list[int]] = {}
        for rank, host in enumerate(self.hosts):
            out.setdefault(host, []).append(rank)
        return {h: tuple(r) for h, r in out.items()}

    @property
    def per_node(self) -> int | None:
        """Ranks per node when every node has as many, else None."""
        counts = {len(r) for r in self.nodes.values()}
        return counts.pop() if len(counts) == 1 else None

    @property
    def contiguous(self) -> bool:
        """Each node's ranks are adjacent (the launcher filled node by node)."""
        return all(r == tuple(range(r[0], r[0] + len(r))) for r in self.nodes.values())

    def local_groups(self) -> list[tuple[int, ...]]:
        return list(self.nodes.values())

    def cross_groups(self) -> list[tuple[int, ...]]:
        """The ranks with local index i on every node, for each i (uniform layouts only)."""
        if self.per_node is None:
            raise ValueError(f"nodes of unequal size ({self.describe()}): no cross-node groups")
        ranks = list(self.nodes.values())
        return [tuple(r[i] for r in ranks) for i in range(self.per_node)]

    def node_size(self) -> int | None:
        """Ranks per node for algorithms that follow nodes: when the world spans two or more
        hosts of as many adjacent ranks each; None on one host or an irregular layout."""
        if len(self.nodes) < 2 or not self.contiguous:
            return None
        return self.per_node

    def describe(self) -> str:
        def span(r: tuple[int, ...]) -> str:
            adjacent = r == tuple(range(r[0], r[0] + len(r)))
            return f"{r[0]}-{r[-1]}" if adjacent and len(r) > 1 else ranks_text(r)

        shape = (f"{len(self.nodes)} x {self.per_node}" if self.per_node
                 else f"{len(self.nodes)} of unequal size")
        return f"{shape} ({'; '.join(f'{h}: {span(r)}' for h, r in self.nodes.items())})"
