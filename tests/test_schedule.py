"""Compiled schedules: bitwise the reference algorithms, replayable, refusing bad calls up front.

The oracle and byte properties of ``<algo>_compiled`` run with every other algorithm in
``test_algorithms.py``; here, what is particular to compiling: the same blocks, peers and order of
operations as the reference path give bitwise the same floats (not merely close ones), a compiled
object replays any number of times, and bad arguments fail before any message.
"""

from __future__ import annotations

import pytest
import torch
from collective_cases import judge
from hypothesis import given
from hypothesis import strategies as st
from schedule_cases import messages, refusal, replay, waits

from commbench.collectives.algorithm import Step
from commbench.collectives.compiled.reduce import TINY, tiny_reducer
from commbench.collectives.compiled.steps import SCHEDULES, SPLIT, pieces, step_list, tiny_first_only

pytestmark = [pytest.mark.collectives, pytest.mark.ring]

ALGOS = sorted(SCHEDULES)


@pytest.mark.world(sizes=[1, 2, 3, 4, 5, 8])
@given(algo=st.sampled_from(ALGOS), count=st.sampled_from([0, 1, 7, 13, 97]) | st.integers(0, 300),
       dtype=st.sampled_from(["float32", "float64", "float16", "bfloat16"]),
       redop=st.sampled_from(["sum", "avg", "prod", "min", "max"]), seed=st.integers(0, 999),
       segment=st.sampled_from([None, 0, 8, 24]), wait=st.sampled_from([None, "spin", "yield"]))
def test_compiled_equals_the_reference_bitwise(world, algo, count, dtype, redop, seed, segment,
                                               wait):
    """``segment``: MPI messages split into pieces of that many bytes (tiny, so that these counts
    split); ``wait``: MPI's own wait or test-and-yield (None: by ranks per core); the same bytes
    land in the same places."""
    for transport in world.transports:
        assert judge(world, transport, "all_reduce", f"{algo}_compiled", count=count,
                     dtype=dtype, redop=redop, seed=seed, values="random", segment=segment,
                     wait=wait) == []


@pytest.mark.world(sizes=[2, 3, 4])
@pytest.mark.parametrize("algo", ALGOS)
def test_bitwise_comparison_catches_a_dropped_piece(world, algo):
    if "mpi" not in world.transports:
        pytest.skip("messages are split over MPI only")
    # 32 B = 8 float32: every schedule here then has messages of 9..32 elements (the ring's
    # are a rank's block: 10 elements a rank)
    count = 10 * world.size if algo == "ring" else 30
    case = dict(count=count, seed=5, values="random", segment=32)
    assert judge(world, "mpi", "all_reduce", f"{algo}_compiled", broken="short_pieces", **case)
    assert judge(world, "mpi", "all_reduce", f"{algo}_compiled", **case) == []


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("algo", ALGOS)
def test_bitwise_comparison_catches_a_tiny_reduction_that_drops_an_element(world, algo):
    """Counts at which the ranks combine blocks of TINY = 2 elements (the ring: a block per
    rank; Rabenseifner: half the vector each)."""
    count = {"ring": world.size * TINY, "rabenseifner": 2 * TINY}.get(algo, TINY)
    for transport in world.transports:
        case = dict(count=count, seed=5, values="random")
        assert judge(world, transport, "all_reduce", f"{algo}_compiled",
                     broken="tiny_first_only", **case)
        assert judge(world, transport, "all_reduce", f"{algo}_compiled", **case) == []


def tiny_mismatches(make, op: str, xs: list[float], ys: list[float], dtype) -> list[str]:
    """Where ``make(op, a, b)()`` leaves ``a`` with other bits than NumPy's ufunc in place. Of
    two NaNs, IEEE 754 (6.2.3) leaves open which one's payload the result carries, and neither
    NumPy (its vector and scalar loops differ) nor C (either operand order) fixes it: there the
    result must be one of the two, quieted, of either sign."""
    import numpy as np

    a, b = np.array(xs, dtype), np.array(ys, dtype)
    want = a.copy()
    with np.errstate(all="ignore"):
        {"prod": np.multiply}.get(op, np.add)(want, b, want)
        make(op, a, b)()
    bits = np.dtype(dtype).itemsize * 8
    uint, sign = np.dtype(f"u{bits // 8}").type, 1 << (bits - 1)
    quiet = 1 << (51 if bits == 64 else 22)  # the fraction's top bit

    def payload(v) -> int:  # a NaN's bits, quieted, without its sign
        return (int(np.array(v, dtype).view(uint)) | quiet) & ~sign

    def same(x, y, g, w) -> bool:
        if np.isnan(x) and np.isnan(y):
            return bool(np.isnan(g)) and payload(g) in (payload(x), payload(y))
        return g.tobytes() == w.tobytes()

    return [f"{op} {dtype.__name__}: {x!r} with {y!r} gave {g!r}, NumPy {w!r}"
            for x, y, g, w in zip(np.array(xs, dtype), np.array(ys, dtype), a, want)
            if not same(x, y, g, w)]


