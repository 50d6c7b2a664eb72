"""The protobuf wire format, as much as the hub needs: read fields, write them back.

Kubernetes objects in ``application/vnd.kubernetes.protobuf`` are protobuf messages whose
field numbers are stable API (``generated.proto`` of each group). The hub reads a handful of
them (the event type, ``ObjectMeta``'s name, namespace and resourceVersion) and rewrites one
(the resourceVersion of a relist's DELETE), so it needs no generated types: a message is a
sequence of (field number, wire type, value) and every field it does not touch is copied as
the bytes it came in. Malformed input raises ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Iterator

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 64 bits")


def encode_varint(value: int) -> bytes:
    if value < 0:
        raise ValueError("negative varint")
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes, bytes]]:
    """Each field as (number, wire type, value, the field's own bytes on the wire).

    The value is an int for varint and fixed fields, the payload for length-delimited ones.
    """
    pos, end = 0, len(data)
    while pos < end:
        start = pos
        tag, pos = read_varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ValueError("field number 0")
        value: int | bytes
        if wire == VARINT:
            value, pos = read_varint(data, pos)
        elif wire == LENGTH:
            size, pos = read_varint(data, pos)
            if pos + size > end:
                raise ValueError("truncated length-delimited field")
            value, pos = data[pos : pos + size], pos + size
        elif wire == FIXED64:
            if pos + 8 > end:
                raise ValueError("truncated fixed64")
            value, pos = int.from_bytes(data[pos : pos + 8], "little"), pos + 8
        elif wire == FIXED32:
            if pos + 4 > end:
                raise ValueError("truncated fixed32")
            value, pos = int.from_bytes(data[pos : pos + 4], "little"), pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value, data[start:pos]


def length_field(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | LENGTH) + encode_varint(len(payload)) + payload


def varint_field(number: int, value: int) -> bytes:
    return encode_varint(number << 3 | VARINT) + encode_varint(value)


def first(data: bytes, number: int) -> bytes | None:
    """The payload of the first length-delimited field ``number``, if present."""
    for found, wire, value, _raw in fields(data):
        if found == number and wire == LENGTH:
            assert isinstance(value, bytes)
            return value
    return None


def text(data: bytes, number: int) -> str:
    """A string field ("" when absent, as proto2 defaults it)."""
    value = first(data, number)
    return "" if value is None else value.decode("utf-8")


def replace(data: bytes, number: int, payload: bytes) -> bytes:
    """``data`` with length-delimited field ``number`` set to ``payload``.

    The first occurrence is replaced in place and later ones dropped; when absent, the field
    goes before the first higher-numbered field (where a marshaller would have put it).
    """
    out: list[bytes] = []
    written = False
    for found, _wire, _value, raw in fields(data):
        if found == number:
            if not written:
                out.append(length_field(number, payload))
                written = True
            continue
        if found > number and not written:
            out.append(length_field(number, payload))
            written = True
        out.append(raw)
    if not written:
        out.append(length_field(number, payload))
    return b"".join(out)
