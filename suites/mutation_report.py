"""``make mutate``'s report: mutmut's results (``mutants/**/*.meta``) as results/mutation.md.

Per module: mutants killed (a test failed, or the mutant hung past mutmut's timeout), survived
(every selected test passed), and without a test (functions only tests on a local world's ranks
reach, which mutmut does not trace). The score is killed / (killed + survived). Every survivor
is listed with its diff and, where it was judged, why it is equivalent; the others are open.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict

# survivors judged equivalent: mutant name (module.x_function__mutmut_N) -> why
_V = "commbench.timing.verify."
_S = "commbench.studies.sweep."
REASONS: dict[str, str] = {
    _V + "x_pattern__mutmut_1": "the default reduction spelled otherwise takes the same branch as "
                                "sum (every other name does)",
    _V + "x_pattern__mutmut_2": "the same: 'SUM' takes sum's branch",
    _V + "x_pattern__mutmut_7": "torch.arange of Python ints is int64 without dtype=",
    _V + "x_pattern__mutmut_9": "the same: int64 is arange's default for ints",
    _V + "x_pattern__mutmut_50": "`.to(None)` keeps the tensor where it is: the same on the CPU "
                                 "these tests run on (make gpu-check runs the device path)",
    _V + "x__reduce__mutmut_3": "stacking in the dtype instead of float64: the patterns' small "
                                "integers sum and multiply exactly in every dtype (their ranges "
                                "are chosen for it)",
    _V + "x__reduce__mutmut_38": "an integer result converted from float64 directly instead of "
                                 "through int64 differs only on overflow, which the patterns' "
                                 "ranges never reach",
    "commbench.results.compare.x_compare__mutmut_45": "float('NAN') is float('nan')",
    _S + "x_format_row__mutmut_31": "float('NAN') is float('nan')",
    "commbench.patterns.pp.schedule.x_schedule__mutmut_81": "None is as false as False: the "
                                                            "backward order is the same",
    _S + "x_merge_rounds__mutmut_16": "the rounds' rows differ only in the fields merge_rounds "
                                      "sets again (times, wrong, bandwidths); copying round 1's "
                                      "row instead of round 0's changes nothing",
}
_A = "commbench.studies.audit_layout."
_M = "commbench.wire.modules."
_FALSY = "None where the code has 0 or '': both false, and only tested for truth"
_SELF = ("a peer of 0 is rank 0 itself, and the comparison reads rank 0's calls: a rank posts "
         "no point-to-point call to itself")
_DEPTH = ("the stack walk's bound one frame longer: the same on every stack the walk meets "
          "within 64 frames")
REASONS |= {
    _A + "x__predicted__mutmut_12": _FALSY, _A + "x_compare__mutmut_111": _FALSY,
    _A + "x_compare__mutmut_113": _FALSY, _A + "x_compare__mutmut_28": _SELF,
    _A + "x_compare__mutmut_29": _SELF, _A + "x_compare__mutmut_47": _SELF,
    _A + "x_compare__mutmut_48": _SELF,
    _M + "x__says__mutmut_5": "stripping blanks instead of '_': the split on '_' then leaves "
                              "empty words, which say nothing",
    _M + "x__says__mutmut_6": "the same: stripping 'X' and '_' leaves the same words",
    _M + "x__batch_says__mutmut_28": "a kind no batch names instead of '': neither is in the "
                                     "batch's description",
    _M + "x__batch_says__mutmut_38": "a way no table names instead of '': both say nothing",
    _M + "x__batch_says__mutmut_40": _FALSY, _M + "x__batch_says__mutmut_42": _FALSY,
    _M + "x__optimizer_step__mutmut_8": "a method's self is its first argument: the first two "
                                        "names hold it just the same",
    _M + "x_library_module__mutmut_1": _DEPTH, _M + "x_library_phase__mutmut_2": _DEPTH,
    _M + "x_library_phase__mutmut_1": "an op that is neither a send nor a receive, as '' is: "
                                      "every caller names its op",
    _M + "x_library_module__mutmut_42": "a backslash appears only in Windows paths",
    _M + "x_library_module__mutmut_43": "the same: no backslash to replace on POSIX",
    _M + "x_library_module__mutmut_21": "an FSDP2 parameter group always has its modules: "
                                        "getattr finds them without a default",
    "commbench.results.lock.x__acquire__mutmut_34": "a pid has at most 7 digits (Linux's "
                                                    "pid_max): 32 or 33 bytes read it whole",
    "commbench.results.lock.x__acquire__mutmut_47": "truncating to 1 byte, then writing the pid "
                                                    "of at least 1 digit from byte 0, leaves the "
                                                    "same file",
}
# judged by the shape of the change, for every function
TEXT_ONLY = "only the wording of an error message; the tests match the rule it names"
CUDA_ONLY = "the CUDA path, which runs on a GPU only (make gpu-check)"
# functions whose tests run on a local world's ranks, which mutmut does not trace: their
# survivors are open until a single-process test reaches them
WORLD_ONLY = {"commbench.costmodel.layout.x__calls": "held by tests/test_layout.py's ledger "
              "equalities on a local world, which mutmut does not run"}


def _classify(code) -> str:
    if code is None:
        return "not run"
    if code == 33:
        return "no tests"
    if code == 0:
        return "survived"
    if code in (-24, 36, 24):
        return "timeout"
    return "killed"


def _diff(name: str, source: str) -> list[str]:
    """The mutant's changed lines: mutmut's own diff, in this process (a ``mutmut show`` per
    survivor took a second each), or from ``mutmut show`` where its API has moved."""
    try:
        from mutmut.mutation.diff_apply import get_diff_for_mutant

        text = get_diff_for_mutant(name, path=source)
    except (ImportError, OSError, TypeError, ValueError):
        text = subprocess.run([os.path.join(os.path.dirname(sys.executable), "mutmut"), "show",
                               name], capture_output=True, text=True).stdout
    return [line for line in text.splitlines()
            if line.startswith(("-", "+")) and not line.startswith(("---", "+++"))]


def _reason(name: str, diff: list[str]) -> str:
    if name in REASONS:
        return REASONS[name]
    minus = [d[1:] for d in diff if d.startswith("-")]
    plus = [d[1:] for d in diff if d.startswith("+")]
    if minus and all("raise " in m for m in minus) and all("raise " in p for p in plus):
        return TEXT_ONLY
    if minus and all("cuda" in m or "elapsed_time" in m for m in minus):
        return CUDA_ONLY
    if name.split("__mutmut_")[0] in WORLD_ONLY:
        return "open: " + WORLD_ONLY[name.split("__mutmut_")[0]]
    return "open: not yet killed"


def main() -> int:
    results: dict[str, Counter] = defaultdict(Counter)
    survivors = []  # (mutant, its source file)
    for meta in sorted(glob.glob("mutants/**/*.meta", recursive=True)):
        with open(meta) as f:
            data = json.load(f)
        for name, code in sorted(data.get("exit_code_by_key", {}).items()):
            module = re.split(r"\.x(?:_|ǁ)", name)[0]  # a function's, or a class's method's
            kind = _classify(code)
            results[module][kind] += 1
            if kind == "survived":
                survivors.append((name, os.path.relpath(meta[:-len(".meta")], "mutants")))
    if not results:
        print("no mutmut results under mutants/: run `make mutate`", file=sys.stderr)
        return 2
    total = Counter()
    for c in results.values():
        total.update(c)
    dead = total["killed"] + total["timeout"]
    score = dead / (dead + total["survived"]) if dead + total["survived"] else float("nan")
    lines = ["# Mutation testing", "",
             "`make mutate`: mutmut over the pure modules of `[tool.mutmut]` in pyproject.toml, "
             "run against the single-process tests listed there. Killed: a test failed or the "
             "mutant hung; no tests: functions only the tests on a local world's ranks reach "
             "(mutmut does not trace them), not counted in the score.", "",
             f"**Score: {dead} of {dead + total['survived']} mutants with tests killed "
             f"({score:.1%})**; {total['no tests']} without a test, {total['not run']} not run.",
             "", "| module | killed | timeout | survived | no tests | score |",
             "| --- | --- | --- | --- | --- | --- |"]
    for module, c in sorted(results.items()):
        d = c["killed"] + c["timeout"]
        s = f"{d / (d + c['survived']):.1%}" if d + c["survived"] else "-"
        lines.append(f"| `{module}` | {c['killed']} | {c['timeout']} | {c['survived']} | "
                     f"{c['no tests']} | {s} |")
    lines += ["", "## Survivors", "", "| mutant | change | why it survives |", "| --- | --- | --- |"]
    open_ = 0
    for name, source in survivors:
        diff = _diff(name, source)
        why = _reason(name, diff)
        open_ += why.startswith("open")
        change = " / ".join(d.strip() for d in diff[:2]).replace("|", "\\|")
        lines.append(f"| `{name}` | `{change[:160]}` | {why} |")
    lines += ["", f"{open_} survivors open, {len(survivors) - open_} judged equivalent."]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