_FLOATS = {"float32": st.floats(width=32), "float64": st.floats(allow_nan=True)}


@given(op=st.sampled_from(["sum", "avg", "prod"]), dtype=st.sampled_from(sorted(_FLOATS)),
       data=st.data())
def test_a_tiny_reduction_has_numpys_bits(op, dtype, data):
    """Any floats, infinities, NaNs and subnormals included; 1 and TINY elements."""
    import numpy as np

    n = data.draw(st.integers(1, TINY))
    xs, ys = (data.draw(st.lists(_FLOATS[dtype], min_size=n, max_size=n)) for _ in range(2))
    assert tiny_mismatches(tiny_reducer, op, xs, ys, getattr(np, dtype)) == []


def test_a_tiny_reduction_check_catches_rounding_in_the_wrong_width():
    """Negative: float32 combined as float16 (a rounding too many), and an element dropped."""
    import numpy as np

    def half(op, a, b):
        def f() -> None:
            a[:] = (a.astype(np.float16) + b.astype(np.float16)).astype(a.dtype)
        return f

    assert tiny_mismatches(half, "sum", [1.0 + 2 ** -20], [1.0], np.float32)
    assert tiny_mismatches(tiny_first_only, "sum", [1.0, 2.0], [3.0, 4.0], np.float32)

    def foreign(op, a, b):  # of two NaNs, a NaN with neither one's payload
        def f() -> None:
            a[:] = np.nan
        return f

    nans = [np.array([bits], np.uint64).view(np.float64)[0] for bits in (0x7FF8_0000_0000_0001,
                                                                         0xFFF8_0000_0000_0ABC)]
    assert tiny_mismatches(foreign, "sum", nans[:1], nans[1:], np.float64)
    assert tiny_mismatches(tiny_reducer, "sum", nans[:1], nans[1:], np.float64) == []
    assert tiny_reducer("max", np.zeros(2), np.zeros(2)) is None  # only sum, avg, prod
    assert tiny_reducer("sum", np.zeros(TINY + 1), np.zeros(TINY + 1)) is None
    assert tiny_reducer("sum", np.zeros(2, np.int32), np.zeros(2, np.int32)) is None


def test_pieces_cover_a_message_in_order_within_the_split_range():
    assert pieces(3, 10, 0) == [(3, 10)] and pieces(3, 10, 7) == [(3, 10)]
    assert pieces(3, 10, 3) == [(3, 6), (6, 9), (9, 10)]
    assert pieces(0, SPLIT * 4 + 1, 4) == [(0, SPLIT * 4 + 1)]  # long: whole (rendezvous wins)
    for lo, hi, seg in [(0, 16, 4), (5, 6, 1), (2, 13, 4)]:
        got = pieces(lo, hi, seg)
        assert got[0][0] == lo and got[-1][1] == hi
        assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
        assert all(0 < b - a <= seg for a, b in got)


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_split_messages_are_booked_as_their_pieces(world, algo, dtype):
    """16 B segments: pieces of 16 / itemsize elements (2 float64, 4 float32, 8 float16), each
    booked at its elements x itemsize bytes."""
    itemsize = getattr(torch, dtype).itemsize
    for transport in world.transports:
        split_any = could = False
        for count in (12, 24, 40):
            for split, whole, booked in world.run(messages, transport, algo, count, 16, dtype):
                assert booked == [(n, n * itemsize) for _, n in split]
                if transport != "mpi":
                    assert split == whole
                    continue
                per = 16 // itemsize
                assert split == [(k, b - a) for k, c in whole for a, b in pieces(0, c, per)]
                split_any |= len(split) > len(whole)
                could |= any(per < c <= SPLIT * per for _, c in whole)  # else whole by rule
        assert split_any == could


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("wait", ["spin", "yield"])
def test_the_wait_asked_for_is_the_one_used(world, wait):
    if "mpi" not in world.transports:
        pytest.skip("the compiled schedules wait on MPI requests only")
    for asked in world.run(waits, "mpi", "ring", 8, wait):
        assert asked and set(asked) == {wait}, asked


@pytest.mark.world(sizes=[3, 4])
@pytest.mark.parametrize("algo", ALGOS)
def test_bitwise_comparison_catches_a_miscombined_block(world, algo):
    for transport in world.transports:
        assert judge(world, transport, "all_reduce", f"{algo}_compiled", count=40, seed=5,
                     values="random", broken="miscombine")


