"""Debug mode: before each collective, the members agree on what they are about to call.

Ranks that call different collectives, or one collective with different dtypes, element counts,
reduction ops, roots or groups, would hang or compute garbage. With debug on (``Comm(debug=True)``,
``COMMBENCH_DEBUG=1``; the test suite turns it on), every member first all-gathers a fingerprint of
its call over the same group (on the group's device), or over the group's side gloo group when
the transport is NCCL (``Group.side_pg``), or on a local world through shared memory
(:mod:`commbench.runtime.board`), and all of them raise the same error, naming the op and the
disagreeing ranks, before the real call starts. A member that calls nothing at all leaves
the others in the fingerprint exchange, where the world's timeout names the pending op.

The fingerprint exchange is harness traffic: it is not booked in the ledger.
"""

from __future__ import annotations

import zlib

import torch

from commbench.ops import OPS

__all__ = ["DTYPE_CODES", "OP_CODES", "agree", "fingerprint", "judge"]

# the calls members must agree on (Op.agreed), numbered in the records' order
OP_CODES = {name: k for k, name in enumerate(o.name for o in OPS.values() if o.agreed)}
DTYPE_CODES = {d: k for k, d in enumerate(
    (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
     torch.int16, torch.int32, torch.int64, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2))}
REDOPS = ("", "sum", "prod", "min", "max", "avg")
FIELDS = ("op", "dtype", "count", "redop", "root", "group")


class Mismatch(ValueError):
    """Members of a group called different collectives, or one with different arguments."""


def fingerprint(op: str, dtype: torch.dtype, count: int, redop: str, root: int,
                ranks: tuple[int, ...]) -> list[int]:
    """count -1: the op lets members pass different counts (all-to-all)."""
    group = zlib.crc32(",".join(map(str, ranks)).encode())
    return [OP_CODES[op], DTYPE_CODES.get(dtype, -1), count, REDOPS.index(redop), root, group]


def _describe(fp: list[int]) -> str:
    ops = {v: k for k, v in OP_CODES.items()}
    dts = {v: str(k).removeprefix("torch.") for k, v in DTYPE_CODES.items()}
    text = f"{ops.get(fp[0], '?')} {dts.get(fp[1], '?')}"
    if fp[2] >= 0:
        text += f"[{fp[2]}]"
    if fp[3]:
        text += f" op={REDOPS[fp[3]]}"
    if fp[0] in ops and OPS[ops[fp[0]]].rooted:
        text += f" root={fp[4]}"
    return text


def agree(backend, group, fp: list[int], device: torch.device | None = None) -> None:
    """All-gather ``fp`` over ``group`` (its tensors on ``device``, the transport's: NCCL takes
    no CPU tensor) and raise :class:`Mismatch` unless every member's matches."""
    device = device or torch.device("cpu")
    mine = torch.tensor(fp, dtype=torch.int64, device=device)
    everyone = torch.empty(group.size * len(fp), dtype=torch.int64, device=device)
    backend.all_gather(everyone, mine, group)
    judge(group, fp, everyone.view(group.size, len(fp)).tolist())


def judge(group, fp: list[int], rows: list[list[int]]) -> None:
    """Raise :class:`Mismatch` unless every member's row (in group order) is the same; every
    member, given the same rows, raises the same error."""
    if all(r == rows[0] for r in rows):
        return
    differ = [FIELDS[k] for k in range(len(fp)) if len({r[k] for r in rows}) > 1]
    calls = "; ".join(f"rank {group.ranks[i]}: {_describe(r)}" for i, r in enumerate(rows))
    raise Mismatch(f"{_describe(fp).split()[0]} on {group}: the members disagree on "
                   f"{', '.join(differ)} ({calls})")
