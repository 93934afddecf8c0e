"""Pure Range / conditional-header logic."""

import pytest

from sakura.server.ranges import RangeError, RangeNotSatisfiable, if_none_match_hits, if_range_allows, parse_range


@pytest.mark.parametrize("hdr, size, want", [
    ("bytes=0-9", 100, (0, 10)),
    ("bytes=10-", 100, (10, 100)),
    ("bytes=-5", 100, (95, 100)),
    ("bytes=-500", 100, (0, 100)),
    ("bytes=90-1000", 100, (90, 100)),
    ("bytes=99-99", 100, (99, 100)),
])
def test_valid(hdr, size, want):
    assert parse_range(hdr, size) == want


@pytest.mark.parametrize("hdr", ["bytes=abc", "bytes=5-2", "items=0-1", "bytes=0-1,3-4", "bytes=-", "bytes= 0-1",
                                 "bytes=0x10-", "bytes=1-2-3", "", "bytes=99999999999999999999-"])
def test_malformed(hdr):
    with pytest.raises(RangeError):
        parse_range(hdr, 100)


@pytest.mark.parametrize("hdr, size", [("bytes=100-", 100), ("bytes=-0", 100), ("bytes=0-", 0), ("bytes=500-600", 100)])
def test_unsatisfiable(hdr, size):
    with pytest.raises(RangeNotSatisfiable):
        parse_range(hdr, size)


def test_conditionals():
    assert if_none_match_hits('"a", "b"', '"b"')
    assert if_none_match_hits('W/"b"', '"b"')
    assert if_none_match_hits("*", '"b"')
    assert not if_none_match_hits('"a"', '"b"')
    assert not if_none_match_hits(None, '"b"')
    assert if_range_allows(None, '"b"')
    assert if_range_allows('"b"', '"b"')
    assert not if_range_allows('"a"', '"b"')
    assert not if_range_allows('W/"b"', '"b"')
    assert not if_range_allows("Wed, 21 Oct 2015 07:28:00 GMT", '"b"')
