"""A namespace's sealed segments (manifest mode): immutable objects holding the older
rows of its head, the refs the head keeps of them, and their Bloom filters.

::

    memory/n/<node id>/@s/<number>.<token>   a segment: rows sorted by key, never changed

A head holds its namespace's newest rows up to a budget; past it, a writer seals the
older rows into segments (written first, ``IfNoneMatch``) in the swap that drops them
from the head. A key's item is its newest row: the head's, else the newest segment's
(higher ``number``) that holds the key. The head's ref of a segment carries what a
reader and a writer need to know without reading it: the key range, a Bloom filter of
its keys (``BITS_PER_KEY`` bits a key, about 1% false positives), its rows and bytes,
and the bytes of its rows no read returns any more (``dead``: shadowed by a newer row of
their key, or tombstones), which decide when a compaction pays.

A segment stores its namespace and number: a read compares both with what the head
named (a segment copied under another key is a CorruptObjectError). It carries no
nonce: a segment PUT sent again writes the same bytes (``put_immutable``'s same-bytes
rule), under a key no other write takes (a fresh token).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from s3_saver._format.codec import pack, unpack
from s3_saver._format.key_codec import MEMORY_PREFIX
from s3_saver._format.memory.names import show
from s3_saver._format.memory.rows import (
    ObjectRef,
    Row,
    ValueCell,
    VectorsCell,
    row_from_wire,
    row_to_wire,
)
from s3_saver.errors import CorruptObjectError

SEGMENT_FORMAT = "s3_saver.memory-segment/1"
SEGMENT_DIR = "@s"
SEGMENT_NAME = re.compile(r"@s/[0-9]{8}\.[0-9a-f]{16}")
TOKEN_BYTES = 8
BITS_PER_KEY = 10
_HASHES = 7  # optimal for 10 bits a key: about 0.8% false positives
_ROW_OVERHEAD = 48  # a row's fields beside its key and cells, as packed (times, seq, flags, framing)


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """What a head keeps of one of its segments."""

    number: int
    token: str
    count: int
    """Rows in it."""
    size: int
    """Bytes of its rows (``row_bytes``)."""
    dead: int
    """Bytes of its rows no read returns any more: a newer row of their key (in the head or
    a newer segment) shadows them, or they are tombstones."""
    min_key: str
    max_key: str
    bloom: bytes

    @property
    def name(self) -> str:
        return f"{self.number:08d}.{self.token}"

    def may_hold(self, key: str) -> bool:
        """Whether the segment may hold a row of ``key`` (False: surely not)."""
        return self.min_key <= key <= self.max_key and _in_bloom(self.bloom, key)

    def with_dead(self, more: int) -> SegmentRef:
        return SegmentRef(
            self.number, self.token, self.count, self.size, min(self.size, self.dead + more), self.min_key, self.max_key, self.bloom
        )


def segment_key(prefix: str, node: str, ref: SegmentRef) -> str:
    return f"{prefix}{MEMORY_PREFIX}n/{node}/{SEGMENT_DIR}/{ref.name}"


def row_bytes(row: Row) -> int:
    """A row's bytes, as the head budget and the segments count them (an estimate of its
    packed size: its key, its cells and a fixed overhead)."""
    return _ROW_OVERHEAD + len(row.key.encode()) + _cell_bytes(row.value) + _cell_bytes(row.vectors)


def _cell_bytes(cell: Any) -> int:
    if isinstance(cell, ValueCell):
        return len(cell.data) + len(cell.type_tag)
    if isinstance(cell, VectorsCell):
        return len(cell.raw) + sum(len(p) + 1 for p in cell.paths) + 8
    if isinstance(cell, ObjectRef):
        return 48
    return 0


def make_ref(number: int, token: str, rows: Sequence[Row]) -> SegmentRef:
    """The ref of a segment of ``rows`` (sorted by key, at least one)."""
    sizes = [row_bytes(r) for r in rows]
    dead = sum(s for r, s in zip(rows, sizes) if r.tombstone)
    return SegmentRef(number, token, len(rows), sum(sizes), dead, rows[0].key, rows[-1].key, bloom_of(r.key for r in rows))


def dumps_segment(path: tuple[str, ...], ref: SegmentRef, rows: Sequence[Row]) -> bytes:
    return pack({"format": SEGMENT_FORMAT, "path": list(path), "number": ref.number, "rows": [row_to_wire(r) for r in rows]})


def loads_segment(data: bytes, path: tuple[str, ...], ref: SegmentRef, where: str) -> dict[str, Row]:
    """A segment's rows by key, checked against the ref its head keeps: CorruptObjectError
    naming ``where`` and the namespace for anything else."""
    at = f"{where} (namespace {show(path)})"
    record = unpack(data, SEGMENT_FORMAT, at)
    stored, number, wire = record.get("path"), record.get("number"), record.get("rows")
    if not isinstance(stored, list) or tuple(stored) != path or number != ref.number:
        found = tuple(stored) if isinstance(stored, list) else stored
        raise CorruptObjectError(f"{at}: the segment is namespace {show(found)}'s number {show(number)}, not the one its head names")
    if not isinstance(wire, list) or len(wire) != ref.count:
        raise CorruptObjectError(f"{at}: not the {ref.count} rows its head names")
    rows: dict[str, Row] = {}
    last = None
    for obj in wire:
        row = row_from_wire(obj, at)
        if last is not None and row.key <= last:
            raise CorruptObjectError(f"{at}: key {show(row.key)} out of order")
        rows[row.key] = row
        last = row.key
    return rows


def ref_to_wire(ref: SegmentRef) -> list[Any]:
    return [ref.number, ref.token, ref.count, ref.size, ref.dead, ref.min_key, ref.max_key, ref.bloom]


def ref_from_wire(obj: Any, where: str) -> SegmentRef:
    if (
        isinstance(obj, list)
        and len(obj) == 8
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (obj[0], obj[2], obj[3], obj[4]))
        and isinstance(obj[1], str)
        and re.fullmatch(r"[0-9a-f]{16}", obj[1])
        and isinstance(obj[5], str)
        and isinstance(obj[6], str)
        and obj[5] <= obj[6]
        and isinstance(obj[7], bytes)
        and obj[7]
        and obj[2] > 0
    ):
        return SegmentRef(*obj)
    raise CorruptObjectError(f"{where}: not a segment ref: {show(obj, 120)}")


# -- Bloom filters ------------------------------------------------------------------------


def bloom_of(keys: Iterable[str]) -> bytes:
    """A Bloom filter of ``keys``: ``BITS_PER_KEY`` bits a key (at least 64)."""
    keys = list(keys)
    size = max(8, (len(keys) * BITS_PER_KEY + 7) // 8)
    bits = bytearray(size)
    for key in keys:
        for p in _positions(key, size * 8):
            bits[p >> 3] |= 1 << (p & 7)
    return bytes(bits)


def _in_bloom(bloom: bytes, key: str) -> bool:
    return all(bloom[p >> 3] >> (p & 7) & 1 for p in _positions(key, len(bloom) * 8))


def _positions(key: str, m: int) -> list[int]:
    digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
    h1 = int.from_bytes(digest[:8], "little")
    h2 = int.from_bytes(digest[8:], "little") | 1
    return [(h1 + i * h2) % m for i in range(_HASHES)]
