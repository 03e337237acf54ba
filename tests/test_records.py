"""The result records' helpers at their edges: percentiles of none, one and many samples, the
row statistics, CSV columns, atomic writes, machine labels."""

from __future__ import annotations

import json
import math
import os
import stat

import pytest

from commbench.results.machine import LABEL_MAX, check_label, machine_class, slug
from commbench.results.records import (
    Rows,
    csv_text,
    percentile,
    summarize_iters,
    write_atomic,
    write_json,
)

pytestmark = pytest.mark.foundation


def test_percentile_at_its_edges():
    """Nearest rank of the sorted samples, in any input order; none: NaN."""
    assert math.isnan(percentile([], 50))
    assert percentile([7.0], 0) == percentile([7.0], 99) == 7.0
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]  # sorted 1..5, k = round(q/100 * 4)
    assert [percentile(xs, q) for q in (0, 10, 50, 99, 100)] == [1.0, 1.0, 3.0, 5.0, 5.0]
    # ranks 0.5 and 1.5 round half to even: to 0 and 2
    assert percentile(xs, 12.5) == 1.0 and percentile(xs, 37.5) == 3.0
    assert percentile(xs, -50) == 1.0 and percentile(xs, 150) == 5.0  # clamped to the samples


def test_row_statistics_in_microseconds():
    got = summarize_iters([3e-6, 1e-6, 2e-6, 10e-6])
    assert got == {"time_us": pytest.approx(2.5), "min_us": pytest.approx(1.0),
                   "avg_us": pytest.approx(4.0), "p10_us": pytest.approx(1.0),
                   "max_us": pytest.approx(10.0), "p99_us": pytest.approx(10.0), "n_samples": 4}
    one = summarize_iters([5e-6])
    assert one["time_us"] == one["min_us"] == one["max_us"] == pytest.approx(5.0)


def test_csv_has_every_field_any_row_has_in_first_seen_order():
    rows = [{"op": "a", "size": 8, "samples_s": [1.0]}, {"op": "b", "extra": [1, 2], "size": 16}]
    lines = csv_text(rows).splitlines()
    assert lines == ["op,size,extra", "a,8,", 'b,16,"[1, 2]"']  # samples kept out, lists as JSON
    assert csv_text([]) == "\n"


