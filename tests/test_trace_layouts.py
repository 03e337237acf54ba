"""A trace reads the same however its events are laid out: the reader skips undecoded the events
no figure needs where the array's layout lets it cut events by their text (Kineto's own writer,
``json.dumps(indent=...)``, one event a line), and decodes every event of a compact one-line
file. Held here: every real trace of the corpus, laid out each way, gives the figures its
compact form gives; and each trap a layout can hold (a separator's pattern inside an event or
past the array's end, a name spelled with an escape) is read as the compact form reads it.
Each rule, broken on purpose, is caught by the same comparison."""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trace_generator import LAYOUTS, Planned, generate, lay_out

from commbench.traces import kineto, stream

pytestmark = pytest.mark.traces

DATA = os.path.join(os.path.dirname(__file__), "data", "traces")
REAL = sorted(p for p in glob.glob(os.path.join(DATA, "**", "*.json.gz"), recursive=True)
              if '"traceEvents"' in gzip.open(p, "rt").read(1 << 16))  # not execution traces


def figures(path: str) -> tuple:
    """Everything a rank's trace hands the analysis, its file's name aside (on a world of 8 where
    the trace states none: a torch < 2.1 trace's calls need one)."""
    t = kineto.read(path, progress=False, world=8)
    return (t.rank, t.world_size, t.backend, t.nccl_version, t.groups, t.devices,
            [dataclasses.astuple(c) for c in t.calls], list(t.compute_ts), list(t.compute_end),
            t.steps, t.unlinked, t.no_kernel, t.unsized, t.world_stated)


def differences(doc: dict, tmp_path, layouts=LAYOUTS, text=lambda t: t) -> list[str]:
    """The layouts whose file (``text`` applied to it) reads otherwise than the compact one."""
    want = None
    bad = []
    for how in ("compact", *layouts):
        path = tmp_path / f"{how}.json"
        path.write_text(text(lay_out(doc, how)))
        got = figures(str(path))
        if want is None:
            want = got
        elif got != want:
            bad.append(how)
    return bad


def test_the_corpus_has_real_traces_of_both_layouts():
    native = [p for p in REAL if gzip.open(p, "rt").read(64).lstrip().startswith("{\n")]
    assert len(REAL) >= 10 and native, REAL  # PARAM's DLRM job is the profiler's own layout


@pytest.mark.parametrize("path", REAL, ids=lambda p: os.path.relpath(p, DATA))
def test_a_real_trace_laid_out_any_way_gives_the_figures_of_its_compact_form(tmp_path, path):
    assert differences(json.load(gzip.open(path, "rt")), tmp_path) == []


def test_an_event_a_figure_needs_skipped_for_its_text_is_caught(tmp_path, monkeypatch):
    """The broken rule: steps and ops told apart from the rest by kernels alone."""
    doc = json.load(gzip.open(os.path.join(DATA, "param", "dlrm_kineto",
                                           "rank0.pt.trace.json.gz"), "rt"))
    monkeypatch.setattr(kineto, "_wanted", lambda texts: ['"kernel"' in t for t in texts])
    assert differences(doc, tmp_path) == ["kineto", "indent", "lines"]


PLAN = [Planned("allreduce", (0, 1), 4096, "Float", 50.0, (0, 3), 20.0)]
# an event no figure needs whose arguments hold an array of objects, the middle one a kernel
NESTED = {"ph": "X", "cat": "cpu_op", "name": "aten::foo", "pid": 0, "tid": 1, "ts": 1.0,
          "dur": 1.0, "args": {"parts": [{"a": 1}, {"ph": "X", "cat": "kernel", "name": "gemm",
                                                    "pid": 0, "tid": 7, "ts": 0.0, "dur": 1e6},
                                         {"b": 2}]}}


def _doc(tmp_path, events_after=(), keys_after=None, link=False) -> dict:
    doc = json.loads(open(generate(2, PLAN, str(tmp_path / "gen"), link=link)[0]).read())
    doc["traceEvents"] += list(events_after)
    if keys_after:  # keys after the events, the events' array no longer the last
        doc = {**{k: v for k, v in doc.items() if k not in keys_after}, **keys_after}
    return doc


