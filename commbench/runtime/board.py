"""Debug mode's agreement among ranks of one host, through shared memory.

On a local world every rank maps one small file per rank in the world's status folder, its
*board*. Before its k-th agreed call on a group, a member writes the call's fingerprint
(:func:`commbench.runtime.debug.fingerprint`) under that group and k, then reads every other
member's until each has written its k-th; all members compare the same rows, so all raise the
same :class:`~commbench.runtime.debug.Mismatch` before the real call starts. That costs a few
memory reads where the all-gather it replaces costs a round of the transport (a millisecond and
more over gloo on two cores, a quarter of a pattern's run on a rank; docs/decisions.md). A
member that never makes the call leaves the others reading, where the world's timeout names the
pending op, as in the all-gather. Under a launcher ranks can be on other hosts: there the
all-gather stays (:meth:`commbench.wire.comm.Comm._agree`).

A rank's file is a table of :data:`ENTRIES` entries, one per group, found by linear probing on
the group's key (never removed). An entry is the key, then two rows, one for odd k and one for
even k: [k, fingerprint...]. Two rows suffice: a member cannot write k+2 on a group before every
member has written k+1, and a member writes k+1 only once it has read every row k. A row is
written fingerprint first and k last, and read k, fingerprint, k: a row read while it is being
written does not count.
"""

from __future__ import annotations

import mmap
import os
import time
import zlib

__all__ = ["ENTRIES", "Board"]

ENTRIES = 1024  # groups a rank can agree on in one world
FIELDS = 6  # fingerprint fields (commbench.runtime.debug.FIELDS)
_ROW = 1 + FIELDS  # k, fingerprint
_ENTRY = 16  # int64 words: key, two rows, padding
_BYTES = ENTRIES * _ENTRY * 8


def _key(ranks: tuple[int, ...]) -> int:
    """A group's key: never 0 (an empty entry)."""
    return (1 << 62) | (len(ranks) << 32) | zlib.crc32(",".join(map(str, ranks)).encode())


def _probe(view: memoryview, key: int) -> int:
    """The entry of ``key`` in a board, or the empty one where it would go; -1 if neither."""
    for probe in range(ENTRIES):
        slot = (key + probe) % ENTRIES
        if view[slot * _ENTRY] in (0, key):
            return slot
    return -1


class Board:
    """This rank's board in ``folder`` and its reads of the other ranks' boards there."""

    def __init__(self, folder: str, rank: int) -> None:
        self.folder, self.rank = folder, rank
        self._mine = self._map(rank, create=True)
        self._peers: dict[int, memoryview] = {rank: self._mine}
        self._calls: dict[tuple[int, ...], int] = {}  # group -> agreed calls on it so far
        self._slots: dict[int, int] = {}  # key -> this rank's entry for it
        self._keys: dict[tuple[int, ...], int] = {}  # group -> its key
        self._found: dict[tuple[int, int], int] = {}  # (rank, key) -> its entry there, once made

    def _path(self, rank: int) -> str:
        return os.path.join(self.folder, f"board{rank}")

    def _map(self, rank: int, create: bool = False) -> memoryview:
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(self._path(rank), flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, _BYTES)
            mm = mmap.mmap(fd, _BYTES)
        finally:
            os.close(fd)
        return memoryview(mm).cast("q")

    def _peer(self, rank: int) -> memoryview | None:
        view = self._peers.get(rank)
        if view is None:
            try:
                view = self._map(rank)
            except (FileNotFoundError, ValueError):  # not made yet, or not yet its full size
                return None
            self._peers[rank] = view
        return view

    def _key(self, ranks: tuple[int, ...]) -> int:
        key = self._keys.get(ranks)
        if key is None:
            key = self._keys[ranks] = _key(ranks)
        return key

    def _slot(self, key: int) -> int:
        slot = self._slots.get(key)
        if slot is None:
            slot = _probe(self._mine, key)
            if slot < 0:
                raise RuntimeError(f"debug agreement: more than {ENTRIES} groups on rank "
                                   f"{self.rank}")
            self._mine[slot * _ENTRY] = key
            self._slots[key] = slot
        return slot

    def post(self, ranks: tuple[int, ...], fp: list[int]) -> int:
        """Write this rank's fingerprint of its next agreed call on ``ranks``; its number k."""
        k = self._calls.get(ranks, 0) + 1
        self._calls[ranks] = k
        base = self._slot(self._key(ranks)) * _ENTRY + 1 + (k % 2) * _ROW
        view = self._mine
        view[base] = -1
        for j, v in enumerate(fp):
            view[base + 1 + j] = v
        view[base] = k
        return k

    def read(self, rank: int, ranks: tuple[int, ...], k: int) -> list[int] | None:
        """``rank``'s fingerprint of its k-th agreed call on ``ranks``, or None before it wrote
        it."""
        view = self._peer(rank)
        if view is None:
            return None
        key = self._key(ranks)
        slot = self._found.get((rank, key))
        if slot is None:  # an entry never moves once made: looked up until it is, then kept
            slot = _probe(view, key)
            if slot < 0 or view[slot * _ENTRY] != key:  # the rank has no entry for it yet
                return None
            self._found[(rank, key)] = slot
        base = slot * _ENTRY + 1 + (k % 2) * _ROW
        if view[base] != k:
            return None
        row = view[base + 1 : base + _ROW].tolist()
        return row if view[base] == k else None

    def rows(self, ranks: tuple[int, ...], fp: list[int]) -> list[list[int]]:
        """Post ``fp`` and return every member's row of the same call, in group order (waiting
        for each: sleeps of up to half a millisecond, so a slow member costs little CPU)."""
        k = self.post(ranks, fp)
        rows: dict[int, list[int]] = {self.rank: list(fp)}
        waited = 0
        while len(rows) < len(ranks):
            for r in ranks:
                if r not in rows and (row := self.read(r, ranks, k)) is not None:
                    rows[r] = row
            if len(rows) < len(ranks):
                waited += 1
                time.sleep(0 if waited < 8 else min(5e-4, 1e-5 * waited))
        return [rows[r] for r in ranks]
