"""The cost models' arithmetic, pinned: NCCL's tuning model against hand-worked cases and its
published latency floors, the presets against published nccl-tests figures, topology files and
NCCL's XML, and the alpha-beta-gamma fit."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from said import said

from commbench.collectives import ALGORITHMS
from commbench.costmodel.alphabeta import Params, terms
from commbench.costmodel.fitting import fit
from commbench.costmodel.nccl import nccl_predict, nccl_table
from commbench.costmodel.published import HEADLINE, check_published
from commbench.costmodel.topology import GPU_PRESETS, from_nccl_xml, gpu_presets, load
from commbench.ops import OPS

pytestmark = [pytest.mark.model]


def _lat(table, algo, proto):
    return next(round(t.lat_us, 2) for t in table if (t.algo, t.proto) == (algo, proto))


def test_latency_floors_of_one_and_two_h100_nodes_by_hand():
    """costmodel.md 3.7: 8 GPUs on NVLink, Intel host, latencyInter 0."""
    one = nccl_table("all_reduce", 8, load("dgx-h100"))
    assert _lat(one, "ring", "LL") == 6.6 + 14 * 0.6
    assert _lat(one, "ring", "LL128") == round(14 + 14 * 1.9, 2)
    assert _lat(one, "ring", "Simple") == round(8.4 + 14 * 3.4, 2)
    assert _lat(one, "tree", "LL") == round(6.8 + 2 * 7 * 0.6, 2)
    assert _lat(one, "tree", "Simple") == round(8.4 + 2 * 7 * 4, 2)
    assert _lat(one, "nvls", "Simple") == 25.0
    two = nccl_table("all_reduce", 8, load("cluster-h100-ndr", 2))
    assert _lat(two, "ring", "LL") == round(6.6 + 28 * 1.0 + 2 * 2.7, 2)  # intra max'd to 1 us
    assert _lat(two, "ring", "Simple") == round(8.4 + 28 * 3.4 + 2 * 14, 2)
    assert _lat(two, "tree", "LL") == round(6.8 + 2 * (7 * 0.6 + 5.0), 2)
    assert _lat(two, "tree", "Simple") == round(8.4 + 2 * (28 + 14), 2)
    assert _lat(two, "nvls_tree", "Simple") == round(25 + 2 * 20.9, 2)
    ag = nccl_table("all_gather", 8, load("dgx-h100"))
    assert _lat(ag, "ring", "LL") == round(6.6 + 7 * 0.6, 2)
    assert _lat(ag, "ring", "Simple") == round(8.4 + 7 * 3.4, 2)


def test_small_messages_pick_ll_and_large_ones_simple_at_the_hand_worked_crossover():
    """Ring on one H100 node: LL (15 us, busBw min(141, 0.5 x 370.8)) against Simple (56 us,
    370.8): equal when 15 + S/alg_LL = 56 + S/alg_S, alg = busBw * 8/14."""
    h = load("dgx-h100")
    alg_ll, alg_s = min(141.0, 0.5 * 370.8) * 8 / 14, 370.8 * 8 / 14
    cross = (56.0 - 15.0) / (1 / alg_ll - 1 / alg_s) * 1000  # bytes
    below, above = int(cross * 0.9), int(cross * 1.1)
    ring = [t for t in nccl_table("all_reduce", below, h) if t.algo == "ring"]
    assert min(ring, key=lambda t: t.time_us).proto in ("LL", "LL128")
    for size, proto in ((below, "LL"), (above, "Simple")):
        ll, simple = (nccl_predict("all_reduce", size, h, algo="ring", proto=p) for p in ("LL", "Simple"))
        assert (ll.time_us < simple.time_us) == (proto == "LL")
    assert nccl_predict("all_reduce", 8, h).time_us == pytest.approx(15.0 + 8 / (1000 * alg_ll))


def test_tree_correction_factor_and_ring_plateau_are_applied():
    h = load("dgx-h100")
    size = 1 << 20  # (1 MiB >> 6) = 2^14: Simple factor 0.5
    tree = nccl_predict("all_reduce", size, h, algo="tree", proto="Simple")
    bus = min(0.92 * 370.8, 16 * 38.7)
    assert tree.time_us == pytest.approx(64.4 + size / (1000 * bus * 0.5 * 0.5))
    multi = load("cluster-h100-ndr", 4)
    big = nccl_predict("all_reduce", 1 << 30, multi, algo="ring", proto="Simple")
    n = multi.ranks
    lat = (8.4 + (2 * (n - 1) - 6) * 3.4 + 6 * 14.0) * 1.4
    assert big.lat_us == pytest.approx(lat)


@pytest.mark.parametrize("version", ["2.18.1", "2.30.7"])
def test_the_tree_correction_covers_the_sizes_nccl_s_source_gives_it(version):
    """NCCL corrects the tree's bandwidth at logSize = log2(bytes >> 6) < 23 (64 B to 256 MiB;
    src/graph/tuning.cc, ncclTopoGetAlgoTime, in both versions): at 256 MiB the Simple factor
    0.9, at 512 MiB none, though 2.30's table has a 24th entry (0.9) there, which only
    NVLS_TREE reads. 2.18.1's table has 23 entries, as its source does."""
    from commbench.costmodel.nccl import constants, nccl_choices

    h = load("dgx-h100")
    lat, alg = nccl_choices("all_reduce", h, version)[("tree", "Simple")]
    for size, factor in ((256 << 20, 0.9), (512 << 20, 1.0)):
        t = nccl_predict("all_reduce", size, h, version, algo="tree", proto="Simple")
        assert t.time_us == pytest.approx(lat + size / (1000 * alg * factor))
    assert [len(r) for r in constants("2.18.1")["tree_correction"]] == [23, 23, 23]