def _nested_at_the_items_indentation(text: str) -> str:
    """The nested array's objects moved onto lines of their own, at the items' indentation."""
    one = json.dumps(NESTED["args"]["parts"])
    if one not in text:
        return text
    start = text.index('"traceEvents": [') + len('"traceEvents": [')
    lead = text[start:].split("{", 1)[0]
    if "\n" not in lead:  # a compact array: no line to lay it on
        return text
    indent = lead.rsplit("\n", 1)[1]
    return text.replace(one, "[" + ("},\n" + indent + "{").join(one[1:-1].split("}, {")) + "]")


@pytest.mark.parametrize("trap", ["an array of objects in an event", "keys past the events",
                                  "a name spelled with an escape"])
def test_a_layout_s_traps_are_read_as_the_compact_form_reads_them(tmp_path, trap):
    if trap == "an array of objects in an event":
        doc, text = _doc(tmp_path, [NESTED]), _nested_at_the_items_indentation
        assert '},\n{"ph": "X", "cat": "kernel", "name": "gemm"' in text(lay_out(doc, "lines"))
    elif trap == "keys past the events":  # Kineto's last event is one no figure needs
        end = {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": 9}
        doc, text = _doc(tmp_path, [end], {"deviceProperties": [
            {"id": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(3)]}), lambda t: t
    else:
        doc = _doc(tmp_path)
        text = lambda t: t.replace('"record_param_comms"', '"record\\u005fparam_comms"')  # noqa: E731
    assert differences(doc, tmp_path, text=text) == []
    assert figures(str(tmp_path / "lines.json"))[6], "no call read"


def test_each_broken_rule_of_the_cut_is_caught(tmp_path, monkeypatch):
    """Every text skipped that the rule would decode: the nested array's middle object is
    read as a kernel, the keys past the events as events."""
    monkeypatch.setattr(stream, "_skippable", lambda text: True)
    doc = _doc(tmp_path, [NESTED])
    assert differences(doc, tmp_path, text=_nested_at_the_items_indentation) != []
    end = {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": 9}
    doc = _doc(tmp_path, [end], {"deviceProperties": [{"id": i, "name": "X"} for i in range(3)]})
    assert differences(doc, tmp_path) != []


def test_a_name_spelled_with_an_escape_skipped_is_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(kineto, "_wanted", lambda texts: [
        '"kernel"' in t or "record_param_comms" in t or "ProfilerStep#" in t for t in texts])
    doc = _doc(tmp_path, link=True)  # the kernels hold no call of their own: the op is it
    text = lambda t: t.replace('"record_param_comms"', '"record\\u005fparam_comms"')  # noqa: E731
    assert differences(doc, tmp_path, text=text) != []


def _launches_first(tmp_path) -> tuple[str, str]:
    """HTA's sampled rank (torch < 2.1: its kernels reach their ops through their launches) as
    shipped, and with every launch moved before the first event."""
    shipped = json.load(gzip.open(os.path.join(DATA, "hta", "sampled",
                                               "sampled_rank-0.json.gz"), "rt"))
    ev = shipped["traceEvents"]
    launch = [e for e in ev if e.get("cat") == "cuda_runtime" and "Launch" in e.get("name", "")]
    moved = {id(e) for e in launch}
    doc = {**shipped, "traceEvents": launch + [e for e in ev if id(e) not in moved]}
    paths = []
    for name, d in (("shipped", shipped), ("first", doc)):
        path = tmp_path / f"{name}.json"
        path.write_text(lay_out(d, "kineto"))
        paths.append(str(path))
    return paths[0], paths[1]


def test_a_torch_2_0_file_s_launches_are_read_in_a_second_pass_wherever_they_lie(tmp_path):
    shipped, first = _launches_first(tmp_path)
    got = kineto.read(first, progress=False)
    assert got.unlinked == kineto.read(shipped, progress=False).unlinked == 0
    assert figures(first)[6] == figures(shipped)[6]


def test_launches_left_unread_are_caught(tmp_path, monkeypatch):
    shipped, first = _launches_first(tmp_path)
    want = figures(shipped)[6]
    monkeypatch.setattr(kineto, "_launches", lambda path, wanted, limit: {})
    assert figures(first)[6] != want and figures(shipped)[6] != want


# --- drawn events: strings holding the cut's own marks, arrays of objects inside events
WORDS = st.lists(st.sampled_from(["a", "{", "}", "[", "]", ",", ":", '"', "\\", "\n", " ", "ü",
                                  "kernel", "ts", "nccl:", "},", "#"]), max_size=6).map("".join)
VALUES = st.recursive(
    st.one_of(st.integers(-9, 9), st.floats(-1e3, 1e3, allow_nan=False), WORDS, st.none()),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(WORDS, inner, max_size=3),
                            st.lists(st.dictionaries(WORDS, inner, max_size=2), min_size=2,
                                     max_size=4)),
    max_leaves=8)


@st.composite
def drawn_events(draw) -> list[dict]:
    out = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["op", "kernel", "nccl", "step", "meta"]))
        e = {"ph": "M" if kind == "meta" else "X",
             "cat": {"op": "cpu_op", "kernel": "kernel", "nccl": "kernel",
                     "step": "user_annotation", "meta": "__metadata"}[kind],
             "name": {"nccl": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                      "step": f"ProfilerStep#{draw(st.integers(1, 3))}"}.get(kind, "")
             or draw(WORDS.filter(lambda w: not w.startswith("nccl"))),
             "pid": 0, "tid": draw(st.sampled_from([1, 7, 20]))}
        args = draw(st.dictionaries(WORDS, VALUES, max_size=3))
        if args and draw(st.booleans()):  # the arguments before the times, as other writers do
            e["args"] = args
        e["ts"], e["dur"] = draw(st.integers(0, 400)) / 2, draw(st.integers(0, 60)) / 2
        if args and "args" not in e:
            e["args"] = args
        out.append(e)
    return out


