"""What a rank posts to the wire, in order: the record that NCCL's rules are checked against.

The comm layer (:class:`~commbench.wire.comm.Comm`) appends a :class:`Post` for every collective
and every point-to-point message it hands a transport, when a :class:`Posts` is attached
(``comm.posts``; :func:`recording` attaches one to every comm of a context). The record is the
same on every transport: it says what the code asks of the wire, so a run over gloo on a CPU
records what the same code would post to NCCL on a GPU, and
:func:`commbench.wire.nccl_rules.check` replays every rank's record under NCCL's semantics.

A post carries its communicator (the group's global ranks), its peer (a global rank) and bytes
for point-to-point, its op, dtype and count for a collective, the group call it belongs to
(``batch``: messages posted together, NCCL's ``ncclGroupStart/End``, torch's
``batch_isend_irecv``; -1 for a message posted alone) and ``after``: the posts this rank had
waited for before posting it (on a GPU, the NCCL stream of a new call waits for the compute
stream, which waited for those).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["MODES", "Post", "Posts", "recording", "stream_of"]


@dataclass(frozen=True, slots=True)
class Post:
    kind: str  # "coll", "send" or "recv"
    op: str  # the collective (root included, "broadcast@1"), or "send" / "recv"
    comm: tuple[int, ...]  # the group's global ranks: one NCCL communicator
    peer: int = -1  # global rank of the other end (point-to-point)
    nbytes: int = 0
    dtype: str = ""
    count: int = -1  # elements; -1 where members may pass different counts (all-to-all)
    batch: int = -1  # posts of one group call share it; -1: posted alone
    after: tuple[int, ...] = ()  # posts of this rank waited for before this one was posted
    tag: int = 0  # point-to-point: the tag gloo and MPI match by; NCCL ignores it
    where: str = ""  # the line that issued it (an audited script's "file.py:LINE"), if known


MODES = ("eager", "lazy")


def stream_of(rank: int, p: Post, mode: str = "lazy") -> tuple:
    """The NCCL communicator (and so the stream) a post runs on: the group's own for collectives
    and grouped messages; for a message posted alone, under lazy initialisation torch's lazily
    made communicator of the pair (ProcessGroupNCCL keys it by the two ranks), under eager
    initialisation (``device_id`` given to ``init_process_group``: torch 2.3 and later) the
    group's own communicator too."""
    if p.kind == "coll" or p.batch >= 0 or mode == "eager":
        return ("group", p.comm)
    return ("pair", p.comm, min(rank, p.peer), max(rank, p.peer))


class Posts:
    """One rank's record (module docstring)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.items: list[Post] = []
        self._batch = -1
        self._batches = 0
        self._waited: dict[tuple, int] = {}  # stream -> the latest post waited for on it

    def post(self, kind: str, op: str, comm: tuple[int, ...], *, peer: int = -1, nbytes: int = 0,
             dtype: str = "", count: int = -1, tag: int = 0) -> int:
        """Append one post; returns its index (for :meth:`wait`)."""
        if kind not in ("coll", "send", "recv"):
            raise ValueError(f"post kind {kind!r}: must be coll, send or recv")
        if kind != "coll" and peer not in comm:
            raise ValueError(f"{kind} to rank {peer}: not in the communicator {list(comm)}")
        after = tuple(sorted(self._waited.values()))
        self.items.append(Post(kind, op, comm, peer, nbytes, dtype, count, self._batch, after,
                               tag))
        return len(self.items) - 1

    def wait(self, index: int) -> None:
        """This rank waited for post ``index``: later posts start after it (and after every
        earlier post of its stream, which runs in order)."""
        key = stream_of(self.rank, self.items[index])
        self._waited[key] = max(self._waited.get(key, -1), index)

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """The posts made inside are one group call (nested groups are one, as NCCL's are)."""
        if self._batch >= 0:
            yield
            return
        self._batch, self._batches = self._batches, self._batches + 1
        try:
            yield
        finally:
            self._batch = -1

    def clear(self) -> None:
        self.items.clear()
        self._waited.clear()
        self._batch, self._batches = -1, 0

    def export(self) -> list[tuple]:
        """Plain tuples (picklable, for the driver): ``Post(*t)`` rebuilds each."""
        return [(p.kind, p.op, p.comm, p.peer, p.nbytes, p.dtype, p.count, p.batch, p.after,
                 p.tag) for p in self.items]


@contextlib.contextmanager
def recording(ctx) -> Iterator[Posts]:
    """Record every post of ``ctx``'s comms (every transport) while inside; yields the record."""
    rec = Posts(ctx.rank)
    comms = [ctx.comm(t) for t in ctx.transports]
    before = [c.posts for c in comms]
    for c in comms:
        c.posts = rec
    try:
        yield rec
    finally:
        for c, b in zip(comms, before):
            c.posts = b
