"""NCCL's tuning model and the layout's pricing on their less-used branches, each against values
worked out by hand from the constants (``costmodel/data/nccl-2.30.7.json``) and the presets.

Hopper's constants used below: 18 NVLink links x 20.6 GB/s = 370.8 GB/s per GPU, 16 channels
(23.175 GB/s each); a CX-7 NIC 48 GB/s; base latency (LL, LL128, Simple) ring 6.6 / 14 / 8.4,
pat 8; hardware latency NVLink ring 0.6 / 1.9 / 3.4, net ring 2.7 / 4 / 14, net tree Simple
14, net pat Simple 14, NVLink NVLS Simple 25, collnet direct 3.7 (NVLink) and 31 (net), chain
2.8 and 30; the LL bandwidth cap 141 GB/s (one Hopper node), 39 (nodes, Intel host: the Volta
row) or 22.5 (AMD host: the Ampere row); NVLS efficiency 0.85 and search speeds 60, 50, 40, 30,
24, 20, ... GB/s; net overhead 1 us (Intel), 2 us (AMD).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from commbench.costmodel.layout import call_time_us, group_ranks, group_span
from commbench.costmodel.layout_config import Layout
from commbench.costmodel.nccl import nccl_predict, nccl_table
from commbench.costmodel.topology import load
from commbench.patterns.base import Call

pytestmark = [pytest.mark.model]

MIB = 1 << 20


def _row(table, algo, proto):
    return next(t for t in table if (t.algo, t.proto) == (algo, proto))


def test_broadcast_and_reduce_are_a_chain_of_n_steps_on_the_ring_alone():
    """8 ranks on one node: nsteps = n = 8, every step one NVLink hop: Simple 8.4 + 8 x 3.4 =
    35.6 us at 370.8 GB/s; LL 6.6 + 8 x 0.6 = 11.4 us at min(141, 370.8 / 2) = 141 GB/s. Their
    algbw is their busbw (factor 1). Only the ring runs them."""
    h = load("dgx-h100")
    for op in ("broadcast", "reduce"):
        table = nccl_table(op, MIB, h)
        assert {t.algo for t in table} == {"ring"}
        simple, ll = _row(table, "ring", "Simple"), _row(table, "ring", "LL")
        assert simple.lat_us == pytest.approx(35.6)
        assert simple.alg_bw == pytest.approx(370.8) == simple.bus_bw
        assert simple.time_us == pytest.approx(35.6 + MIB / (1000 * 370.8))
        assert (ll.lat_us, ll.alg_bw, ll.bus_bw) == (pytest.approx(11.4), 141.0, 141.0)


def test_nvls_all_gather_and_all_reduce_by_hand():
    """NVLS on one H100 node, 16 channels: 370.8 / 16 = 23.175 GB/s per channel, so the search
    settles on 20 GB/s. All-gather: 20 x 0.85 x 15/16 x 7/8 per channel, x 16 = 223.125 GB/s,
    its algbw (not scaled by steps); busbw x 7/8. All-reduce: x 2 instead of x 7/8 = 510 GB/s
    of bus, algbw 510 x 8/14. Latency 25 us either way."""
    h = load("dgx-h100")
    ag = nccl_predict("all_gather", MIB, h, algo="nvls", proto="Simple")
    assert ag.alg_bw == pytest.approx(223.125)
    assert ag.bus_bw == pytest.approx(223.125 * 7 / 8)
    assert ag.time_us == pytest.approx(25.0 + MIB / (1000 * 223.125))
    ar = nccl_predict("all_reduce", MIB, h, algo="nvls", proto="Simple")
    assert ar.alg_bw == pytest.approx(510 * 8 / 14)
    assert ar.bus_bw == pytest.approx(510)
    assert {t.proto for t in nccl_table("all_gather", MIB, h) if t.algo == "nvls"} == {"Simple"}


def test_pat_and_the_rails_ring_with_one_gpu_per_node():
    """A rail of 4 nodes, one GPU each (one NIC, 48 GB/s, over 16 channels: 3 GB/s each): PAT
    runs all-gather and reduce-scatter only, bus 0.75 x 16 x 3 = 36 GB/s, latency 8 + log2(4) x
    14 / 3.5 + 2.8 x 4 = 27.2 us, busbw 36 x 3/4. The ring there prices its net hops at the
    tree's latency (one GPU per node): 8.4 + 3 x 14 = 50.4 us."""
    rail = load("cluster-h100-ndr", 4).part(4, 1)
    for op in ("all_gather", "reduce_scatter"):
        pat = nccl_predict(op, MIB, rail, algo="pat", proto="Simple")
        assert (pat.alg_bw, pat.lat_us) == (pytest.approx(36.0), pytest.approx(27.2))
        assert pat.bus_bw == pytest.approx(27.0)
        assert nccl_predict(op, MIB, rail, algo="ring", proto="Simple").lat_us == pytest.approx(50.4)
    assert "pat" not in {t.algo for t in nccl_table("all_reduce", MIB, rail)}
    assert "pat" not in {t.algo for t in nccl_table("all_gather", MIB, load("dgx-h100"))}