def _dump(v, indent: str) -> str:
    """``v`` as JSON, every array holding an object with each item on a line of its own at
    ``indent`` (the events' own indentation: the cut's separator met inside an event, also
    where the array's first item is no object)."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_dump(x, indent)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        sep = ",\n" + indent if any(isinstance(x, dict) for x in v) else ", "
        return "[" + sep.join(_dump(x, indent) for x in v) + "]"
    return json.dumps(v)


def _readings_differ(events: list[dict], tmp_path) -> list[str]:
    """The layouts (one event a line; the profiler's two spaces) whose file, with arrays of
    objects inside events laid at the events' indentation, reads otherwise than the compact."""
    head = '{"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": ['
    texts = {"compact": json.dumps({"distributedInfo": {"rank": 0, "world_size": 1},
                                    "traceEvents": events}),
             "lines": head + "\n" + ",\n".join(_dump(e, "") for e in events) + "\n]}\n",
             "kineto": head + "\n" + ",\n".join("  " + _dump(e, "  ") for e in events) +
             "\n  ]\n}\n"}
    got = {}
    for how, text in texts.items():
        path = tmp_path / how / "rank0.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        got[how] = figures(str(path))
    return [how for how in ("lines", "kineto") if got[how] != got["compact"]]


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=drawn_events())
def test_drawn_events_holding_the_cut_s_marks_read_as_their_compact_form(tmp_path, events):
    assert _readings_differ(events, tmp_path) == []


def test_a_cut_blind_to_objects_after_an_array_s_first_item_is_caught(tmp_path, monkeypatch):
    """The array's objects follow a number: no ``[`` before an object opens, and a rule that
    looks only there skips the opening text and reads the middle object as a kernel."""
    inner = {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0.0, "dur": 1e6}
    events = [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 0, "tid": 1, "ts": 1.0,
               "dur": 1.0, "args": {"x": [1, {"a": 1}, inner, {"b": 2}]}},
              {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 3.0,
               "dur": 1.0}]
    assert _readings_differ(events, tmp_path / "rule") == []
    monkeypatch.setattr(stream, "_skippable", lambda text: re.search(r"\[\s*\{", text) is None)
    assert _readings_differ(events, tmp_path / "blind") == ["lines", "kineto"]


