"""The bodies a manifest document carries, compressed together in one zstd frame.

The checkpoints of one thread repeat one another (each one's copy of a message
list holds the one before), so their bodies compressed together take a fraction
of the bytes of the same bodies compressed one by one (the objects' own zlib,
whose 32 KB window sees little of the body before): the workload of ``make
bench`` measured 34 head bodies at 31 KB in zstd against 297 KB one by one and
215 KB in zlib, in 0.5 ms against 27 ms.

A segment carries every body it seals here (history reads no object); the head,
rewritten by every write, carries here the bodies its rows do not (every
checkpoint but what "latest" reads), newest first, as many as fit HEAD_FRAME_MAX
compressed: a full history then reads the head, the segments and the large
values only. The frame is a field of the document beside its rows: a reader of
an earlier version ignores it and reads those bodies from their objects, as it
did, and a writer of an earlier version drops it, which costs only those reads.
On a versioned bucket every head a write replaces stays as a noncurrent
version, frame included, so there the head has no frame
(``manifest_doc.encode_head``, ``lean``): reads GET those bodies from their
objects, as a reader of an earlier version does.
A body read back from a frame is the plain record, which every reader of a body
takes (``_codec.unpack``, ``same_record``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import ormsgpack

from s3_saver._archive import _zstd
from s3_saver._codec import plain
from s3_saver._index.base import CheckpointEntry, WritesEntry
from s3_saver.errors import CorruptObjectError

FIELD = "zbodies"
# The head's field of pinned bodies (see ``manifest_doc.Head.pinned``); older
# versions ignore it.
PINNED = "zpinned"
# A body larger than this (stored) is read from its object: a segment or a head
# never grows by one large value.
BODY_MAX = 64 * 1024
# The head's frame, compressed: what each write adds to the head's bytes at most.
HEAD_FRAME_MAX = 64 * 1024
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


def pack_head(
    entries: list[CheckpointEntry], writes: list[WritesEntry], in_rows: set[_CheckpointKey]
) -> bytes | None:
    """The head's frame: the bodies of the checkpoints not in ``in_rows`` and of
    their writes, newest first, halved until the frame fits HEAD_FRAME_MAX."""
    kept = [e for e in entries if _fits(e) and (e.ns, e.checkpoint_id) not in in_rows]
    while kept:
        ids = {(e.ns, e.checkpoint_id) for e in kept}
        frame = pack(kept, [w for w in writes if (w.ns, w.checkpoint_id) in ids])
        if frame is None or len(frame) <= HEAD_FRAME_MAX:
            return frame
        kept = kept[(len(kept) + 1) // 2 :]  # entries are oldest first: the newest half stays
    return None


def pack_pinned(pinned: dict[tuple[str, str, str], bytes]) -> bytes | None:
    """The head's pinned bodies in one frame, the largest left out until it fits
    HEAD_FRAME_MAX (a read then GETs those objects)."""
    rows = sorted(([*key, plain(body, key[1])] for key, body in pinned.items()), key=lambda r: len(r[3]))
    while rows:
        frame = _zstd().ZstdCompressor(level=_LEVEL, write_content_size=True).compress(ormsgpack.packb(rows))
        if len(frame) <= HEAD_FRAME_MAX:
            return frame
        rows.pop()
    return None


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
