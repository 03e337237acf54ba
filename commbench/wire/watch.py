"""Watch third-party code's torch.distributed calls and book them in a ledger.

``with watch(ledger): model(x).sum().backward()`` books every collective and point-to-point call
that torch's own tensor parallelism, FSDP2, DTensor, a Megatron or DeepSpeed layer makes, with the
same fields and byte conventions as commbench's comm layer (:mod:`commbench.ops`).

How: a ``TorchDispatchMode``. Every torch.distributed entry point ends in one dispatcher op: the
c10d ops behind ``dist.all_reduce``, ``all_gather_into_tensor`` and the rest (``c10d.allreduce_``,
``c10d._allgather_base_``, ...), the functional collectives behind DTensor and funcol
(``_c10d_functional.all_reduce``, ...), and ``_dtensor.shard_dim_alltoall``. The mode sees the
outermost of them once; an op it runs is not dispatched to it again, so each call is booked once
whatever entry point it went through. An op on DTensors is handed to DTensor's own dispatch with
the mode still on (``NotImplemented``), so the collectives DTensor issues inside it (the
all-gather a ``Shard @ Shard`` matmul needs, loss_parallel's three all-reduces) are booked too.
``wait_tensor`` moves nothing and is not booked. Which op is which call, and how its group and
size are read: :mod:`commbench.wire.watch_rules`. The time booked is the host time of the call:
for async ops (NCCL, funcol) that is the launch, not the transfer.

Each entry also carries the reduction (sum, max, ...), the phase (backward while autograd runs
one, else as the library says: :func:`~commbench.wire.modules.library_phase`) and the issuing
module's qualified name (torch's ``ModuleTracker``: the innermost module active; a module's own
forward hooks, such as torch TP's redistribution of an output, run once it has left), and the
tensor's own bytes beside the modelled ones.

Calls made by commbench's own comm layer are booked by the comm layer and skipped here.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import time

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from commbench.ops import OPS, booked, bufferless
from commbench.runtime.status import Tracker
from commbench.wire import steps
from commbench.wire.ledger import Ledger
from commbench.wire.modules import DdpBuckets, carried, holder_name, module_tracker, origin
from commbench.wire.watch_rules import OP_OF, first_tensor, pg_of, ranks_of, read, redop_name

__all__ = ["batched", "quiet", "watch"]

_QUIET: contextvars.ContextVar[bool] = contextvars.ContextVar("commbench_quiet", default=False)
_BATCH: contextvars.ContextVar[int] = contextvars.ContextVar("commbench_batch", default=-1)
_BATCHES = [0]


@contextlib.contextmanager
def batched():
    """The messages booked inside are one group call (``batch_isend_irecv``): their entries
    share a ``batch`` number."""
    if _BATCH.get() >= 0:
        yield
        return
    token = _BATCH.set(_BATCHES[0])
    _BATCHES[0] += 1
    try:
        yield
    finally:
        _BATCH.reset(token)


# a script's own torch function or dispatch mode (a CPU stand-in for a CUDA library) passes
# calls on; the line that issued them is further out
_MODES = ("__torch_function__", "__torch_dispatch__")


def _line(script: str, frame) -> str:
    """``file.py:LINE`` of the innermost frame in ``script`` that is not one of the script's
    own torch modes, '' when none is."""
    while frame is not None:
        if frame.f_code.co_filename == script and frame.f_code.co_name not in _MODES:
            return f"{script.rsplit('/', 1)[-1]}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


class quiet:
    """Inside: the watcher ignores torch.distributed calls (the comm layer books its own)."""

    def __enter__(self) -> None:
        self._token = _QUIET.set(True)

    def __exit__(self, *exc) -> None:
        _QUIET.reset(self._token)


# torch's own guard around a mode's dispatch (torch >= 2.1), applied as torch applies it
_no_dynamo = getattr(torch, "_disable_dynamo", None) or (lambda **_: lambda fn: fn)


class watch(TorchDispatchMode):
    """Book torch.distributed calls made inside the ``with`` block into ``ledger``."""

    def __init__(self, ledger: Ledger, transport: str | None = None,
                 script: str | None = None, tracker: Tracker | None = None) -> None:
        super().__init__()
        self.ledger, self.transport = ledger, transport
        self.script = script  # an audited script's path: each entry gets its line there
        # the rank's status: a hang report names the call a rank is blocked in, and its line
        self.tracker = tracker
        # (entry, its c10d Work, or the watcher's (start, end) events) of calls on CUDA tensors
        self.works: list[tuple] = []
        self._modules = module_tracker()
        self._ddp = DdpBuckets()  # the modules in DDP's copied buckets

    def __enter__(self):
        self._modules.__enter__()
        self._ddp.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._ddp.__exit__(*exc)
            self._modules.__exit__(*exc)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """torch wraps a mode's ``__torch_dispatch__`` so that dynamo never compiles into it,
        and its wrapper imports torch._dynamo on the first call: 1.6 s of a core in every rank
        of an audit that never compiles. Dynamo can only be compiling where it was imported, so
        the same guard is taken here only then (:meth:`__torch_dispatch__`)."""
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "torch._dynamo" in sys.modules:
            return self._guarded(func, types, args, kwargs)
        return self._dispatch(func, types, args, kwargs)

    @_no_dynamo(recursive=True)
    def _guarded(self, func, types, args, kwargs):
        return self._dispatch(func, types, args, kwargs)

    def _dispatch(self, func, types, args, kwargs):
        kwargs = kwargs or {}
        name = f"{func.namespace}.{func._schema.name.split('::')[1]}"
        known = name in OP_OF
        if not known and any(t.__name__ == "DTensor" for t in types):
            # a tensor subclass's op (DTensor's): let its own dispatch run with this mode still
            # on, so that the collectives it issues inside reach the watcher
            return NotImplemented
        if not known or _QUIET.get():
            return func(*args, **kwargs)
        named = {arg.name: (args[i] if i < len(args) else kwargs.get(arg.name, arg.default_value))
                 for i, arg in enumerate(func._schema.arguments)}
        op, pg_arg, count, vol = read(name, named)
        pg = pg_of(pg_arg)
        ranks = ranks_of(pg)
        line = _line(self.script, sys._getframe(1)) if self.script else ""
        said = f"{op} at {line}" if line else op
        if self.tracker is not None:
            self.tracker.enter(said, ranks)
        first = None if bufferless(op) else first_tensor(list(named.values()))
        start = _event() if first is not None and first.is_cuda else None
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        seconds = time.perf_counter() - t0
        if self.tracker is not None:
            self.tracker.leave(said)
        dtype = first.dtype if first is not None else torch.uint8
        sent, recv = booked(op, pg.size(), pg.rank(), count, dtype.itemsize, **vol)
        phase, module = origin(self._modules, op, sys._getframe(1))
        tracked = getattr(self._modules, "_known_modules", {})
        # a DDP bucket's modules from the reducer, else those its memory holds
        carries = self._ddp.carries(tracked, ranks, count, first.dtype) \
            if op == "all_reduce" and first is not None else ()
        if not carries and not bufferless(op):
            carries = carried(_tensors(list(named.values())), tracked)
        if carries:  # the innermost module holding all it carries
            module = holder_name([m for m, _ in carries])
        end = named.get("dst", named.get("src")) if op in ("send", "recv") else None
        peer = ranks[end] if isinstance(end, int) and 0 <= end < pg.size() else -1
        # the tensor bytes this rank passed: a scatter's non-root ranks only their own block
        # (the ledger books every rank's count as the root's whole buffer)
        own = count // pg.size() if op == SCATTER and vol.get("root") != pg.rank() else count
        n, row = steps.current(), vol.get("row", 1)  # an all-to-all's splits in elements:
        splits = tuple(tuple(int(s) * row for s in vol[k]) for k in ("in_splits", "out_splits")) \
            if "in_splits" in vol else ()
        with self.ledger.scope(f"step {n}") if n else contextlib.nullcontext():
            entry = self.ledger.record(op, ranks, self.transport or _backend(pg),
                                       str(dtype).removeprefix("torch.") if first is not None else "",
                                       count, sent, recv,
                                       seconds, source="torch",
                                       redop=redop_name(named.get("reduce_op")), phase=phase,
                                       module=module, nbytes=own * dtype.itemsize, start=t0,
                                       peer=peer, splits=splits,
                                       line=line,
                                       batch=_BATCH.get() if op in ("send", "recv") else -1,
                                       pg=str(getattr(pg, "group_name", "") or ""),
                                       api=object_call(sys._getframe(1)), carries=carries)
        if start is not None:
            # a blocking call on NCCL returns no Work (torch 2.11 on an H200): the current
            # stream waits for the collective when the call returns, so events on it around the
            # call time it
            work = _work_of(out)
            self.works.append((entry, work if work is not None else (start, _event())))
        return out

    def device_times(self) -> dict[int, float]:
        """id(entry) -> the seconds its collective ran on the GPU, for the c10d calls on CUDA
        tensors booked so far: a call that returned its Work, NCCL's own start and end events
        (recorded when the process group was made with ``TORCH_NCCL_ENABLE_TIMING=1``, which
        ``commbench audit`` sets); a blocking call that returned none, the watcher's events on
        the current stream around it. Waits for the device. Functional collectives (DTensor's)
        return no work: none."""
        if self.works and torch.cuda.is_available():
            torch.cuda.synchronize()
        out = {}
        for entry, work in self.works:
            try:
                if isinstance(work, tuple):
                    out[id(entry)] = work[0].elapsed_time(work[1]) / 1e3  # milliseconds
                else:
                    out[id(entry)] = work._get_duration() / 1e3
            except (RuntimeError, AttributeError, ValueError):  # no timing, or not a GPU work
                continue
        return out


# torch.distributed's collectives of picklable objects: each is made of tensor collectives (the
# sizes, then the pickled bytes), which the tables show as parts of the one call
OBJECT_CALLS = frozenset({"all_gather_object", "gather_object", "broadcast_object_list",
                          "scatter_object_list", "send_object_list", "recv_object_list"})


# the op whose non-root ranks receive a block of the root's buffer (ops.py's record)
SCATTER = next(op for op, r in OPS.items() if r.rooted and r.input == "blocks")


def object_call(frame, depth: int = 12) -> str:
    """The object collective of torch.distributed on the stack above ``frame``, or ""."""
    while frame is not None and depth:
        name = frame.f_code.co_name
        if name in OBJECT_CALLS and frame.f_code.co_filename.endswith("distributed_c10d.py"):
            return name
        frame, depth = frame.f_back, depth - 1
    return ""


def _tensors(values: list) -> list[torch.Tensor]:
    """Every tensor among ``values`` and the lists in them."""
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, list | tuple):
            out += _tensors(list(v))
    return out


def _event() -> torch.cuda.Event:
    """A timing event recorded now on the current CUDA stream."""
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    return e


def _work_of(out):
    """The c10d Work a c10d op returned (its last output, a script object), or None."""
    items = out if isinstance(out, tuple | list) else (out,)
    for x in reversed(items):
        if isinstance(x, torch.ScriptObject):
            try:
                # lazy: optional: its absence is handled here
                from torch._C._distributed_c10d import Work

                return Work.unbox(x)
            except (ImportError, RuntimeError, TypeError, AttributeError):
                return None
    return None


def _backend(pg) -> str:
    try:
        return str(dist.get_backend(pg))
    except (ValueError, RuntimeError):
        return "torch"