def test_a_cut_that_trusts_its_separator_is_caught_by_the_drawn_events_judge(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setattr(stream, "_skippable", lambda text: True)
    inner = {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0.0, "dur": 1e6}
    events = [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 0, "tid": 1, "ts": 1.0,
               "dur": 1.0, "args": {"x": [{"a": 1}, inner, {"b": 2}]}},
              {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 3.0,
               "dur": 1.0}]
    assert _readings_differ(events, tmp_path) == ["lines", "kineto"]


# --- a computation kernel decoded up to its arguments (stream.HEAD), the rest left undecoded
GEMM = {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1.0, "dur": 1.0}


@pytest.mark.parametrize("trap", ["objects in its arguments", "arguments before its time",
                                  "no arguments", "a library's kernel"])
def test_a_kernel_read_up_to_its_arguments_reads_as_its_compact_form(tmp_path, trap):
    inner = {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0.0, "dur": 1e6}
    kernel = {"objects in its arguments": {**GEMM, "args": {"x": [{"a": 1}, inner, {"b": 2}]}},
              "arguments before its time": {"ph": "X", "cat": "kernel", "name": "gemm",
                                            "args": {"stream": 7}, "ts": 1.0, "dur": 1.0},
              "no arguments": GEMM,
              "a library's kernel": {**GEMM, "name": "void deep_ep::intranode::dispatch<8>()",
                                     "args": {"stream": 7}}}[trap]
    events = [kernel, {**GEMM, "ts": 5.0, "args": {"stream": 7, "grid": [1, 1, 1]}}]
    assert _readings_differ(events, tmp_path) == []


def test_a_kernel_s_head_read_without_its_proof_is_caught(tmp_path, monkeypatch):
    """The broken rule: a kernel's keys before ``"args"`` taken without proving the text one
    event, so the object laid out as an event in its arguments is read as a kernel too."""
    inner = {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0.0, "dur": 1e6}
    events = [{**GEMM, "args": {"x": [{"a": 1}, inner, {"b": 2}]}}, GEMM]
    monkeypatch.setattr(stream, "_head", lambda text: text.find('"args": {'))
    assert _readings_differ(events, tmp_path) == ["lines", "kineto"]


def test_a_kernel_s_head_never_decoded_whole_is_caught(tmp_path, monkeypatch):
    """The broken rule: what a computation kernel's head leaves out never decoded, where it is
    not one (its time after its arguments; a library's communication kernel and the call it
    links to by its arguments' ``External id``)."""
    monkeypatch.setattr(kineto, "whole", lambda e, path: e)
    late = {"ph": "X", "cat": "kernel", "name": "gemm", "args": {"stream": 7}, "ts": 1.0,
            "dur": 1.0}
    with pytest.raises(kineto.TraceError, match="no time"):
        _readings_differ([late, GEMM], tmp_path)  # the last event is read by another path
    doc = json.load(gzip.open(os.path.join(DATA, "tracelens", "b200_vllm_symm_mem_rank0.json.gz"),
                              "rt"))
    assert differences(doc, tmp_path) != []


def test_a_kernel_s_arguments_that_are_no_json_are_refused_where_they_are_decoded(tmp_path):
    """Another library's kernel is decoded whole once told apart: arguments that are no JSON
    there are one line naming the file, as in a compact file."""
    bad = ('{"ph": "X", "cat": "kernel", "name": "void deep_ep::intranode::dispatch<8>()", '
           '"pid": 0, "tid": 7, "ts": 1.0, "dur": 1.0, "args": {"stream": 7,, "x": 1}}')
    path = tmp_path / "rank0.json"
    path.write_text('{"traceEvents": [\n' + bad + ",\n" + json.dumps(GEMM) + "\n]}\n")
    with pytest.raises(kineto.TraceError, match="rank0.json: not valid JSON"):
        kineto.read(str(path), progress=False)
