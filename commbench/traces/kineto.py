"""Read one rank's PyTorch-profiler (Kineto) trace in one pass, with bounded memory (pure).

The file (``.json`` or gzipped) is parsed incrementally: the top-level object key by key, and
``traceEvents`` one event at a time, so that a trace of several hundred MB never sits in memory
as one document. What is kept: the communication calls (:class:`commbench.traces.calls.Call`),
the union of the computation kernels' intervals (two float arrays, merged as they are read),
the ``ProfilerStep#N`` annotations and ``distributedInfo``.

Where the trace has NCCL kernels, the calls are the kernels (their device time; arguments from
the kernel, or from the ``record_param_comms`` op it shares an ``External id`` with); otherwise
the ``record_param_comms`` CPU ops (gloo jobs, and the audit's own traces). A collective without
a ``Seq`` is numbered in its group in start order.

Before torch 2.1 ``record_param_comms`` carries no sizes and no group: the process group's own
profiler op around it (``nccl:all_reduce``, ``gloo:broadcast``: :data:`~commbench.traces.calls.
PROFILER`) holds the input's dims and C++ type, and the call is on the world (no group was
recorded; the world of ``distributedInfo``). A kernel reaches its op through its
``correlation``: the runtime call that launched it (``cudaLaunchKernel``, ``hipLaunchKernel``)
on some thread, and the innermost profiler op on that thread that contains the launch.

A trace with no ``record_param_comms`` at all has its calls in those profiler ops too (gloo of
releases that record none). Kernels of other libraries (DeepEP, custom all-reduces, torch's
SymmetricMemory: :data:`~commbench.traces.calls.LIBRARIES`) are communication, not computation.
An NCCL kernel with no op of its own is one launched before the window, or one replayed from a
CUDA graph (its graph launch's correlation), counted in the step of that launch.

Algorithm and protocol are taken from a kernel's name only where the name is that collective's
own kernel (:attr:`commbench.ops.Names.kernel`): several NCCL versions run every collective as
``ncclKernel_SendRecv_RING_SIMPLE``, whose words then say nothing (``unknown``); NCCL runs
point-to-point with no algorithm (``""``).
"""

from __future__ import annotations

import json
import math
import os
import sys
from array import array
from dataclasses import dataclass, field, replace
from functools import lru_cache

from commbench.ops import OPS, bufferless
from commbench.traces import stream
from commbench.traces.calls import (
    CPP_TYPES,
    DTYPES,
    MAX_WORLD,
    P2P,
    PROFILER,
    SYMM_MEM,
    UNSIZED,
    Call,
    TraceError,
    kernel_choice,
    kernel_word,
    library_kernel,
    library_op,
    library_start,
    op_of,
    ranks_of,
    symm_mem_op,
)
from commbench.traces.intervals import OnlineUnion
from commbench.traces.stream import HEAD, REST, whole

UNKNOWN = "unknown"  # the op of an unlinked kernel whose name states none
NO_KERNEL = "no-kernel"  # the source of a call whose CPU op no NCCL kernel in the trace ran
LIBRARY = "library-kernel"  # the source of another library's communication kernel (DeepEP's)
GRAPHED = "kernel-graph"  # the source of an NCCL kernel replayed from a CUDA or HIP graph
# the runtime's and driver's graph launches, as CUPTI and roctracer name them: every kernel a
# replay runs carries the launch's correlation and no op's External id
_GRAPH_LAUNCH = ("cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch")

__all__ = ["GRAPHED", "LIBRARY", "NO_KERNEL", "RankTrace", "read"]

_ITEMSIZE = dict(DTYPES.values())  # commbench's dtype -> bytes
KERNEL = ("kernel", "Kernel")  # a GPU kernel's category, as Kineto writes it (old and new)