def test_an_amd_host_pays_its_net_overhead_and_the_amperes_ll_cap():
    """Two nodes, 16 ranks, ring LL all-reduce: 30 steps, 2 across the net. Intel: each NVLink
    step max(0.6, 1) = 1 us, 6.6 + 28 + 2 x 2.7 = 40 us, LL capped at 39 GB/s. AMD: max(0.6, 2)
    = 2 us, 6.6 + 56 + 5.4 = 68 us, capped at 22.5 GB/s."""
    intel = load("cluster-h100-ndr", 2)
    amd = replace(intel, cpu_vendor="amd")
    for topo, lat, cap in ((intel, 40.0, 39.0), (amd, 68.0, 22.5)):
        ll = nccl_predict("all_reduce", 8, topo, algo="ring", proto="LL")
        assert (ll.lat_us, ll.bus_bw) == (pytest.approx(lat), pytest.approx(cap))


def test_collnet_runs_all_reduce_only_where_the_fabric_has_it():
    """Two nodes with CollNet (SHARP): direct 0 + 2 x (3.7 + 7 x 0.4) + 31 = 44 us, chain
    0 + 2 x 7 x 2.8 + 30 = 69.2 us, both at half the bus: 370.8 / 2 GB/s."""
    plain = load("cluster-h100-ndr", 2)
    sharp = replace(plain, collnet=True)
    assert not {t.algo for t in nccl_table("all_reduce", MIB, plain)} & {"collnet_direct",
                                                                        "collnet_chain"}
    direct = nccl_predict("all_reduce", MIB, sharp, algo="collnet_direct", proto="Simple")
    chain = nccl_predict("all_reduce", MIB, sharp, algo="collnet_chain", proto="Simple")
    assert (direct.lat_us, chain.lat_us) == (pytest.approx(44.0), pytest.approx(69.2))
    assert direct.alg_bw == pytest.approx(370.8 / 2) == chain.alg_bw
    assert not {t.algo for t in nccl_table("all_gather", MIB, sharp)} & {"collnet_direct"}


@pytest.mark.parametrize("size, stride, per_node, span", [
    (16, 1, 8, (2, 8)),   # dp over two whole nodes
    (4, 8, 8, (4, 1)),    # one GPU per node: a rail
    (4, 2, 8, (1, 4)),    # every other GPU of one node
    (8, 4, 8, (4, 2)),    # two per node, four nodes
    (1, 1, 8, (1, 1)),    # a group of one
    (8, 1, 8, (1, 8)),    # exactly one node
    (12, 1, 8, (2, 8)),   # a node and a half: two nodes, the second part-filled
    (6, 2, 8, (2, 4)),    # every other GPU, more than one node holds
])
def test_group_span_by_hand(size, stride, per_node, span):
    assert group_span(tuple(range(0, size * stride, stride)), per_node) == span


