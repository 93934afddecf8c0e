"""Range / conditional-header decisions on aiohttp's parsed headers (real aiohttp requests,
built without a connection)."""

import pytest
from aiohttp.test_utils import make_mocked_request

from sakura.wire.server.ranges import RangeError, RangeNotSatisfiable, byte_range, if_none_match_hits, if_range_allows


def req(**headers):
    return make_mocked_request("GET", "/objects/ab/x", headers={k.replace("_", "-"): v for k, v in headers.items()})


def rng(hdr, size):
    return byte_range(req(Range=hdr), size)


@pytest.mark.parametrize("hdr, size, want", [
    ("bytes=0-9", 100, (0, 10)),
    ("bytes=10-", 100, (10, 100)),
    ("bytes=-5", 100, (95, 100)),
    ("bytes=-500", 100, (0, 100)),
    ("bytes=90-1000", 100, (90, 100)),
    ("bytes=99-99", 100, (99, 100)),
    # issue 35 item 10: a last-byte-pos past the end is clamped however large (RFC 9110 14.1.2)
    ("bytes=0-99999999999999999999", 100, (0, 100)),
    ("bytes=7-" + "9" * 400, 100, (7, 100)),
])
def test_valid(hdr, size, want):
    assert rng(hdr, size) == want


def test_no_range_header():
    assert byte_range(req(), 100) is None


@pytest.mark.parametrize("hdr", ["bytes=abc", "bytes=5-2", "items=0-1", "bytes=0-1,3-4", "bytes=-", "bytes= 0-1",
                                 "bytes=0x10-", "bytes=1-2-3", "", "bytes=99999999999999999999-",
                                 "bytes=" + "9" * 5000 + "-"])
def test_malformed(hdr):
    with pytest.raises(RangeError):
        rng(hdr, 100)


@pytest.mark.parametrize("hdr, size", [("bytes=100-", 100), ("bytes=-0", 100), ("bytes=-000", 100), ("bytes=0-", 0),
                                       ("bytes=-5", 0), ("bytes=500-600", 100)])
def test_unsatisfiable(hdr, size):
    with pytest.raises(RangeNotSatisfiable):
        rng(hdr, size)


def test_conditionals():
    assert if_none_match_hits(req(If_None_Match='"a", "b"'), '"b"')
    assert if_none_match_hits(req(If_None_Match='W/"b"'), '"b"')
    assert if_none_match_hits(req(If_None_Match="*"), '"b"')
    assert not if_none_match_hits(req(If_None_Match='"a"'), '"b"')
    assert not if_none_match_hits(req(If_None_Match="b"), '"b"')  # unquoted: not an entity tag
    assert not if_none_match_hits(req(), '"b"')
    assert if_range_allows(req(), '"b"')
    assert if_range_allows(req(If_Range='"b"'), '"b"')
    assert not if_range_allows(req(If_Range='"a"'), '"b"')
    assert not if_range_allows(req(If_Range='W/"b"'), '"b"')
    assert not if_range_allows(req(If_Range="Wed, 21 Oct 2015 07:28:00 GMT"), '"b"')