def test_nvls_tree_is_corrected_on_blackwell_only():
    """2.30 corrects NVLS_TREE's bandwidth like the tree's, up to logSize 23 (1 GiB excluded),
    where the GPUs are Blackwell (minCompCap >= 100) and the host x86: at 1 MiB (logSize 14)
    the Simple factor 0.5, at 1 GiB none; on Hopper never."""
    from commbench.costmodel.nccl import nccl_choices

    for preset, corrected in (("dgx-b200", True), ("dgx-h100", False)):
        topo = load(preset, 2)
        lat, alg = nccl_choices("all_reduce", topo)[("nvls_tree", "Simple")]
        for size, factor in ((1 << 20, 0.5), (1 << 30, 1.0)):
            t = nccl_predict("all_reduce", size, topo, algo="nvls_tree", proto="Simple")
            f = factor if corrected else 1.0
            assert t.time_us == pytest.approx(lat + size / (1000 * alg * f))


def test_one_rank_costs_nothing_and_unknown_requests_are_refused():
    one = load("dgx-h100").__class__(**{**load("dgx-h100").__dict__, "gpus_per_node": 1})
    assert nccl_predict("all_reduce", 1 << 20, one).time_us == 0.0
    with pytest.raises(ValueError, match="op='gather'"):
        nccl_table("gather", 8, load("dgx-h100"))
    with pytest.raises(ValueError, match="would not run algo=nvls"):
        nccl_predict("all_reduce", 8, load("dgx-a100"), algo="nvls")


def test_presets_reproduce_the_published_figures_within_ten_percent():
    rows = check_published()
    for r in rows[:HEADLINE]:
        assert abs(r["ratio"] - 1) <= 0.10, r
    assert [r["headline"] for r in rows].count(True) == HEADLINE


@pytest.mark.parametrize(("change", "message"), [
    ({"arch": "kepler"}, "arch='kepler': must be one of"),
    ({"gpus_per_node": 0}, "gpus_per_node=0: must be an integer >= 1"),
    ({"nvlink_links": 0}, "nvlink_links=0: an NVLink machine needs"),
    ({"nic_GBps": -1}, "nic_GBps=-1: must be a number >= 0"),
    ({"nodes": 2, "nics_per_node": 0}, "nodes=2 needs nics_per_node"),
    ({"arch": "ampere", "nvls": True}, "nvls=true needs a Hopper or Blackwell"),
    ({"speed": 3}, "unknown field 'speed'"),
    ({"graphs": {"ring": {"channels": 2}}}, "graphs.ring: needs exactly"),
    ({"chunk_fill": {"ring": 1.0}}, "chunk_fill: must map nvls_tree to chunk-times >= 0"),
    ({"chunk_fill": {"nvls_tree": -1}}, "chunk_fill.nvls_tree=-1: must be chunk-times >= 0"),
])
def test_topology_files_with_missing_or_nonsensical_fields_are_refused(tmp_path, change, message):
    data = json.loads(load.__globals__["presets"]()["dgx-h100"].read_text())
    data.update(change)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        load(str(path))
    del data["name"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="mine.json: missing field 'name'"):
        load(str(path))
    path.write_text("{not json")
    with pytest.raises(ValueError, match="mine.json: not valid JSON"):
        load(str(path))


