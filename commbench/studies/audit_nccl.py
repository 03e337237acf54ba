"""``commbench audit SCRIPT --nccl``: a training script run on CPU, its own calls replayed under
NCCL's rules, so that what would hang on the first GPU cluster is found on a laptop.

Each rank runs the script under the watcher (:func:`commbench.studies.audit.run_script`) and also
records the groups it makes (``new_group``, with its backend) and which messages one
``batch_isend_irecv`` posted together, and the keywords it gave ``init_process_group``. Then:

* its calls become NCCL posts (:mod:`commbench.wire.posts`) and are replayed under
  :func:`commbench.wire.nccl_rules.check`, in the init mode the script asks for (``device_id``
  given: eager; else lazy) or the one named: ordering that would deadlock, a first message that
  blocks its host, collectives issued in another order, messages that do not match;
* its group creations are replayed as torch's ``ncclCommSplit`` calls
  (:func:`commbench.wire.splits.check`): groups made differently on different ranks;
* what NCCL does not have: the bitwise reductions, a receive from any source.

Every finding names the ranks, the calls and the line of the script that issued each. Not seen
from a CPU run: the host's waits on a result between calls (the record has the calls, not the
waits), so a hang that needs one is missed, never invented; tensors made on the wrong device
(a CPU run has no device to get wrong).
"""

from __future__ import annotations

import contextlib

from commbench.studies.audit import script_rank
from commbench.wire import nccl_rules, splits
from commbench.wire.ledger import Entry
from commbench.wire.posts import Post
from commbench.wire.splits import Creation

__all__ = ["findings", "run_script_nccl"]

NO_NCCL_REDOPS = ("band", "bor", "bxor")


def run_script_nccl(ctx, path: str, argv: list[str], shown: tuple[int, ...] = (0,)) -> dict:
    """On a rank: :func:`~commbench.studies.audit.run_script` with group creations, batches and
    ``init_process_group``'s keywords recorded (module docstring)."""
    # lazy: imports torch
    import torch.distributed as dist

    # lazy: imports torch
    import torch.distributed.distributed_c10d as c10d

    # lazy: imports torch
    from commbench.wire.watch import batched

    made: list[tuple[tuple[int, ...], str]] = []
    real_new, real_batch = c10d.new_group, c10d.batch_isend_irecv

    def new_group(ranks=None, timeout=None, backend=None, *args, **kwargs):
        group = tuple(sorted(ranks)) if ranks is not None else tuple(range(dist.get_world_size()))
        # a GPU job's default backend is NCCL, whatever this CPU run's is
        made.append((group, "gloo" if backend is not None and "nccl" not in str(backend).lower()
                     else "nccl"))
        return real_new(ranks, timeout, backend, *args, **kwargs)

    def batch_isend_irecv(p2p_op_list):
        with batched():
            return real_batch(p2p_op_list)

    @contextlib.contextmanager
    def watching():
        saved = (dist.new_group, dist.batch_isend_irecv)
        dist.new_group = c10d.new_group = new_group
        dist.batch_isend_irecv = c10d.batch_isend_irecv = batch_isend_irecv
        try:
            yield
        finally:
            dist.new_group, dist.batch_isend_irecv = saved
            c10d.new_group, c10d.batch_isend_irecv = real_new, real_batch

    out = script_rank(ctx, path, argv, extra=watching(), shown=shown)
    return {**out, "creations": made, "device_id": "device_id" in out["asked"]}


def _posts(entries: list[tuple]) -> list[Post]:
    out = []
    for e in map(Entry._make, entries):
        if e.op in ("send", "recv"):
            out.append(Post(e.op, e.op, tuple(e.group), e.peer, e.nbytes, e.dtype, e.count,
                            e.batch, (), 0, e.line))
        else:
            count = -1 if e.op in ("all_to_all", "all_to_allv") else e.count
            out.append(Post("coll", e.op, tuple(e.group), dtype=e.dtype, count=count,
                            where=e.line))
    return out


def findings(per_rank: list[dict], mode: str = "auto") -> tuple[str, list[str]]:
    """(the init mode checked and why, what NCCL would do wrong: one line each)."""

    if mode == "auto":
        asked = [r for r, out in enumerate(per_rank) if out["device_id"]]
        mode = "eager" if asked else "lazy"
        why = (f"eager: the script gives init_process_group a device_id (ranks {asked[:8]})"
               if asked else "lazy: the script gives init_process_group no device_id")
    else:
        why = f"{mode}: as asked (--nccl {mode})"
    problems = []
    for r, out in enumerate(per_rank):
        for e in map(Entry._make, out["entries"]):
            at = f" at {e.line}" if e.line else ""
            if e.redop in NO_NCCL_REDOPS:
                problems.append(f"NCCL has no {e.redop} reduction: rank {r}'s {e.op} on group "
                                f"{list(e.group)}{at}")
            if e.op == "recv" and e.peer < 0:
                problems.append(f"NCCL cannot receive from any source: rank {r}'s recv on "
                                f"group {list(e.group)}{at} names no source")
    problems += nccl_rules.check([_posts(out["entries"]) for out in per_rank], mode=mode)
    problems += splits.check([[Creation(g, b) for g, b in out["creations"]]
                              for out in per_rank], mode=mode)
    return why, problems
