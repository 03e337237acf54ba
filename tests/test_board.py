"""Debug mode's agreement board (commbench.runtime.board): each member of a group reads every
member's fingerprint of the same call, however far ahead or behind the others run; a row not
yet written, or being written, is never read."""

from __future__ import annotations

import random
import threading
import time

import pytest

from commbench.runtime.board import _ENTRY, _ROW, Board

pytestmark = pytest.mark.foundation

SIZE = 3
GROUPS = [(0, 1, 2), (0, 1), (1, 2), (0, 2)]


def _calls(seed: int, rounds: int) -> list[tuple[tuple[int, ...], list[int]]]:
    """The program every rank runs: a group and a fingerprint per call."""
    rng = random.Random(seed)
    return [(rng.choice(GROUPS), [rng.randrange(1 << 40) for _ in range(6)])
            for _ in range(rounds)]


def _rank(folder, rank, program, plant, seen, errors) -> None:
    try:
        board = Board(str(folder), rank)
        rng = random.Random(rank)
        for n, (ranks, fp) in enumerate(program):
            if rank not in ranks:
                continue
            mine = [v + 1 for v in fp] if (n, rank) == plant else fp
            if rng.random() < 0.2:  # one member runs late, so others run ahead of it
                time.sleep(rng.random() * 1e-3)
            seen[rank].append((n, board.rows(ranks, mine)))
    except BaseException as exc:  # noqa: BLE001 (reported by the test)
        errors.append(exc)


def _run(folder, program, plant=(-1, -1)) -> dict[int, list]:
    seen: dict[int, list] = {r: [] for r in range(SIZE)}
    errors: list = []
    threads = [threading.Thread(target=_rank, args=(folder, r, program, plant, seen, errors))
               for r in range(SIZE)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads), errors
    return seen


def test_every_member_reads_every_member_s_row_of_the_same_call(tmp_path):
    program = _calls(7, 300)
    seen = _run(tmp_path, program)
    for rank, got in seen.items():
        want = [(n, [fp] * len(ranks)) for n, (ranks, fp) in enumerate(program) if rank in ranks]
        assert got == want, rank


def test_one_member_s_different_call_is_seen_by_every_member_in_its_place(tmp_path):
    """Negative: rank 1 changes one call's fingerprint; each member of that call sees it in
    rank 1's place, and only there."""
    program = _calls(8, 120)
    n = next(k for k, (ranks, _) in enumerate(program) if ranks == (0, 1, 2) and k > 50)
    seen = _run(tmp_path, program, plant=(n, 1))
    fp = program[n][1]
    for rank in range(SIZE):
        rows = dict(seen[rank])
        assert rows[n] == [fp, [v + 1 for v in fp], fp]
        assert all(r == [program[k][1]] * len(r) for k, r in rows.items() if k != n)


def test_a_row_not_yet_written_or_being_written_is_not_read(tmp_path):
    a, b = Board(str(tmp_path), 0), Board(str(tmp_path), 1)
    assert b.read(0, (0, 1), 1) is None  # no entry for the group yet
    k = a.post((0, 1), [1, 2, 3, 4, 5, 6])
    assert k == 1 and b.read(0, (0, 1), 1) == [1, 2, 3, 4, 5, 6]
    assert b.read(0, (0, 1), 2) is None  # the next call's row: not written
    assert b.read(0, (0, 2), 1) is None  # another group's
    a.post((0, 1), [7, 7, 7, 7, 7, 7])
    assert b.read(0, (0, 1), 1) == [1, 2, 3, 4, 5, 6]  # one call ahead keeps the last row
    base = a._slot(next(iter(a._slots))) * _ENTRY + 1 + (3 % 2) * _ROW
    a._mine[base] = -1  # as while a writer fills the row of call 3
    assert b.read(0, (0, 1), 3) is None and b.read(0, (0, 1), 2) == [7] * 6
