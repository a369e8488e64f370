"""Kafka record headers as txstream reads and carries them: decoded to text, and packed.

A record's headers travel through the coordinator's query packed into one binary column
(:func:`pack_headers`): a list of (name, value) structs costs Spark's pandas-to-Arrow
conversion a Python call per header of every record; one binary column costs it nothing.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from txstream.errors import MalformedRecord

__all__ = ["Headers", "header_dict", "headers_tuple", "pack_headers", "unpack_headers",
           "packed_header_dict"]

Headers = tuple[tuple[str, bytes], ...]
_BYTES = (bytes, bytearray, memoryview)


def header_dict(headers: Iterable[tuple[str, bytes | None]] | None) -> dict[str, str]:
    """Decode headers to text; raise :class:`MalformedRecord` on anything undecodable."""
    out: dict[str, str] = {}
    for item in headers or ():
        try:
            name, raw = item
        except (TypeError, ValueError):
            raise MalformedRecord("header is not a (name, value) pair") from None
        if not isinstance(name, str):
            raise MalformedRecord("header name is not text")
        if raw is None:
            raw = b""
        # bytes(n) of an int would be n zero bytes (or a terabyte): only real bytes are text.
        if not isinstance(raw, _BYTES):
            raise MalformedRecord(f"header {name!r} value is not bytes")
        try:
            out[name] = bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedRecord(f"header {name!r} is not UTF-8 text") from None
    return out


def headers_tuple(pairs: Sequence[tuple[str, bytes | None]] | None) -> Headers:
    return tuple((k, v if v is not None else b"") for k, v in (pairs or ()))


# (name length, value length) before each header's name and value in pack_headers.
_PACKED = struct.Struct(">HI")


def pack_headers(headers: Iterable[tuple[str, bytes | None]]) -> bytes:
    """Headers as one byte string, the way the source and the operator's output rows carry them.

    A list of (name, value) structs costs Spark's pandas-to-Arrow conversion a Python call per
    header of every record; one binary column costs it nothing. ``None`` values become empty,
    as Kafka clients write them anyway.
    """
    parts: list[bytes] = []
    for name, value in headers:
        raw = name.encode("utf-8")
        value = value or b""
        parts += (_PACKED.pack(len(raw), len(value)), raw, value)
    return b"".join(parts)


def _packed(blob: object) -> bytes:
    if not isinstance(blob, _BYTES):
        raise MalformedRecord(f"packed headers are {type(blob).__name__}, not bytes")
    return bytes(blob)


def _walk_packed(blob: bytes, as_text: bool) -> list[tuple[str, bytes]] | dict[str, str]:
    """The headers packed in ``blob``: as (name, value) pairs, or ``as_text`` as
    :func:`header_dict` gives them (the same result and errors). One loop, not a generator
    or a second pass: every record the coordinator reads comes through here, and those were
    a third of its cost."""
    pairs: list[tuple[str, bytes]] = []
    text: dict[str, str] = {}
    unpack_from, size = _PACKED.unpack_from, _PACKED.size
    at, end = 0, len(blob)
    while at < end:
        if end - at < size:
            raise MalformedRecord("packed headers end inside a header's lengths")
        name_len, value_len = unpack_from(blob, at)
        at += size
        name_end = at + name_len
        value_end = name_end + value_len
        if value_end > end:
            raise MalformedRecord("packed headers end inside a header")
        try:
            name = blob[at:name_end].decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedRecord("a packed header's name is not UTF-8") from None
        if not as_text:
            pairs.append((name, blob[name_end:value_end]))
        else:
            try:
                text[name] = blob[name_end:value_end].decode("utf-8")
            except UnicodeDecodeError:
                raise MalformedRecord(f"header {name!r} is not UTF-8 text") from None
        at = value_end
    return text if as_text else pairs


def unpack_headers(blob: bytes | None) -> list[tuple[str, bytes]]:
    """The headers :func:`pack_headers` packed; raises MalformedRecord on anything else."""
    if blob is None:
        return []
    pairs = _walk_packed(_packed(blob), as_text=False)
    assert isinstance(pairs, list)
    return pairs


def packed_header_dict(blob: bytes | None) -> dict[str, str]:
    """:func:`header_dict` of packed headers (the same result, the same errors)."""
    if blob is None:
        return {}
    text = _walk_packed(_packed(blob), as_text=True)
    assert isinstance(text, dict)
    return text
