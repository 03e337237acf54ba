"""``commbench audit SCRIPT [ARGS]``: run a training script on every rank under the watcher and
print (and write) every collective it issued, per group and per module (studies/audit.py)."""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
import threading
import time

from commbench.cli import checks
from commbench.cli.common import UsageError
from commbench.results import records as res
from commbench.results.files import kind_of
from commbench.results.machine import machine_class
from commbench.results.trace import chrome_trace
from commbench.studies.audit import audit_markdown, in_steps, script_rank, tables
from commbench.studies.audit_layout import compare, parse_layout
from commbench.studies.audit_nccl import findings, run_script_nccl
from commbench.traces.write import kineto_traces
from commbench.wire.ledger import Entry

__all__ = ["add_parser", "command"]


NCCL_TIMING = "TORCH_NCCL_ENABLE_TIMING"


def add_parser(sub) -> None:
    a = sub.add_parser("audit", help="every collective a script of yours issues, per group and "
                       "per module",
                       description="Runs your script on every rank and books every collective "
                       "it issues. Example: commbench audit examples/torch_tp_sp.py --np 2 (the "
                       "script's own arguments after --)")
    a.add_argument("script", help="a Python script, run as __main__ on every rank")
    a.add_argument("args", nargs="*", help="its arguments (put them after --)")
    checks.world_options(a, np=2, timeout=None)
    a.add_argument("--timeout", type=float, default=None,
                   help="seconds before the script's run counts as a hang (default: none, a "
                        "training script may run for hours)")
    a.add_argument("--trace", default="", metavar="FILE", help="also write every rank's calls "
                   "as a Chrome trace (open it in Perfetto or chrome://tracing)")
    a.add_argument("--kineto", default="", metavar="DIR",
                   help="also write one Kineto-shaped trace per rank (record_param_comms with "
                        "torch's arguments) for commbench analyze and replay")
    a.add_argument("--layout", default="", metavar="SPEC",
                   help="compare rank 0's calls with this layout's (the predict layout flags: "
                        "tp=2,sp,hidden=4096,...; with pp > 1 rank 0 is the first stage, "
                        "loss=none); exit 1 on a difference")
    a.add_argument("--nccl", nargs="?", const="auto", default=None,
                   choices=("auto", "eager", "lazy"),
                   help="replay the script's calls and group creations under NCCL's rules and "
                   "report what would hang or fail there, with the ranks, calls and lines (exit "
                   "1 on a finding); the init mode the script asks for (device_id given: eager), "
                   "or the one named")
    a.add_argument("--output", default="0", metavar="RANKS",
                   help="whose printed output to show, before the tables: 0 (rank 0's, the "
                        "default), a list of ranks (0,3), all, or none")
    a.add_argument("--step", type=int, default=None, metavar="N",
                   help="compare only step N (from 1) of those the script marks with "
                        "commbench.audit.step(); default: the whole script")
    a.add_argument("--steps", type=int, default=1, metavar="K",
                   help="with --step: compare K steps from N (default 1)")


def command(a) -> int:
    """The audit; the environment variable it sets for NCCL's timing is taken back after it
    (a command run inside another program, a test session's, leaves that program's
    environment as it found it)."""
    before = os.environ.get(NCCL_TIMING)
    try:
        return _audit(a)
    finally:
        if before is None:
            os.environ.pop(NCCL_TIMING, None)