def _wanted(texts: list[str]) -> list:
    """Whether each event's text may be one :func:`read` needs: a kernel, a step, a collective's
    op (``record_param_comms``, the process groups' own ``nccl:*`` and ``gloo:*``, torch
    SymmetricMemory's ``symm_mem::*``), a graph's launch. Any other event is skipped undecoded
    (:func:`commbench.traces.stream.events`). A text holding an escape (``\\u`` may spell any
    name) is decoded. A kernel's text is marked :data:`~commbench.traces.stream.HEAD` unless
    it names NCCL: a computation kernel needs only its time, decoded from the keys before its
    arguments (Kineto writes ``args`` last), and any other kernel is decoded whole as it is
    told apart (:func:`read`). The cheap tests first: one character's search runs far faster
    than a word's, so a rare character guards its word."""
    return [(HEAD if "\\" not in t and "nccl" not in t else True)
            if '"kernel"' in t or '"Kernel"' in t else
            "record_param_comms" in t or "\\" in t or ("#" in t and "ProfilerStep#" in t) or
            ("G" in t and "GraphLaunch" in t) or "nccl:" in t or "gloo:" in t or
            "symm_mem::" in t for t in texts]


@dataclass
class RankTrace:
    path: str
    rank: int
    world_size: int
    backend: str = ""
    nccl_version: str = ""
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)  # pg_name -> ranks
    devices: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    # the computation kernels' intervals: once read, their union (sorted, merged), made in the
    # worker that reads the rank rather than in the process that gathers every rank's
    compute_ts: array = field(default_factory=lambda: array("d"))
    compute_end: array = field(default_factory=lambda: array("d"))
    steps: list[tuple[int, float, float]] = field(default_factory=list)  # (N, start, end)
    unlinked: int = 0  # NCCL kernels whose launch the trace does not hold
    graphed: int = 0  # NCCL kernels replayed from a CUDA graph: their calls ran at its capture
    library: dict[str, int] = field(default_factory=dict)  # other libraries' kernels: how many
    no_kernel: int = 0  # calls whose collective made no NCCL kernel in the trace (NO_KERNEL)
    unsized: int = 0  # calls whose sizes the trace does not hold (Call.sized false)
    world_stated: bool = True  # False: no distributedInfo.world_size, the world inferred


def _static(e: dict, args: dict, where: str, ranks: tuple[int, ...] | None, groups: dict,
            same: dict[int, int]) -> tuple:
    """What a ``record_param_comms`` op's or a kernel's call takes from its arguments alone:
    (op, name, ranks, group name, group description, dtype, bytes per element, elements in,
    elements out, in splits, out splits, peer). ``same``: the element counts met so far, each
    kept once (a job moves a few sizes many times; a kernel and its op each carry them)."""
    name = sys.intern(str(args.get("Collective name", "")))
    op = op_of(name)
    try:
        n_in, n_out = int(args["In msg nelems"]), int(args["Out msg nelems"])
        n_in, n_out = same.setdefault(n_in, n_in), same.setdefault(n_out, n_out)
    except (KeyError, TypeError, ValueError):
        raise TraceError(f"{where}: {name or e.get('name')} at ts {e.get('ts')}: its sizes "
                         "cannot be read (In msg nelems / Out msg nelems)") from None
    dtype, itemsize = DTYPES.get(str(args.get("dtype", "")), (str(args.get("dtype", "")), 0))
    if itemsize == 0 and not bufferless(op):
        raise TraceError(f"{where}: {name} at ts {e.get('ts')}: dtype {args.get('dtype')!r} "
                         f"unknown; known: {', '.join(DTYPES)}")
    pg = sys.intern(str(args.get("Process Group Name", "")))
    if ranks is not None:
        pass
    elif pg in groups:
        ranks = groups[pg]
    else:
        raise TraceError(f"{where}: {name} at ts {e.get('ts')}: no Process Group Ranks and "
                         f"group {pg!r} is not in distributedInfo.pg_config")
    splits = [_splits(args.get(k), where, name) for k in ("In split size", "Out split size")]
    peer = -1
    if op in P2P and isinstance(args.get("Rank"), int) and 0 <= args["Rank"] < len(ranks):
        peer = ranks[args["Rank"]]  # the peer, group-local in torch's record
    return (op, name, ranks, pg, sys.intern(str(args.get("Process Group Description", ""))),
            dtype, itemsize, n_in, n_out, splits[0], splits[1], peer)


