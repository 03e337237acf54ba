"""The two-level cost model (costmodel/twolevel.py), the node layout (runtime/nodes.py) and the
mismatched-MPI check, from lists and dicts; and the model's link bytes against the bytes the
ring and hierarchical all-reduce really send between nodes, counted on the wire at 4 ranks."""

from __future__ import annotations

import json
import math

import pytest
import torch
from said import said

from commbench.collectives import ALGORITHMS
from commbench.costmodel.twolevel import (
    HostCluster,
    fit_host,
    host_us,
    link_bytes,
    link_steps,
    load,
    predict_us,
    validate,
)
from commbench.runtime.nodes import NodeLayout
from commbench.world.context import mpi_mismatch

pytestmark = pytest.mark.foundation

MiB = 1 << 20


def test_link_bytes_of_each_algorithm():
    S = 64 * MiB
    assert link_bytes("ring", "gloo", 2, 2, S) == 1.5 * S  # 2(n-1)/n, n = 4
    assert link_bytes("native", "gloo", 2, 2, S) == 1.5 * S
    assert link_bytes("hierarchical", "mpi", 2, 2, S) == S  # 2(N-1)/N, N = 2
    assert link_bytes("native", "mpi", 2, 2, S) == S
    assert link_bytes("hierarchical", "gloo", 4, 8, S) == 1.5 * S
    assert link_bytes("ring", "gloo", 4, 8, S) == pytest.approx(2 * 31 / 32 * S)
    assert link_bytes("ring", "gloo", 1, 8, S) == 0.0
    with pytest.raises(ValueError, match="algo='tree' on gloo: no two-level terms"):
        link_bytes("tree", "gloo", 2, 2, S)
    assert [link_steps(a, t, 2, 2) for a, t in (("ring", "mpi"), ("native", "gloo"),
                                                 ("native", "mpi"), ("hierarchical", "gloo"))] \
        == [6, 6, 2, 2]
    assert link_steps("ring", "gloo", 1, 8) == 0


def _cluster(**kw) -> HostCluster:
    host = {"gloo/ring": [{"from_bytes": 0, "alpha_us": 100.0, "beta_us_per_byte": 1e-3},
                          {"from_bytes": MiB, "alpha_us": 50.0, "beta_us_per_byte": 2e-3}]}
    return HostCluster(**{"name": "t", "nodes": 2, "ranks_per_node": 2, "link_Gbps": 1.0,
                          "host": host, **kw})


def test_prediction_adds_host_and_link_and_gives_the_overlapped_bound():
    c = _cluster()
    small = predict_us(c, "gloo", "ring", 1000)
    assert small["host_us"] == pytest.approx(100 + 1.0)
    assert small["link_us"] == pytest.approx(1500 / 125)  # 1 Gbit/s = 125 bytes per us
    big = predict_us(c, "gloo", "ring", 16 * MiB)
    assert big["host_us"] == pytest.approx(50 + 2e-3 * 16 * MiB)  # the second regime
    regimes = c.host["gloo/ring"]  # the boundary: from_bytes is the second regime's first size
    assert host_us(regimes, MiB) == pytest.approx(50 + 2e-3 * MiB)
    assert host_us(regimes, MiB - 1) == pytest.approx(100 + 1e-3 * (MiB - 1))
    hier = predict_us(_cluster(host={"mpi/hierarchical": regimes}, nodes=4), "mpi",
                      "hierarchical", 16 * MiB)  # the bound: 2(N-1)/N * S over the link
    assert hier["link_us"] == pytest.approx(2 * 3 / 4 * 16 * MiB / 125)
    assert big["time_us"] == pytest.approx(big["host_us"] + big["link_us"])
    assert big["overlap_us"] == max(big["host_us"], big["link_us"])
    fast = predict_us(c.at(10.0), "gloo", "ring", 16 * MiB)
    assert fast["link_us"] == pytest.approx(big["link_us"] / 10)
    lat = predict_us(_cluster(link_latency_us=5.0), "gloo", "ring", 16 * MiB)
    assert lat["link_us"] - big["link_us"] == pytest.approx(5.0 * 6)  # 2(n-1) ring steps
    with pytest.raises(ValueError, match="no host constants for mpi/ring"):
        predict_us(c, "mpi", "ring", 8)


def test_fit_host_recovers_each_regimes_line():
    rows = [{"op": "all_reduce", "transport": "mpi", "algo": "ring", "size": s,
             "time_us": (30 + 0.01 * s) if s < MiB else (400 + 0.004 * s)}
            for s in (8, 1024, 65536, 262144, MiB, 4 * MiB, 16 * MiB)]
    h = fit_host(rows)["mpi/ring"]
    assert [r["from_bytes"] for r in h] == [0, MiB]
    assert h[0]["alpha_us"] == pytest.approx(30) and h[0]["beta_us_per_byte"] == pytest.approx(0.01)
    assert h[1]["alpha_us"] == pytest.approx(400) and h[1]["beta_us_per_byte"] == pytest.approx(0.004)
    assert fit_host(rows[:1]) == {}  # one row fits no line