@pytest.mark.world(sizes=[4])
@pytest.mark.parametrize("algo", ALGOS)
def test_a_compiled_schedule_replays(world, algo):
    for transport in world.transports:
        outs = world.run(replay, transport, algo, 10, 3)
        want = torch.arange(10, dtype=torch.int64) * sum(range(1, world.size + 1))
        for runs, booked, per_call in outs:
            assert all(torch.equal(y, want) for y in runs)
            assert booked == 3 * per_call


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize(("op", "dtype", "words"), [
    ("median", torch.float32, "op='median': must be one of"),
    ("avg", torch.int32, "avg needs a floating dtype"),
])
def test_bad_calls_are_refused_before_any_message(world, op, dtype, words):
    for transport in world.transports:
        for msg in world.run(refusal, transport, "ring", op, dtype):
            assert msg is not None and words in msg


def test_schedules_pair_up():
    """Every message a member sends is one its peer receives, same step order, same length."""
    for algo in ALGOS:
        for n in range(1, 9):
            for count in (0, 1, 5, 64, 101):
                steps = [step_list(algo, n, i, count) for i in range(n)]
                sent = {(i, s.dst): [] for i in range(n) for s in steps[i]}
                for i in range(n):
                    for s in steps[i]:
                        if s.send and s.send[1] > s.send[0]:
                            sent.setdefault((i, s.dst), []).append(s.send[1] - s.send[0])
                for j in range(n):
                    got: dict[int, list[int]] = {}
                    for s in steps[j]:
                        if s.recv and s.recv[1] > s.recv[0]:
                            got.setdefault(s.src, []).append(s.recv[1] - s.recv[0])
                    for i, lengths in got.items():
                        assert sent.get((i, j), []) == lengths, (algo, n, count, i, j)


def test_unknown_schedule_is_named():
    with pytest.raises(ValueError, match="algo='tree': must be one of"):
        step_list("tree", 4, 0, 10)
    assert Step().avg is None


def test_a_negative_segment_is_refused():
    import types

    from commbench.collectives.compiled.schedule import Compiled

    with pytest.raises(ValueError, match=r"ring_compiled: segment=-1: must be >= 0 bytes"):
        Compiled(types.SimpleNamespace(transport="mpi"), torch.zeros(4), None, [], "sum",
                 "ring_compiled", -1)


class _Done:
    def wait(self) -> None:
        pass


class _Landed:
    """A gloo process group stand-in on which every peer's message is already there: a receive
    is filled the moment it is posted (the worst case for receives posted together)."""

    def __init__(self, vectors: dict[int, torch.Tensor]) -> None:
        self.vectors, self.sent = vectors, []

    def recv(self, tensors, src, tag):
        tensors[0].copy_(self.vectors[src])
        return _Done()

    def send(self, tensors, dst, tag):
        self.sent.append((dst, tensors[0].clone()))
        return _Done()


def _joint_root(n: int, steps: list[Step]) -> tuple[torch.Tensor, _Landed]:
    import types

    from commbench.collectives.compiled.schedule import Compiled

    xs = [torch.arange(5, dtype=torch.float64) * 10 ** r for r in range(n)]
    pg = _Landed(dict(enumerate(xs)))
    group = types.SimpleNamespace(size=n, index=0, torch_pg=pg)
    buf = xs[0].clone()
    Compiled(types.SimpleNamespace(transport="gloo", posts=None), buf, group, steps, "sum",
             "naive").run()
    return buf - sum(xs), pg


@pytest.mark.parametrize("n", [3, 4, 6])
def test_receives_posted_together_land_in_their_own_blocks(n):
    steps = step_list("naive", n, 0, 5)
    assert sum(s.joint for s in steps) == 2 * (n - 2)  # receives and sends: one run each
    err, pg = _joint_root(n, steps)
    assert not err.any()
    assert [d for d, _ in pg.sent] == list(range(1, n))
    assert all(torch.equal(t, pg.sent[0][1]) for _, t in pg.sent)


@pytest.mark.parametrize("n", [3, 4])
def test_receives_posted_together_into_one_block_are_caught(n):
    """Negative: the same run with every receive in scratch block 0 loses all but the last."""
    from dataclasses import replace

    err, _ = _joint_root(n, [replace(s, slot=0) for s in step_list("naive", n, 0, 5)])
    assert err.any()


def test_every_compiled_record_declares_the_broken_variants_these_tests_catch():
    """miscombine, short_pieces and tiny_first_only above, off_by_one_chunk in
    tests/test_algorithms.py (only where the schedule cuts the buffer in chunks)."""
    from commbench.collectives import ALGORITHMS

    for algo in ALGOS:
        got = {b.name for b in ALGORITHMS[("all_reduce", f"{algo}_compiled")].broken}
        chunked = {"off_by_one_chunk"} if algo in ("ring", "rabenseifner") else set()
        assert got == {"miscombine", "short_pieces", "tiny_first_only"} | chunked, algo
