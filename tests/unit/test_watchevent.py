"""Watch-stream lines: events decode, anything else is a WatchEventError (a ValueError)."""

from __future__ import annotations

import pytest

from watchproxy.kube.watchevent import WatchEventError, decode_watch_line


def test_an_event_decodes_with_its_resource_version() -> None:
    event = decode_watch_line(
        b'{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"p","resourceVersion":"7"}}}\n'
    )
    assert event.type == "ADDED"
    assert event.object["kind"] == "Pod"
    assert event.resource_version == "7"


def test_a_bookmark_needs_its_resource_version() -> None:
    assert decode_watch_line('{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}')
    with pytest.raises(WatchEventError):
        decode_watch_line('{"type":"BOOKMARK","object":{"metadata":{}}}')


def test_an_error_event_carries_its_status_code() -> None:
    event = decode_watch_line('{"type":"ERROR","object":{"kind":"Status","code":410}}')
    assert event.code == 410
    assert decode_watch_line('{"type":"ERROR","object":{"code":true}}').code is None


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[1]",
        b'"ADDED"',
        b'{"type":"ADDED"}',
        b'{"type":"ADDED","object":[]}',
        b'{"type":"SYNC","object":{}}',
        b'{"type":["ADDED"],"object":{}}',
        b"[" * 100_000,
    ],
)
def test_anything_else_is_a_watch_event_error(line: bytes) -> None:
    with pytest.raises(WatchEventError):
        decode_watch_line(line)