@pytest.mark.parametrize("change, message", [
    ({"nodes": 0}, "nodes=0: must be an integer >= 1"),
    ({"link_Gbps": 0}, "link_Gbps=0: must be a finite number > 0"),
    ({"link_Gbps": math.nan}, "link_Gbps=nan: must be a finite number > 0"),
    ({"link_latency_us": -1}, "link_latency_us=-1: must be a finite number >= 0"),
    ({"rate": 1}, "unknown field 'rate'"),
    ({"host": {"nccl/ring": []}}, "host.nccl/ring: must be transport/algo"),
    ({"host": {"gloo/ring": [{"from_bytes": 8, "alpha_us": 1, "beta_us_per_byte": 0}]}},
     r"from_bytes \[8\]: must start at 0"),
    ({"host": {"gloo/ring": [{"from_bytes": 0, "alpha_us": -1, "beta_us_per_byte": 0}]}},
     "must be >= 0"),
])
def test_a_bad_hosts_file_is_refused_naming_field_and_rule(change, message):
    data = {"name": "t", "kind": "hosts", "nodes": 2, "ranks_per_node": 2, "link_Gbps": 1.0,
            **change}
    with pytest.raises(ValueError, match=message):
        validate(data, "f.json")
    with pytest.raises(ValueError, match="missing field 'link_Gbps'"):
        validate({"name": "t", "nodes": 2, "ranks_per_node": 2}, "f.json")


def test_the_committed_cluster_topology_loads_and_predicts(tmp_path):
    from pathlib import Path

    path = Path(__file__).parents[1] / "results" / "cluster_emulated-2x2-topology.json"
    c = load(str(path))
    assert (c.nodes, c.ranks_per_node) == (2, 2)
    for key in c.host:
        transport, _, algo = key.partition("/")
        assert predict_us(c, transport, algo, 64 * MiB)["time_us"] > 0
    other = tmp_path / "gpu.json"
    other.write_text(json.dumps({"name": "x", "arch": "hopper"}))
    assert load(str(other)) is None and load("dgx-h100") is None


def test_node_layout_from_host_names():
    two = NodeLayout(("a", "a", "b", "b"))
    assert two.per_node == 2 and two.contiguous and two.node_size() == 2
    assert two.local_groups() == [(0, 1), (2, 3)] and two.cross_groups() == [(0, 2), (1, 3)]
    assert two.describe() == "2 x 2 (a: 0-1; b: 2-3)"
    robin = NodeLayout(("a", "b", "a", "b"))  # a launcher placing ranks round-robin
    assert robin.per_node == 2 and not robin.contiguous and robin.node_size() is None
    assert robin.describe() == "2 x 2 (a: 0,2; b: 1,3)"
    # 512 ranks placed round-robin on 64 hosts: each host's ranks a stride, not 8 numbers
    wide = NodeLayout(tuple(f"h{r % 64}" for r in range(512)))
    assert wide.describe().startswith("64 x 8 (h0: 0-448:64; h1: 1-449:64; ")
    odd = NodeLayout(("a", "a", "a", "b"))
    assert odd.per_node is None and odd.describe().startswith("2 of unequal size")
    with pytest.raises(ValueError, match="unequal size"):
        odd.cross_groups()
    assert odd.node_size() is None and NodeLayout(("h",) * 4).node_size() is None  # one host


def test_a_launcher_with_another_mpis_library_is_named_before_init():
    mpich, ompi = "MPICH Version:      5.0.2\nMPICH Release date: ...", "Open MPI v5.0.11, ..."
    assert "Open MPI's mpirun started this rank but mpi4py loads 'MPICH Version: 5.0.2'" in \
        mpi_mismatch("openmpi", mpich)
    assert ("a PMI launcher (MPICH's mpiexec, srun --mpi=pmi2) started this rank but mpi4py "
            "loads 'Open MPI v5.0.11, ...'") in \
        mpi_mismatch("mpich", ompi)
    for ok in (("openmpi", ompi), ("mpich", mpich), ("mpich", "Intel(R) MPI Library 2021"),
               ("slurm", mpich), ("slurm", ompi), ("pmix", ompi), ("torchrun", mpich)):
        assert mpi_mismatch(*ok) is None


def _count_cross_node(ctx, transport: str, algo: str, count: int) -> dict[int, int]:
    """Bytes this rank sends to each other rank in one all-reduce of ``count`` floats, read off
    the record of its posts (commbench.wire.posts)."""
    from commbench.wire.posts import recording

    comm = ctx.comm(transport)
    with recording(ctx) as posts:
        ALGORITHMS[("all_reduce", algo)].bind(ctx, comm, torch.ones(count))()
    sent: dict[int, int] = {}
    for p in posts.items:
        if p.kind == "send":
            sent[p.peer] = sent.get(p.peer, 0) + p.nbytes
    return sent