XML = """<system version="1">
 <cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
  <pci busid="0000:17:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
   {gpus}
   <nic><net name="mlx5_0" dev="0" speed="400000" port="1" latency="0" gdr="1"/></nic>
   <nic><net name="mlx5_1" dev="1" speed="400000" port="1" latency="0" gdr="1"/></nic>
  </pci>
 </cpu>
</system>"""
GPU = ('<pci busid="0000:1{i}:00.0"><gpu dev="{i}" sm="90" rank="{i}" gdr="1">'
       '<nvlink target="0000:e7:00.0" count="18" tclass="0x068000"/></gpu></pci>')


def test_an_nccl_topology_dump_is_read_into_a_topology(tmp_path):
    path = tmp_path / "dump.xml"
    path.write_text(XML.format(gpus="".join(GPU.format(i=i) for i in range(8))))
    topo = load(str(path), nodes=2)
    assert (topo.arch, topo.gpus_per_node, topo.intra, topo.nvlink_links, topo.nodes) == \
        ("hopper", 8, "nvswitch", 18, 2)
    assert (topo.nics_per_node, topo.nic_GBps, topo.nvls) == (2, 50.0, True)
    with pytest.raises(ValueError, match="no <gpu> element"):
        from_nccl_xml(XML.format(gpus=""))
    with pytest.raises(ValueError, match="not valid XML"):
        from_nccl_xml("<system>")


# -- alpha-beta-gamma -------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
@pytest.mark.parametrize(("op", "algo"), [("all_reduce", "ring"), ("all_gather", "ring"),
                                          ("reduce_scatter", "ring"), ("all_to_all", "pairwise"),
                                          ("all_to_all", "bruck")])
def test_bytes_term_equals_the_ledger_formula(n, op, algo):
    """Where every rank sends the same, the model's bytes are the formula's bytes per rank."""
    block = 16 * n
    size = block * n * 4
    count = size // 4 if op != "all_gather" else block
    sent, _ = ALGORITHMS[(op, algo)].bytes(n, 0, count, 4, in_splits=[block] * n,
                                           out_splits=[block] * n)
    assert terms(op, algo, n, size)[1] == pytest.approx(sent)