def test_each_axis_s_group_by_hand_in_megatron_order():
    """tp=2, cp=2, ep=2, dp=4 (16 ranks; TP fastest, then cp, ep, dp/ep): rank 5 is t=1, c=0,
    e=1, d=0. Its dp group spans every rank with t=1 (cp x dp = 8); its edp group keeps e=1 and
    varies c and d: strides 2 and 8 at once."""
    lay = Layout(tp=2, cp=2, ep=2, dp=4, experts=4, seq=8)
    assert group_ranks(lay, "tp", 5) == (4, 5)
    assert group_ranks(lay, "cp", 5) == (5, 7)
    assert group_ranks(lay, "ep", 5) == (1, 5)
    assert group_ranks(lay, "dp", 5) == (1, 3, 5, 7, 9, 11, 13, 15)
    assert group_ranks(lay, "edp", 5) == (5, 7, 13, 15)
    assert group_ranks(lay, "pp", 5) == (5,)
    assert group_span(group_ranks(lay, "edp", 5), 8) == (2, 2)


def test_layout_prices_point_to_point_and_all_to_all_on_the_links_they_cross():
    """NCCL's point-to-point model (costmodel/p2p.py) on 2 DGX H100 nodes: a send between nodes
    costs 8.4 + 14 us and 1 MB over one NIC, 48 GB/s; inside a node 8.4 + 3.4 us and 1 MB over
    370.8 GB/s; a receive costs nothing more. An all-to-all of 16 ranks, 8 per node, of S: 7/16
    of S to the node's others over NVLink and 8/16 over the NIC at once, the slower setting the
    time."""
    topo = load("cluster-h100-ndr", 2)
    send = Call("isend", "pp", 10**6, 10**6, 0)
    t, pick = call_time_us(send, 2, topo, (2, 1), "2.30.7")
    assert (t, pick) == (pytest.approx(22.4 + 10**6 / (1000 * 48)), "p2p/Simple")
    assert call_time_us(send, 2, topo, (1, 2), "2.30.7")[0] == pytest.approx(11.8 + 10**6 / 370.8e3)
    assert call_time_us(Call("irecv", "pp", 10**6, 0, 10**6), 2, topo, (2, 1), "2.30.7")[0] == 0.0
    S = 16 * 10**6
    a2a = Call("all_to_all", "ep", S, S * 15 // 16, S * 15 // 16)
    assert call_time_us(a2a, 16, topo, (2, 8), "2.30.7")[0] == pytest.approx(
        22.4 + max(S * 7 / 16 / 370.8e3, S * 8 / 16 / 48e3))


def test_layout_prices_a_collective_at_nccl_tests_size_on_the_groups_own_part():
    """An all-gather's call holds one rank's block, NCCL's model the whole output (x n); an
    all-reduce its buffer. Each on the group's own part of the machine: 2 nodes x 8 GPUs."""
    topo = load("cluster-h100-ndr", 2)
    part = topo.part(2, 8)
    ag = Call("all_gather", "dp", MIB, 15 * MIB, 15 * MIB)
    t, pick = call_time_us(ag, 16, topo, (2, 8), "2.30.7")
    want = nccl_predict("all_gather", 16 * MIB, part)
    assert (t, pick) == (pytest.approx(want.time_us), f"{want.algo}/{want.proto}")
    ar = Call("all_reduce", "dp", MIB, 0, 0)
    assert call_time_us(ar, 16, topo, (2, 8), "2.30.7")[0] == pytest.approx(
        nccl_predict("all_reduce", MIB, part).time_us)
    # the same all-reduce on 2 GPUs of one node is cheaper than across the 2 nodes
    assert call_time_us(ar, 2, topo, (1, 2), "2.30.7")[0] < call_time_us(ar, 2, topo, (2, 1), "2.30.7")[0]
    assert math.isclose(call_time_us(ar, 2, topo, (2, 1), "2.30.7")[0],
                        nccl_predict("all_reduce", MIB, topo.part(2, 1)).time_us)


@pytest.mark.parametrize("nodes, want", [
    # (algo, proto) -> bus bandwidth, GB/s; one node: the GPU's 370.8 over NVLink
    (1, {("ring", "LL"): 141.0, ("ring", "LL128"): 0.92 * 370.8, ("ring", "Simple"): 370.8,
         ("tree", "LL"): 370.8 / 3.8, ("tree", "LL128"): 370.8 * 7 / 9,
         ("tree", "Simple"): 0.92 * 370.8, ("nvls", "Simple"): 510.0}),
    # two nodes: still NVLink's per channel (23.175 < the NIC's 24), LL at the Volta row's 39;
    # the tree's LL128 at 120/128; NVLS-tree at 20 x 0.85 x 15/16 x 2 per channel
    (2, {("ring", "LL"): 39.0, ("ring", "LL128"): 0.92 * 370.8, ("ring", "Simple"): 370.8,
         ("tree", "LL"): 39.0, ("tree", "LL128"): 370.8 * 120 / 128,
         ("tree", "Simple"): 0.92 * 370.8, ("nvls_tree", "Simple"): 510.0}),
    # three nodes: a channel crosses NVLink and a NIC at one speed, NVLink's 23.175 (< the
    # NIC's 24), LL at 20.4; NVLS-tree net-bound at the NIC's 24 per channel (384 in all)
    (3, {("ring", "LL"): 20.4, ("ring", "LL128"): 0.92 * 370.8, ("ring", "Simple"): 370.8,
         ("tree", "LL"): 20.4, ("tree", "LL128"): 370.8 * 120 / 128,
         ("tree", "Simple"): 0.92 * 370.8, ("nvls_tree", "Simple"): 384.0}),
])
def test_every_all_reduce_row_s_bus_bandwidth_by_hand(nodes, want):
    """All-reduce of 8 B (no tree correction below 64 B) on 1, 2, 3 DGX H100 nodes: each
    enabled (algorithm, protocol)'s bus bandwidth, the figure NCCL divides the bytes by. The
    tree's and CollNet's algbw is half the bus, the ring's and NVLS's bus x n / nsteps."""
    topo = load("cluster-h100-ndr", nodes) if nodes > 1 else load("dgx-h100")
    n = topo.ranks
    table = {(t.algo, t.proto): t for t in nccl_table("all_reduce", 8, topo)}
    assert set(table) == set(want)
    for key, bus in want.items():
        alg = bus * 0.5 if key[0] == "tree" else bus * n / (2 * (n - 1))
        assert table[key].alg_bw == pytest.approx(alg), key
        assert table[key].bus_bw == pytest.approx(alg * 2 * (n - 1) / n), key


def test_loss_none_prices_no_embedding_on_dp():
    """``loss=none`` leaves the embedding and head out: the vocabulary's size changes nothing
    the gradients' all-reduce moves; with a loss it adds its V x h / tp gradient, in grad_bytes
    (4 by default; a ring all-reduce on 2 ranks sends 2 (n-1)/n = 1 times its buffer)."""
    from commbench.costmodel.layout import predict_layout

    def dp_bytes(loss, vocab):
        lay = Layout(tp=2, dp=2, loss=loss, vocab=vocab, layers=2, hidden=64, heads=4)
        return next(r["bytes_per_rank"] for r in predict_layout(lay, load("dgx-h100"))
                    if r["group"] == "dp")

    assert dp_bytes("none", 2) == dp_bytes("none", 1000)
    assert dp_bytes("megatron", 1000) - dp_bytes("megatron", 2) == (1000 - 2) * 64 // 2 * 4
