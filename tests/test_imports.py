"""The package's import graph: no module imports itself back through others (lazy imports in
function bodies included, and the operators a pattern names as ``"module:attribute"``), and no
module imports from a floor above its own.

Floors, lowest first: the names and the collectives' records (commbench.ops) every layer
shares; the runtime (launchers, groups, errors, the supervisor); the wire (comms, ledger,
transports, NCCL's rules); the world a rank is given (context, local and launched worlds), the
timing loop and the result records; the collective algorithms; the patterns; the cost model; the
studies; the command line and the pytest plugin.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.foundation

ROOT = os.path.join(os.path.dirname(__file__), "..", "commbench")
NAMED = re.compile(r"^([a-z_][a-z0-9_.]*):\w*$")  # a pattern's part: "seq.ulysses_comms:s2h"
NAMING = ("commbench.patterns", "commbench.collectives")  # the packages whose records name parts
FLOORS = {"names": 0, "ops": 0, "rankset": 0, "version": 0, "verdict": 0, "runtime": 1,
          "wire": 2, "world": 3, "timing": 3, "results": 3, "collectives": 4, "patterns": 5,
          "costmodel": 6, "studies": 7, "traces": 7, "cli": 8, "pytest_plugin": 8, "__main__": 8, "": 8}


def modules(root: str = ROOT) -> dict[str, str]:
    """Dotted module name -> file, for every module of the package under ``root``."""
    out = {}
    base = os.path.dirname(os.path.abspath(root))
    for folder, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, base)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    return out


@functools.cache
def _tree(path: str) -> ast.Module:
    """A file's syntax tree, parsed once for every check of the session."""
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read())


@functools.cache
def _strings(path: str) -> frozenset[str]:
    """Every string literal of a file, lower-cased."""
    return frozenset(n.value.lower() for n in ast.walk(_tree(path))
                     if isinstance(n, ast.Constant) and isinstance(n.value, str))


