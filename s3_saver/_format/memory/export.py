"""The memory export format: the items of a namespace prefix in one self-describing file.

``S3Store.export_memory`` writes it, ``import_memory`` reads it back into any bucket,
prefix or index mode. JSON lines (UTF-8), so a file is read one line at a time, and a
file written by hand, or by a script from another store, imports too::

    {"format": "s3_saver.memory-export/1", "prefix": [...], "exported_at": "...", "index": {...} | null}
    {"namespace": [...], "key": "...", "created_us": ..., "updated_us": ..., "expires_us": ... | null,
     "ttl_minutes": ... | null, "type": "...", "value": "<base64>", "vectors": null | {...}}
    ...
    {"end": {"items": N}}

- The header's ``format`` names the version; a reader refuses a version it does not know
  (a later one may mean something else by the same fields).
- Items are grouped by namespace, namespaces in registration order (their first put), items
  in their namespace's order: an import registers and numbers them in that order.
- ``type`` and ``value``: the serializer's ``(type_tag, bytes)`` as ``dumps_typed`` gave them
  (uncompressed; base64): the export never decodes a value, so an encrypting serializer's
  values stay encrypted in the file, and the importing store must be given the same
  serializer (the import checks that it reads every value before writing any).
- Times in microseconds since the epoch (UTC): ``created_at``/``updated_at`` exactly, and the
  expiry (``expires_us``, with ``ttl_minutes`` what a read refreshes it by).
- ``vectors``: ``{"dtype", "dims", "paths", "data": <base64 little-endian floats>}`` as stored;
  the header's ``index`` (``dims`` and ``fields`` of the exporting store, or null) says what
  they were computed for.
- The last line counts the items: a file cut short (a copy that stopped, a disk full) is
  refused, never imported in part as if whole.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from s3_saver._format.memory.names import check_item_namespace, check_key, show
from s3_saver._format.memory.rows import (
    DTYPES,
    RAW,
    SEALED_DTYPE,
    ValueCell,
    VectorsCell,
)
from s3_saver._format.memory.ttl import MAX_TTL_MINUTES, MAX_US, is_minutes, to_datetime
from s3_saver.errors import CorruptObjectError, S3SaverError

EXPORT_FORMAT = "s3_saver.memory-export/1"
_READS = (EXPORT_FORMAT,)


@dataclass(frozen=True, slots=True)
class ExportedItem:
    """One item of an export: what its row holds, with the value as the serializer gave it."""

    namespace: tuple[str, ...]
    key: str
    created_us: int
    updated_us: int
    expires_us: int | None
    ttl_minutes: float | None
    value: ValueCell  # codec RAW: the serializer's bytes
    vectors: VectorsCell | None = None


@dataclass
class MemoryExport:
    prefix: tuple[str, ...]
    exported_us: int
    index: dict[str, Any] | None
    """``{"dims": int, "fields": [str, ...]}`` of the exporting store, or None (no index)."""
    items: list[ExportedItem] = field(default_factory=list)
    sealed: dict[str, str] | None = None
    """Written by a store with ``encryption=``: ``{"bucket", "prefix", "key_bucket"}`` of
    that store, whose key store holds the keys its items are sealed under (each item's
    value and vectors under its namespace's key: ``type`` is ``s3_saver.sealed``, the
    vectors' ``dtype`` is ``sealed``)."""

    def namespaces(self) -> list[tuple[str, ...]]:
        """The namespaces of the items, in the file's order."""
        return list(dict.fromkeys(item.namespace for item in self.items))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _line(doc: dict[str, Any]) -> bytes:
    # ensure_ascii: a label or key holding a lone surrogate or a line separator stays one line.
    return json.dumps(doc, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii") + b"\n"


def encode_lines(export: MemoryExport) -> Iterator[bytes]:
    """The file, line by line."""
    yield _line(
        {
            "format": EXPORT_FORMAT,
            "prefix": list(export.prefix),
            "exported_at": to_datetime(export.exported_us).isoformat(),
            "index": export.index,
            **({"sealed": export.sealed} if export.sealed is not None else {}),
        }
    )
    for item in export.items:
        assert item.value.codec == RAW
        vectors = None
        if item.vectors is not None:
            v = item.vectors
            vectors = {"dtype": v.dtype, "dims": v.dims, "paths": list(v.paths), "data": _b64(v.raw)}
        yield _line(
            {
                "namespace": list(item.namespace),
                "key": item.key,
                "created_us": item.created_us,
                "updated_us": item.updated_us,
                "expires_us": item.expires_us,
                "ttl_minutes": item.ttl_minutes,
                "type": item.value.type_tag,
                "value": _b64(item.value.data),
                "vectors": vectors,
            }
        )
    yield _line({"end": {"items": len(export.items)}})


def encode_export(export: MemoryExport) -> bytes:
    return b"".join(encode_lines(export))


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Bad(Exception):
    """What is wrong with one line (the decoder adds where)."""


def _bytes(text: Any, what: str) -> bytes:
    if not isinstance(text, str):
        raise _Bad(f"{what} is not base64 text")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise _Bad(f"{what} is not base64 ({exc})") from None


def _vectors(doc: Any) -> VectorsCell | None:
    if doc is None:
        return None
    if not isinstance(doc, dict) or set(doc) != {"dtype", "dims", "paths", "data"}:
        raise _Bad("vectors is not null nor {dtype, dims, paths, data}")
    dtype, dims, paths = doc["dtype"], doc["dims"], doc["paths"]
    if dtype == SEALED_DTYPE and _int(dims) and dims > 0 and isinstance(paths, list):
        return VectorsCell(dtype, dims, tuple(paths), _bytes(doc["data"], "vectors.data"))
    if dtype not in DTYPES or not _int(dims) or dims <= 0:
        raise _Bad(f"vectors: dtype {show(dtype)} or dims {show(dims)} is not one this store writes")
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths) or len(set(paths)) != len(paths):
        raise _Bad("vectors: paths is not a list of distinct strings")
    raw = _bytes(doc["data"], "vectors.data")
    if len(raw) != len(paths) * dims * DTYPES[dtype][1]:
        raise _Bad(f"vectors: {len(raw)} bytes of data for {len(paths)} vectors of {dims} {dtype}")
    return VectorsCell(dtype, dims, tuple(paths), raw)


_ITEM_FIELDS = {"namespace", "key", "created_us", "updated_us", "expires_us", "ttl_minutes", "type", "value", "vectors"}


def _item(doc: dict[str, Any]) -> ExportedItem:
    if set(doc) != _ITEM_FIELDS:
        missing, extra = sorted(_ITEM_FIELDS - set(doc)), sorted(set(doc) - _ITEM_FIELDS)
        raise _Bad(f"not an item line (missing {missing}, unknown {extra})")
    try:
        namespace = check_item_namespace(doc["namespace"])
        key = check_key(namespace, doc["key"])
    except S3SaverError as exc:
        raise _Bad(str(exc)) from None
    created, updated, expires, ttl = doc["created_us"], doc["updated_us"], doc["expires_us"], doc["ttl_minutes"]
    # Times within what every index keeps (MAX_US: a head's 64-bit counts, a DynamoDB
    # number, a datetime): checked here, a file is refused whole before any write.
    if not (_int(created) and _int(updated) and 0 <= created <= updated <= MAX_US):
        raise _Bad(f"key {show(key)}: created_us and updated_us are not integers with 0 <= created_us <= updated_us <= {MAX_US}")
    if expires is not None and not (_int(expires) and 0 <= expires <= MAX_US):
        raise _Bad(f"key {show(key)}: expires_us is not null nor an integer from 0 to {MAX_US}")
    if ttl is not None and not is_minutes(ttl):
        raise _Bad(f"key {show(key)}: ttl_minutes is not null nor a number of minutes from 0 to {MAX_TTL_MINUTES}")
    if not isinstance(doc["type"], str):
        raise _Bad(f"key {show(key)}: type is not a string")
    value = ValueCell(doc["type"], _bytes(doc["value"], f"key {show(key)}: value"), RAW)
    return ExportedItem(namespace, key, created, updated, expires, None if ttl is None else float(ttl), value, _vectors(doc["vectors"]))


def decode_export(data: bytes, where: str) -> MemoryExport:
    """The export in ``data``, every line checked. CorruptObjectError naming ``where`` and
    the line: not an export (or a version this store does not read), a line that is not
    what the format writes, an item twice, or a file cut short (no end line, or a count
    that differs)."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    export: MemoryExport | None = None
    seen: set[tuple[tuple[str, ...], str]] = set()
    ended = False
    for number, raw in enumerate(lines, 1):
        at = f"{where}, line {number}"
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            if number == 1:
                raise CorruptObjectError(f"{where}: not a memory export (expected a first line naming {EXPORT_FORMAT!r})") from exc
            raise CorruptObjectError(f"{at}: not a JSON line ({exc})") from exc
        if not isinstance(doc, dict):
            raise CorruptObjectError(f"{at}: not a JSON object")
        if ended:
            raise CorruptObjectError(f"{at}: a line after the end line")
        if export is None:
            fmt = doc.get("format")
            if fmt not in _READS:
                raise CorruptObjectError(
                    f"{where}: not a memory export of a version this store reads (format {show(fmt, 60)};"
                    f" expected {EXPORT_FORMAT!r})"
                )
            export = _header(doc, at)
            continue
        if "end" in doc:
            end = doc["end"]
            if set(doc) != {"end"} or not isinstance(end, dict) or not _int(end.get("items")):
                raise CorruptObjectError(f"{at}: not an end line ({{\"end\": {{\"items\": N}}}})")
            if end["items"] != len(export.items):
                raise CorruptObjectError(f"{at}: the end line counts {end['items']} items; the file holds {len(export.items)}")
            ended = True
            continue
        try:
            item = _item(doc)
        except _Bad as exc:
            raise CorruptObjectError(f"{at}: {exc}") from None
        if (item.namespace, item.key) in seen:
            raise CorruptObjectError(f"{at}: key {show(item.key)} of namespace {show(item.namespace)} is in the file twice")
        seen.add((item.namespace, item.key))
        export.items.append(item)
    if export is None:
        raise CorruptObjectError(f"{where}: empty, not a memory export")
    if not ended:
        raise CorruptObjectError(
            f"{where}: cut short: no end line after line {len(lines)} ({len(export.items)} items read); export it again"
        )
    return export


def _header(doc: dict[str, Any], at: str) -> MemoryExport:
    prefix, exported_at, index = doc.get("prefix"), doc.get("exported_at"), doc.get("index")
    if not isinstance(prefix, list) or not all(isinstance(label, str) for label in prefix) or not isinstance(exported_at, str):
        raise CorruptObjectError(f"{at}: the header's prefix or exported_at is not what the format writes")
    if index is not None and not (
        isinstance(index, dict)
        and _int(index.get("dims"))
        and isinstance(index.get("fields"), list)
        and all(isinstance(f, str) for f in index["fields"])
    ):
        raise CorruptObjectError(f"{at}: the header's index is not null nor {{dims, fields}}")
    try:
        stamp = datetime.fromisoformat(exported_at)
    except ValueError as exc:
        raise CorruptObjectError(f"{at}: exported_at is not an ISO time ({exc})") from None
    exported_us = round(stamp.timestamp() * 1_000_000) if stamp.tzinfo else 0
    sealed = doc.get("sealed")
    if sealed is not None and not (
        isinstance(sealed, dict)
        and set(sealed) == {"bucket", "prefix", "key_bucket"}
        and all(isinstance(v, str) for v in sealed.values())
    ):
        raise CorruptObjectError(f"{at}: the header's sealed is not null nor {{bucket, prefix, key_bucket}}")
    return MemoryExport(tuple(prefix), exported_us, index, sealed=sealed)
