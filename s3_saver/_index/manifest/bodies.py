"""The bodies a manifest document carries, compressed together in one zstd frame.

The checkpoints of one thread repeat one another (each one's copy of a message
list holds the one before), so their bodies compressed together take a fraction
of the bytes of the same bodies compressed one by one (the objects' own zlib,
whose 32 KB window sees little of the body before): the workload of ``make
bench`` measured 34 head bodies at 31 KB in zstd against 297 KB one by one and
215 KB in zlib, in 0.5 ms against 27 ms.

A segment carries every body it seals here (history reads no object for
them). Heads carried a frame too (the bodies of their checkpoints but the
newest, up to 64 KB compressed) and the bodies pinned for "latest"; every
write re-uploaded them (a head of ~40 KB in ``make bench``'s workload), and a
versioned bucket kept each one as a noncurrent version. Heads are written
without them now (``doc.encode_head``); a head written with them
still reads (``fill``, ``unpack_pinned``), as a head without them always did
for a reader of an earlier version (it reads those bodies from their objects).
A body read back from a frame is the plain record, which every reader of a body
takes (``codec.unpack``, ``same_record``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import ormsgpack

from s3_saver._format.archive import _zstd
from s3_saver._format.codec import plain
from s3_saver._format.entries import CheckpointEntry, WritesEntry
from s3_saver.errors import CorruptObjectError

FIELD = "zbodies"
# The field of pinned bodies in heads written before (see ``doc.Head.pinned``).
PINNED = "zpinned"
# A body larger than this (stored) is read from its object: a segment never
# grows by one large value.
BODY_MAX = 64 * 1024
_LEVEL = 3  # level 19 saves another 10% at 20 times the CPU, on every write
_PLAIN_MAX = 1 << 30  # what a frame may decompress to (corrupt data never allocates more)

_CheckpointKey = tuple[str, str]
_WriteKey = tuple[str, str, str, str, str]


def pack(entries: list[CheckpointEntry], writes: list[WritesEntry]) -> bytes | None:
    """One frame of the bodies of ``entries`` and ``writes`` (None: none to carry)."""
    rows = [[e.ns, e.checkpoint_id, plain(e.body, e.checkpoint_id)] for e in entries if _fits(e)]
    wrows = [[*write_key(w), plain(w.body, w.checkpoint_id)] for w in writes if _fits(w)]
    if not rows and not wrows:
        return None
    return _zstd().ZstdCompressor(level=_LEVEL, write_content_size=True).compress(ormsgpack.packb([rows, wrows]))


def unpack_pinned(frame: bytes | None, where: str) -> dict[tuple[str, str, str], bytes]:
    if not frame:
        return {}
    try:
        rows = ormsgpack.unpackb(_zstd().ZstdDecompressor().decompress(frame, max_output_size=_PLAIN_MAX))
    except Exception as exc:  # zstandard.ZstdError (imported lazily), msgpack errors
        raise CorruptObjectError(f"{where}: its pinned bodies are not a zstd frame of msgpack ({exc})") from exc
    return {(ns, cid, tag): body for ns, cid, tag, body in rows}


def fill(
    entries: list[CheckpointEntry], writes: list[WritesEntry], frame: bytes | None, where: str
) -> tuple[list[CheckpointEntry], list[WritesEntry]]:
    """``entries`` and ``writes`` with the bodies ``frame`` carries for them."""
    if not frame:
        return entries, writes
    try:
        rows, wrows = ormsgpack.unpackb(_zstd().ZstdDecompressor().decompress(frame, max_output_size=_PLAIN_MAX))
    except Exception as exc:  # zstandard.ZstdError (imported lazily), msgpack errors
        raise CorruptObjectError(f"{where}: its bodies are not a zstd frame of msgpack ({exc})") from exc
    bodies: dict[_CheckpointKey, bytes] = {(ns, cid): body for ns, cid, body in rows}
    wbodies: dict[_WriteKey, bytes] = {tuple(row[:5]): row[5] for row in wrows}  # type: ignore[misc]
    entries = [
        replace(e, body=bodies[(e.ns, e.checkpoint_id)]) if e.body is None and (e.ns, e.checkpoint_id) in bodies else e
        for e in entries
    ]
    writes = [
        replace(w, body=wbodies[write_key(w)]) if w.body is None and write_key(w) in wbodies else w for w in writes
    ]
    return entries, writes


def _fits(entry: Any) -> bool:
    return entry.body is not None and len(entry.body) <= BODY_MAX


def write_key(w: WritesEntry) -> _WriteKey:
    """A writes part's identity in a document (its token tells a replaced part)."""
    return (w.ns, w.checkpoint_id, w.task_id, w.part, w.token)
