"""A small CBOR (RFC 8949) decoder for the tests: enough to read what kube-apiserver sends.

The apiserver encodes map keys in no fixed order (two LISTs of one state differ in their bytes),
so its CBOR answers are compared decoded. Kubernetes writes strings as byte strings (major type
2); :func:`plain` turns them into ``str`` for reading fields. Only what a test needs and no more:
definite and indefinite lengths, tags (the value is kept, the tag number dropped), simple values
and floats. A malformed input raises ``ValueError``, never loops.
"""

from __future__ import annotations

import struct
from typing import Any

_SIMPLE = {20: False, 21: True, 22: None, 23: None}
_BREAK = object()


def _argument(data: bytes, pos: int, info: int) -> tuple[int | None, int]:
    """The head's argument (None: indefinite length) and the position after it."""
    if info < 24:
        return info, pos
    if info in (24, 25, 26, 27):
        size = 1 << (info - 24)
        if pos + size > len(data):
            raise ValueError("CBOR: truncated head")
        return int.from_bytes(data[pos : pos + size], "big"), pos + size
    if info == 31:
        return None, pos
    raise ValueError(f"CBOR: reserved additional information {info}")


def _item(data: bytes, pos: int) -> tuple[Any, int]:
    if pos >= len(data):
        raise ValueError("CBOR: truncated item")
    major, info = data[pos] >> 5, data[pos] & 0x1F
    pos += 1
    if major == 7:
        if info == 31:
            return _BREAK, pos
        if info in (25, 26, 27):
            size = 1 << (info - 24)
            raw = data[pos : pos + size]
            if len(raw) != size:
                raise ValueError("CBOR: truncated float")
            return struct.unpack({2: ">e", 4: ">f", 8: ">d"}[size], raw)[0], pos + size
        value, pos = _argument(data, pos, info)
        return _SIMPLE.get(value or 0), pos
    arg, pos = _argument(data, pos, info)
    if major == 0:
        return arg, pos
    if major == 1:
        return -1 - (arg or 0), pos
    if major == 6:
        return _item(data, pos)  # the tagged value (55799 "self-described CBOR" and the rest)
    if major in (2, 3):
        if arg is None:  # indefinite: a run of definite chunks, then a break
            chunks: list[bytes] = []
            while True:
                chunk, pos = _item(data, pos)
                if chunk is _BREAK:
                    break
                chunks.append(chunk if isinstance(chunk, bytes) else chunk.encode())
            joined = b"".join(chunks)
            return (joined if major == 2 else joined.decode()), pos
        raw = data[pos : pos + arg]
        if len(raw) != arg:
            raise ValueError("CBOR: truncated string")
        return (raw if major == 2 else raw.decode()), pos + arg
    if major == 4:
        items: list[Any] = []
        for _ in range(arg if arg is not None else len(data)):
            value, pos = _item(data, pos)
            if value is _BREAK:
                break
            items.append(value)
        return items, pos
    entries: dict[Any, Any] = {}
    for _ in range(arg if arg is not None else len(data)):
        key, pos = _item(data, pos)
        if key is _BREAK:
            break
        value, pos = _item(data, pos)
        entries[key] = value
    return entries, pos


def decode(data: bytes) -> Any:
    """Exactly one CBOR data item (``application/cbor``)."""
    value, end = _item(data, 0)
    if end != len(data):
        raise ValueError(f"CBOR: {len(data) - end} bytes after the item")
    return value


def decode_sequence(data: bytes) -> list[Any]:
    """Zero or more items back to back (``application/cbor-seq``, a watch body)."""
    items, pos = [], 0
    while pos < len(data):
        value, pos = _item(data, pos)
        items.append(value)
    return items


def plain(value: Any) -> Any:
    """``value`` with byte strings that are UTF-8 as ``str``, keys and values alike."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return value
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    return value
