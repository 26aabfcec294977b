"""The row: one version of one item, the same in node heads, segments and exports (and
the fields of an item in DynamoDB mode), with its codec, the value's packing through
the user's serializer, and the vectors' packing.

Wire form (msgpack, in a list so rows stay small)::

    [key, seq, created_us, updated_us, expires_us | nil, ttl_minutes | nil, flags, value, vectors]

- ``seq``: the item's place in its namespace (the commit order of the put that created
  it; kept by an overwrite). 0 where the order is kept otherwise (DynamoDB mode orders
  by ``(created_us, key)``).
- ``created_us`` kept by an overwrite, ``updated_us`` moved; ``expires_us`` when the item
  expires (nil: never); ``ttl_minutes`` what a refresh adds.
- ``flags``: ``TOMBSTONE`` (the key was deleted: value and vectors nil). A reader refuses
  a flag it does not know (CorruptObjectError), so a later format that adds one cannot be
  misread as this one.
- ``value``: ``[type_tag, bytes, codec]``: the serializer's pair, ``codec`` 0 as it came,
  1 zlib-compressed (when that saves a tenth); or ``["@v", token, size]``: moved to an
  immutable object of its own (large values). A cell holds bytes second, a reference a str.
- ``vectors``: nil, or ``[dtype, dims, [path, ...], raw]``: every vector of the item,
  ``raw`` their concatenated little-endian floats in ``paths`` order (``float64``: 8 bytes
  per dimension, the default, so scores are bit-equal to InMemoryStore's; ``float32``: 4
  bytes, scores within about 1e-6); or ``["@v", token, size]``.

A row is whole: the newest row of a key is everything about the item (no row inherits
fields from an older one), so reading is "newest row of the key wins; a tombstone or an
expired row means absent".
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import ormsgpack
from langgraph.store.base import Item

from s3_saver._format.memory.names import show
from s3_saver._format.memory.ttl import is_expired, to_datetime
from s3_saver.errors import CorruptObjectError, EmbeddingError, SerializationError

TOMBSTONE = 1
_KNOWN_FLAGS = TOMBSTONE

RAW, ZLIB = 0, 1
COMPRESS_MIN = 256
"""Values of this many serialized bytes or more are stored zlib-compressed when that saves
at least a tenth: memory text compresses 2-3x, which is bytes sent, stored, and (in
DynamoDB mode) write and read units. Pass ``compress_min=None`` where the value's
container is compressed whole anyway (a manifest head)."""

REF_MARK = "@v"
DTYPES = {"float64": ("d", 8), "float32": ("f", 4)}
"""Vector element types: struct code and bytes per dimension."""
SEALED_DTYPE = "sealed"
"""The dtype of vectors sealed under their namespace's key (``S3Store(encryption=)``): ``raw``
is an envelope of ``[dtype, raw]``; ``dims`` and ``paths`` stay as they were."""


@dataclass(frozen=True, slots=True)
class ValueCell:
    """A value as stored: the serializer's ``(type_tag, bytes)``, maybe compressed."""

    type_tag: str
    data: bytes
    codec: int = RAW

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """A value (or an item's vectors) moved to an immutable object of its own."""

    token: str
    size: int


@dataclass(frozen=True, slots=True)
class VectorsCell:
    """Every vector of one item: ``paths[i]``'s vector is ``raw``'s i-th run of ``dims`` floats."""

    dtype: str
    dims: int
    paths: tuple[str, ...]
    raw: bytes

    def vectors(self) -> list[list[float]]:
        """The vectors as lists of Python floats, in ``paths`` order."""
        code, _ = DTYPES[self.dtype]
        flat = struct.unpack(f"<{len(self.paths) * self.dims}{code}", self.raw)
        return [list(flat[i : i + self.dims]) for i in range(0, len(flat), self.dims)]

    def by_path(self) -> dict[str, list[float]]:
        return dict(zip(self.paths, self.vectors(), strict=True))


@dataclass(frozen=True, slots=True)
class Row:
    key: str
    seq: int
    created_us: int
    updated_us: int
    expires_us: int | None
    ttl_minutes: float | None
    flags: int
    value: ValueCell | ObjectRef | None
    vectors: VectorsCell | ObjectRef | None = None

    @property
    def tombstone(self) -> bool:
        return bool(self.flags & TOMBSTONE)

    def live(self, now: int) -> bool:
        """The row is an item at ``now``: not a tombstone, not expired."""
        return not self.tombstone and not is_expired(self.expires_us, now)

    def with_expiry(self, expires_us: int | None) -> Row:
        """The row with another expiry (a refresh: value, vectors and times unchanged)."""
        return replace(self, expires_us=expires_us)