def _audit(a) -> int:
    if not os.path.isfile(a.script):
        what = kind_of(a.script)
        raise UsageError(f"{a.script}: is {what}; a script must be a regular file" if what
                         else f"{a.script}: no such script")
    try:  # refused before any rank starts, as python would refuse it
        with open(a.script, "rb") as f:
            compile(f.read(), a.script, "exec")
    except SyntaxError as exc:
        raise UsageError(f"{a.script}:{exc.lineno}: syntax error: {exc.msg}") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{a.script}: cannot be read as Python ({exc})") from None
    missing = _missing_imports(a.script)
    if missing:
        name, line = missing[0]
        extra = (": install the libs extra (pip install 'commbench[libs]')"
                 if name in LIBS_EXTRA else "")
        raise UsageError(f"{a.script}:{line}: imports {name}, which is not installed here"
                         f"{extra}")
    checks.check_world(a)
    size, launcher = a.world_size, a.launcher
    if a.trace:
        checks.check_file(a.trace, "--trace")
    if a.kineto:
        checks.check_out(a.kineto, "--kineto")
    if a.step is not None and (a.step < 1 or a.steps < 1):
        raise UsageError(f"--step {a.step} --steps {a.steps}: both must be >= 1")
    shown = _shown(a.output, size)
    if a.step is not None and not a.layout:
        raise UsageError(f"--step {a.step}: selects the steps --layout compares; give --layout")
    lay = None
    if a.layout:
        try:
            lay = parse_layout(a.layout, size)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    # NCCL records each collective's start and end on the GPU (the device time of the tables)
    os.environ.setdefault(NCCL_TIMING, "1")
    # the script's own collectives may be on CPU tensors beside CUDA ones (its backend string
    # "cpu:gloo,cuda:nccl"): the world gives both a backend; a rank whose script raises ends the
    # audit within seconds, naming it (its peers would wait in the collective it never joins
    # until the timeout); without --timeout a local audit has no limit
    pg_backend = None
    if launcher:  # a local world imports torch once its ranks' processes exist (start_world)
        # lazy: imports torch
        import torch

        pg_backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else None
    world, prints = checks.open_world(a, local_timeout_s=float("inf"), stop_on_raise=True,
                                      pg_backend=pg_backend)
    if launcher and checks.refused_together(world, getattr(a, "host_refusal", ""), prints):
        world.close()
        return 2
    path = os.path.abspath(a.script)
    try:
        checks.start_world(world, prints)
        with _still_running(os.path.basename(a.script), prints):
            if a.nccl:
                full = world.run(run_script_nccl, path, list(a.args), shown=tuple(shown))
            else:
                full = world.run(script_rank, path, list(a.args), shown=tuple(shown))
            per_rank = [out["entries"] for out in full]
    finally:
        world.close()
    if prints:
        for r in shown:
            text = full[r]["output"]
            if text:
                print(f"# rank {r}'s output:\n{text.rstrip()}\n# (end of rank {r}'s output)")
    record = res.header("audit", size, f"local-{world.launch}" if not launcher else launcher,
                        machine_class(a.label), {"what": "the calls a script issued, booked"})
    record["script"] = os.path.basename(a.script)
    record["rows"] = tables(per_rank)
    # every rank's calls in order, what commbench replay re-issues
    record["calls"] = [[Entry._make(t).as_dict() for t in es] for es in per_rank]
    if lay is not None:
        mine, steps = per_rank[0], 1
        if a.step is not None:
            mine, steps = in_steps(mine, a.step, a.steps), a.steps
            marked = {r["step"] for r in record["rows"]["steps"]} - {0}
            # more steps than marked cannot all be: said without listing them (--steps 10^11)
            if a.steps > len(marked) or not set(range(a.step, a.step + a.steps)) <= marked:
                raise UsageError(f"--step {a.step} --steps {a.steps}: the script marked steps "
                                 f"{sorted(marked) or 'none'} (commbench.audit.step())")
        record["layout"] = {"spec": a.layout, "settings": lay.as_dict(), "step": a.step,
                            "steps": steps, **compare(lay, mine, steps)}
    text = audit_markdown(record)
    if prints:
        print(text)
        if not a.no_write:
            stem = os.path.join(a.out, f"audit_{os.path.splitext(record['script'])[0]}_"
                                       f"{machine_class(a.label)}-x{size}")
            res.write_json(stem + ".json", record)
            res.write_atomic(stem + ".md", text)
            print(f"# wrote {stem}.json and {stem}.md")
        if a.trace:
            res.write_json(a.trace, chrome_trace([(record['script'], per_rank)]))
            print(f"# wrote {a.trace}")
        if a.kineto:
            os.makedirs(a.kineto, exist_ok=True)
            for r, doc in enumerate(kineto_traces(per_rank)):
                res.write_json(os.path.join(a.kineto, f"rank{r}.pt.trace.json"), doc)
            print(f"# wrote {size} traces under {a.kineto}")
    flags = record.get("layout", {}).get("flags", [])
    if prints and flags:
        print(f"# {len(flags)} difference(s) from the layout:", *flags, sep="\n#   ")
        print(f"commbench audit: {len(flags)} difference(s) from the layout {a.layout}",
              file=sys.stderr)
    alone = [r for r, out in enumerate(full) if not out["initialised"]]
    calls = sum(len(es) for es in per_rank)
    if alone and calls and prints:  # rank 0's line, not one per rank of a launched world
        print(f"commbench audit: {a.script} never calls torch.distributed.init_process_group "
              f"(itself or through a library) on ranks {_ranks(alone)}, yet its ranks issued "
              f"{calls} call(s): launched by torchrun, srun or mpirun its first would fail "
              "(the default process group is not initialised)", file=sys.stderr)
    found: list[str] = []
    if a.nccl:
        why, found = findings(full, a.nccl)
        if prints:
            print(f"# NCCL's rules ({why}): " + (f"{len(found)} finding(s)" if found else
                                                 "nothing would hang or fail"))
            for line in found:
                print(f"#   {line}")
            if found:
                print(f"commbench audit: NCCL would hang or fail on {a.script}: {len(found)} "
                      "finding(s)", file=sys.stderr)
    return 1 if flags or found or (alone and calls) else 0