def _splits(raw, where: str, name: str) -> tuple[int, ...]:
    """A split list, written as a list or as its text (``"[2, 2]"``, ``"[]"``)."""
    if raw in (None, ""):
        return ()
    try:
        vals = json.loads(raw) if isinstance(raw, str) else raw
        return tuple(int(x) for x in vals)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: {name}: split sizes {raw!r} cannot be read") from None


def read(path: str, progress: bool = True, limit: int = stream.LIMIT, world: int = 0
         ) -> RankTrace:
    """One rank's trace (TraceError naming the file on bad input). Each call is made into a
    :class:`Call` as it is read (its arguments dropped), so memory grows with the calls kept,
    not with the file. ``world``: the job's world size where the trace does not state it
    (``distributedInfo.world_size``; a torch < 2.1 trace's calls are on the world); 0: none
    given."""
    top: dict = {}
    out = RankTrace(path, -1, 0)
    make = _Maker(path)
    kernels: list[Call] = []
    pending: list[tuple[dict, tuple[str, str]]] = []  # NCCL kernels whose op holds the args
    cpu: list[Call] = []
    by_id: dict = {}  # External id -> the record_param_comms call, to link kernels to
    later: list[tuple[dict, dict, tuple[str, str] | None]] = []  # calls naming only their group
    prof: list[tuple[dict, dict]] = []  # the process groups' profiler ops (torch < 2.1's sizes)
    own: list[tuple[Call, object]] = []  # kernels with their call's args, and its External id
    own_args = 0  # kernels with their call's args: each links to its op only by External id
    bare_ops = 0  # record_param_comms without sizes: torch < 2.1
    compute = OnlineUnion()  # the computation kernels' intervals, merged as they come
    others: list[Call] = []  # communication kernels of other libraries (library_kernel)
    symm: dict = {}  # External id -> a torch SymmetricMemory op's (name, args): its kernel's size
    symm_kernels: list[tuple[int, object]] = []  # (index in others, External id) of its kernels
    graph_at: dict = {}  # a graph launch's correlation -> its start: the step of its replay
    say = stream.progress_line(path) if progress and os.path.getsize(path) > \
        stream.PROGRESS_BYTES else None
    for e in stream.events(path, top, say, limit=limit, wanted=_wanted):
        if REST in e and (e.get("cat") not in KERNEL or "ts" not in e or "ph" not in e):
            e = whole(e, path)  # decoded up to its arguments: enough for a computation kernel only
        if e.get("ph") != "X":
            continue
        name, cat = str(e.get("name", "")), str(e.get("cat", ""))
        if cat in KERNEL:
            choice = kernel_choice(name) if name.startswith("nccl") else None
            # a library's kernel is in its namespace: a name without one is computation at once
            lib = library_kernel(name) if choice is None and "::" in name and \
                library_start(name) else None
            if REST in e and (choice is not None or lib is not None):
                e = whole(e, path)  # communication: its arguments are read
            if lib is not None:  # communication, though not NCCL's
                if lib[0] == SYMM_MEM and (e.get("args") or {}).get("External id") is not None:
                    symm_kernels.append((len(others), e["args"]["External id"]))
                others.append(_library(e, lib, path))
                out.library[lib[0]] = out.library.get(lib[0], 0) + 1
            elif choice is None:
                try:
                    ts = float(e["ts"])
                    compute.add(ts, ts + float(e.get("dur", 0.0)))
                except (KeyError, TypeError, ValueError):
                    raise TraceError(f"{path}: kernel {name[:60]}: no time (ts, dur)") from None
            elif "Collective name" in (e.get("args") or {}):
                own_args += 1
                c = make.call(e, e["args"], choice)
                if c is None:
                    later.append((e, e["args"], choice))
                else:
                    kernels.append(c)
                    if e["args"].get("External id") is not None:
                        own.append((c, e["args"]["External id"]))
            else:
                pending.append((_slim(e), choice))
        elif name in PROFILER and cat != "gpu_user_annotation":  # the host's op, not its GPU span
            args = e.get("args") or {}
            prof.append(({k: e.get(k) for k in ("name", "ts", "dur", "tid")},
                          {k: args.get(k) for k in ("Input Dims", "Input type")}))
        elif name == "record_param_comms":
            args = e.get("args") or {}
            if "In msg nelems" not in args and "Collective name" not in args:
                bare_ops += 1  # its sizes are on the profiler op it contains (torch < 2.1)
                continue
            if args.get("Collective name") == "wait":  # a Work's wait: no call of its own
                continue
            c = make.call(e, args, None)
            if c is None:
                later.append((e, args, None))
            else:
                cpu.append(c)
                if args.get("External id") is not None:
                    by_id[args["External id"]] = c
        elif name.startswith("symm_mem::") and cat != "gpu_user_annotation" and symm_mem_op(name):
            args = e.get("args") or {}
            if args.get("External id") is not None:
                symm[args["External id"]] = (name, args)
        elif name.startswith(_GRAPH_LAUNCH):
            corr = (e.get("args") or {}).get("correlation")
            if type(corr) is int and isinstance(e.get("ts"), int | float):
                graph_at[corr] = float(e["ts"])
        elif name.startswith("ProfilerStep#") and cat in ("user_annotation", "cpu_op", ""):
            try:
                out.steps.append((int(name.split("#", 1)[1]), float(e["ts"]),
                                  float(e["ts"]) + float(e.get("dur", 0.0))))
            except (KeyError, TypeError, ValueError):
                raise TraceError(f"{path}: {name}: not a step annotation with a time") from None
    _info(out, top, path)
    if not out.world_size and world > 0:  # the user's word for it (analyze --world)
        if world > MAX_WORLD:
            raise TraceError(f"--world {world}: a job of at most {MAX_WORLD} ranks is read")
        out.world_size, out.world_stated = world, False
    make.groups = out.groups
    for e, args, choice in later:  # their ranks are in distributedInfo, read last
        c = make.call(e, args, choice, needed=True)
        if choice is not None:
            kernels.append(c)
            if args.get("External id") is not None:
                own.append((c, args["External id"]))
        else:
            cpu.append(c)
            if args.get("External id") is not None:
                by_id[args["External id"]] = c
    if not cpu and (bare_ops or (prof and not kernels)):  # the calls are the profiler ops
        cpu, inner = _profiled(prof, out, path, bare_ops > 0)
        found = _launches(path, {e["args"].get("correlation") for e, _ in pending}, limit)
    else:
        inner, found = None, {}
    ran: set[int] = set()  # the CPU calls that a kernel in the trace ran
    for c, ext in own:  # the step is the CPU op's: the GPU may run steps behind
        if ext in by_id:
            c.host_ts = by_id[ext].ts
            ran.add(id(by_id[ext]))
    for e, choice in pending:
        base = by_id.get(e["args"].get("External id"))
        if base is None and inner is not None:  # linked through its launch
            base = inner(found.get(e["args"].get("correlation")))
        if base is not None:
            ran.add(id(base))
            algo, proto = _stated(base.op, e["name"], choice)
            kernels.append(replace(base, ts=float(e["ts"]), dur=float(e.get("dur") or 0.0),
                                   stream=str(e.get("tid", "")), source="kernel", algo=algo,
                                   proto=proto, host_ts=base.ts))
        elif type(corr := e["args"].get("correlation")) is int and corr in graph_at:
            # replayed from a graph: its op ran at capture, the replay in the launch's step
            kernels.append(replace(_unlinked(e, choice), source=GRAPHED,
                                   group_desc="replayed from a CUDA graph (its op ran at capture)",
                                   host_ts=graph_at[corr]))
            out.graphed += 1
        else:  # launched before the profiler's window opened: still communication
            kernels.append(_unlinked(e, choice))
            out.unlinked += 1
    claimed: set[int] = set()  # CPU calls that a SymmetricMemory kernel ran
    for k, ext in symm_kernels:
        base = by_id.get(ext)
        if base is not None:  # newer torch records its call: op, sizes and group, as NCCL's
            lib = others[k]
            others[k] = replace(base, ts=lib.ts, dur=lib.dur, stream=lib.stream, source=LIBRARY,
                                host_ts=base.ts)
            ran.add(id(base))
            claimed.add(id(base))
        elif ext in symm:  # else the op that launched it: op, and sizes where it holds them
            others[k] = _symm_sized(others[k], *symm[ext])
    if kernels and inner is None and len(own) == own_args:
        kernels += _no_kernel(cpu, ran, out)
    out.calls = (kernels or [c for c in cpu if id(c) not in claimed]) + others
    _number(out)
    out.compute_ts, out.compute_end = compute.spans()
    return out


