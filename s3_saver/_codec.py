"""Bytes on the wire: the self-describing object formats and DynamoDB attribute values.

Every object is one msgpack map whose ``format`` names its kind and version, so
an index can be rebuilt from the bucket alone. Serialized values are always kept
as ``[type_tag, bytes]`` pairs from the user's serializer.
"""

from __future__ import annotations

from typing import Any

import ormsgpack

from s3_saver.errors import CorruptObjectError

CHECKPOINT_FORMAT = "s3_saver.checkpoint/1"
BLOB_FORMAT = "s3_saver.blob/1"
WRITES_FORMAT = "s3_saver.writes/1"

Typed = tuple[str, bytes]


def pack(record: dict[str, Any]) -> bytes:
    return ormsgpack.packb(record)


def unpack(data: bytes, expected_format: str, where: str) -> dict[str, Any]:
    try:
        record = ormsgpack.unpackb(data)
    except (ormsgpack.MsgpackDecodeError, ValueError) as exc:
        raise CorruptObjectError(f"{where}: not a msgpack document ({exc})") from exc
    if not isinstance(record, dict) or record.get("format") != expected_format:
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise CorruptObjectError(f"{where}: expected format {expected_format!r}, found {found!r}")
    return record


def typed(pair: Any) -> Typed:
    return (pair[0], bytes(pair[1]))


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
