"""Where a call comes from, for the watcher's ``module`` and ``phase`` columns
(:mod:`commbench.wire.watch`): torch's module tracker, made safe for every way of taking a
gradient; the module whose parameters a library's call carries (FSDP2's parameter groups);
and the phase a library gives a call it makes outside the autograd engine.

Phase: ``backward`` while the autograd engine runs a backward pass. Libraries also move
gradients outside it: DeepSpeed's ZeRO-1/2 reduce them after ``loss.backward()`` returns (in
``engine.backward`` / ``allreduce_gradients``), torch's pipelining sends and receives them in
batches it labels ``bwd_send`` / ``bwd_recv`` (its multi-stage schedules in actions,
``SEND_B`` / ``RECV_B``). An optimizer's step is a phase of its own,
``optimizer``: DeepSpeed's all-reduce of the gradients' norm and its ZeRO-1/2 all-gather of the
updated partitions, a distributed optimizer's parameter gather. :func:`library_phase` reads
these off the call's stack: the innermost frame that says decides, by a pipelining batch's
``desc`` (``fwd_send_bwd_recv``: the sends forward, the receives backward), by an optimizer's
``step`` (a method ``step`` or ``step_*`` of a class whose name, or a base's, has
``Optimizer`` in it: torch's optimizers, DeepSpeed's ZeRO optimizers, Megatron's and its
``step_with_ready_grads``), by a multi-stage pipelining schedule's action, or by the words of
its function's name (``backward``, ``bwd``, ``gradients``, ``grads``, ``grad``: Megatron's
``finish_grad_sync``; ``forward``, ``fwd``; a name with words of both, such as Megatron's
``forward_backward_no_pipelining``, or with ``norm``, a gradient norm computed rather than a
gradient moved, decides nothing). A library's set-up is a phase of its own, ``setup``: a call
under a constructor (``__init__``: DDP's parameter broadcast, DeepSpeed's engine) or a frame
whose name says ``init``, ``initialize``, ``setup``, ``parallelize`` or ``distribute``
(Megatron's ``initialize_model_parallel``, torch TP's ``parallelize_module`` and
``distribute_tensor`` placing the weights), and DDP's one broadcast of the bucket order it
rebuilt after the first backward (its C++ reducer issues it from the line of ``_pre_forward``
that calls ``_rebuild_buckets``, in the second step's forward: a set-up, not the step's work).
"""

from __future__ import annotations

import linecache
import os
import re

import torch
from torch.autograd.graph import register_multi_grad_hook
from torch.utils._pytree import tree_flatten
from torch.utils.module_tracker import ModuleTracker

from commbench.wire.watch_rules import ranks_of

__all__ = ["DdpBuckets", "carried", "holder", "holder_name", "library_module", "library_phase",
           "module_tracker", "origin"]

_BACKWARD = {"backward", "bwd", "gradients", "grads", "grad"}
_FORWARD = {"forward", "fwd"}
# a library's set-up: a constructor (DDP's parameter broadcast, DeepSpeed's engine), a group or
# mesh being made (Megatron's initialize_model_parallel), torch TP placing its weights
# (parallelize_module, distribute_tensor)
_SETUP = {"init", "initialize", "setup", "parallelize", "distribute"}
# DDP's bucket rebuild: the reducer broadcasts the new order from C++, the innermost Python
# frame being the line of DistributedDataParallel._pre_forward that asks for it
_DDP_REBUILD = ("_pre_forward", "_rebuild_buckets", os.path.join("nn", "parallel", "distributed.py"))
_BATCHES = ("_batch_p2p", "_sorted_batch_p2p")  # torch.distributed.pipelining.schedules
# the multi-stage schedules' actions (_PipelineScheduleRuntime: Interleaved1F1B, LoopedBFS,
# the zero-bubble ones) batch their sends and receives without a desc; the action says
_ACTIONS = {"F": "forward", "SEND_F": "forward", "RECV_F": "forward", "B": "backward",
            "I": "backward", "W": "backward", "SEND_B": "backward", "RECV_B": "backward",
            "REDUCE_GRAD": "backward"}


def _says(name: str) -> str:
    words = set(name.strip("_").lower().split("_"))
    if "norm" in words:  # a gradient norm is computed, not moved (clip_grad_norm_, ...)
        return ""
    if words & _SETUP:
        return "setup"
    back, fwd = bool(words & _BACKWARD), bool(words & _FORWARD)
    return "" if back == fwd else ("backward" if back else "forward")