# every argument _static reads: with the group's ranks, a call's key to what they give; the
# names first (the text ones: Collective name, dtype, group name and description)
_STATIC_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "dtype",
                "Process Group Name", "Process Group Description", "In split size",
                "Out split size", "Rank")
_TEXT = (str, type(None))


class _Maker:
    """Calls from events, their group tuples and names shared between calls, and what each set
    of arguments gives (:func:`_static`) worked out once: a job repeats a few calls many
    times."""

    def __init__(self, path: str) -> None:
        self.path, self.groups = path, None
        self.ranks: dict[str, tuple[int, ...]] = {}
        self.counts: dict[int, int] = {}  # element counts, each kept once
        self.known: dict[tuple, tuple] = {}  # the arguments _static reads -> what it gives

    def call(self, e: dict, args: dict, choice, needed: bool = False) -> Call | None:
        """The call, or None when its group is named only and the names are not read yet."""
        raw = args.get("Process Group Ranks")
        if raw is None and self.groups is None and not needed:
            return None
        key = raw if isinstance(raw, str) else None
        ranks = self.ranks.get(key) if key is not None else None
        if ranks is None and raw is not None:
            ranks = ranks_of(raw, self.path)
            if key is not None:
                self.ranks[key] = ranks
        known = (ranks, *map(args.get, _STATIC_ARGS))
        if ranks is None or type(known[1]) not in _TEXT or type(known[4]) not in _TEXT or \
                type(known[5]) not in _TEXT or type(known[6]) not in _TEXT:
            known = None  # text read as text: 1, True and 1.0 would share a key
        try:
            fixed = self.known.get(known) if known is not None else None
        except TypeError:  # a list or an object among them: no key
            fixed = known = None
        if fixed is None:
            fixed = _static(e, args, self.path, ranks, self.groups or {}, self.counts)
            if known is not None:
                self.known[known] = fixed
        op, name, ranks, pg, desc, dtype, itemsize, n_in, n_out, s_in, s_out, peer = fixed
        try:
            ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            raise TraceError(f"{self.path}: {name}: an event without a time (ts)") from None
        seq = args.get("Seq")
        c = Call(-1, op, name, ranks, pg, desc, dtype, itemsize, n_in, n_out, ts, dur,
                 int(seq) if isinstance(seq, int) else -1, in_splits=s_in, out_splits=s_out,
                 stream=sys.intern(str(e.get("tid", ""))), peer=peer)
        if choice is not None:
            c.source = "kernel"
            c.algo, c.proto = _stated(op, str(e.get("name", "")), choice)
        return c


