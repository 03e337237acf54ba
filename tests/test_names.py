"""The names the command line reads without torch (commbench/names.py): sizes and their
rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commbench.names import parse_size, size_text, sizes_between

pytestmark = pytest.mark.foundation


def test_sizes_and_their_rules():
    assert [parse_size(t) for t in ("8", "8B", "64k", "2M", "1G", " 4 ")] == \
        [8, 8, 65536, 2 << 20, 1 << 30, 4]
    for bad, rule in (("abc", "write a whole number"), ("0", "must be > 0"), ("-8", "size '-8'"),
                      ("1.5M", "write a whole number")):
        with pytest.raises(ValueError, match=rule):
            parse_size(bad)
    assert parse_size("1") == 1 and sizes_between(1, 4, 2) == [1, 2, 4]
    assert sizes_between(8, 8, 2) == [8] and sizes_between(3, 30, 3) == [3, 9, 27]
    for args, rule in (((0, 8, 2), "-b 0: must be > 0"), ((16, 8, 2), "-e 8 is below -b 16"),
                       ((8, 64, 1), "-f 1: must be >= 2")):
        with pytest.raises(ValueError, match=rule):
            sizes_between(*args)


@given(st.integers(1, 1 << 40))
def test_a_size_s_text_reads_back_as_the_size(n):
    text = size_text(n)
    assert parse_size(text) == n and len(text) <= len(str(n))


def test_a_size_s_text_takes_the_largest_whole_unit():
    assert [size_text(n) for n in (8, 1000, 1024, 1536, 65536, 4 << 20, 3 << 30, 2049 << 20)] == \
        ["8", "1000", "1K", "1536", "64K", "4M", "3G", "2049M"]
