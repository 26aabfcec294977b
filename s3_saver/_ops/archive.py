"""archive_thread, restore_thread, export/import and archive_idle.

Archive: read the thread's whole history (its index, then every object it
refers to), write it as one archive object (``IfNoneMatch``; its key is its
content's hash, so an archive written again after a crash lands on the same
key), switch the index to it (the commit point), then remove the live objects
and entries. Restore: read the archive, write every object back under the keys
it had, install the entries and take the marker out (the commit point), then
delete the archive object. Cut short anywhere, the thread reads from exactly
one place, and a call again finishes the job:

* before the switch, the live thread is read (an archive object may exist
  already: the next call writes the same key, or, the thread changed, deletes
  it: its key was recorded first, ``Index.intend_archive``);
* after it, the archive is read, and ``archive_thread`` again removes what is
  left of the live thread (``Index.archive`` with no entries);
* a restore cut short before its switch left objects that hold what the
  archive holds (written again, compared as records, by the next call); after
  it, the archive object waits in the index (``stale_archive``) until deleted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from s3_saver._archive import (
    ARCHIVE_CLASSES,
    Archive,
    archive_metadata,
    check_class,
    decode_archive,
    digest,
    encode_archive,
    latest_of,
    newest_of,
)
from s3_saver._codec import plain, same_record, squeeze
from s3_saver._index.base import IN_BLOB_OBJECT, ArchiveRef, CheckpointEntry
from s3_saver._ops import threads
from s3_saver._ops.archived import RESTORE_DONE, archive_body, cold_error, read_archive
from s3_saver._ops.context import Context, target
from s3_saver._ops.delete import delete_keys, object_keys
from s3_saver._protocol import Op, drain, gather, raise_failure, request
from s3_saver._s3 import put_immutable
from s3_saver.errors import (
    CONDITIONAL_CONFLICT_CODES,
    PRECONDITION_FAILED_CODES,
    ConfigurationError,
    S3SaverError,
    ThreadArchivedError,
    error_code,
)

_WAVE = 100  # objects read or written per round trip
_TIERS = ("Standard", "Bulk", "Expedited")


@dataclass(frozen=True)
class ArchiveStatus:
    """Where a thread lives, as :meth:`S3Saver.archive_thread` and
    :meth:`S3Saver.restore_thread` leave it.

    Attributes:
        thread_id: The thread.
        state: ``"archived"`` (read from its archive object), ``"restoring"``
            (S3 is restoring the archive from a cold class: call
            ``restore_thread`` again later) or ``"live"``.
        storage_class: The archive object's storage class (None when live and no archive was read).
        key: The archive object's key (None when live and no archive was read).
        size: Bytes of the archive object.
        checkpoints: Checkpoints archived or restored (hidden ones included).
        live_bytes: Bytes of the live objects archived or restored.
    """

    thread_id: str
    state: str
    storage_class: str | None = None
    key: str | None = None
    size: int = 0
    checkpoints: int = 0
    live_bytes: int = 0


# -- archive -----------------------------------------------------------------------------
def archive_thread(ctx: Context, thread_id: str, storage_class: str) -> Op[ArchiveStatus]:
    thread_id = _thread(thread_id)
    check_class(storage_class, ARCHIVE_CLASSES, "storage_class")
    own = yield from ctx.index.archive_of(thread_id)
    if own.stale_archive is not None:
        yield from _remove_stale(ctx, thread_id, own.stale_archive)
    if own.archive is not None:
        # Archived already: finish removing the live thread, if a call was cut short:
        # what the archive holds, when it can be read (a write parked since stays).
        data, _ = yield from archive_body(ctx, own.archive)
        known = decode_archive(data, f"s3://{ctx.s3.bucket}/{own.archive.key}").entries if data else None
        yield from ctx.index.archive(thread_id, own.archive, None, _deleter(ctx, thread_id), known)
        return _status(thread_id, "archived", own.archive)
    entries = [e for e in (yield from ctx.index.contents(thread_id)) if not ctx.expired(e)]
    if not entries:
        raise ConfigurationError(f"thread {thread_id!r} has no checkpoints to archive ({ctx.index.describe()})")
    archive, live_bytes = yield from _collect(ctx, thread_id, entries, own.created or ctx.now())
    data = encode_archive(archive)
    key = ctx.layout.archive_key(thread_id, digest(data))
    newest = newest_of(archive.entries)
    # The key goes into the index first: if this call is cut short and the thread
    # changes before the next, that call deletes this object (it writes another key).
    yield from ctx.index.intend_archive(thread_id, key)
    yield from _put_archive(ctx, key, data, storage_class, archive_metadata(newest))
    ref = ArchiveRef(key, storage_class, len(data), ctx.now(), newest, latest_of(archive), len(entries), live_bytes)
    ctx.locs.forget_thread(thread_id)
    yield from ctx.index.archive(thread_id, ref, entries, _deleter(ctx, thread_id))
    ctx.locs.forget_thread(thread_id)
    return _status(thread_id, "archived", ref)


def _status(thread_id: str, state: str, ref: ArchiveRef) -> ArchiveStatus:
    return ArchiveStatus(thread_id, state, ref.storage_class, ref.key, ref.size, ref.checkpoints, ref.live_bytes)


def _collect(ctx: Context, thread_id: str, entries: list[CheckpointEntry], created: int) -> Op[tuple[Archive, int]]:
    """The archive of ``entries``: every object they own, read in waves
    (what the index carries already is not read again)."""
    layout = ctx.layout
    wanted: dict[str, Any] = {}
    for e in entries:
        if e.body is None:
            wanted[layout.checkpoint_key(thread_id, e.ns, e.checkpoint_id)] = e
        for ch, (version, src, kind, _) in e.loc.items():
            if kind == IN_BLOB_OBJECT and src == e.checkpoint_id:
                wanted[layout.blob_key(thread_id, e.ns, ch, version, src)] = (e.ns, ch, version, src)
        for w in e.writes or ():
            if w.body is None:
                wanted[layout.writes_key(thread_id, w.ns, w.checkpoint_id, w.task_id, w.part, w.token)] = w
    bodies: dict[int, bytes] = {}
    blobs: dict[tuple[str, str, Any, str], bytes] = {}
    keys = list(wanted)
    for i in range(0, len(keys), _WAVE):
        chunk = keys[i : i + _WAVE]
        results = yield from request(*(ctx.s3.get(k) for k in chunk))
        for k, result in zip(chunk, results):
            if isinstance(wanted[k], tuple):
                blobs[wanted[k]] = result["Body"]
            else:
                bodies[id(wanted[k])] = result["Body"]
    live_bytes = sum(len(b) for b in bodies.values()) + sum(len(b) for b in blobs.values())
    out = []
    for e in sorted(entries, key=lambda e: (e.checkpoint_id, e.ns)):  # parents first
        body = e.body if e.body is not None else bodies[id(e)]
        writes = []
        for w in e.writes or ():
            wbody = w.body if w.body is not None else bodies[id(w)]
            live_bytes += len(wbody) if w.body is not None else 0
            writes.append(replace(w, body=plain(wbody, f"pending write of {e.checkpoint_id}"), gen=0, expires_at=None))
        live_bytes += len(body) if e.body is not None else 0
        out.append(replace(e, body=plain(body, f"checkpoint {e.checkpoint_id}"), writes=writes, gen=0, expires_at=None))
    where = f"blob of thread {thread_id!r}"
    return Archive(thread_id, created, out, {k: plain(b, where) for k, b in blobs.items()}), live_bytes


def _put_archive(ctx: Context, key: str, data: bytes, storage_class: str, metadata: dict[str, str]) -> Op[None]:
    for _ in range(3):
        call = ctx.s3.put_new(key, data, storage_class, metadata)
        (result,) = yield (call,)
        if not isinstance(result, BaseException):
            return
        code = error_code(result)
        if code in PRECONDITION_FAILED_CODES:
            return  # the key is the content's hash: that archive holds these bytes (a call again)
        if code not in CONDITIONAL_CONFLICT_CODES:
            raise_failure(call, result)
    raise S3SaverError(f"s3://{ctx.s3.bucket}/{key}: concurrent writes of the same archive kept conflicting")


def _deleter(ctx: Context, thread_id: str) -> Any:
    def delete_objects(entries: list[Any]) -> Op[None]:
        yield from delete_keys(ctx, sorted(set(object_keys(ctx, entries))), f"thread {thread_id!r}")

    return delete_objects


# -- restore, export, import ----------------------------------------------------------------
def restore_thread(ctx: Context, thread_id: str, days: int, tier: str) -> Op[ArchiveStatus]:
    thread_id = _thread(thread_id)
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ConfigurationError(f"days must be an int >= 1 (how long S3 keeps the restored copy), got {days!r}")
    if tier not in _TIERS:
        raise ConfigurationError(f"tier must be one of {', '.join(_TIERS)}; got {tier!r}")
    own = yield from ctx.index.archive_of(thread_id)
    if own.archive is None:
        if own.stale_archive is not None:
            yield from _remove_stale(ctx, thread_id, own.stale_archive)
        return ArchiveStatus(thread_id, "live")
    ref = own.archive
    data, head = yield from archive_body(ctx, ref)
    if data is None:
        return (yield from _request_restore(ctx, thread_id, ref, head, days, tier))
    archive = decode_archive(data, f"s3://{ctx.s3.bucket}/{ref.key}")
    live_bytes = yield from _install(ctx, thread_id, archive, ref)
    return ArchiveStatus(thread_id, "live", ref.storage_class, ref.key, ref.size, len(archive.entries), live_bytes)


def _request_restore(
    ctx: Context, thread_id: str, ref: ArchiveRef, head: dict[str, Any], days: int, tier: str
) -> Op[ArchiveStatus]:
    """Ask S3 to restore a cold archive object (once: a restore under way is left alone)."""
    storage_class = head.get("StorageClass") or ref.storage_class
    if not head.get("Restore"):
        call = ctx.s3.restore(ref.key, days, tier)
        (result,) = yield (call,)
        if isinstance(result, BaseException) and error_code(result) != "RestoreAlreadyInProgress":
            raise_failure(call, result)
    elif RESTORE_DONE in head["Restore"]:
        raise cold_error(ctx, thread_id, ref, head)  # restored, yet the GET refused: say so
    return ArchiveStatus(thread_id, "restoring", storage_class, ref.key, ref.size)


def restore_before_write(ctx: Context, thread_id: str, ref: ArchiveRef) -> Op[None]:
    """A write to an archived thread: bring it back first (ThreadArchivedError
    when its class cannot be read at once)."""
    data = yield from read_archive(ctx, thread_id, ref)
    yield from _install(ctx, thread_id, decode_archive(data, f"s3://{ctx.s3.bucket}/{ref.key}"), ref)


def export_thread(ctx: Context, thread_id: str) -> Op[bytes]:
    thread_id = _thread(thread_id)
    own = yield from ctx.index.archive_of(thread_id)
    if own.archive is not None:
        return (yield from read_archive(ctx, thread_id, own.archive))  # the archive is the export
    entries = [e for e in (yield from ctx.index.contents(thread_id)) if not ctx.expired(e)]
    if not entries:
        raise ConfigurationError(f"thread {thread_id!r} has no checkpoints to export ({ctx.index.describe()})")
    archive, _ = yield from _collect(ctx, thread_id, entries, own.created or ctx.now())
    return encode_archive(archive)


def import_thread(ctx: Context, data: bytes, thread_id: str | None) -> Op[str]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ConfigurationError(f"import_thread takes the bytes export_thread returned, got {type(data).__name__}")
    archive = decode_archive(bytes(data), "the archive given to import_thread")
    dest = _thread(archive.thread_id if thread_id is None else thread_id)
    own, existing = yield from gather(ctx.index.archive_of(dest), ctx.index.contents(dest))
    if existing or own.archive is not None:
        raise ConfigurationError(
            f"thread {dest!r} already has checkpoints ({ctx.index.describe()}); import_thread imports into "
            "an empty thread (delete_thread it first, or pass thread_id=...)"
        )
    archive.entries = [replace(e, gen=own.gen) for e in archive.entries]
    yield from _install(ctx, dest, archive, None)
    return dest


def _install(ctx: Context, thread_id: str, archive: Archive, ref: ArchiveRef | None) -> Op[int]:
    """Write the archive's objects under ``thread_id``, then its index entries:
    with ``ref``, in place of the thread's archive marker (restore), else into
    the empty thread (import). Returns the bytes written."""
    layout = ctx.layout
    objects: dict[str, bytes] = {}
    for e in archive.entries:
        objects[layout.checkpoint_key(thread_id, e.ns, e.checkpoint_id)] = squeeze(e.body or b"")
        for w in e.writes or ():
            objects[layout.writes_key(thread_id, w.ns, w.checkpoint_id, w.task_id, w.part, w.token)] = squeeze(w.body or b"")
    for (ns, ch, version, cid), body in archive.blobs.items():
        objects[layout.blob_key(thread_id, ns, ch, version, cid)] = squeeze(body)
    keys = list(objects)
    for i in range(0, len(keys), _WAVE):
        # An object left by a cut-short archive or restore holds the same record
        # (maybe compressed by another zlib): that counts as written.
        yield from put_immutable(ctx.s3, {k: objects[k] for k in keys[i : i + _WAVE]}, same=same_record)
    expires_at = ctx.now() + ctx.ttl_seconds if ctx.ttl_seconds else None
    entries = [
        replace(e, thread_id=thread_id, body=squeeze(e.body or b""), writes=[], expires_at=expires_at)
        for e in archive.entries
    ]
    writes = [
        replace(w, thread_id=thread_id, body=squeeze(w.body or b""), expires_at=expires_at)
        for e in archive.entries
        for w in e.writes or ()
    ]
    ctx.locs.forget_thread(thread_id)
    if ref is not None:
        yield from ctx.index.unarchive(thread_id, ref, entries, writes)  # the commit point
        yield from _remove_stale(ctx, thread_id, ref.key)
    else:
        yield from ctx.index.restore(thread_id, entries, writes, archive.created or ctx.now())
        runs = sorted({e.run_id for e in entries if e.run_id is not None})
        yield from gather(*(ctx.index.note(thread_id, None, run) for run in runs))
    ctx.locs.forget_thread(thread_id)
    return sum(len(b) for b in objects.values())


def _remove_stale(ctx: Context, thread_id: str, key: str) -> Op[None]:
    yield from delete_keys(ctx, [key], f"thread {thread_id!r}")
    yield from ctx.index.forget_archive(thread_id, key)


# -- the operator's schedule ----------------------------------------------------------------
def archive_idle(ctx: Context, older_than: timedelta, storage_class: str, limit: int | None) -> Op[list[ArchiveStatus]]:
    if not isinstance(older_than, timedelta) or older_than.total_seconds() < 0:
        raise ConfigurationError(f"older_than must be a datetime.timedelta >= 0, got {older_than!r}")
    check_class(storage_class, ARCHIVE_CLASSES, "storage_class")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigurationError(f"limit must be an int >= 1 or None, got {limit!r}")
    cutoff = datetime.fromtimestamp(time.time(), timezone.utc) - older_than  # to the microsecond, as ts is
    listed, _ = yield from drain(threads.list_threads(ctx, None, None, None))
    done: list[ArchiveStatus] = []
    for info in listed:
        if info.archived or not info.ts or datetime.fromisoformat(info.ts) > cutoff:
            continue
        try:
            done.append((yield from archive_thread(ctx, info.thread_id, storage_class)))
        except ThreadArchivedError:
            continue  # written to while archived, or archived meanwhile: the next run sees it
        if limit is not None and len(done) >= limit:
            break
    return done


def _thread(thread_id: Any) -> str:
    if not isinstance(thread_id, str):
        raise ConfigurationError(f"thread_id must be a string, got {type(thread_id).__name__}: {thread_id!r}")
    checked, _, _ = target({"configurable": {"thread_id": thread_id}})
    return checked