def _no_kernel(cpu: list[Call], ran: set[int], out: RankTrace) -> list[Call]:
    """The CPU calls of a trace with NCCL kernels that no kernel in it ran. On a group of one
    rank NCCL runs a collective as a copy on the device or not at all (an in-place all-reduce or
    broadcast: nothing to move), and no NCCL kernel appears; on any group, a kernel that ran
    after the profiler's window closed is not in the trace. Each is a call, with its bytes and
    its step; no time (its op times the enqueue) and no bandwidth: :data:`NO_KERNEL`."""
    left = [c for c in cpu if id(c) not in ran]
    for c in left:
        c.source, c.dur = NO_KERNEL, 0.0
    out.no_kernel = len(left)
    return left


def _slim(e: dict) -> dict:
    """What a call needs of its event (the event itself may carry much more)."""
    return {"name": e.get("name"), "ts": e.get("ts"), "dur": e.get("dur", 0.0),
            "tid": e.get("tid", ""), "args": {k: v for k, v in (e.get("args") or {}).items()
                                               if k in ("External id", "correlation")}}


def _launches(path: str, wanted: set, limit: int) -> dict:
    """correlation -> (thread, ts) of the runtime calls (``cudaLaunchKernel``,
    ``hipLaunchKernel``) that launched the ``wanted`` correlations' kernels: a second pass over
    the file, made for a trace of torch < 2.1 only, whose NCCL kernels reach their ops through
    their launches. The first pass decodes no launch: a trace holds one per kernel, and one of
    torch 2.x needs none."""
    found = {}
    for e in stream.events(path, {}, None, limit=limit, wanted=_launch_texts):
        if e.get("ph") != "X" or str(e.get("cat", "")) not in ("cuda_runtime", "cuda_driver"):
            continue
        corr = (e.get("args") or {}).get("correlation")
        if "Launch" in str(e.get("name", "")) and isinstance(corr, int) and corr in wanted:
            try:
                found[corr] = (e.get("tid"), float(e["ts"]))
            except (KeyError, TypeError, ValueError):
                continue
    return found