def test_an_atomic_write_leaves_the_old_file_or_the_new_one_and_is_readable(tmp_path):
    path = tmp_path / "sub" / "r.json"
    write_json(str(path), {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    with pytest.raises(TypeError):
        write_json(str(path), {"a": object()})  # fails while writing the temporary file
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temporary left
    write_atomic(str(path), "")
    assert path.read_text() == ""


def test_a_record_is_written_with_one_row_per_line_and_reads_back_equal(tmp_path):
    rows = [{"op": "a", "size": 8, "rounds_us": [1.5, 2.0]}, {"op": "b", "size": float("nan")}]
    record = {"schema": "s", "rows": rows, "empty": [], "mixed": [{"x": 1}, 2], "m": {"k": [1]}}
    path = tmp_path / "r.json"
    write_json(str(path), record)
    text = path.read_text()
    assert json.dumps(json.loads(text)) == json.dumps(record)  # NaN kept, as json writes it
    lines = text.splitlines()
    assert lines[:3] == ['{', '"schema": "s",', '"rows": [']
    assert lines[3:5] == [json.dumps(r) + "," * (i == 0) for i, r in enumerate(rows)]
    assert '"mixed": [{"x": 1}, 2],' in lines  # a list that is not all objects stays on one line
    assert lines[-1] == "}"
    write_json(str(path), {})
    assert json.loads(path.read_text()) == {}


def test_rows_made_as_they_are_written_are_written_as_a_list_of_them(tmp_path):
    """A table whose rows are made one at a time (:class:`Rows`, an analysis' calls) reads and
    writes as the list of those rows, one per line; each row is made when it is asked for."""
    made = []

    def make(i: int) -> dict:
        made.append(i)
        return {"i": i, "sq": i * i}
    rows = Rows([3, 1, 2], make)
    assert made == []
    assert (len(rows), rows[0], rows[-1], rows[1:]) == (3, {"i": 3, "sq": 9}, {"i": 2, "sq": 4},
                                                         [{"i": 1, "sq": 1}, {"i": 2, "sq": 4}])
    assert list(rows) == [make(3), make(1), make(2)]
    path = tmp_path / "r.json"
    write_json(str(path), {"calls": rows, "none": Rows([], make)})
    assert json.loads(path.read_text()) == {"calls": [make(3), make(1), make(2)], "none": []}
    assert path.read_text().splitlines()[1:6] == ['"calls": [', '{"i": 3, "sq": 9},',
                                                  '{"i": 1, "sq": 1},', '{"i": 2, "sq": 4}', '],']


def test_a_machine_label_at_its_limits():
    assert machine_class("a" * LABEL_MAX) == "a" * LABEL_MAX
    with pytest.raises(ValueError, match=f"--label of {LABEL_MAX + 1} characters: at most"):
        machine_class("a" * (LABEL_MAX + 1))
    with pytest.raises(ValueError, match="use lower-case letters, digits and '-' \\(e.g. 'my-box'\\)"):
        machine_class("My Box")
    assert slug("") == "unknown" and slug("(R)(TM)") == "unknown"
    for label in ("a" * (LABEL_MAX + 1), "My Box"):  # the same rules, without torch
        with pytest.raises(ValueError, match="--label"):
            check_label(label)
    assert check_label("my-box") == "my-box"


def test_a_plot_s_title_names_machine_transport_world_and_commit():
    """Two plots of one machine, one per transport, read apart; so do two commits."""
    from commbench.results.records import header, plot_title

    rec = header("collectives", 4, "local-mpi", "intel-xeon-2c", {})
    rec["commit"] = "0123456789ab"
    gloo = {**rec, "rows": [{"transport": "gloo"}]}
    mpi = {**rec, "rows": [{"transport": "mpi"}, {"transport": "mpi"}]}
    assert plot_title(gloo) == ("collectives: intel-xeon-2c, gloo, 4 ranks (local-mpi), commit "
                                "0123456789ab")
    assert plot_title(mpi) != plot_title(gloo) and ", mpi, " in plot_title(mpi)
    both = {**rec, "rows": gloo["rows"] + mpi["rows"], "commit": ""}
    assert plot_title(both).endswith("intel-xeon-2c, gloo+mpi, 4 ranks (local-mpi), commit unknown")


def test_a_results_table_rewritten_leaves_the_commit_clean_and_code_does_not(tmp_path):
    """The stamp a table carries: a regeneration rewrites results/ one command after another,
    and each later table is still of the clean commit; a changed source file is +dirty."""
    import subprocess

    from commbench.results.records import git_commit

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "results").mkdir()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "results" / "t.md").write_text("old\n")
    (tmp_path / "pkg" / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "one", "--allow-empty")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "two")
    clean = git_commit(str(tmp_path / "pkg"))
    assert clean and not clean.endswith("+dirty")
    (tmp_path / "results" / "t.md").write_text("new\n")
    assert git_commit(str(tmp_path / "pkg")) == clean
    (tmp_path / "pkg" / "code.py").write_text("x = 2\n")
    assert git_commit(str(tmp_path / "pkg")) == clean + "+dirty"


def test_a_table_without_a_plot_says_why():
    """A barrier's rows move no bytes: nothing to plot, and the line says so (before: "no
    matplotlib" where matplotlib was there); rows that move bytes and no plot: no matplotlib."""
    from commbench.results.records import no_plot, plot

    barrier = {"rows": [{"op": "barrier", "algo": "native", "size": 0, "busbw": 0.0}]}
    assert plot(barrier, "never-written.png") is None
    assert no_plot(barrier) == "no row moves bytes: no plot"
    assert no_plot({"rows": [{"size": 8}]}) == "no matplotlib: no plot"