def _batch_says(desc: str, op: str) -> str:
    """A pipelining batch's phase for ``op``: ``fwd_send_bwd_recv`` sends activations forward
    and receives gradients in one batch."""
    parts = dict((kind, way) for way, kind in re.findall(r"(fwd|bwd)_(send|recv)", desc))
    kind = "send" if op in ("isend", "send") else "recv" if op in ("irecv", "recv") else ""
    way = parts.get(kind) or (next(iter(parts.values())) if len(set(parts.values())) == 1 else "")
    return {"fwd": "forward", "bwd": "backward"}.get(way, "")


def _optimizer_step(frame) -> bool:
    """Whether ``frame`` runs an optimizer's ``step`` method (or ``step_*``: Megatron's
    ``step_with_ready_grads``, whose words are no gradient's move)."""
    name = frame.f_code.co_name
    if not (name == "step" or name.startswith("step_")) or \
            "self" not in frame.f_code.co_varnames[:1]:
        return False
    kinds = type(frame.f_locals.get("self")).__mro__
    return any("Optimizer" in k.__name__ for k in kinds)


def _ddp_rebuild(frame) -> bool:
    """Whether ``frame`` is DDP's ``_pre_forward`` at its call of ``_rebuild_buckets``."""
    name, call, where = _DDP_REBUILD
    code = frame.f_code
    return code.co_name == name and code.co_filename.endswith(where) and \
        call in linecache.getline(code.co_filename, frame.f_lineno)


def library_phase(frame, op: str = "", depth: int = 64) -> str:
    """``forward``, ``backward``, ``optimizer`` or ``setup`` for a call of ``op`` as the innermost
    deciding frame of the stack from ``frame`` out says, within ``depth`` frames; '' where
    none does."""
    f = frame
    for _ in range(depth):
        if f is None:
            return ""
        name = f.f_code.co_name
        if name in _BATCHES:
            desc = f.f_locals.get("desc")
            if isinstance(desc, str) and _batch_says(desc, op):
                return _batch_says(desc, op)
        elif "comp_type" in f.f_locals and "pipelining" in f.f_code.co_filename:
            kind = f.f_locals["comp_type"]
            way = _ACTIONS.get(str(getattr(kind, "value", kind)), "")
            if way:
                return way
        elif _optimizer_step(f):
            return "optimizer"
        elif _ddp_rebuild(f):
            return "setup"
        elif _says(name):
            return _says(name)
        f = f.f_back
    return ""


def origin(tracker, op: str, frame) -> tuple[str, str]:
    """(phase, module's qualified name) of a call of ``op`` booked from ``frame``: backward
    while the engine runs one, else as the library says (forward where nothing says); the
    module whose parameters a library's call carries, else the innermost module the tracker
    is in."""
    names = [p for p in tracker.parents if p != "Global"]
    carried = library_module(frame, getattr(tracker, "_known_modules", {}))
    if torch._C._current_graph_task_id() != -1 or tracker.is_bw:
        phase = "backward"
    else:  # a gradient a library moves outside the engine
        phase = library_phase(frame, op) or "forward"
    return phase, carried or max(names, key=len, default="")


_DS_PARAMS = ("params", "params_to_reduce", "params_in_bucket", "param_list")  # ZeRO-3's


def library_module(frame, known, depth: int = 64) -> str:
    """The module whose parameters a library's call carries, by the library's own record on
    the stack: an FSDP2 parameter group's first module (its all-gathers prefetched for the
    next module, its reduce-scatters after the whole backward, run where the tracker names
    another module or none); the innermost module holding every parameter a DeepSpeed ZeRO-3
    gather or gradient reduction carries (its list of parameters, which have a ``ds_id``, in
    the innermost DeepSpeed frame that names one: prefetched gathers, buckets of gradients);
    ``known``: module -> qualified name. '' where none says."""
    f = frame
    for _ in range(depth):
        if f is None:
            return ""
        where = f.f_code.co_filename
        if "fsdp" in where:
            group = f.f_locals.get("self")
            modules = getattr(group, "modules", None) if type(group).__name__ == \
                "FSDPParamGroup" else None
            if modules:
                return known.get(modules[0], "")
        elif "/deepspeed/" in where.replace("\\", "/"):  # the package, not a script's name
            for name in _DS_PARAMS:
                params = f.f_locals.get(name)
                if isinstance(params, list | tuple | set) and params and \
                        all(hasattr(p, "ds_id") for p in params):
                    return holder(params, known)
        f = f.f_back
    return ""