def _shown(spec: str, size: int) -> list[int]:
    """The ranks ``--output`` names, refused before any rank starts if out of the world."""
    if spec in ("none", ""):
        return []
    if spec == "all":
        return list(range(size))
    try:
        ranks = [int(x) for x in spec.split(",")]
    except ValueError:
        raise UsageError(f"--output {spec}: must be 0, a list of ranks (0,3), all or none") \
            from None
    bad = [r for r in ranks if not 0 <= r < size]
    if bad:
        raise UsageError(f"--output {spec}: rank {bad[0]} is not in the world of {size} "
                         f"(0..{size - 1})")
    return sorted(set(ranks))


def _ranks(ranks: list[int]) -> str:
    return str(ranks) if len(ranks) <= 8 else f"[{', '.join(map(str, ranks[:8]))}, ...]"


# what the libs extra brings (pyproject.toml): a script importing them gets its install line
LIBS_EXTRA = ("deepspeed", "megatron")


def _missing_imports(script: str) -> list[tuple[str, int]]:
    """(package, line) of each module the script imports that cannot be found here, outside a
    ``try`` that catches ImportError: refused before any rank starts, where every rank would
    otherwise fail with the same traceback. The script's folder is searched first, as
    ``python script`` would."""

    with open(script, "rb") as f:
        tree = ast.parse(f.read(), script)
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                h.type is None or any(n in ast.unparse(h.type) for n in
                                      ("ImportError", "ModuleNotFoundError", "Exception"))
                for h in node.handlers):
            guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    wanted: dict[str, int] = {}
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                wanted.setdefault(alias.name.split(".")[0], node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module != "__future__":
            wanted.setdefault(node.module.split(".")[0], node.lineno)
    folder = os.path.dirname(os.path.abspath(script))
    sys.path.insert(0, folder)
    try:
        return [(name, line) for name, line in sorted(wanted.items(), key=lambda kv: kv[1])
                if importlib.util.find_spec(name) is None]
    finally:
        sys.path.remove(folder)


class _still_running:
    """A line on stderr when the script is still running after 10 s, then every 60 s: its
    imports and set-up (DeepSpeed builds its ops on a first run) can take minutes."""

    def __init__(self, script: str, prints: bool, first_s: float = 10.0,
                 every_s: float = 60.0) -> None:
        self.script, self.prints, self.first_s, self.every_s = script, prints, first_s, every_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._say, daemon=True)

    def _say(self) -> None:
        t0, wait = time.monotonic(), self.first_s
        while not self.done.wait(wait):
            print(f"# audit: {self.script} still running after {time.monotonic() - t0:.0f} s "
                  "(imports, set-up or a library building its ops on a first run)",
                  file=sys.stderr, flush=True)
            wait = self.every_s

    def __enter__(self):
        if self.prints:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join()