def _launch_texts(texts: list[str]) -> list[bool]:
    return ["Launch" in t for t in texts]


def _unlinked(e: dict, choice: tuple[str, str]) -> Call:
    """An NCCL kernel whose call the trace does not hold: its collective from its name where the
    name states one (the records' kernel word: ``AllReduce``, ``Broadcast``, ...), else
    ``unknown``: RCCL's ``Generic`` kernel runs any collective, and NCCL runs collectives as well
    as point-to-point under ``SendRecv`` (the sampled and DLRM traces of the corpus). No sizes,
    no group; its device time. It counts in the rank's communication and exposed time; nothing
    is matched to it."""
    word = kernel_word(str(e.get("name", "")))
    op = next((o.name for o in OPS.values() if o.nccl and o.names.kernel == word), UNKNOWN)
    known = op != UNKNOWN
    return Call(-1, op, sys.intern(word), (), "", "unlinked (launched before the trace)",
                UNSIZED, 0, 0, 0, float(e["ts"]), float(e.get("dur") or 0.0),
                source="kernel-unlinked",
                algo=choice[0] if known else "unknown", proto=choice[1] if known else "unknown",
                stream=str(e.get("tid", "")))


def _library(e: dict, lib: tuple[str, str], path: str) -> Call:
    """A communication kernel of another library (:func:`~commbench.traces.calls.
    library_kernel`): DeepEP's dispatch and combine are all-to-alls of the expert-parallel group,
    its other kernels exchange counts or wait (``unknown``). Its device time; its sizes and its
    group are not in the trace (torch SymmetricMemory's kernels take them afterwards from the
    call torch recorded, or the op that launched them: :func:`read`). It counts in the rank's
    communication and exposed time."""
    try:
        ts, dur = float(e["ts"]), float(e.get("dur") or 0.0)
    except (KeyError, TypeError, ValueError):
        raise TraceError(f"{path}: kernel {str(e.get('name'))[:60]}: no time (ts, dur)") from None
    op = library_op(*lib)
    return Call(-1, op, sys.intern(f"{lib[0]} {lib[1]}"), (), "",
                f"{lib[0]}'s own (not NCCL): no sizes or group in the trace", UNSIZED, 0, 0, 0,
                ts, dur, source=LIBRARY, stream=str(e.get("tid", "")))