def put_row(
    key: str,
    *,
    kept: Row | None,
    now: int,
    seq: int,
    value: ValueCell | ObjectRef,
    vectors: VectorsCell | ObjectRef | None,
    ttl_minutes: float | None,
    expires_us: int | None,
) -> Row:
    """The row a put writes. ``kept``: the key's newest row if it is live at ``now`` (an
    overwrite: its ``created_us`` and ``seq`` are kept), else None (a new item: created
    now, at ``seq``). The vectors replace the old ones (none: no vectors)."""
    if kept is not None:
        created, seq = kept.created_us, kept.seq
    else:
        created = now
    # The kept ``created_us`` is another process's clock (or this one's, ahead of a write
    # built earlier): an overwrite is never stamped before the item's creation.
    return Row(key, seq, created, max(now, created), expires_us, ttl_minutes, 0, value, vectors)


def tombstone_row(key: str, now: int) -> Row:
    """The row a delete writes where older rows of the key may remain (manifest segments)."""
    return Row(key, 0, 0, now, None, None, TOMBSTONE, None, None)


def to_item(namespace: tuple[str, ...], row: Row, value: dict[str, Any]) -> Item:
    return Item(
        value=value,
        key=row.key,
        namespace=namespace,
        created_at=to_datetime(row.created_us),
        updated_at=to_datetime(row.updated_us),
    )


# -- values ---------------------------------------------------------------------------


