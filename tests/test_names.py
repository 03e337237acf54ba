"""The names the command line reads without torch (commbench/names.py): sizes and their
rules."""

from __future__ import annotations

import pytest

from commbench.names import parse_size, sizes_between

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