def test_fit_recovers_known_constants_and_never_goes_negative():
    truth = {"lib": Params(5e-6, 2e-10, 1e-10), "py": Params(4e-5, 5e-10, 8e-10)}
    rows = []
    for op, algo in (("pingpong", "native"), ("all_reduce", "native"), ("sendrecv", "native"),
                     ("all_reduce", "ring"), ("all_reduce", "naive")):
        cls = "lib" if algo == "native" and op != "sendrecv" else "py"
        for size in (4096, 65536, 1 << 20, 16 << 20):
            rows.append({"op": op, "algo": algo, "size": size,
                         "time_us": truth[cls].time(terms(op, algo, 4, size)) * 1e6})
    model = fit(rows, 4)
    for cls, p in truth.items():  # point-to-point rows separate beta from gamma
        got = model.classes[cls]
        for name in ("alpha", "beta", "gamma"):
            assert getattr(got, name) == pytest.approx(getattr(p, name), rel=1e-6), (cls, name)
    for r in rows:  # the fitted model reproduces the data it came from
        assert model.predict_us(r["op"], r["algo"], 4, r["size"]) == pytest.approx(r["time_us"],
                                                                                 rel=1e-6)
    noisy = [dict(r, time_us=r["time_us"] * (0.2 if r["size"] > 65536 else 5)) for r in rows]
    assert all(v >= 0 for p in fit(noisy, 4).classes.values() for v in p.__dict__.values())


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                "scatter", "gather", "broadcast", "reduce"])
def test_native_bytes_terms_against_the_ledger_formula(n, op):
    """The transports' own collectives: where the model's schedule is the booked one, its bytes
    term is the busiest rank's booked bytes; broadcast and reduce are priced as binomial trees
    (lg n sends of the whole buffer on the critical path) but booked as the bandwidth-optimal
    chain (each rank forwards it once); gather's term is what its root receives."""
    from commbench.ops import booked

    S = 4 * 16 * n * 3  # bytes, float32, every split even
    count = {"all_gather": S // 4 // n, "gather": S // 4 // n}.get(op, S // 4)
    splits = [count // n] * n
    per = [booked(op, n, i, count, 4, in_splits=splits, out_splits=splits) for i in range(n)]
    sent, recv = max(s for s, _ in per), max(r for _, r in per)
    term = terms(op, "native", n, S)[1]
    if op in ("broadcast", "reduce"):
        assert sent == S and term == pytest.approx(math.ceil(math.log2(n)) * sent)
    elif op == "gather":
        assert term == pytest.approx(recv) and sent == S // n
    else:
        assert term == pytest.approx(sent)


def test_native_all_reduce_terms_are_bandwidth_optimal_at_log_latency():
    steps, sent, red = terms("all_reduce", "native", 8, 1 << 20)
    assert steps == 2 * math.log2(8) and sent == pytest.approx(2 * 7 / 8 * (1 << 20))
    assert red == pytest.approx(7 / 8 * (1 << 20))


# -- command line -----------------------------------------------------------------------------------
def test_predict_prints_the_table_and_refuses_bad_input_in_one_line(capsys):
    from commbench.cli.main import main

    assert main(["predict", "collective", "all_reduce", "1G", "--topology", "dgx-h100,dgx-a100"]) == 0
    out = capsys.readouterr().out
    assert out.count("<-") == 2 and "nvls" in out and "answered in" in out
    assert main(["predict", "published", "--no-write"]) == 0
    assert "Headline figures (the first 11) within 10%: 11 of 11" in capsys.readouterr().out
    for argv, message in ((["predict", "collective", "all_reduce", "1G", "--topology", "nope"],
                           "topology 'nope': no such preset"),
                          (["predict", "collective", "gather", "1G"], "op='gather'"),
                          (["predict", "layout", "--tp", "3"], "must split over tp=3")):
        assert main(argv) == 2
        err = said(capsys)
        assert message in err and err.count("\n") == 1


def test_rows_carry_the_calibrated_and_the_nccl_prediction():
    from commbench.costmodel.alphabeta import Fit
    from commbench.studies.model import annotate

    model = Fit({"lib": Params(1e-5, 1e-9, 0.0), "py": Params(1e-4, 1e-9, 1e-9)}, [])
    rows = [{"op": "all_reduce", "algo": "native", "size": 1 << 20, "time_us": 3000.0},
            {"op": "all_to_all", "algo": "bruck", "size": 1 << 20, "time_us": 5000.0}]
    annotate(rows, model, 4, load("dgx-h100"))
    want = (1e-5 * 4 + 1e-9 * 1.5 * (1 << 20)) * 1e6
    assert rows[0]["pred_us"] == pytest.approx(want)
    assert rows[0]["meas_over_pred"] == pytest.approx(3000 / want)
    assert rows[0]["nccl_pred_us"] > 0 and "nccl_pred_us" not in rows[1]


def test_two_level_all_reduce_is_its_three_stages():
    from dataclasses import replace

    from commbench.costmodel.nccl import hierarchical_all_reduce

    topo, S = load("cluster-h100-ndr", 4), 1 << 30
    node = replace(topo, nodes=1)
    rail = replace(topo, gpus_per_node=1, nvls=False, nics_per_node=1)
    want = (nccl_predict("reduce_scatter", S, node).time_us
            + nccl_predict("all_gather", S, node).time_us
            + nccl_predict("all_reduce", S // 8, rail).time_us)
    assert hierarchical_all_reduce(S, topo) == pytest.approx(want)
    # the rail all-reduce of S/8 over one 48 GB/s NIC per GPU bounds it: 2 (N-1)/N S/8 / 48 GB/s
    assert nccl_predict("all_reduce", S // 8, rail).time_us > 2 * 3 / 4 * (S / 8) / 48e3


def test_two_gpus_by_hand():
    """n = 2 on one H100 node: ring AR nsteps 2, LL 6.6 + 2 x 0.6; Simple 8.4 + 2 x 3.4; the
    tree chain 2 x (1 x 4.0) + 8.4; NVLS 25 whatever n."""
    from commbench.cli.predict import on_ranks

    two = on_ranks(load("dgx-h100"), 2)
    t = nccl_table("all_reduce", 8, two)
    assert (_lat(t, "ring", "LL"), _lat(t, "ring", "Simple")) == (7.8, 15.2)
    assert (_lat(t, "tree", "Simple"), _lat(t, "nvls", "Simple")) == (16.4, 25.0)
    with pytest.raises(ValueError, match="--ranks 12: must fill whole nodes of 8"):
        on_ranks(load("cluster-h100-ndr"), 12)


def test_all_to_all_and_send_recv_follow_nccl_s_point_to_point_rules():
    """NCCL's maintainers' rules (costmodel/p2p.py): one node at the GPU's NVLink bandwidth; one
    GPU per node at one NIC's; N nodes of L at (n-1)/(n-L) x the NIC share; a send across nodes
    at one NIC however many the node has."""
    big = 8 << 30
    def busbw(op, topo):
        c = nccl_predict(op, big, topo)
        return big / c.time_us / 1e3 * OPS[op].bus(topo.ranks)
    h100 = load("dgx-h100")
    assert busbw("all_to_all", h100) == pytest.approx(18 * 20.6, rel=0.01)
    ndr = load("cluster-h100-ndr")
    assert busbw("all_to_all", ndr.part(2, 1)) == pytest.approx(48.0, rel=0.01)
    assert busbw("all_to_all", ndr.part(4, 8)) == pytest.approx(31 / 24 * 48.0, rel=0.01)
    assert busbw("sendrecv", ndr.part(2, 8)) == pytest.approx(48.0, rel=0.01)
    # a node of half as many NICs as GPUs: each GPU's share halves
    half = ndr.__class__(**{**ndr.__dict__, "nics_per_node": 4})
    assert busbw("all_to_all", half.part(2, 1)) == pytest.approx(48.0, rel=0.01)
    assert busbw("all_to_all", half.part(2, 8)) == pytest.approx(15 / 8 * 24.0, rel=0.01)
    # direct links without a switch: one pair has its share of them
    alps = load("alps-gh200").part(1, 4)
    assert busbw("sendrecv", alps) == pytest.approx(18 * 20.6 / 3, rel=0.01)


def test_a_p2p_model_that_aggregates_nics_misses_the_published_figures(monkeypatch):
    """Negative: pricing all-to-all as if a GPU used all of its node's NICs (what the
    maintainers say it cannot) takes the multi-node published checks out of 10%."""
    import commbench.costmodel.p2p as p2p

    def aggregating(op, nbytes, topo, c):
        wide = topo.__class__(**{**topo.__dict__, "nic_GBps": topo.nic_GBps * topo.nics_per_node})
        return real(op, nbytes, wide, c)

    real = p2p.p2p_time
    monkeypatch.setattr("commbench.costmodel.nccl.p2p_time", aggregating)
    rows = {r["figure"]: r for r in check_published()}
    assert abs(rows["H100 nodes x 8 NDR, all-to-all on 6 nodes"]["ratio"] - 1) > 0.1


def test_the_tables_of_many_sizes_are_each_size_s_own_table():
    """nccl_tables prices a run of sizes with their size-free part worked out once (the
    calibration's loss): every choice equals nccl_table's for each size, on every preset and op,
    where the tree's per-size correction and the ring's plateau apply and where they do not."""
    from commbench.costmodel.nccl import OPS, nccl_tables, nccl_times
    from commbench.costmodel.topology import presets

    sizes = [0, 1, 64, 100, 4096, 1 << 20, 3 << 22, 1 << 30, 1 << 33]
    corrected = set()
    for name in presets():
        topo = load(name)
        for part in (topo, topo.part(1, topo.gpus_per_node), topo.part(topo.nodes, 1)):
            for op in (*OPS, "all_to_all"):
                tables = nccl_tables(op, sizes, part)
                assert tables == [nccl_table(op, s, part) for s in sizes], (name, op)
                # the calibration's fast path: each size's fastest time, bit for bit
                assert nccl_times(op, sizes, part) == \
                    [min(c.time_us for c in t) for t in tables], (name, op)
                for s, table in zip(sizes, tables, strict=True):  # the size's own corrections
                    if any(c.algo == "tree" for c in table) and s >= 1 << 20:
                        corrected.add("tree")
                    if part.nodes > 1 and any(c.algo == "ring" and c.proto == "Simple"
                                              for c in table) and s >= 1 << 30:
                        corrected.add("plateau")
    assert corrected == {"tree", "plateau"}
    # negative: one size's table is not another's, so a table priced for the wrong size is seen
    topo = load("cluster-h100-ndr")
    assert nccl_tables("all_reduce", [1 << 20, 1 << 30], topo) != \
        [nccl_table("all_reduce", s, topo) for s in (1 << 30, 1 << 20)]
    # and a time that skips the size's own corrections differs from the pick's at some size
    uncorrected = [min(c.lat_us + s / (1000 * c.alg_bw) for c in nccl_table("all_reduce", 64, topo))
                   for s in sizes]
    assert nccl_times("all_reduce", sizes, topo) != uncorrected


DEVICES = [("NVIDIA B200", ("dgx-b200", "dgx-b200")), ("NVIDIA GB200", None),
           ("NVIDIA GH200 120GB", ("alps-gh200", "alps-gh200")),
           ("NVIDIA H200", ("dgx-h200", "cluster-h100-ndr")), ("NVIDIA H200 NVL", None),
           ("NVIDIA H100 80GB HBM3", ("dgx-h100", "cluster-h100-ndr")), ("NVIDIA H100 PCIe", None),
           ("NVIDIA H800", ("hgx-h800", "hgx-h800")), ("NVIDIA H800 PCIe", None),
           ("NVIDIA A100-SXM4-80GB", ("dgx-a100", "cluster-a100-hdr")),
           ("NVIDIA A100-PCIE-40GB", None), ("Tesla V100-SXM2-32GB", None)]


@pytest.mark.parametrize(("name", "want"), DEVICES, ids=[n for n, _ in DEVICES])
def test_a_device_name_points_to_its_machine_by_whole_word_and_never_a_card_s(name, want):
    """The presets a trace's or a log's device name is priced on: a GB200 is no B200, a GH200
    no H200, a PCIe or NVL card sits on no NVSwitch (no preset, rather than a wrong one)."""
    assert gpu_presets(name) == want


def test_a_device_name_matched_inside_words_is_caught():
    """The broken variant: the GPU's word found anywhere in the name."""
    def loose(name: str):
        return next(((one, many) for word, one, many in GPU_PRESETS if word in name.upper()),
                    None)
    assert [n for n, want in DEVICES if loose(n) != want] == \
        ["NVIDIA GB200", "NVIDIA H200 NVL", "NVIDIA H100 PCIe", "NVIDIA H800 PCIe",
         "NVIDIA A100-PCIE-40GB"]


def _ring(topo) -> float:
    return nccl_predict("all_reduce", 8 << 30, topo, algo="ring", proto="Simple").bus_bw


def test_an_h800_node_is_eight_links_and_more_nodes_never_make_its_ring_faster():
    """An H800's NVLink is cut to 400 GB/s both ways (DeepSeek in deepseek-ai/DeepSeek-V3#28):
    8 links of NVLink 4, a large ring all-reduce on one node at NCCL's 20.6 GB/s a link, 8/18 of
    an H100 node's (DeepEP's maintainers reached about 160 GB/s). Across nodes a ring's channel
    crosses NVLink as well as a NIC, at one speed (NCCL's search keeps a ring's two equal): on
    H800 nodes, whose NICs would carry more than their NVLink, the ring keeps its NVLink figure
    at any node count, where the NICs' share alone would price it past what the node carries."""
    h800 = load("hgx-h800")
    assert _ring(h800) == pytest.approx(8 * 20.6, rel=1e-3)
    assert _ring(h800) / _ring(load("dgx-h100")) == pytest.approx(8 / 18, rel=1e-3)
    assert [_ring(load("hgx-h800", n)) for n in (2, 3, 16)] == \
        pytest.approx([_ring(h800)] * 3, rel=1e-3)
    # negative: a graph whose inter-node speed is the NICs' share alone (8 x 48 GB/s over 16
    # channels), as the model once built it, is priced past the NVLink figure
    nics_alone = dataclasses.replace(load("hgx-h800", 16), graphs={
        "ring": {"channels": 16, "bw_intra": 8 * 20.6 / 16, "bw_inter": 8 * 48.0 / 16}})
    assert _ring(nics_alone) > 2 * _ring(h800)


def test_the_b200_preset_is_nccl_s_own_nvlink_figure():
    """NCCL's log on 8 x B200 prints maxBw 721.8 (NVIDIA/nccl#1807): 18 links x 40.1 GB/s."""
    topo = load("dgx-b200")
    ring = nccl_predict("all_reduce", 8 << 30, topo, algo="ring")
    assert topo.arch == "blackwell" and topo.nvlink_links * 40.1 == pytest.approx(721.8)
    assert ring.bus_bw == pytest.approx(721.8, rel=0.01)