def _span(t) -> tuple[int, int, int] | None:
    """(storage address, first byte, end byte) of ``t`` within its storage; None for a tensor
    without storage of its own (a DTensor, a meta or empty tensor)."""
    if not isinstance(t, torch.Tensor) or type(t) is not torch.Tensor and \
            not isinstance(t, torch.nn.Parameter) or t.numel() == 0 or t.device.type == "meta":
        return None
    try:
        start = t.storage_offset() * t.element_size()
        return t.untyped_storage().data_ptr(), start, start + t.numel() * t.element_size()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def carried(tensors: list, known) -> tuple[tuple[str, int], ...]:
    """(module, elements) for each module of ``known`` (module -> qualified name) whose own
    parameters, or their gradients (``.grad``; Megatron's ``.main_grad``), lie in the memory of
    a call's ``tensors``: a flat buffer of gradients or parameters that a library reduces or
    gathers at once (megatron-core's buckets, DDP's with ``gradient_as_bucket_view``), its
    bytes belonging to every module whose tensors it holds, in proportion. () where none
    does (a buffer its parameters are copied into)."""
    spans = [x for x in map(_span, tensors) if x is not None]
    if not spans:
        return ()
    out: dict[str, int] = {}
    for module, name in list(known.items()):
        for p in module._parameters.values():
            for t in (p, getattr(p, "main_grad", None), getattr(p, "grad", None)):
                here = _span(t)
                if here and any(here[0] == q and here[1] < e and s < here[2]
                                for q, s, e in spans):
                    # its elements: a partitioned parameter's (DeepSpeed's: empty data)
                    # are its gradient's
                    out[name] = out.get(name, 0) + (p.numel() or t.numel())
                    break
    return tuple(sorted(out.items())) if out else ()


def _own(module) -> list:
    """A module's own parameters, and the local shards of the DTensors it holds as plain
    attributes: torch's TP under DDP (``_pre_dp_module_transform``) swaps each sharded
    parameter for a DTensor over the local tensor DDP registered, once the module has run."""
    out = [p for p in module._parameters.values() if p is not None]
    for v in vars(module).values():
        if type(v).__name__ == "DTensor":
            out.append(v._local_tensor)
    return out


def _owners(params, known) -> tuple[tuple[str, int], ...]:
    """(module, elements) of ``params``' owners among ``known`` (module -> qualified name): the
    module holding the parameter, or a tensor over its memory."""
    spans: dict[int, list[tuple[int, int, int]]] = {}  # storage -> (first, end, elements)
    for p in params:
        here = _span(p)
        if here:
            spans.setdefault(here[0], []).append((here[1], here[2], p.numel()))
    out: dict[str, int] = {}
    for module, name in list(known.items()):
        for t in _own(module):
            here = _span(t)
            k = next((k for s, e, k in spans.get(here[0], ()) if s < here[2] and here[1] < e),
                     0) if here else 0
            if k:
                out[name] = out.get(name, 0) + k
    return tuple(sorted(out.items()))