def imports(name: str, path: str, known: dict[str, str]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its file."""
    tree = _tree(path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            found |= set(resolved(package, node, known))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                NAMED.match(node.value):
            for home in NAMING:  # a record's named part: "ring_comms:ring_all_reduce"
                if name.startswith(home):
                    found.add(f"{home}.{NAMED.match(node.value).group(1)}")
    return {m for m in found if m in known and m != name}


def resolved(package: str, node: ast.Import | ast.ImportFrom, known: dict[str, str]) -> list[str]:
    """The modules an import statement in ``package`` imports, one per name: ``import a.b``'s
    names; ``from m import x``'s ``m.x`` where that is one of ``known``'s modules, else ``m``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        parts = package.split(".")[:len(package.split(".")) - node.level + 1]
        module = ".".join(parts + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    return [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]


def graph(root: str = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {m: imports(m, p, known) for m, p in known.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for start in sorted(g):
        if start in index:
            continue
        work = [(start, iter(sorted(g[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                part = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    part.append(w)
                    if w == v:
                        break
                if len(part) > 1:
                    out.append(sorted(part))
    return out


def floor(module: str) -> int:
    part = module.split(".")[1] if "." in module else ""
    return FLOORS[part]


def upward(g: dict[str, set[str]]) -> list[str]:
    return [f"{m} (floor {floor(m)}) imports {d} (floor {floor(d)})"
            for m in sorted(g) for d in sorted(g[m]) if floor(d) > floor(m)]


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_no_import_from_a_higher_floor():
    assert upward(graph()) == []


def test_every_top_level_part_has_a_floor():
    assert {m.split(".")[1] if "." in m else "" for m in graph()} <= set(FLOORS)


def test_the_checks_catch_a_cycle_and_an_upward_import(tmp_path):
    """Negative: a package whose runtime imports a pattern lazily, and the pattern the runtime."""
    pkg = tmp_path / "commbench"
    for sub in ("runtime", "patterns"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "runtime" / "a.py").write_text("def f():\n    from commbench.patterns import b\n")
    (pkg / "patterns" / "b.py").write_text("from ..runtime import a\n")
    g = graph(str(pkg))
    assert cycles(g) == [["commbench.patterns.b", "commbench.runtime.a"]]
    assert upward(g) == ["commbench.runtime.a (floor 1) imports commbench.patterns.b (floor 5)"]
    (pkg / "patterns" / "c.py").write_text('PARTS = "d:Parts"\n')
    (pkg / "patterns" / "d.py").write_text("from commbench.patterns import c\n")
    assert ["commbench.patterns.c", "commbench.patterns.d"] in cycles(graph(str(pkg)))


def test_every_named_part_is_there():
    """Each pattern's parts and broken parts, named as strings, name something that exists."""
    from commbench.patterns.base import named
    from commbench.patterns.registry import PATTERNS

    for p in PATTERNS.values():
        assert callable(named(p.parts_from)), p.name
        for b in p.broken:
            for part, where in b.parts.items():
                assert callable(named(where)), (p.name, b.name, part)
                assert hasattr(p.parts, part), (p.name, b.name, part)


def test_every_named_algorithm_part_is_there():
    """Each algorithm's function, parts and broken parts, named as strings, exist; a broken
    part replaces one its parts have."""
    from commbench.collectives import ALGORITHMS
    from commbench.collectives.algorithm import resolve

    for (op, name), r in ALGORITHMS.items():
        assert r.fn is None or callable(r.function), (op, name)
        for b in r.broken:
            for part, where in b.parts.items():
                assert callable(resolve(where)), (op, name, b.name, part)
                assert hasattr(r.parts_of(), part), (op, name, b.name, part)


def test_each_algorithm_keeps_its_code_beside_its_record():
    """An algorithm's record is in its family's file and names its code in the family's
    ``_comms`` (a compiled schedule: the engine, :mod:`commbench.collectives.compiled`)."""
    import inspect

    from commbench.collectives import ALGORITHMS

    for (op, name), r in ALGORITHMS.items():
        if r.fn is None:
            continue
        home = "compiled.schedule" if r.compiled else \
            f"{inspect.getmodule(r.elements).__name__.rpartition('.')[2]}_comms"
        assert r.fn.partition(":")[0] == home, (op, name, r.fn)
        for b in r.broken:
            for where in b.parts.values():
                assert not isinstance(where, str) or where.partition(":")[0] == home, \
                    (op, name, b.name, where)


def test_each_pattern_keeps_its_operators_and_broken_parts_beside_its_record():
    """A pattern's broken parts sit with its own operators: in the module of its parts, which
    is its record's ``<name>_comms.py`` or its family's shared one."""
    import inspect

    from commbench.patterns.registry import PATTERNS

    for p in PATTERNS.values():
        record = inspect.getmodule(type(p)).__name__.removeprefix("commbench.patterns.")
        assert record.rpartition(".")[2] in (p.name, "tp_layer"), (p.name, record)  # tp_mlp
        homes = {p.parts_from.partition(":")[0], f"{record}_comms"}
        for b in p.broken:
            for where in b.parts.values():
                assert where.partition(":")[0] in homes, (p.name, b.name, where)


def test_the_records_the_layout_prediction_and_the_listing_import_no_torch():
    """The pattern and algorithm records, ``predict layout`` and ``list`` answer without torch
    or hypothesis (each costs about a second to import)."""
    code = ("import sys, contextlib, io\n"
            "import commbench.patterns.registry, commbench.costmodel.layout\n"
            "import commbench.collectives\n"
            "from commbench.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['predict', 'layout', '--tp', '2', '--dp', '2', '--cp', '2', '--pp', '2', "
            "'--experts', '4', '--ep', '2'])\n"
            "    main(['list'])\n"
            "print(sorted(m for m in ('torch', 'hypothesis') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)


def mutual_families(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Pairs of pattern families (patterns/<family>/) that import each other."""
    fam: dict[str, set[str]] = {}
    for m, deps in g.items():
        parts = m.split(".")
        if len(parts) > 3 and parts[1] == "patterns":
            for d in deps:
                dp = d.split(".")
                if len(dp) > 3 and dp[1] == "patterns" and dp[2] != parts[2]:
                    fam.setdefault(parts[2], set()).add(dp[2])
    return sorted((a, b) for a in fam for b in fam[a] if a < b and a in fam.get(b, set()))


def test_no_two_pattern_families_import_each_other():
    """A family (patterns/<family>/) may build on another, never both ways: what two share sits
    one level up (patterns/mappings.py, patterns/buckets.py)."""
    assert mutual_families(graph()) == []
    # the check itself: tp's layer taking DDP from dp while dp's pattern builds on tp's layer
    assert mutual_families({"commbench.patterns.tp.tp_layer_comms": {"commbench.patterns.dp.x"},
                            "commbench.patterns.dp.ddp": {"commbench.patterns.tp.y"}}) == \
        [("dp", "tp")]


def modules_spelling(word: str, root: str = ROOT) -> list[str]:
    """The package modules that spell ``word`` as a string literal (any quotes, any case)."""
    hits = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                if word in _strings(path):
                    hits.append(os.path.relpath(path, root))
    return sorted(hits)


@pytest.mark.parametrize("word", ["broadcast", "reduce", "gather", "scatter", "barrier", "hsdp"])
def test_a_thing_no_other_names_is_spelled_in_at_most_three_modules(word):
    """A collective that no pattern names lives in its record (ops.py), its comm-layer method
    and its algorithms' schedule; a pattern in its family's file, its operators and the registry.
    Every other module asks the record."""
    assert len(modules_spelling(word)) <= 3, modules_spelling(word)


def test_the_spelling_count_sees_a_sixth_table(tmp_path):
    for i in range(4):
        (tmp_path / f"m{i}.py").write_text(f"NAMES = ('x', {'BROADCAST'!r})\n")
    (tmp_path / "n.py").write_text("# broadcast in a comment is no table\n")
    assert modules_spelling("broadcast", str(tmp_path)) == ["m0.py", "m1.py", "m2.py", "m3.py"]


HEAVY = ("torch", "mpi4py", "matplotlib", "numpy", "hypothesis", "deepspeed", "megatron",
         "commbench.patterns.registry")  # the last: every pattern's module, for the layout model
REASON = re.compile(r"#\s*lazy:\s*(.+)$")


def lazy_imports(name: str, source: str, path: str = "",
                 known: dict[str, str] | None = None) -> list[tuple[int, str, str, str]]:
    """(line, what it imports, its reason or "", the module-level function it is in or "") of
    each import in a function body of the module ``name``; the reason is a ``# lazy: ...``
    comment on its line or the line above. Nested functions' imports are reported once per
    enclosing function: the set keeps one."""
    tree = ast.parse(source)
    lines = source.splitlines()
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import | ast.ImportFrom):
                said = [REASON.search(lines[k]) for k in (node.lineno - 1, node.lineno - 2)
                        if k >= 0]
                reason = next((m.group(1).strip() for m in said if m), "")
                out.append((node.lineno, resolved(package, node, known or {})[0], reason,
                            fn.name if fn in tree.body else ""))
    return sorted(set(out))


def top_level(known: dict[str, str]) -> dict[str, set[str]]:
    """What each module imports at its top: the package's modules and outside packages."""
    out = {}
    for name, path in known.items():
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        out[name] = {m for node in _tree(path).body
                     if isinstance(node, ast.Import | ast.ImportFrom)
                     for m in resolved(package, node, known)}
    return out


def pulls(module: str, tops: dict[str, set[str]]) -> set[str]:
    """The heavy packages (and heavy modules of our own) importing ``module`` imports (its
    package's too)."""
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        parts = m.split(".")
        for k in range(1, len(parts) + 1):
            head = ".".join(parts[:k])
            if head not in seen:
                seen.add(head)
                todo += list(tops.get(head, ()))
    return ({m.split(".")[0] for m in seen} | seen) & set(HEAVY)


def unexplained(known: dict[str, str]) -> list[str]:
    """The function-level imports that say no reason, or one the code does not bear out: that
    they keep a heavy package out (``# lazy: imports torch``) where the module imports it
    anyway or the import does not; that ``python -m`` runs the module (its package must not
    import it first) where it has no ``__main__`` block; that they are the package's attribute
    (PEP 562) outside its ``__getattr__``. ``optional`` ones say their absence is handled."""
    tops = top_level(known)
    bad = []
    for name, path in sorted(known.items()):
        mine = pulls(name, tops)
        for line, target, reason, top_fn in lazy_imports(name, open(path).read(), path, known):
            where = f"{name}:{line} ({target})"
            if not reason:
                bad.append(f"{where}: no '# lazy:' reason")
            elif reason.startswith("python -m runs it"):
                if target not in known or '__name__ == "__main__"' not in open(known[target]).read():
                    bad.append(f"{where}: says python -m runs it; it has no __main__ block")
            elif reason.startswith("the package's attribute"):
                if top_fn != "__getattr__" or not path.endswith("__init__.py"):
                    bad.append(f"{where}: says it is the package's attribute; not in the "
                               "package's __getattr__")
            elif reason.startswith("imports "):
                said = {p.strip() for p in reason[len("imports "):].split(",")}
                if not said <= set(HEAVY) or not said <= pulls(target, tops) - mine:
                    bad.append(f"{where}: says {reason!r}; it adds "
                               f"{sorted(pulls(target, tops) - mine) or 'nothing heavy'}")
            elif not reason.startswith("optional"):
                bad.append(f"{where}: reason {reason!r} is none of the kinds")
    return bad


def test_every_lazy_import_says_why_and_says_it_truly():
    """An import in a function body hides a dependency: it is there only to keep a heavy
    package (torch, mpi4py, matplotlib, ...; of our own, every pattern's module, which only the
    layout model needs) out of a module that does not need it at its top (``--help``,
    ``predict``, the trace reader), for an optional one, for a module ``python -m``
    runs, or for the package's attributes loaded on first use; each says which, and the code
    must bear it out. Every other import is at the module's top."""
    assert unexplained(modules()) == []


def test_a_lazy_import_without_a_true_reason_is_found(tmp_path):
    """Negative: no reason; a reason the graph does not bear out (json is no heavy package's
    door); a reason for a package the module imports anyway; a module said to run under
    ``python -m`` that cannot; a package attribute outside a package."""
    pkg = tmp_path / "commbench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "heavy.py").write_text("import torch\n")
    (pkg / "a.py").write_text("def f():\n    import json\n\n\ndef g():\n    # lazy: imports torch\n"
                              "    from commbench import heavy\n\n\ndef h():\n"
                              "    from json import dumps  # lazy: imports torch\n")
    (pkg / "b.py").write_text("import torch\n\n\ndef f():\n    # lazy: imports torch\n"
                              "    from commbench import heavy\n")
    (pkg / "c.py").write_text("def f():\n    # lazy: python -m runs it\n"
                              "    from commbench import heavy\n\n\ndef __getattr__(name):\n"
                              "    # lazy: the package's attribute\n    import json\n")
    assert unexplained(modules(str(pkg))) == [
        "commbench.a:2 (json): no '# lazy:' reason",
        "commbench.a:11 (json): says 'imports torch'; it adds nothing heavy",
        "commbench.b:6 (commbench.heavy): says 'imports torch'; it adds nothing heavy",
        "commbench.c:3 (commbench.heavy): says python -m runs it; it has no __main__ block",
        "commbench.c:8 (json): says it is the package's attribute; not in the package's "
        "__getattr__"]