def pack_value(
    serde: Any,
    value: Mapping[str, Any],
    *,
    namespace: tuple[str, ...] = (),
    key: str = "",
    compress_min: int | None = COMPRESS_MIN,
) -> ValueCell:
    """The value through the user's serializer (``dumps_typed``), compressed when it pays.
    A serializer that refuses it raises SerializationError naming namespace and key."""
    try:
        type_tag, data = serde.dumps_typed(value)
    except Exception as exc:
        raise SerializationError(
            f"the store's serializer ({type(serde).__name__}) refused the value of key {show(key)} in namespace"
            f" {show(namespace)}: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(type_tag, str) or not isinstance(data, (bytes, bytearray, memoryview)):
        raise SerializationError(
            f"the store's serializer ({type(serde).__name__}) returned {type(type_tag).__name__},"
            f" {type(data).__name__} for key {show(key)} in namespace {show(namespace)}; dumps_typed returns (str, bytes)"
        )
    return squeeze_cell(ValueCell(type_tag, bytes(data), RAW), compress_min)


def squeeze_cell(cell: ValueCell, compress_min: int | None = COMPRESS_MIN) -> ValueCell:
    """A serializer's pair (``RAW``) as stored: compressed when that saves a tenth."""
    if cell.codec == RAW and compress_min is not None and len(cell.data) >= compress_min:
        squeezed = zlib.compress(cell.data, 6)
        if len(squeezed) * 10 <= len(cell.data) * 9:
            return ValueCell(cell.type_tag, squeezed, ZLIB)
    return cell


def raw_cell(cell: ValueCell, where: str) -> ValueCell:
    """The serializer's pair of a stored cell (decompressed); CorruptObjectError naming ``where``."""
    if cell.codec != ZLIB:
        return cell
    try:
        return ValueCell(cell.type_tag, zlib.decompress(cell.data), RAW)
    except zlib.error as exc:
        raise CorruptObjectError(f"{where}: the value does not decompress ({exc})") from exc


def unpack_value(serde: Any, cell: ValueCell, where: str) -> dict[str, Any]:
    """The value of a cell (``loads_typed``). CorruptObjectError for bytes that do not
    decompress or a value that is not a mapping; SerializationError when the serializer
    cannot read what it is given (another serializer or key wrote it). ``where`` names
    the object or item and the key."""
    data = cell.data
    if cell.codec == ZLIB:
        try:
            data = zlib.decompress(data)
        except zlib.error as exc:
            raise CorruptObjectError(f"{where}: the value does not decompress ({exc})") from exc
    try:
        value = serde.loads_typed((cell.type_tag, data))
    except Exception as exc:
        raise SerializationError(
            f"{where}: the store's serializer ({type(serde).__name__}) cannot read the value (type {cell.type_tag!r}):"
            f" {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(value, Mapping):
        raise CorruptObjectError(f"{where}: the value is a {type(value).__name__}, not a mapping")
    return value if isinstance(value, dict) else dict(value)


# -- vectors --------------------------------------------------------------------------


def pack_vectors(vectors: Mapping[str, Sequence[float]], dims: int, dtype: str = "float64") -> VectorsCell | None:
    """An item's vectors (path -> vector, in the order the item's vectors are scored) as
    stored; None for none. Vectors were checked (``embedding.vectors_for_puts``);
    a float32 overflow raises EmbeddingError."""
    if not vectors:
        return None
    code, _ = DTYPES[dtype]
    flat = [float(x) for vector in vectors.values() for x in vector]
    try:
        raw = struct.pack(f"<{len(flat)}{code}", *flat)
    except (OverflowError, struct.error) as exc:
        raise EmbeddingError(f"a vector does not fit {dtype}: {exc}") from exc
    return VectorsCell(dtype, dims, tuple(vectors), raw)


# -- the codec --------------------------------------------------------------------------


def value_to_wire(value: ValueCell | ObjectRef | None) -> list[Any] | None:
    if value is None:
        return None
    if isinstance(value, ObjectRef):
        return [REF_MARK, value.token, value.size]
    return [value.type_tag, value.data, value.codec]


def vectors_to_wire(vectors: VectorsCell | ObjectRef | None) -> list[Any] | None:
    if vectors is None:
        return None
    if isinstance(vectors, ObjectRef):
        return [REF_MARK, vectors.token, vectors.size]
    return [vectors.dtype, vectors.dims, list(vectors.paths), vectors.raw]


def row_to_wire(row: Row) -> list[Any]:
    return [
        row.key,
        row.seq,
        row.created_us,
        row.updated_us,
        row.expires_us,
        row.ttl_minutes,
        row.flags,
        value_to_wire(row.value),
        vectors_to_wire(row.vectors),
    ]


def dumps_row(row: Row) -> bytes:
    return ormsgpack.packb(row_to_wire(row))


def loads_row(data: bytes, where: str) -> Row:
    try:
        obj = ormsgpack.unpackb(data)
    except (ormsgpack.MsgpackDecodeError, ValueError, TypeError) as exc:
        raise CorruptObjectError(f"{where}: not a msgpack row ({exc})") from exc
    return row_from_wire(obj, where)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ref_from_wire(obj: Any) -> ObjectRef | None:
    if (
        isinstance(obj, list)
        and len(obj) == 3
        and obj[0] == REF_MARK
        and isinstance(obj[1], str)
        and obj[1]
        and _is_int(obj[2])
        and obj[2] >= 0
    ):
        return ObjectRef(obj[1], obj[2])
    return None


def value_from_wire(obj: Any, where: str) -> ValueCell | ObjectRef:
    ref = _ref_from_wire(obj)
    if ref is not None:
        return ref
    if (
        isinstance(obj, list)
        and len(obj) == 3
        and isinstance(obj[0], str)
        and isinstance(obj[1], bytes)
        and obj[2] in (RAW, ZLIB)
        and not isinstance(obj[2], bool)
    ):
        return ValueCell(obj[0], obj[1], obj[2])
    raise CorruptObjectError(f"{where}: not a stored value: {show(obj, 120)}")


def vectors_from_wire(obj: Any, where: str) -> VectorsCell | ObjectRef:
    ref = _ref_from_wire(obj)
    if ref is not None:
        return ref
    if isinstance(obj, list) and len(obj) == 4:
        dtype, dims, paths, raw = obj
        if dtype == SEALED_DTYPE and _is_int(dims) and dims > 0 and isinstance(paths, list) and isinstance(raw, bytes):
            return VectorsCell(dtype, dims, tuple(paths), raw)
        if (
            dtype in DTYPES
            and _is_int(dims)
            and dims > 0
            and isinstance(paths, list)
            and paths
            and all(isinstance(p, str) for p in paths)
            and len(set(paths)) == len(paths)
            and isinstance(raw, bytes)
            and len(raw) == len(paths) * dims * DTYPES[dtype][1]
        ):
            return VectorsCell(dtype, dims, tuple(paths), raw)
    raise CorruptObjectError(f"{where}: not stored vectors: {show(obj, 120)}")


def row_from_wire(obj: Any, where: str) -> Row:
    """A row from its wire form, every field checked: CorruptObjectError naming ``where``
    (and the key, once known) for anything this format does not write."""
    if not isinstance(obj, list) or len(obj) != 9:
        raise CorruptObjectError(f"{where}: not a row (a list of 9 fields): {show(obj, 120)}")
    key, seq, created, updated, expires, ttl, flags, value, vectors = obj
    if not isinstance(key, str):
        raise CorruptObjectError(f"{where}: a row's key is not a string: {show(key)}")
    at = f"{where}, key {show(key)}"
    if not (_is_int(seq) and seq >= 0 and _is_int(created) and _is_int(updated) and _is_int(flags)):
        raise CorruptObjectError(f"{at}: seq, times and flags are not integers: {show(obj[1:4] + [flags])}")
    if flags & ~_KNOWN_FLAGS:
        raise CorruptObjectError(f"{at}: unknown row flags {flags:#x} (written by a later format?)")
    if expires is not None and not _is_int(expires):
        raise CorruptObjectError(f"{at}: expiry is not an integer: {show(expires)}")
    if ttl is not None and (
        isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or ttl < 0
    ):
        raise CorruptObjectError(f"{at}: ttl is not a number of minutes: {show(ttl)}")
    if flags & TOMBSTONE:
        if value is not None or vectors is not None:
            raise CorruptObjectError(f"{at}: a tombstone row holds a value or vectors")
        return Row(key, seq, created, updated, expires, ttl, flags, None, None)
    if value is None:
        raise CorruptObjectError(f"{at}: a row without a value that is not a tombstone")
    return Row(
        key,
        seq,
        created,
        # An overwrite stamped before the item's creation: in DynamoDB mode ``ca`` is kept by
        # the write itself (``if_not_exists``), set by another process's clock, or by a
        # concurrent first put built after this overwrite and landed before it; no update
        # expression takes a max, so the read does (updated_at is never before created_at).
        max(created, updated),
        expires,
        None if ttl is None else float(ttl),
        flags,
        value_from_wire(value, at),
        None if vectors is None else vectors_from_wire(vectors, at),
    )