def _symm_sized(c: Call, name: str, args: dict) -> Call:
    """A torch SymmetricMemory kernel told by the op that launched it (``symm_mem::*``, the same
    ``External id``): that op's collective (its two-shot kernel is also its reduce-scatter),
    and, where the op's input is the call's whole buffer, its input's dims and type (``Input
    Dims``, ``Input type``) as the call's size; still no group (the group's name is a string
    argument the profiler leaves empty). A kernel whose op states no dims or type is unsized."""
    op, whole = symm_mem_op(name)
    c = replace(c, op=op, group_desc=f"{SYMM_MEM}'s own (not NCCL), launched by {name}: no group "
                                     "in the trace")
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not (whole and isinstance(dims, list) and dims and isinstance(dims[0], list) and
            all(isinstance(d, int) and d >= 0 for d in dims[0]) and isinstance(types, list) and
            types and types[0] in CPP_TYPES):
        return c
    elems = math.prod(dims[0])
    dtype = CPP_TYPES[types[0]]
    return replace(c, dtype=dtype, itemsize=_ITEMSIZE[dtype], in_elems=elems, out_elems=elems)


@lru_cache(maxsize=1024)  # a job runs a few kernels many times
def _stated(op: str, kernel: str, choice: tuple[str, str]) -> tuple[str, str]:
    """(algorithm, protocol) of ``op``'s call from its kernel's name, as far as the name states
    them for that collective (the module docstring)."""
    own, word = OPS[op].names.kernel if op in OPS else "", kernel_word(kernel)
    if own == "SendRecv" and word == "SendRecv":
        return "", ""
    if own and word != own:
        return "unknown", "unknown"
    return choice


def _op_input(e: dict, args: dict, path: str) -> tuple[str, int, int]:
    """(dtype, bytes per element, elements) of a torch < 2.1 profiler op's input; (UNSIZED, 0,
    0) where the trace was recorded without shapes (record_shapes=False, the profiler's
    default): the call has its op and time, and no size."""
    if args.get("Input Dims") is None and args.get("Input type") is None:
        return UNSIZED, 0, 0
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    try:
        count = 1
        for d in dims[0]:
            count *= int(d)
    except (IndexError, TypeError, ValueError):
        raise TraceError(f"{path}: {e['name']} at ts {e.get('ts')}: its input's dims cannot "
                         f"be read ({dims!r})") from None
    dtype = CPP_TYPES.get(str(types[0]) if types else "", "")
    itemsize = _ITEMSIZE.get(dtype, 0)
    if not itemsize:
        raise TraceError(f"{path}: {e['name']} at ts {e.get('ts')}: input type "
                         f"{types[:1]!r} unknown; known: {', '.join(CPP_TYPES)}")
    return dtype, itemsize, count


