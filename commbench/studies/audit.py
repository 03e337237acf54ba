"""Audit a user's own training step: every torch.distributed call it makes, booked by the
watcher (:mod:`commbench.wire.watch`), summed per group and per module.

``audit(step, *args)`` runs ``step(*args)`` on this rank under the watcher and returns the
booked entries; :func:`run_script` runs a whole script that way (as ``python SCRIPT ARGS``
would, on a rank whose process group is already up: the script's own
``init_process_group`` and ``destroy_process_group`` are skipped); :func:`tables` turns every
rank's entries into the rows ``commbench audit`` prints and writes.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import io
import os
import runpy
import sys
from collections.abc import Callable
from unittest import mock

from tabulate import tabulate

from commbench.rankset import rank_list
from commbench.results.records import markdown
from commbench.runtime.launch import detect
from commbench.studies.audit_layout import layout_tables
from commbench.wire import steps
from commbench.wire.ledger import Entry, Ledger
from commbench.wire.steps import step, step_of

__all__ = ["audit", "audit_markdown", "in_steps", "run_script", "script_rank", "step_rows",
           "tables", "torchrun_env"]


def audit(step: Callable, *args, ledger: Ledger | None = None, script: str | None = None,
          tracker=None, **kwargs) -> list[Entry]:
    """Run ``step(*args, **kwargs)`` under the watcher; the entries it booked on this rank
    (with ``script``, each with the line of that file that issued it; with ``tracker``, the
    rank's status names each call while it runs)."""
    # lazy: imports torch
    from commbench.wire.watch import watch

    ledger = ledger or Ledger()
    with watch(ledger, script=script, tracker=tracker) as w, ledger.capture() as cap:
        step(*args, **kwargs)
    device = w.device_times()
    return [e._replace(device_seconds=device[id(e)]) if id(e) in device else e
            for e in cap.entries]


audit.step = step  # commbench.audit.step(): marks a training step in a script


@contextlib.contextmanager
def _process_group_kept(asked: dict | None = None):
    """The script's init_process_group / destroy_process_group become no-ops while the rank's
    own world is up (a launcher's script calls them; the audit's world already did); the
    keywords the script gave init_process_group go into ``asked``, with ``called``.

    To the script the default group is up only once it has called init_process_group, itself
    or through a library, as under torchrun: ``dist.is_initialized()`` says False before (the
    scripts and libraries that initialise only ``if not dist.is_initialized()`` then do), and so
    does the check device_mesh makes before it initialises the default group itself
    (``init_device_mesh`` in a script that never calls init_process_group)."""
    # lazy: imports torch
    import torch.distributed as dist

    # lazy: imports torch
    import torch.distributed.device_mesh as device_mesh

    if not dist.is_initialized():
        yield
        return
    asked = asked if asked is not None else {}
    asked["called"] = False
    real_is = dist.is_initialized

    def init_process_group(*args, **kwargs) -> None:
        asked.update(kwargs, called=True)

    def is_initialized() -> bool:
        return bool(asked["called"]) and real_is()

    # device_mesh holds its own references to both (from distributed_c10d import ...)
    places = [(dist, "init_process_group", init_process_group),
              (dist, "destroy_process_group", lambda *a, **k: None),
              (dist, "is_initialized", is_initialized)]
    places += [(device_mesh, name, new) for _, name, new in places
               if name != "destroy_process_group" and hasattr(device_mesh, name)]
    saved = [(where, name, getattr(where, name)) for where, name, _ in places]
    for where, name, new in places:
        setattr(where, name, new)
    try:
        yield
    finally:
        for where, name, old in saved:
            setattr(where, name, old)


class _Kept(io.TextIOBase):
    """What a script printed (its ``sys.stdout`` and ``sys.stderr``), the last ``limit``
    characters of it, with the number left out before them. What is written to the file
    descriptor itself (C code, subprocesses, ``faulthandler``) goes where it went before: the
    rank's own stderr."""

    encoding = "utf-8"

    def __init__(self, limit: int = 256 * 1024) -> None:
        self.parts: list[str] = []
        self.size = self.dropped = 0
        self.limit = limit

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return sys.__stderr__.fileno()

    def write(self, s: str) -> int:
        self.parts.append(s)
        self.size += len(s)
        if self.size > 2 * self.limit:
            text = "".join(self.parts)
            self.dropped += len(text) - self.limit
            self.parts, self.size = [text[-self.limit:]], self.limit
        return len(s)

    def text(self) -> str:
        text = "".join(self.parts)
        cut = self.dropped + max(0, len(text) - self.limit)
        return (f"[{cut} earlier characters left out]\n" if cut else "") + text[-self.limit:]


# torchrun's defaults where it is not given an endpoint: nothing connects to it (the script's
# own init_process_group is skipped), libraries only read it
_MASTER = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def torchrun_env(rank: int, size: int, local_rank: int, local_size: int) -> dict[str, str]:
    """The variables torchrun gives each rank (``torch.distributed.run``): what DeepSpeed,
    Megatron and the scripts people train with read to find their rank and device."""
    return {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_size), "GROUP_RANK": str(rank // local_size),
            "GROUP_WORLD_SIZE": str(-(-size // local_size)), "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(size), "ROLE_NAME": "default",
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": "commbench-audit", **_MASTER}


@contextlib.contextmanager
def _looks_like_torchrun(ctx):
    """A rank of a local world, to the script, is a rank of torchrun: its variables set while
    the script runs, then put back. A launched rank keeps every variable its launcher set and
    gets the others (mpirun and srun set no LOCAL_RANK that DeepSpeed reads)."""
    local = ctx.size
    if ctx.launcher not in ("local", "none"):
        local = detect().local_size or 1

    env = {k: v for k, v in torchrun_env(ctx.rank, ctx.size, ctx.local_rank, local).items()
           if k not in os.environ}
    with mock.patch.dict(os.environ, env):  # put back as it was, whatever the script set
        yield


_DS_TORCH = "deepspeed.comm.torch"  # DeepSpeed's torch backend, which builds its CPU op


def _no_shm_op():
    return None


@contextlib.contextmanager
def _deepspeed_without_its_cpu_op():
    """DeepSpeed's torch backend without its shared-memory op (``build_shm_op`` gives None)
    while a script runs: the op is DeepSpeed's CPU-only all-reduce for inference, which moves
    tensors outside torch.distributed, where the watcher cannot book them (on a GPU DeepSpeed
    has no such op and all-reduces through torch.distributed, as it then does here too), and
    DeepSpeed compiles it the first time a backend starts, half a minute or more per machine
    and environment. Nothing is imported for it: a script that never loads DeepSpeed is left
    as it is."""

    patched: list = []

    def patch(module) -> None:
        if hasattr(module, "build_shm_op"):
            patched.append((module, module.build_shm_op))
            module.build_shm_op = _no_shm_op

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != _DS_TORCH:
                return None
            sys.meta_path.remove(self)  # the module's own spec, found without this finder
            try:
                spec = importlib.util.find_spec(fullname)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            run = spec.loader.exec_module

            def exec_module(module) -> None:
                run(module)
                patch(module)

            spec.loader.exec_module = exec_module
            return spec

    finder = Finder()
    if _DS_TORCH in sys.modules:
        patch(sys.modules[_DS_TORCH])
    else:
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        for module, real in patched:
            module.build_shm_op = real


def run_script(ctx, path: str, argv: list[str], extra: contextlib.AbstractContextManager
               | None = None, asked: dict | None = None,
               output: list[str] | None = None) -> list[tuple]:
    """On a rank: ``path`` run as ``__main__`` with ``argv`` under the watcher, with torchrun's
    variables and, as ``python path`` has it, the script's folder first on ``sys.path`` (its
    own modules import); its entries as plain tuples (``Entry`` fields), for the driver.
    ``extra``: a context the script also runs in; ``asked``: filled with the keywords the script
    gave ``init_process_group`` (``called``: whether it did); ``output``: given, what the script
    printed is kept (:class:`_Kept`) and appended to it, also when the script raises."""

    ctx.tracker.start_task(os.path.basename(path))  # a hang report names the script
    saved, folder = sys.argv, os.path.dirname(os.path.abspath(path))
    sys.argv = [path, *argv]
    sys.path.insert(0, folder)
    steps.restart()
    kept = _Kept() if output is not None else None
    try:
        with _process_group_kept(asked), _looks_like_torchrun(ctx), steps.profiler_steps(), \
                _deepspeed_without_its_cpu_op(), extra or contextlib.nullcontext(), \
                _printing_to(kept):
            entries = audit(runpy.run_path, path, run_name="__main__", ledger=ctx.ledger,
                            script=os.path.abspath(path), tracker=ctx.tracker)
    finally:
        sys.argv = saved
        if folder in sys.path:
            sys.path.remove(folder)
        if kept is not None:
            output.append(kept.text())
    return [tuple(e) for e in entries]


@contextlib.contextmanager
def _printing_to(kept: _Kept | None):
    if kept is None:
        yield
        return
    with contextlib.redirect_stdout(kept), contextlib.redirect_stderr(kept):
        yield


def script_rank(ctx, path: str, argv: list[str], extra: contextlib.AbstractContextManager
                | None = None, shown: tuple[int, ...] = (0,)) -> dict:
    """On a rank, for ``commbench audit``: :func:`run_script`'s entries with what the script
    printed (``output``: kept on the ``shown`` ranks only, '' on the others, so that a large
    world sends rank 0 no more than it prints), whether it called init_process_group
    (``initialised``) and the keywords it gave it a value (``asked``: their names; the values
    need not pickle)."""
    asked: dict = {}
    output: list[str] | None = [] if ctx.rank in shown else None
    entries = run_script(ctx, path, argv, extra=extra, asked=asked, output=output)
    return {"entries": entries, "output": output[0] if output else "",
            "initialised": bool(asked.get("called")),
            "asked": sorted(k for k, v in asked.items() if k != "called" and v is not None)}


def tables(per_rank: list[list[tuple]]) -> dict:
    """Per (group, op, dtype, redop, phase, peer, process group, object collective): calls,
    elements, bytes sent and tensor bytes of the busiest rank, host and (GPU) device seconds
    summed over calls (slowest rank), ranks that made such calls; per module: calls and bytes
    of the busiest rank, a call whose buffer holds the tensors of several modules (a bucket of
    gradients) counted under each, its bytes shared in proportion. Two groups of the same
    ranks are two rows (``pg``, their own names), and the tensor calls an object collective is
    made of say which (``api``)."""
    fields = ("calls", "elements", "sent", "tensor_bytes", "seconds", "device_seconds")
    groups: dict[tuple, dict] = {}
    modules: dict[str, dict] = {}
    for entries in per_rank:
        mine: dict[tuple, list] = {}
        by_module: dict[str, list] = {}
        for e in map(Entry._make, entries):
            key = (e.group, e.op, e.dtype, e.redop or "-", e.phase or "-", e.peer, e.pg, e.api)
            acc = mine.setdefault(key, [0, 0, 0, 0, 0.0, 0.0])
            for i, v in enumerate((1, e.count, e.sent, e.nbytes, e.seconds, e.device_seconds)):
                acc[i] += v
            carries = e.carries if sum(k for _, k in e.carries) else \
                ((e.module or "(no module)", 1),)
            total = sum(k for _, k in carries)
            for name, k in carries:  # a buffer's bytes to each module it holds, in proportion
                acc = by_module.setdefault(name, [0, 0])
                acc[0] += 1
                acc[1] += e.sent * k // total
        for key, acc in mine.items():
            row = groups.setdefault(key, {"ranks": 0, **dict.fromkeys(fields, 0)})
            row["ranks"] += 1
            row.update({f: max(row[f], v) for f, v in zip(fields, acc, strict=True)})
        for name, (calls, sent) in by_module.items():
            row = modules.setdefault(name, {"calls": 0, "sent": 0})
            row.update(calls=max(row["calls"], calls), sent=max(row["sent"], sent))
    group_rows = [{"group": list(k[0]), "op": k[1], "dtype": k[2], "redop": k[3],
                   "phase": k[4], "peer": k[5], "pg": k[6], "api": k[7], **row}
                  for k, row in groups.items()]
    names: dict[tuple, set] = {}  # the process groups of each set of ranks
    for r in group_rows:
        names.setdefault(tuple(r["group"]), set()).add(r["pg"])
    for r in group_rows:  # a group's name is said only where its ranks have several groups
        r["pg"] = r["pg"] if len(names[tuple(r["group"])]) > 1 else ""
    module_rows = [{"module": name, **row} for name, row in sorted(modules.items())]
    return {"groups": group_rows, "modules": module_rows, "steps": step_rows(per_rank)}


def step_rows(per_rank: list[list[tuple]]) -> list[dict]:
    """Per step the script marked (0: set-up), the busiest rank's calls and bytes sent; [] when
    it marks none."""
    rows: dict[int, dict] = {}
    for entries in per_rank:
        mine: dict[int, list[int]] = {}
        for e in map(Entry._make, entries):
            acc = mine.setdefault(step_of(e.scope), [0, 0])
            acc[0] += 1
            acc[1] += e.sent
        for n, (calls, sent) in mine.items():
            row = rows.setdefault(n, {"step": n, "calls": 0, "sent": 0})
            row.update(calls=max(row["calls"], calls), sent=max(row["sent"], sent))
    return [rows[n] for n in sorted(rows)] if any(rows) else []


def in_steps(entries: list[tuple], first: int, count: int) -> list[tuple]:
    """The entries of steps ``first`` .. ``first + count - 1``."""
    return [t for t in entries if first <= step_of(Entry._make(t).scope) < first + count]


def _group_cell(row: dict) -> str:
    """The group; a point-to-point call's also names its peer (``[0, 1] to 1``); where several
    process groups have those ranks, the group's own name too (``[0, 1] pg 2``)."""
    peer, named = row.get("peer", -1), f" pg {row['pg']}" if row.get("pg") else ""
    group = rank_list(row["group"])  # a big job's group as ranges (``[0-511] (512 ranks)``)
    if peer is None or peer < 0:
        return f"{group}{named}"
    return f"{group}{named} {'to' if row['op'] in ('send', 'isend') else 'from'} {peer}"


def _op_cell(row: dict) -> str:
    """The op; a part of an object collective says whose (``all_gather (all_gather_object)``)."""
    return f"{row['op']} ({row['api']})" if row.get("api") else row["op"]


def audit_markdown(record: dict) -> str:
    head = markdown(dict(record, rows=[])).rstrip()
    device = any(r.get("device_seconds") for r in record["rows"]["groups"])
    groups = tabulate([[_group_cell(r), _op_cell(r), r["dtype"] or "-", r["redop"], r["phase"], r["calls"],
                        r["elements"], r["sent"], r["tensor_bytes"], f"{r['seconds'] * 1e6:.0f}"]
                       + ([f"{r['device_seconds'] * 1e6:.0f}"] if device else [])
                       for r in record["rows"]["groups"]],
                      headers=["group", "op", "dtype", "redop", "phase", "calls", "elements",
                               "sent(B)", "tensor(B)", "host time(us)"]
                      + (["device time(us)"] if device else []), tablefmt="github")
    modules = tabulate([[r["module"], r["calls"], r["sent"]] for r in record["rows"]["modules"]],
                       headers=["module", "calls", "sent(B)"], tablefmt="github")
    text = (f"{head}\n\nPer group (the busiest rank's figures; bytes sent as the ledger books "
            f"them, tensor bytes as the call passed them):\n\n{groups}\n\nPer module:\n\n"
            f"{modules}\n")
    if record["rows"].get("steps"):
        per_step = tabulate([[r["step"] or "set-up", r["calls"], r["sent"]]
                             for r in record["rows"]["steps"]],
                            headers=["step", "calls", "sent(B)"], tablefmt="github")
        text += (f"\nPer step the script marked (commbench.audit.step(); set-up: the calls "
                 f"outside every step):\n\n{per_step}\n")
    lay = record.get("layout")
    if lay:
        rows, verdict = layout_tables(lay, "audited")
        which = (f"rank 0's calls in steps {lay['step']}..{lay['step'] + lay['steps'] - 1} "
                 f"the script marked" if lay.get("step") else "rank 0's calls, the whole script")
        text += (f"\nAgainst the layout `{lay['spec']}` ({which}, by axis; elements per "
                 f"call):\n\n{rows}\n\n{verdict}\n")
    return text

