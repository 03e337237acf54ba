"""PyTorch's execution trace (``ExecutionTraceObserver``, the Chakra host trace PARAM replays)
as the calls each rank must re-issue (pure).

One JSON file per rank (the rank from its name: ``...rank<N>...``); ``nodes`` in execution
order (by ``id``). Groups come from the ``## process_group:init ##`` node (a JSON list of
``{pg_name, pg_desc, ranks, group_size}``; no ranks: every rank). Calls come from:

* ``record_param_comms`` nodes (NCCL jobs): inputs ``[tensor(s), seq, [pg_name, pg_desc], peer,
  collective name, in splits, out splits, ...]`` (no leading tensor for wait and barrier);
* otherwise the ``c10d::`` ops (gloo jobs, which record no ``record_param_comms``). Their process
  group is an opaque object in the trace, so they are replayed only where the job has one group
  of more than one rank.

A tensor is written ``[tensor id, storage id, offset, elements, item size, device]`` and its
type ``Tensor(float)``, ``GenericList[Tensor(c10::BFloat16)]``, ...
"""

from __future__ import annotations

import json
import os
import re

from commbench.ops import OPS
from commbench.traces.calls import COLLECTIVE, CPP_TYPES, MAX_WORLD, TraceError
from commbench.traces.recorded import Rec
from commbench.traces.stream import LIMIT, events, open_text

__all__ = ["from_et", "is_et"]

# c10d op -> (commbench op, index of the input whose elements are booked, index of the peer):
# the records' Names.c10d
C10D = {name: (o.name, arg, peer) for o in OPS.values() for name, arg, peer in o.names.c10d}


# the schemas read: PyTorch's ExecutionTraceObserver from 1.0.3 (PARAM replays 1.0.3 and 1.1.0,
# each "-chakra.0.0.4"), and their successors of the same major version
SCHEMAS = re.compile(r"1\.(?:0\.(?:[3-9]|\d{2,})|[1-9]\d*\.\d+)(-chakra\.\d+\.\d+\.\d+)?$")
# torch 2.0's observer (1.0.1, 1.0.2: PARAM's dlrm_pytorch_et): each node's inputs a bare list,
# no process_group:init node, record_param_comms without its tensors or group: not read
OLD_SCHEMAS = re.compile(r"1\.0\.[0-2](-chakra\.\d+\.\d+\.\d+)?$")


def is_et(path: str) -> bool:
    """Whether ``path`` looks like an execution trace, plain or gzipped (its head names a
    chakra schema or nodes)."""
    try:
        with open_text(path) as f:
            head = f.read(2048)
    except (OSError, UnicodeDecodeError, EOFError):
        return False
    return '"nodes"' in head or "chakra" in head


def _elements(value) -> int:
    """Elements of a tensor or a (nested) list of tensors as the trace writes them."""
    if isinstance(value, list) and len(value) == 6 and isinstance(value[3], int) \
            and isinstance(value[5], str):
        return value[3]
    if isinstance(value, list):
        return sum(_elements(v) for v in value)
    return 0


def _dtype(kind: str, where: str) -> str:
    m = re.search(r"Tensor\(([^)]*)\)", kind)
    if not m or m.group(1) not in CPP_TYPES:
        raise TraceError(f"{where}: tensor type {kind!r} unknown; known: {', '.join(CPP_TYPES)}")
    return CPP_TYPES[m.group(1)]


def _groups(node: dict, where: str) -> dict[str, tuple[int, ...]]:
    try:
        out = {}
        for g in json.loads(node["inputs"]["values"][0]):
            size = 0 if g.get("ranks") else int(g["group_size"])
            if size > MAX_WORLD:  # listed rank by rank below
                raise TraceError(f"{where}: group {g.get('pg_name')!r} of {size} ranks: a job "
                                 f"of at most {MAX_WORLD} ranks is read")
            out[str(g["pg_name"])] = tuple(g.get("ranks") or range(size))
        return out
    except TraceError:
        raise
    except (KeyError, IndexError, TypeError, ValueError):
        raise TraceError(f"{where}: its process_group:init node cannot be read") from None


def _rank(path: str, nodes: list[dict]) -> int:
    """This trace's rank: from its content (a record_param_comms node on the default group
    records the rank in it: the global rank), else from the file's name (rank<N>)."""
    for n in nodes:
        if n.get("name") != "record_param_comms":
            continue
        vals, types = n["inputs"]["values"], n["inputs"]["types"]
        shift = 0 if types and "Tensor" in types[0] else 1
        pg = vals[2 - shift] if len(vals) > 3 - shift else None
        if isinstance(pg, list) and len(pg) == 2 and pg[1] == "default_pg" and \
                isinstance(vals[3 - shift], int):
            return int(vals[3 - shift])
    m = re.search(r"rank[_-]?(\d+)", os.path.basename(path))
    if not m and not any(_communicates(n) for n in nodes):
        raise TraceError(f"{path}: an execution trace without a communication call "
                         "(record_param_comms or c10d op): nothing to replay")
    if not m:
        raise TraceError(f"{path}: an execution trace's rank is neither in it (no call on the "
                         "default group) nor in its name (rank<N>, e.g. et_rank3.json)")
    return int(m.group(1))


def _communicates(n: dict) -> bool:
    return n.get("name") == "record_param_comms" or n.get("name") in C10D


