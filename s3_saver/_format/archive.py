"""The archive format: a whole thread in one self-describing, compressed object.

``archive_thread`` writes it under ``archive/``, ``export_thread`` hands it to
the caller, ``restore_thread`` and ``import_thread`` read it back. It holds
every namespace, checkpoint (hidden ones included: newer checkpoints read
through them), pending write and value of the thread, each as the record its
live object holds, with the index's view of it (parent, ``loc``, run): a thread
restored from it reads exactly as before, in any bucket, prefix, region or index
mode, under any thread id.

On the wire: one header line, ``s3_saver.archive/<version> <codec>\\n``, then
the compressed msgpack document. The header says how to read the rest without
decompressing anything. The codec was chosen by measurement on the benchmark's
conversations (see docs/guides/archival.md): the records of one thread repeat
one another (each version of a message list holds the previous one), which a
compressor with a long window turns into a fraction of the bytes, where the
live objects, compressed one by one, cannot share anything.

Also here: which storage classes can be read at once, and an ``ArchiveRef``
to and from the bytes an index stores.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import ormsgpack

from s3_saver._format.codec import CHECKPOINT_FORMAT, is_packed, pack, plain, unpack
from s3_saver._format.entries import ArchiveRef, CheckpointEntry, WritesEntry, as_ref
from s3_saver.errors import ConfigurationError, CorruptObjectError

ARCHIVE_FORMAT = "s3_saver.archive/2"
# /1 had no ``records``: archives written by earlier versions read as before.
_READS = ("s3_saver.archive/1", ARCHIVE_FORMAT)
REF_FORMAT = 1

# Classes a GET reads at once; an archive in any other must be restored first.
INSTANT_CLASSES = frozenset(
    {"STANDARD", "STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING", "GLACIER_IR", "REDUCED_REDUNDANCY"}
)
COLD_CLASSES = frozenset({"GLACIER", "DEEP_ARCHIVE"})
ARCHIVE_CLASSES = INSTANT_CLASSES | COLD_CLASSES
# Live objects are small (a checkpoint, a value, a batch of writes: ~1.7 KB each in the
# benchmark's conversation) and replaced or deleted within days (prune, archive, delete):
# only the classes that bill a small object by its size and for the days it lived.
# INTELLIGENT_TIERING bills an object under 128 KB at its frequent tier, unmonitored, with
# no minimum duration.
LIVE_CLASSES = frozenset({"STANDARD", "INTELLIGENT_TIERING"})
# The instant classes refused for live objects: (minimum billable size in KB, minimum days).
_SMALL_OBJECT_MINIMUMS = {"STANDARD_IA": (128, 30), "ONEZONE_IA": (128, 30), "GLACIER_IR": (128, 90)}
_REFUSED_LIVE = {
    "REDUCED_REDUNDANCY": "AWS no longer recommends it: it costs more than STANDARD and keeps fewer copies",
    "EXPRESS_ONEZONE": "a directory bucket stores every object in it already: leave storage_class None",
    "GLACIER": "a GET cannot read it until S3 restores it (minutes to hours)",
    "DEEP_ARCHIVE": "a GET cannot read it until S3 restores it (hours)",
}

_ZSTD_LEVEL = 19
_WINDOW_LOG = 27  # 128 MiB: the whole of nearly every thread is in reach of each match


def _zstd() -> Any:
    # zstandard is imported on first use: a saver that never archives never loads it.
    import zstandard

    return zstandard


def _compress(data: bytes) -> bytes:
    zstd = _zstd()
    # The window reaches across the whole thread (up to 128 MiB), never beyond
    # what the data needs (a reader allocates the window the frame names).
    window = min(_WINDOW_LOG, max(10, len(data).bit_length()))
    params = zstd.ZstdCompressionParameters.from_level(
        _ZSTD_LEVEL, source_size=len(data), window_log=window, write_content_size=True
    )
    return zstd.ZstdCompressor(compression_params=params).compress(data)


def _decompress(data: bytes) -> bytes:
    return _zstd().ZstdDecompressor(max_window_size=1 << _WINDOW_LOG).decompress(data)


_CODECS = {"zstd": (_compress, _decompress)}
CODEC = "zstd"


def check_live_class(storage_class: Any, bucket: str) -> str:
    """``storage_class`` if it pays for small, short-lived objects, else a ConfigurationError
    that says what the class would cost and what to use instead."""
    if storage_class in LIVE_CLASSES:
        return storage_class
    instead = (
        "use STANDARD or INTELLIGENT_TIERING for live objects (objects under 128 KB are billed at "
        "its frequent tier, with no minimum duration), and archive_thread() for cold threads "
        "(one object per thread)"
    )
    if storage_class in _SMALL_OBJECT_MINIMUMS:
        size_kb, days = _SMALL_OBJECT_MINIMUMS[storage_class]
        reason = (
            f"it bills each object as at least {size_kb} KB and for at least {days} days; live objects "
            f"are a few KB and are replaced or deleted within days (a 20-turn conversation: 100 objects, "
            f"168 KB, billed as {100 * size_kb / 1000:.1f} MB, and each prune or archive pays the days "
            "left as an early-deletion charge)"
        )
    else:
        reason = _REFUSED_LIVE.get(storage_class, "it is not an S3 storage class the saver writes live objects in")
    raise ConfigurationError(
        f"storage_class {storage_class!r} for the live objects of bucket {bucket!r}: {reason}; {instead}"
    )


def check_class(storage_class: Any, allowed: frozenset[str], what: str) -> str:
    if not isinstance(storage_class, str) or storage_class not in allowed:
        raise ConfigurationError(f"{what} must be one of {', '.join(sorted(allowed))}; got {storage_class!r}")
    return storage_class


@dataclass
class Archive:
    """A thread as its archive holds it: entries with their records and writes
    (bodies are uncompressed records), blob records by (ns, channel, version,
    checkpoint), and the records of checkpoints it has no entry of that its
    entries read values from (a pruned or expired ancestor's), by (ns, checkpoint).

    Every object the entries name is here (``closure.closure``), under its
    logical name: no object key, no tag (an install writes them all anew).
    """

    thread_id: str
    created: int
    entries: list[CheckpointEntry] = field(default_factory=list)  # commit order: parents first
    blobs: dict[tuple[str, str, Any, str], bytes] = field(default_factory=dict)
    records: dict[tuple[str, str], bytes] = field(default_factory=dict)

    @property
    def writes(self) -> list[WritesEntry]:
        return [w for e in self.entries for w in e.writes or ()]


def encode_archive(archive: Archive) -> bytes:
    doc = {
        "format": ARCHIVE_FORMAT,
        "thread_id": archive.thread_id,
        "created": archive.created,
        "checkpoints": [
            [e.ns, e.checkpoint_id, e.parent_id, {ch: list(v) for ch, v in e.loc.items()}, e.run_id, e.hidden, e.body]
            for e in archive.entries
        ],
        "writes": [[w.ns, w.checkpoint_id, w.task_id, w.part, w.token, w.body] for w in archive.writes],
        "blobs": [[ns, ch, version, cid, body] for (ns, ch, version, cid), body in archive.blobs.items()],
        "records": [[ns, cid, body] for (ns, cid), body in archive.records.items()],
    }
    compress, _ = _CODECS[CODEC]
    return f"{ARCHIVE_FORMAT} {CODEC}\n".encode() + compress(ormsgpack.packb(doc))


def decode_archive(data: bytes, where: str) -> Archive:
    header, newline, rest = data.partition(b"\n")
    fmt, _, codec = header.decode("ascii", "replace").partition(" ")
    if not newline or fmt not in _READS or codec not in _CODECS:
        raise CorruptObjectError(
            f"{where}: not an s3_saver archive of a version this saver reads (header {header[:60]!r}; "
            f"expected {ARCHIVE_FORMAT!r} with codec {', '.join(_CODECS)})"
        )
    try:
        doc = ormsgpack.unpackb(_CODECS[codec][1](rest))
    except Exception as exc:
        raise CorruptObjectError(f"{where}: the archive does not decode ({type(exc).__name__}: {exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise CorruptObjectError(f"{where}: the archive's document is not {fmt!r}")
    thread_id = doc["thread_id"]
    archive = Archive(thread_id, doc["created"])
    by_key: dict[tuple[str, str], CheckpointEntry] = {}
    for ns, cid, parent_id, loc, run_id, hidden, body in doc["checkpoints"]:
        record = unpack(body, CHECKPOINT_FORMAT, f"{where}: checkpoint {cid}")
        entry = CheckpointEntry(
            thread_id=thread_id,
            ns=ns,
            checkpoint_id=cid,
            parent_id=parent_id,
            loc={ch: as_ref(v) for ch, v in loc.items()},
            body=bytes(body),
            metadata=(record["metadata"][0], bytes(record["metadata"][1])),
            writes=[],
            run_id=run_id,
            hidden=hidden,
        )
        archive.entries.append(entry)
        by_key[(ns, cid)] = entry
    for ns, cid, task_id, part, token, body in doc["writes"]:
        owner = by_key.get((ns, cid))
        if owner is not None:
            owner.writes.append(WritesEntry(thread_id, ns, cid, task_id, part, token, bytes(body)))  # type: ignore[union-attr]
    archive.blobs = {(ns, ch, version, cid): bytes(body) for ns, ch, version, cid, body in doc["blobs"]}
    archive.records = {(ns, cid): bytes(body) for ns, cid, body in doc.get("records", ())}
    return archive


def summary(entry: CheckpointEntry, where: str) -> CheckpointEntry:
    """The entry with its record stripped of values: what the thread listing shows."""
    record = unpack(plain(entry.body or b"", where), CHECKPOINT_FORMAT, where)
    slim = pack({**record, "values": {}, "blobs": {}, "pieces": {}, "chains": {}})
    return CheckpointEntry(
        entry.thread_id, entry.ns, entry.checkpoint_id, entry.parent_id, {}, slim, entry.metadata, writes=[], run_id=entry.run_id
    )


def newest_of(entries: list[CheckpointEntry]) -> dict[str, str]:
    """The newest checkpoint id of each namespace (hidden ones count)."""
    newest: dict[str, str] = {}
    for e in entries:
        newest[e.ns] = max(newest.get(e.ns, ""), e.checkpoint_id)
    return newest


def latest_of(archive: Archive) -> CheckpointEntry | None:
    """The root namespace's latest checkpoint, as the thread listing shows it."""
    roots = [e for e in archive.entries if e.ns == "" and not e.hidden]
    if not roots:
        return None
    return summary(max(roots, key=lambda e: e.checkpoint_id), f"thread {archive.thread_id!r}")


# S3 user metadata is ASCII and at most 2 KB per object: the namespaces go there when they fit,
# so that an index rebuilt beside a cold archive (which cannot be read) still marks them all.
_META_NEWEST = "s3saver-newest"
_META_MAX = 1536
# With encryption: the id (hex) of the thread's data key the archive is sealed under. A
# HeadObject reads it where a GET cannot (a cold class): an erase reports such a version
# crypto-erased only when it names a destroyed key.
_META_KEY_ID = "s3saver-key-id"


def archive_metadata(newest: dict[str, str], key_id: str | None = None) -> dict[str, str]:
    encoded = base64.b64encode(ormsgpack.packb(newest)).decode()
    found = {_META_NEWEST: encoded} if len(encoded) <= _META_MAX else {}
    if key_id is not None:
        found[_META_KEY_ID] = key_id
    return found


def metadata_key_id(metadata: dict[str, str]) -> bytes | None:
    """The data key id an archive object's user metadata names (None: none, or not one)."""
    try:
        return bytes.fromhex(metadata[_META_KEY_ID])
    except (KeyError, TypeError, ValueError):
        return None


def metadata_newest(metadata: dict[str, str]) -> dict[str, str] | None:
    try:
        found = ormsgpack.unpackb(base64.b64decode(metadata[_META_NEWEST]))
    except (KeyError, ValueError, ormsgpack.MsgpackDecodeError):
        return None
    return found if isinstance(found, dict) else None


# -- an encrypted export ---------------------------------------------------------------
# With encryption, ``export_thread`` hands out the thread's record (the archive's bytes)
# sealed under the thread's data key, behind a header that says where that key lives:
# the first line, then a msgpack map of the thread, the bucket, prefix and key store it
# was exported from, and the sealed record. Nothing of the thread's content is in the
# clear; ids and names are (as in object keys).
EXPORT_FORMAT = "s3_saver.export/1"
_EXPORT_HEADER = f"{EXPORT_FORMAT} sealed\n".encode()


@dataclass(frozen=True)
class SealedExport:
    """An encrypted export: the thread's record sealed under its data key, which lives
    in ``key_bucket`` under ``prefix`` (the exporting saver's)."""

    thread_id: str
    bucket: str
    prefix: str
    key_bucket: str
    record: bytes

    def describe(self) -> str:
        return (
            f"the encrypted export of thread {self.thread_id!r} (from s3://{self.bucket}/{self.prefix}, "
            f"its key in s3://{self.key_bucket}/{self.prefix})"
        )


def encode_sealed_export(export: SealedExport) -> bytes:
    doc = {
        "format": EXPORT_FORMAT,
        "thread_id": export.thread_id,
        "bucket": export.bucket,
        "prefix": export.prefix,
        "key_bucket": export.key_bucket,
        "record": export.record,
    }
    return _EXPORT_HEADER + ormsgpack.packb(doc)


def decode_sealed_export(data: bytes, where: str) -> SealedExport | None:
    """The encrypted export ``data`` holds; None: it is not one (a plaintext export)."""
    if not data.startswith(_EXPORT_HEADER):
        return None
    try:
        doc = ormsgpack.unpackb(data[len(_EXPORT_HEADER) :])
        if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
            raise ValueError(f"expected format {EXPORT_FORMAT!r}")
        fields = [doc[name] for name in ("thread_id", "bucket", "prefix", "key_bucket")]
        if not all(isinstance(f, str) for f in fields) or not isinstance(doc["record"], bytes):
            raise TypeError("a field of the wrong type")
        return SealedExport(*fields, doc["record"])
    except (ormsgpack.MsgpackDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CorruptObjectError(f"{where}: not an encrypted s3_saver export of a version this saver reads ({exc})") from exc


# -- the reference an index keeps -----------------------------------------------------
def encode_ref(ref: ArchiveRef) -> bytes:
    latest = ref.latest
    row = None if latest is None else [latest.checkpoint_id, latest.parent_id, latest.body, latest.run_id]
    if row is not None and latest is not None and not is_packed(latest.body or b""):
        # Encrypted (the body is sealed, its metadata cannot be read from it): the
        # metadata, sealed as index entries carry theirs, goes beside.
        row.append(None if latest.metadata is None else list(latest.metadata))
    return ormsgpack.packb(
        [REF_FORMAT, ref.key, ref.storage_class, ref.size, ref.archived_at, ref.newest, row, ref.checkpoints, ref.live_bytes, ref.runs]
    )


def decode_ref(thread_id: str, data: bytes, where: str) -> ArchiveRef:
    try:
        version, key, storage_class, size, archived_at, newest, row, *counts = ormsgpack.unpackb(data)
    except (ValueError, TypeError, ormsgpack.MsgpackDecodeError) as exc:
        raise CorruptObjectError(f"{where}: archive reference does not decode ({exc})") from exc
    if version != REF_FORMAT:
        raise CorruptObjectError(f"{where}: archive reference of version {version}, this saver reads {REF_FORMAT}")
    latest = None
    if row is not None:
        cid, parent_id, body, run_id, *sealed = row
        if sealed:
            # Sealed as the body is: opened where it is read.
            metadata = None if sealed[0] is None else (str(sealed[0][0]), bytes(sealed[0][1]))
        else:
            record = unpack(bytes(body), CHECKPOINT_FORMAT, where)
            metadata = (record["metadata"][0], bytes(record["metadata"][1]))
        latest = CheckpointEntry(thread_id, "", cid, parent_id, {}, bytes(body), metadata, writes=[], run_id=run_id)
    # References written before a field existed are shorter: its default holds.
    return ArchiveRef(key, storage_class, size, archived_at, dict(newest), latest, *counts[:2], *(list(r) for r in counts[2:3]))
