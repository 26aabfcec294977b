"""Bytes on the wire: the self-describing object formats and DynamoDB attribute values.

Every object is one msgpack map whose ``format`` names its kind and version, so
an index can be rebuilt from the bucket alone; maps of 1 KiB or more are stored
zlib-compressed when that saves at least a tenth. Serialized values are always
kept as ``[type_tag, bytes]`` pairs from the user's serializer.
"""

from __future__ import annotations

import zlib
from typing import Any

import ormsgpack

from s3_saver.errors import CorruptObjectError, SerializationError

CHECKPOINT_FORMAT = "s3_saver.checkpoint/1"
BLOB_FORMAT = "s3_saver.blob/1"
WRITES_FORMAT = "s3_saver.writes/2"  # /2: one task's part, no clock sequence
# A checkpoint object that holds pieces of list values stored as deltas, and a
# piece in an object of its own (see ``_format/pieces``): new names, so a version that
# predates deltas refuses them by name instead of reading a piece as a value.
CHECKPOINT_PIECES_FORMAT = "s3_saver.checkpoint/2"
PIECE_FORMAT = "s3_saver.piece/1"
# What a reader of each format also reads.
_ALSO = {
    CHECKPOINT_FORMAT: (CHECKPOINT_PIECES_FORMAT,),
    BLOB_FORMAT: (PIECE_FORMAT,),
    "s3_saver.memory-head/1": ("s3_saver.memory-head/2",),  # a head naming sealed segments
}

Typed = tuple[str, bytes]


# Compression pays in every unit the saver is billed in: bytes sent, S3 storage,
# DynamoDB write and read units (1 KB / 4 KB steps) of the items that carry objects.
_COMPRESS_MIN = 1024
_COMPRESS_MAX = 64 * 1024 * 1024  # beyond this, compressing costs seconds of CPU per put
_ZLIB_FIRST_BYTE = b"\x78"  # a msgpack map never starts with it (0x78 is a fixint)


def pack(record: dict[str, Any]) -> bytes:
    return squeeze(ormsgpack.packb(record))


def squeeze(data: bytes) -> bytes:
    """A packed record as stored: zlib-compressed when that pays."""
    if _COMPRESS_MIN <= len(data) <= _COMPRESS_MAX:
        squeezed = zlib.compress(data, 6)
        if len(squeezed) * 10 <= len(data) * 9:
            return squeezed
    return data


def is_packed(data: bytes) -> bool:
    """Whether ``data`` is a packed record as ``pack`` stores it (a msgpack map, or zlib):
    its first byte tells (an encrypted envelope starts with 0x00, which neither does)."""
    first = data[:1]
    return first == _ZLIB_FIRST_BYTE or (bool(first) and (0x80 <= first[0] <= 0x8F or first[0] in (0xDE, 0xDF)))


def plain(data: bytes, where: str) -> bytes:
    """A stored object's packed record, uncompressed (the inverse of ``squeeze``)."""
    if data[:1] != _ZLIB_FIRST_BYTE:
        return data
    try:
        return zlib.decompress(data)
    except zlib.error as exc:
        raise CorruptObjectError(f"{where}: not a msgpack document ({exc})") from exc


def same_record(stored: bytes, wanted: bytes) -> bool:
    """Two stored objects hold the same record (compressed alike or not)."""
    return stored == wanted or plain(stored, "") == plain(wanted, "")


def unpack(data: bytes, expected_format: str, where: str) -> dict[str, Any]:
    try:
        if data[:1] == _ZLIB_FIRST_BYTE:
            data = zlib.decompress(data)
        record = ormsgpack.unpackb(data)
    except (ormsgpack.MsgpackDecodeError, ValueError, zlib.error) as exc:
        raise CorruptObjectError(f"{where}: not a msgpack document ({exc})") from exc
    found = record.get("format") if isinstance(record, dict) else None
    if found != expected_format and found not in _ALSO.get(expected_format, ()):
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise CorruptObjectError(f"{where}: expected format {expected_format!r}, found {found!r}")
    return record


def typed(pair: Any) -> Typed:
    return (pair[0], bytes(pair[1]))


def loads(serde: Any, pair: Typed, what: str) -> Any:
    """Decode a stored ``(type_tag, bytes)`` pair with the user's serializer.

    Every stored value, checkpoint and metadata is decoded here, so a thread the
    serializer cannot read fails with one [SerializationError][s3_saver.errors.SerializationError] that names
    the type tag (and, for an encrypted thread, the key that is missing).
    """
    try:
        return serde.loads_typed(pair)
    except Exception as exc:
        tag = pair[0]
        message = f"cannot decode the {what}: type tag {tag!r} ({type(exc).__name__}: {exc})"
        if isinstance(tag, str) and "+" in tag:
            cipher = tag.split("+", 1)[1]
            # LangGraph's pycryptodome cipher tags "aes"; other AES ciphers say "aesgcm".
            how = "EncryptedSerializer(...)"
            if cipher.startswith("aes"):
                how = "EncryptedSerializer.from_pycryptodome_aes(key=...)"
            message += (
                f". The thread was written with an EncryptedSerializer (cipher {cipher!r}): pass "
                f"serde={how} with the key it was written with"
            )
        raise SerializationError(message) from exc


# -- DynamoDB attribute values -------------------------------------------------
def to_attrs(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Plain dict -> DynamoDB low-level item (str -> S, bytes -> B, int -> N)."""
    item: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, str):
            item[name] = {"S": value}
        elif isinstance(value, (bytes, bytearray, memoryview)):
            item[name] = {"B": bytes(value)}
        elif isinstance(value, bool):
            item[name] = {"BOOL": value}
        elif isinstance(value, int):
            item[name] = {"N": str(value)}
        else:
            raise TypeError(f"unsupported attribute type for {name}: {type(value).__name__}")
    return item


def from_attrs(item: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, wrapped in item.items():
        ((kind, value),) = wrapped.items()
        if kind == "N":
            out[name] = int(value)
        elif kind == "B":
            out[name] = bytes(value)
        else:
            out[name] = value
    return out


def attr_size(values: dict[str, Any]) -> int:
    """DynamoDB's size of an item: attribute names plus value lengths."""
    size = 0
    for name, value in values.items():
        if value is None:
            continue
        size += len(name.encode())
        if isinstance(value, str):
            size += len(value.encode())
        elif isinstance(value, (bytes, bytearray)):
            size += len(value)
        else:
            size += 21
    return size