def _profiled(prof: list[tuple[dict, dict]], out: RankTrace, path: str, old: bool = True):
    """A call per process group's profiler op (``nccl:*``, ``gloo:*``), and a function from a
    kernel's launch (thread, ts) to the innermost op's call on that thread containing it (None:
    none). ``old``: torch < 2.1, whose ``record_param_comms`` hold no sizes; else a trace with
    no ``record_param_comms`` at all (gloo of torch releases that record none). The ops name no
    group: a call is on the world where every group the trace lists is the world (torch < 2.1
    lists none), else on no known group, sized only where its size needs no group's."""
    what = ("a trace of torch < 2.1 (record_param_comms without sizes)" if old else
            "a trace whose calls are only its process groups' profiler ops")
    if out.world_size < 1:
        raise TraceError(f"{path}: {what} records no group, and without "
                         "distributedInfo.world_size no world to put its calls on: give the "
                         "job's world size (--world N)")
    world = tuple(range(out.world_size))
    if all(g == world for g in out.groups.values()):
        group = world
        desc = ("world (torch < 2.1 records no group)" if old else
                "world (the trace records no group; each group it lists is the world)")
    else:
        group, desc = (), "unknown (the trace records no group, and lists groups of fewer ranks)"
    calls, by_thread = [], {}
    for e, args in prof:
        op = PROFILER[e["name"]]
        try:
            ts, dur = float(e["ts"]), float(e.get("dur") or 0.0)
        except (TypeError, ValueError, KeyError):
            raise TraceError(f"{path}: {e['name']}: no time (ts, dur)") from None
        # a barrier has no input to size: no dtype, no elements, none missing
        dtype, itemsize, count = ("", 0, 0) if bufferless(op) else _op_input(e, args, path)
        out.unsized += dtype == UNSIZED  # recorded without shapes
        if itemsize and not group and OPS[op].call_elems(1, 2) != (1, 1):  # needs its group's
            dtype, itemsize = UNSIZED, 0
        n_in, n_out = OPS[op].call_elems(count, len(group)) if itemsize else (0, 0)
        c = Call(-1, op, sys.intern(e["name"]), group, "", desc, dtype, itemsize, n_in, n_out,
                 ts, dur, stream=sys.intern(str(e.get("tid", ""))))
        calls.append(c)
        by_thread.setdefault(e.get("tid"), []).append(c)

    def inner(launch) -> Call | None:
        if launch is None:
            return None
        tid, t = launch
        holding = [c for c in by_thread.get(tid, ()) if c.ts <= float(t) <= c.end]
        return max(holding, key=lambda c: c.ts) if holding else None

    return calls, inner


def _info(out: RankTrace, top: dict, path: str) -> None:
    info = top.get("distributedInfo") or {}
    if not isinstance(info, dict):
        raise TraceError(f"{path}: distributedInfo is not an object")
    try:
        out.rank = int(info.get("rank", -1))
        out.world_size = int(info.get("world_size", 0))
    except (TypeError, ValueError):
        raise TraceError(f"{path}: distributedInfo rank/world_size are not numbers") from None
    if max(out.rank, out.world_size - 1) >= MAX_WORLD:
        raise TraceError(f"{path}: distributedInfo rank {out.rank}, world_size {out.world_size}: "
                         f"a job of at most {MAX_WORLD} ranks is read")
    out.backend = str(info.get("backend", ""))
    out.nccl_version = str(info.get("nccl_version", ""))
    for g in info.get("pg_config") or []:
        if isinstance(g, dict) and "pg_name" in g:
            out.groups[str(g["pg_name"])] = ranks_of(g.get("ranks", []), path)
    for d in top.get("deviceProperties") or []:
        if isinstance(d, dict) and d.get("name"):
            out.devices.append(str(d["name"]))


def _number(out: RankTrace) -> None:
    """Calls in start order, each collective's rank in its process; a missing Seq counted per
    group (point-to-point calls are numbered apart, per group and peer); each call in the
    ``ProfilerStep#N`` that holds its CPU op (a kernel's start may fall in a later one: the GPU
    runs behind the CPU)."""
    out.calls.sort(key=lambda c: c.ts)
    counters: dict[tuple, int] = {}
    for c in out.calls:
        c.rank = out.rank
        if c.seq < 0:
            k = (c.group, c.peer) if c.op in P2P else (c.group,)
            c.seq = counters.get(k, 0)
            counters[k] = c.seq + 1
        if c.source == "kernel-unlinked":  # its CPU op came before the window: in none of its steps
            continue
        at = c.host_ts if c.host_ts >= 0 else c.ts  # the CPU op's step: the GPU may run behind
        for n, t0, t1 in out.steps:
            if t0 <= at < t1:
                c.step = n
                break
