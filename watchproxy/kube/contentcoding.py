"""Compressed watch-lists as kube-apiserver 1.37 serves them (``WatchListCompression``).

What 1.37.2 does (k8s.io/apiserver v0.37.2 ``endpoints/handlers/watch.go``, checked against
a running 1.37.2, see tests/realapi/test_compression.py):

- it compresses a watch only when it is a watch-list after defaulting (``sendInitialEvents=true``,
  or a watch from "now" that sets neither it nor ``resourceVersionMatch``) *and* allows
  bookmarks (``isListWatchRequest``), whatever its representation (JSON, protobuf, Table, ...);
- only when the first ``Accept-Encoding`` header holds the bare token ``gzip``: the value is
  split at commas and each piece trimmed, nothing else (``GZIP``, ``gzip;q=1``, ``x-gzip``
  and ``*`` are not gzip: ``ContentEncodingSupported``);
- then the answer says ``Content-Encoding: gzip`` and ``Vary: Accept-Encoding``, and the body is
  one complete gzip member (level 1, the fastest) per flush: events written together go out as
  one member, each later change as a member of its own; there is no size threshold (an empty
  watch-list is one member holding the end bookmark), and the end of the stream adds none.
- each member is written as Go's ``gzip.Writer`` writes it when the apiserver's per-flush
  writer calls ``Flush`` and then ``Close`` on it: the data, then a *sync flush* (the deflate
  blocks holding the data end with an empty stored block, the marker ``00 00 ff ff``), then the
  member's end (an empty final block, the CRC-32 and the length).

Why the sync flush matters (the stall it prevents). Go's ``compress/flate`` reader hands over
decoded bytes only when its 32 KiB window fills, when an empty stored block (the sync marker)
ends, or when the *final* block ends, and in that last case it returns the bytes together with
``io.EOF`` (Go 1.26 ``compress/flate/inflate.go``: ``dataBlock``, ``finishBlock``).
``compress/gzip``'s ``Reader.Read``, on that ``io.EOF``, reads the member's trailer and then the
*next member's header* before it returns those bytes to its caller (``gunzip.go``). A member
compressed in one go (zlib's ``Z_FINISH`` alone) has a small batch's data in a single final
block, and a large one's last part, so those events wait inside Go's reader until the next
member's header arrives: the next change to the collection, or a periodic bookmark.
client-go 0.35+ informers read watch-lists that way (WatchList on, gzip on, Go's transparent
decompression), so on a quiet collection their initial-events-end bookmark stayed in the
reader and the informer never synced. With the sync flush, the data is out at
the marker and the final block holds nothing: the reader's wait for the next header holds back
no event. Readers that decode partial blocks (Python's zlib, curl) never showed the difference.
The final block is the one place the bytes differ from Go's: zlib ends with an empty block of
fixed codes (``03 00``), Go's writer with an empty stored one (``01 00 00 ff ff``); either is
an empty final block to every decoder.

A member is written whole or not at all, so a client that reads the stream member by member
never waits on a half-flushed one.
"""

from __future__ import annotations

import zlib

from watchproxy.kube.watchquery import WatchQuery

GZIP = "gzip"
IDENTITY = "identity"

# The apiserver's gzipContentEncodingLevel: the least CPU, nearly the same ratio on JSON.
GZIP_LEVEL = 1
_GZIP_WRAPPER = 16  # added to the window bits: a gzip header and trailer, not zlib's


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether an ``Accept-Encoding`` value asks for gzip, by the apiserver's rule."""
    if not accept_encoding:
        return False
    return any(token.strip() == GZIP for token in accept_encoding.split(","))


def watch_coding(query: WatchQuery, accept_encoding: str | None) -> str:
    """The content coding kube-apiserver 1.37 gives this watch: ``gzip`` or ``identity``.

    ``accept_encoding`` is the request's first ``Accept-Encoding`` header (the apiserver reads
    only that one)."""
    if query.watch_list and query.allow_watch_bookmarks and accepts_gzip(accept_encoding):
        return GZIP
    return IDENTITY


def gzip_member(data: bytes) -> bytes:
    """``data`` as one complete gzip member (header, deflate stream, CRC and length) whose
    deflate blocks end with a sync flush before the member's end, as kube-apiserver 1.37 flushes
    a watch (see the module's docstring: Go's gzip reader stalls on a member without it)."""
    # Window and hash sized to the data: a window larger than the data is never used, so the
    # bytes are the same, but zlib's full-size state costs more to set up than a watch event
    # of a few KiB costs to compress (bench/README.md, "Figures behind the code").
    # zlib.compress has no memLevel, hence compressobj.
    bits = max(9, min(zlib.MAX_WBITS, (len(data) - 1).bit_length()))
    member = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, _GZIP_WRAPPER + bits, max(1, bits - 7))
    return member.compress(data) + member.flush(zlib.Z_SYNC_FLUSH) + member.flush(zlib.Z_FINISH)
