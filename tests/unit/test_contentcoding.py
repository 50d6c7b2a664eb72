"""Which watches kube-apiserver 1.37 compresses, and the members watchproxy writes for them.

The cases are the ones tried against kube-apiserver 1.37.2 (tests/realapi/test_compression.py
checks the same table against it).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from urllib.parse import parse_qsl

import pytest

from watchproxy.kube.contentcoding import accepts_gzip, gzip_member, watch_coding
from watchproxy.kube.watchquery import parse_watch_query

# Accept-Encoding values and whether 1.37.2 answered a watch-list with gzip.
ACCEPT_ENCODINGS = [
    (None, False),
    ("", False),
    ("gzip", True),
    ("gzip, deflate", True),
    ("deflate,gzip", True),
    ("br, gzip", True),
    (" gzip ", True),
    ("gzip,", True),
    ("GZIP", False),
    ("Gzip", False),
    ("gzip;q=1.0", False),
    ("gzip; q=0", False),
    ("x-gzip", False),
    ("*", False),
    ("identity", False),
]

WATCH_LIST = "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
# Queries and whether 1.37.2 compressed them for a client sending Accept-Encoding: gzip.
QUERIES = [
    (WATCH_LIST, True),
    ("sendInitialEvents=true&resourceVersionMatch=NotOlderThan", False),  # no bookmarks
    ("allowWatchBookmarks=true", True),  # from "now": a watch-list after defaulting
    ("resourceVersion=&allowWatchBookmarks=true", True),
    ("resourceVersion=0&allowWatchBookmarks=true", True),
    ("", False),
    ("resourceVersion=0", False),
    ("resourceVersion=264&allowWatchBookmarks=true", False),
    (
        "sendInitialEvents=false&resourceVersionMatch=NotOlderThan&resourceVersion=264"
        "&allowWatchBookmarks=true",
        False,
    ),
    (WATCH_LIST + "&fieldSelector=metadata.name%3Dc1", True),
]


@pytest.mark.parametrize(("value", "gzipped"), ACCEPT_ENCODINGS)
def test_only_the_bare_gzip_token_asks_for_gzip(value: str | None, gzipped: bool) -> None:
    assert accepts_gzip(value) is gzipped


@pytest.mark.parametrize(("query", "gzipped"), QUERIES)
def test_only_a_watch_list_that_allows_bookmarks_is_compressed(query: str, gzipped: bool) -> None:
    parsed = parse_watch_query(dict(parse_qsl(f"watch=1&{query}", keep_blank_values=True)))
    assert watch_coding(parsed, "gzip") == ("gzip" if gzipped else "identity")
    assert watch_coding(parsed, None) == "identity"
    assert watch_coding(parsed, "identity") == "identity"


@pytest.mark.parametrize("size", [0, 1, 200, 511, 512, 513, 4096, 40_000, 200_000, 1 << 20])
def test_a_member_is_one_complete_gzip_member_of_any_size(size: int) -> None:
    data = (b'{"type":"MODIFIED","object":{"metadata":{"name":"x"}}}\n' * (size // 55 + 1))[:size]
    member = gzip_member(data)
    assert member[:3] == b"\x1f\x8b\x08"
    decoder = zlib.decompressobj(31)
    assert decoder.decompress(member) == data
    assert decoder.eof and decoder.unused_data == b""
    assert gzip.decompress(member + gzip_member(data)) == data + data  # members in a series


SYNC_MARKER = b"\x00\x00\xff\xff"  # the empty stored block a sync flush ends with
FINAL_EMPTY_BLOCK = b"\x03\x00"  # zlib's last block after a sync flush: fixed codes, no data


@pytest.mark.parametrize("size", [0, 1, 200, 4096, 40_000, 200_000, 1 << 20])
def test_a_member_hands_over_all_its_data_before_its_last_block(size: int) -> None:
    """Go's gzip reader returns a member's last deflate block only after it has read the next
    member's header: the data must all be out, behind a sync-flush marker, before that block,
    as kube-apiserver 1.37 writes it (see watchproxy/kube/contentcoding.py)."""
    data = (b'{"type":"ADDED","object":{"metadata":{"name":"x"}}}\n' * (size // 52 + 1))[:size]
    member = gzip_member(data)
    # header | blocks holding the data | 00 00 ff ff | an empty final block | CRC-32, size
    assert member[-8:] == struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFFFFFF)
    assert member[:-8].endswith(SYNC_MARKER + FINAL_EMPTY_BLOCK)
    up_to_sync = member[: -8 - len(FINAL_EMPTY_BLOCK)]
    # A strict decoder given the member up to its sync marker has every byte of the data,
    # and the member is not over yet: what follows the marker carries nothing.
    decoder = zlib.decompressobj(wbits=31)
    assert decoder.decompress(up_to_sync) == data
    assert not decoder.eof
    assert decoder.decompress(member[len(up_to_sync) :]) == b""
    assert decoder.eof and decoder.unused_data == b""
    # And the whole member, by itself, is one complete gzip member holding exactly the data.
    whole = zlib.decompressobj(wbits=31)
    assert whole.decompress(member) == data
    assert whole.eof and whole.unused_data == b""