@pytest.mark.world(sizes=[4])
@pytest.mark.parametrize("algo", ["ring", "hierarchical"])
def test_link_bytes_equal_what_the_algorithm_sends_between_nodes(world, algo):
    """Nodes of 2 adjacent ranks (the hierarchical grid's cut): the bytes node 0's ranks send to
    node 1's, summed from every message of the algorithm, are the model's link bytes."""
    count = 3000
    sent = world.run(_count_cross_node, world.transports[0], algo, count)
    node = [0, 0, 1, 1]
    for src in (0, 1):
        crossing = sum(sum(b for dst, b in sent[r].items() if node[dst] != node[r])
                       for r in range(4) if node[r] == src)
        assert crossing == link_bytes(algo, "gloo", 2, 2, count * 4)


def _interleaved_crossing(sent: list[dict[int, int]], node: list[int], src: int) -> int:
    return sum(sum(b for dst, b in sent[r].items() if node[dst] != node[r])
               for r in range(len(node)) if node[r] == src)


@pytest.mark.world(sizes=[4])
def test_the_crossing_count_sees_a_launcher_that_places_ranks_round_robin(world):
    """Negative: the same count with the nodes interleaved (ranks 0, 2 on one host) is not the
    model's: every ring edge then crosses, twice the bytes; the model assumes adjacent ranks
    share a node, and the count is able to tell."""
    count = 3000
    sent = world.run(_count_cross_node, world.transports[0], "ring", count)
    crossing = _interleaved_crossing(sent, [0, 1, 0, 1], 0)
    assert crossing == 2 * link_bytes("ring", "gloo", 2, 2, count * 4)


def test_predict_on_a_hosts_topology(tmp_path, capsys):
    from commbench.cli.main import main

    c = _cluster()
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps({**c.__dict__, "sources": []}))
    assert main(["predict", "collective", "all_reduce", "16M", "--topology", str(path),
                 "--link-gbit", "10"]) == 0
    out = capsys.readouterr().out
    assert "4 ranks (2 x 2), link 10 Gbit/s each way" in out
    p = predict_us(c.at(10.0), "gloo", "ring", 16 * MiB)
    assert f"{p['time_us']:.1f}" in out and f"{p['link_us']:.1f}" in out
    for argv, says in ((["all_gather", "16M", "--topology", str(path)], "all_reduce only"),
                       (["all_reduce", "16M", "--topology", str(path), "--link-gbit", "0"],
                        "--link-gbit 0.0: must be > 0"),
                       (["all_reduce", "16M", "--link-gbit", "1"], "only for a hosts topology"),
                       (["all_reduce", "16M", "--topology", f"{path},dgx-h100"],
                        "in separate calls")):
        assert main(["predict", "collective", *argv]) == 2
        assert says in said(capsys)


def _hierarchical_on_nodes_of(ctx, local: int, nbytes: int) -> dict:
    from commbench.collectives.measure import Case, measure

    saved, ctx.node_size = ctx.node_size, local  # as Context.from_launcher finds it on hosts
    try:
        return measure(ctx, Case("all_reduce", ctx.transports[0], "hierarchical", iters=1,
                                 warmup=0), nbytes)
    finally:
        ctx.node_size = saved


def _peers_on_nodes_of(ctx, local: int | None, count: int) -> list[int]:
    saved, ctx.node_size = ctx.node_size, local
    try:
        return sorted(_count_cross_node(ctx, ctx.transports[0], "hierarchical", count))
    finally:
        ctx.node_size = saved


@pytest.mark.world(sizes=[4, 8])
def test_the_hierarchical_all_reduce_runs_on_the_world_s_own_nodes(world):
    """A launched world on hosts of L ranks each runs the hierarchical all-reduce on nodes of L,
    not on the nodes of 2 of one host: the right result, the bytes predicted for nodes of L, and
    rank 0 talks to its ring neighbour in the node and to rank L, its partner on the next node
    (with nodes of 2: to ranks 1 and 2)."""
    from commbench.collectives import ALGORITHMS

    n, count = world.size, 1000
    record = ALGORITHMS[("all_reduce", "hierarchical")]
    for local in (4, n) if n == 8 else (4,):
        outs = world.run(_hierarchical_on_nodes_of, local, count * 4)
        assert sum(o["wrong"] for o in outs) == 0
        for i, o in enumerate(outs):
            assert o["sent"] == o["pred_sent"] == record.bytes(n, i, count, 4, local=local)[0]
        peers = world.run(_peers_on_nodes_of, local, count)[0]
        assert peers == ([1, local] if local < n else [1])
    assert world.run(_peers_on_nodes_of, None, count)[0] == [1, 2]  # one host: nodes of 2
