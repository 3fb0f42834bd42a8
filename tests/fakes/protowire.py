"""Protocol-buffers wire format by hand: the fakes' encoder and the tests' decoder.

Written from the encoding spec (varints, ``key = field << 3 | wire type``, wire type 0
for integers and enums, 2 for strings, messages, maps and packed repeated scalars),
independently of protobuf and of exporter/attribution/kubernetes/proto, so a test that encodes
here and decodes with the exporter's generated classes (or the reverse) checks the
field numbers against upstream's, not against themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

VARINT, LEN = 0, 2


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64 as two's complement, as protobuf does
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def uint(field: int, n: int) -> bytes:
    return varint(field << 3 | VARINT) + varint(n) if n else b""


def blob(field: int, data: bytes) -> bytes:
    return varint(field << 3 | LEN) + varint(len(data)) + data


def string(field: int, text: str) -> bytes:
    return blob(field, text.encode()) if text else b""


def strings(field: int, texts: Iterable[str]) -> bytes:
    return b"".join(blob(field, t.encode()) for t in texts)


def packed(field: int, numbers: Iterable[int]) -> bytes:
    body = b"".join(varint(n) for n in numbers)
    return blob(field, body) if body else b""


def string_map(field: int, entries: Mapping[str, str]) -> bytes:
    """map<string, string>: a repeated message {1: key, 2: value}."""
    return b"".join(blob(field, string(1, k) + string(2, v)) for k, v in entries.items())


def decode(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """One message level -> [(field number, wire type, int or raw bytes)], in order."""
    out: list[tuple[int, int, int | bytes]] = []
    pos = 0

    def read_varint() -> int:
        nonlocal pos
        shift = value = 0
        while True:
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while pos < len(data):
        key = read_varint()
        field, wire = key >> 3, key & 7
        if wire == VARINT:
            out.append((field, wire, read_varint()))
        elif wire == LEN:
            size = read_varint()
            out.append((field, wire, data[pos:pos + size]))
            pos += size
        else:
            raise ValueError(f"wire type {wire} not used by these APIs")
    return out


def fields(data: bytes) -> dict[int, list[int | bytes]]:
    """decode() grouped by field number."""
    grouped: dict[int, list[int | bytes]] = {}
    for field, _, value in decode(data):
        grouped.setdefault(field, []).append(value)
    return grouped