class DdpBuckets:
    """The modules a DDP bucket carries where its all-reduce cannot show them: without
    ``gradient_as_bucket_view`` DDP copies the gradients into the bucket, so no parameter's
    memory lies in the call's tensor (:func:`carried` finds none). DDP's reducer launches its
    buckets in index order, every synchronised backward. Each time a DDP module's forward
    returns (its buckets rebuilt, if they were), the buckets are read from what DDP logs of
    itself (``_get_ddp_logging_data``, nothing allocated and no lock taken: the reducer holds
    its own while a bucket is reduced): after the rebuild each bucket's parameter indices;
    before it the buckets' sizes, cut from the parameters last to first as DDP first cuts
    them. The k-th floating all-reduce of a bucket's elements on DDP's group is then bucket k.
    A call that is no bucket's (find_unused_parameters' bitmap, an integer; a script's own
    call; the first step of ``static_graph``, reduced at once) carries nothing, and so does a
    DDP whose log does not add up to its parameters."""

    def __init__(self) -> None:
        self._due: dict[int, int] = {}  # id(DDP module) -> the bucket due
        self._buckets: dict[int, list[tuple[int, tuple]]] = {}  # -> (elements, params)
        self._ranks: dict[int, tuple[int, ...]] = {}  # -> its group's ranks
        self._read: dict[int, str] = {}  # -> the log the buckets were read from
        self._handle = None

    def __enter__(self) -> DdpBuckets:
        self._handle = torch.nn.modules.module.register_module_forward_hook(self._forward)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _forward(self, module, args, out) -> None:
        if type(module).__name__ != "DistributedDataParallel":
            return
        key = id(module)
        self._due[key] = 0
        try:
            log = module._get_ddp_logging_data()
        except (AttributeError, RuntimeError):  # a torch without it
            return
        rebuilt = log.get("rebuilt_per_bucket_param_indices") if \
            log.get("has_rebuilt_buckets") else None
        said = f"{rebuilt}|{log.get('bucket_sizes')}"
        if self._read.get(key) == said:
            return
        self._read[key] = said
        params = [p for p in getattr(module, "_module_parameters", ()) if p.requires_grad]
        self._buckets[key] = _ddp_cut(params, rebuilt, str(log.get("bucket_sizes", "")))
        self._ranks[key] = ranks_of(module.process_group)

    def carries(self, known, ranks: tuple[int, ...], count: int,
                dtype) -> tuple[tuple[str, int], ...]:
        if not dtype.is_floating_point:
            return ()
        for key, buckets in self._buckets.items():
            due = self._due[key]
            if self._ranks[key] != tuple(ranks) or due >= len(buckets) or \
                    buckets[due][0] != count:
                continue
            self._due[key] = (due + 1) % len(buckets)
            return _owners(buckets[due][1], known)
        return ()


def _ddp_cut(params: list, rebuilt: str | None, sizes: str) -> list[tuple[int, tuple]]:
    """DDP's buckets in the order it reduces them, (elements, parameters) each, from its log:
    the rebuilt buckets' parameter indices ("19 18, 16 17 15, ..."), else the first buckets'
    sizes in bytes ("8192, 4224, ..."), which DDP cut from the parameters taken last to first;
    [] where the log does not add up to the parameters."""
    try:
        if rebuilt:
            cut = [tuple(params[int(i)] for i in b.split()) for b in rebuilt.split(",")]
        else:
            cut, rest = [], params[::-1]
            at = 0  # the next parameter of rest
            for want in (int(x) for x in sizes.split(",") if x.strip()):
                got, bucket = 0, []
                while at < len(rest) and got < want:
                    bucket.append(rest[at])
                    got += rest[at].numel() * rest[at].element_size()
                    at += 1
                if got != want:
                    return []
                cut.append(tuple(bucket))
            if at < len(rest):
                return []
    except (ValueError, IndexError):
        return []
    return [(sum(p.numel() for p in b), b) for b in cut]


def holder_name(names: list[str]) -> str:
    """The innermost module whose qualified name prefixes every one of ``names``."""
    return ".".join(os.path.commonprefix([n.split(".") for n in names]))


def holder(params, known) -> str:
    """The qualified name of the innermost module of ``known`` (module -> name) whose
    parameters include every one of ``params``: their owners' longest common prefix of dotted
    names. '' where no owner is known."""
    ids = {id(p) for p in params}
    return holder_name([name for module, name in known.items()
                        for p in module._parameters.values() if p is not None and id(p) in ids])


def module_tracker():
    """torch's ``ModuleTracker``, made safe for ``torch.autograd.grad``: the tracker waits for
    every input's gradient of a module (a multi-grad hook in mode "all", which asks the engine
    whether it will reach each input, and the engine refuses for a leaf under
    ``autograd.grad``: the script crashed). Where a module's inputs include a leaf, its hook
    fires on the first input gradient instead (mode "any"); the module stack is the same."""
    class Tracker(ModuleTracker):
        def _fw_pre_hook(self, mod, input) -> None:
            name = self._get_mod_name(mod)
            self._get_append_fn(name, False)()
            args, _ = tree_flatten(input)
            tensors = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            if tensors:
                mode = "any" if any(t.grad_fn is None for t in tensors) else "all"
                self._hooks.append(register_multi_grad_hook(
                    tensors, self._get_pop_fn(name, True), mode=mode))

    private = ("_get_mod_name", "_get_append_fn", "_get_pop_fn", "_fw_pre_hook")
    return Tracker() if all(hasattr(ModuleTracker, p) for p in private) else ModuleTracker()
