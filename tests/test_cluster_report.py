"""suites/cluster/report.py on made-up rows: the host fit, each row's prediction and error, the
side-by-side ratios and the link bytes it writes into results/cluster_* (the measurement itself
needs root and namespaces: `make cluster-bench`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "suites" / "cluster"))
import report  # noqa: E402

from commbench.costmodel.twolevel import link_bytes  # noqa: E402

pytestmark = pytest.mark.foundation
MiB = 1 << 20
SIZES = [8, 1024, 65536, MiB, 4 * MiB, 16 * MiB]


def _host_us(algo: str, size: int) -> float:
    return {"native": 50, "ring": 300, "hierarchical": 400}[algo] + 0.002 * size


def _write(folder: Path, gbit: float | None, slow: float = 1.0) -> None:
    folder.mkdir(parents=True)
    rows = []
    for t in ("gloo", "mpi"):
        for a in ("native", "ring", "hierarchical"):
            for s in SIZES:
                link = link_bytes(a, t, 2, 2, s) / (gbit * 125) if gbit else 0.0
                time = (_host_us(a, s) + link) * slow
                rows.append({"op": "all_reduce", "transport": t, "algo": a, "size": s,
                             "time_us": time, "min_us": time, "max_us": time,
                             "busbw": s / time / 1e3 * 1.5, "wrong": 0})
    (folder / "all_reduce_x.json").write_text(json.dumps({"rows": rows}))
    (folder / "link.json").write_text(json.dumps({"gbit": gbit, "seconds": 1.0,
                                                  "tx_bytes": [1, 2]}))


def test_a_run_that_follows_the_model_has_no_error_and_its_ratios(tmp_path):
    _write(tmp_path / "unshaped", None)
    _write(tmp_path / "1gbit", 1.0)
    (tmp_path / "volume.json").write_text(json.dumps([
        {"transport": "gloo", "algo": "ring", "size": "16M", "tx_bytes_per_call": [1.5 * 16 * MiB,
                                                                                    1.5 * 16 * MiB]}]))
    record, cluster, text = report.build(tmp_path, "t")
    assert cluster.host["gloo/ring"][1]["alpha_us"] == pytest.approx(300, rel=1e-6)
    big = [r for r in record["rows"] if r["size"] >= MiB]
    assert all(abs(r["error"]) < 1e-6 for r in big)  # host + link, exactly as made
    assert all(r["error_overlap"] < 0 for r in big)  # the larger of the two: a lower bound
    r = next(r for r in big if (r["transport"], r["algo"], r["size"]) == ("mpi", "hierarchical",
                                                                         16 * MiB))
    ring = next(x for x in big if (x["transport"], x["algo"], x["size"]) == ("mpi", "ring",
                                                                            16 * MiB))
    assert r["over_ring"] == pytest.approx(r["time_us"] / ring["time_us"])
    assert record["volume"][0]["predicted"] == 1.5 * 16 * MiB
    v = record["volume"][0]
    assert max(v["tx_bytes_per_call"]) / v["predicted"] == 1.0
    assert "hierarchical / ring" in text and "Link at 1 Gbit/s each way" in text
    assert record["medians"] and all(m["median_error"] < 1e-6 for m in record["medians"])


def test_a_run_slower_than_the_model_shows_its_error(tmp_path):
    """Negative: every shaped row 30% slower than host + link: the median error is 1 - 1/1.3 =
    23% (the prediction under the measurement); 50% slower: 33%, past the target, marked no."""
    _write(tmp_path / "unshaped", None)
    _write(tmp_path / "1gbit", 1.0, slow=1.3)
    (tmp_path / "volume.json").write_text("[]")
    record, _, text = report.build(tmp_path, "t")
    for m in record["medians"]:
        assert m["median_error"] == pytest.approx(1 - 1 / 1.3, rel=1e-6)
    _write(tmp_path / "x" / "unshaped", None)
    _write(tmp_path / "x" / "1gbit", 1.0, slow=1.5)
    (tmp_path / "x" / "volume.json").write_text("[]")
    record, _, text = report.build(tmp_path / "x", "t")
    assert all(m["median_error"] > report.TARGET for m in record["medians"])
    assert "| no " in text