def _node_rec(n: dict, groups: dict, where: str, params: bool) -> Rec | None:
    """The call of node ``n`` (None: not a call); ``params``: the trace has record_param_comms
    nodes, which then are the calls (the c10d ops above them would count each twice)."""
    vals, types = n["inputs"]["values"], n["inputs"]["types"]
    name = n["name"]
    if name == "record_param_comms":
        shift = 0 if types and "Tensor" in types[0] else 1
        coll = str(vals[4 - shift]).lower()
        op = COLLECTIVE.get(coll)
        if op is None or coll == "init":
            return None
        pg = vals[2 - shift]
        group = groups.get(str(pg[0] if isinstance(pg, list) else pg))
        if group is None and isinstance(pg, list) and pg[1:] == ["default_pg"] and \
                len(vals) > 9 - shift and isinstance(vals[9 - shift], int) and \
                vals[9 - shift] <= MAX_WORLD:
            group = tuple(range(vals[9 - shift]))  # no init node: the default group, the world
        if group is None:
            raise TraceError(f"{where}: node {n['id']} ({coll}): group {pg!r} is not in the "
                             "process_group:init node")
        count = _elements(vals[0]) if shift == 0 else 0
        dtype = _dtype(types[0], where) if shift == 0 else "uint8"
        peer = group[vals[3 - shift]] if op in ("send", "recv") else -1
        ins = tuple(vals[5]) if op == "all_to_all" and shift == 0 and vals[5] else ()
        outs = tuple(vals[6]) if op == "all_to_all" and shift == 0 and vals[6] else ()
        return Rec(op, group, dtype, count, ins, outs, peer)
    if name not in C10D or params:
        return None
    op, arg, peer_at = C10D[name]
    wide = {g for g in groups.values() if len(g) > 1}  # groups of one rank move nothing
    if len(wide) != 1:
        raise TraceError(f"{where}: node {n['id']} ({name}): a c10d op does not say its group "
                         f"in an execution trace and this job's groups are {sorted(wide)}; "
                         "replay its Kineto trace or its commbench audit instead")
    group = wide.pop()
    count = _elements(vals[arg]) if arg is not None else 0
    dtype = _dtype(types[arg], where) if arg is not None else "uint8"
    peer = group[vals[peer_at]] if peer_at is not None else -1
    ins = outs = ()
    if op == "all_to_all" and (vals[3] or vals[4]):  # splits in rows of the input's dim 0
        rows = n["inputs"]["shapes"][1][0]
        row = count // rows if rows else 0
        ins = tuple(int(k) * row for k in (vals[4] or [rows // len(group)] * len(group)))
        outs = tuple(int(k) * row for k in (vals[3] or [rows // len(group)] * len(group)))
    return Rec(op, group, dtype, count, ins, outs, peer)


def _under(node, taken: set, parent: dict) -> bool:
    """Whether ``node`` or one of its ancestors is a call already read. A walk stops where it
    meets a node it has seen: the root is its own parent in these traces, and a malformed one
    may hold a longer cycle."""
    seen = set()
    while node is not None and node in parent and node not in seen:
        if node in taken:
            return True
        seen.add(node)
        node = parent[node]
    return False


def from_et(paths: list[str], limit: int = LIMIT) -> tuple[int, dict[int, list[Rec]]]:
    """(world size, each rank's calls) from one execution trace per rank."""
    plan: dict[int, list[Rec]] = {}
    world = 0
    for path in paths:
        top: dict = {}
        nodes = sorted(events(path, top, key="nodes", limit=limit), key=lambda n: n.get("id", 0))
        schema = str(top.get("schema", ""))
        old = OLD_SCHEMAS.match(schema) is not None
        if old and not any(_communicates(n) for n in nodes):
            raise TraceError(f"{path}: an execution trace without a communication call "
                             "(record_param_comms or c10d op): nothing to replay")
        if not SCHEMAS.match(schema):
            why = " (torch 2.0's: no groups recorded; replay its Kineto traces)" if old else ""
            raise TraceError(f"{path}: execution trace schema {schema!r}{why}: read are 1.0.3 "
                             "and its successors of major version 1 (1.0.3-chakra.0.0.4, "
                             "1.1.0-chakra.0.0.4, ...)")
        try:
            rank = _rank(path, nodes)
        except (KeyError, IndexError, TypeError) as exc:
            raise TraceError(f"{path}: a record_param_comms node cannot be read "
                             f"({type(exc).__name__}: {exc})") from None
        if rank in plan:
            raise TraceError(f"{path}: rank {rank} is given twice")
        params = any(n.get("name") == "record_param_comms" for n in nodes)
        groups: dict[str, tuple[int, ...]] = {}
        recs: list[Rec] = []
        taken: set = set()  # ids of the call nodes read
        parent = {n.get("id"): n.get("ctrl_deps") for n in nodes}
        for n in nodes:
            if _under(n.get("ctrl_deps"), taken, parent):
                continue  # a call's own re-dispatch (a dispatch mode on): the same call again
            try:
                if "process_group:init" in n.get("name", ""):
                    groups = _groups(n, path)
                    world = max([world] + [len(g) for g in groups.values()])
                    continue
                rec = _node_rec(n, groups, path, params)
            except (KeyError, IndexError, TypeError) as exc:
                raise TraceError(f"{path}: node {n.get('id')} ({n.get('name')}) cannot be read "
                                 f"({type(exc).__name__}: {exc})") from None
            if rec is not None:
                recs.append(rec)
                taken.add(n.get("id"))
        plan[rank] = recs
    return max(world, len(plan)), plan
