"""archive_thread and export_thread: a thread into one object (archive_idle: ``_ops/idle``;
restore and import: ``install``).

Archive (read-decide-act, fenced at the commit): mark the thread with the key
of the archive object about to be written (``Index.mark_archive``), read its
whole history (``Index.snapshot``: every entry and every object they name,
``closure.closure``), write it as one archive object, and switch the index to
it (``Index.switch_archive``, the commit point) only if nothing was committed
since the read; then remove the live entries and objects
(``Index.finish_archive``). Restore: finish that cleanup if it was cut short,
read the archive, write every object again under a fresh tag, install the
entries and take the archive out (the commit point), then delete the archive
object. Cut short anywhere, the thread reads from exactly one place, and a
call again finishes the job:

* before the switch, the live thread is read; the mark names the archive
  object, which the next call (or a delete) deletes;
* after it, the archive is read, and ``archive_thread`` (or a restore, or a
  write, which restores first) again removes what is left of the live thread;
* a restore cut short before its switch left objects under a tag no entry
  names (collect_garbage's); after it, the archive object waits in the index
  (``stale_archive``) until deleted.

With encryption, the archive holds the thread's records in the clear (each live
object opened under the thread's key for its own place as it is read), and the
whole archive object (its header line and compressed document) is sealed under
the thread's key, bound to the archive object's key: moved to another key or
thread it does not open, and once the key is destroyed no copy of it (a locked
version, one in a cold class, a backup) can be read. The object's user metadata
names the key it is sealed under (``archive_metadata``): an erase that cannot read
a cold version tells from its HeadObject whether the destroyed key sealed it. The
index's reference to the archive carries the latest root checkpoint's record
without its values (the thread listing shows it): sealed too, for that
checkpoint's object, as index entries carry bodies. An export is the thread's
record (the archive's bytes) sealed under the thread's key, bound to the saver's
prefix and the thread, behind a header that names the key store the key lives in
(``_format/archive.SealedExport``): an export file holds no plaintext, and once the
thread is erased nobody can read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from s3_saver._format.archive import (
    ARCHIVE_CLASSES,
    Archive,
    SealedExport,
    archive_metadata,
    check_class,
    encode_archive,
    encode_sealed_export,
    latest_of,
    newest_of,
)
from s3_saver._format.closure import closure, own_object
from s3_saver._format.codec import CHECKPOINT_FORMAT, plain, typed, unpack
from s3_saver._format.entries import ArchiveRef, CheckpointEntry, retag
from s3_saver._format.keys import ObjectKey, new_token
from s3_saver._index.terms import Archived
from s3_saver._ops.archived import (
    _WAVE,
    ArchiveStatus,
    _remove_stale,
    _thread,
    read_archive,
)
from s3_saver._ops.context import Context, meta_key
from s3_saver._ops.delete import delete_keys, deleter
from s3_saver._ops.keyed import keyed_beside
from s3_saver._transport.failures import (
    CONDITIONAL_CONFLICT_CODES,
    PRECONDITION_FAILED_CODES,
    error_code,
)
from s3_saver._transport.protocol import Op, gather, raise_failure, request
from s3_saver.errors import (
    ConfigurationError,
    MissingObjectError,
    S3SaverError,
    ThreadArchivedError,
)

_EXPORT_ATTEMPTS = 3


class NothingToArchive(ConfigurationError):
    """The thread has no checkpoints (none ever, or deleted or erased before the archive
    read it). A ConfigurationError to callers; the migration tells it apart: its thread
    emptied under it is "empty", not a failure of the run."""



# -- archive -----------------------------------------------------------------------------
def archive_thread(
    ctx: Context, thread_id: str, storage_class: str, still: Callable[[Archive], bool] | None = None
) -> Op[ArchiveStatus | None]:
    """``still``: asked of the thread as read under the mark (``archive_idle``: is
    it idle still?); False takes the mark off and returns None, nothing archived."""
    thread_id = _thread(thread_id)
    check_class(storage_class, ARCHIVE_CLASSES, "storage_class")
    # The thread's key (with encryption) beside its record: to open its objects and
    # seal the archive.
    ctx, own = yield from keyed_beside(ctx, [thread_id], ctx.index.archive_of(thread_id))
    if own.archive is not None:
        # Archived already: finish removing the live thread, if a call was cut short.
        yield from ctx.index.finish_archive(thread_id, own.archive, deleter(ctx, thread_id))
        return _status(thread_id, "archived", own.archive)
    if own.stale_archive is not None:
        yield from _remove_stale(ctx, thread_id, own.stale_archive)
    # Read-decide-act, fenced at the commit: the archive object's key is marked
    # before the thread is read, and the switch happens only if nothing was
    # committed since the read (a commit fails it). A key of its own per call:
    # an archive cut short leaves an object the next call (or delete) removes.
    key = ctx.layout.archive_key(thread_id, new_token(20))
    earlier = yield from ctx.index.mark_archive(thread_id, key)
    if earlier is not None and earlier != key:
        yield from delete_keys(ctx, [earlier], f"thread {thread_id!r}")  # an archive cut short, or racing this one
    for attempt in range(_EXPORT_ATTEMPTS):
        entries, snapshot = yield from ctx.index.snapshot(thread_id)
        entries = [e for e in entries if not ctx.expired(e)]
        if not entries:
            yield from _unmark(ctx, thread_id, key)
            raise NothingToArchive(f"thread {thread_id!r} has no checkpoints to archive ({ctx.index.describe()})")
        try:
            archive, live_bytes = yield from _collect(ctx, thread_id, entries, own.created or ctx.now())
            break
        except MissingObjectError:
            # A commit after the snapshot replaced an object it names (a special
            # channel's write is last-write-wins: its old object goes) or a prune
            # took one out: read the thread again. The mark stays, so the switch
            # is still fenced against what commits after this read. An object
            # that stays missing is a real loss, and is raised.
            if attempt == _EXPORT_ATTEMPTS - 1:
                yield from _unmark(ctx, thread_id, key)
                raise
    if still is not None and not still(archive):
        # Written to between the caller's look and the mark: what the caller
        # decided on is no longer the thread. A commit after the mark fails
        # the switch (below); one before it is in this read.
        yield from _unmark(ctx, thread_id, key)
        return None
    # Sealed whole (with encryption) for its own key: the archive is one message.
    data = ctx.sealer.seal(thread_id, key, encode_archive(archive))
    newest = newest_of(archive.entries)
    yield from _put_archive(ctx, key, data, storage_class, archive_metadata(newest, ctx.sealer.key_id(thread_id)))
    runs = sorted({e.run_id for e in entries if e.run_id is not None})
    latest = sealed_latest(ctx, latest_of(archive))
    ref = ArchiveRef(key, storage_class, len(data), ctx.now(), newest, latest, len(entries), live_bytes, runs)
    ctx.locs.forget_thread(thread_id)
    if not (yield from ctx.index.switch_archive(thread_id, ref, snapshot)):
        # A commit came after the read (or another call's archive took over):
        # this archive holds less than the thread, and goes.
        yield from delete_keys(ctx, [key], f"thread {thread_id!r}")
        yield from _unmark(ctx, thread_id, key)
        raise ThreadArchivedError(
            f"thread {thread_id!r} was written to while it was being archived ({ctx.index.describe()}); "
            "nothing was archived: call archive_thread again",
            thread_id,
        )
    # The thread's activity entries go with the live thread (archive_idle would
    # find them stale): those its record names (day and token), beside the
    # cleanup. Only those: a restore may have written another since the switch.
    drop = own.named_entries()
    yield from gather(ctx.index.finish_archive(thread_id, ref, deleter(ctx, thread_id)), ctx.index.drop_active(drop))
    ctx.locs.forget_thread(thread_id)
    return _status(thread_id, "archived", ref)


def _unmark(ctx: Context, thread_id: str, key: str) -> Op[None]:
    """Take this call's mark off (the archive did not happen)."""
    yield from ctx.index.cancel_archiving(thread_id, key)
    yield from ctx.index.forget_archive(thread_id, key)


def _status(thread_id: str, state: str, ref: ArchiveRef) -> ArchiveStatus:
    return ArchiveStatus(thread_id, state, ref.storage_class, ref.key, ref.size, ref.checkpoints, ref.live_bytes)


def sealed_latest(ctx: Context, latest: CheckpointEntry | None) -> CheckpointEntry | None:
    """The latest root checkpoint as the index's reference carries it: with encryption,
    its record (without values) sealed for the checkpoint's object as the summary names
    it, and its metadata as index entries seal theirs."""
    if latest is None or not ctx.sealer.enabled:
        return latest
    t, body = latest.thread_id, latest.body or b""
    object_key = ctx.layout.object_key(own_object(latest))
    # The metadata, from the record when the index entry carried none: read from the
    # reference, it cannot be taken from the sealed body.
    metadata = latest.metadata or typed(unpack(body, CHECKPOINT_FORMAT, f"checkpoint {latest.checkpoint_id}")["metadata"])
    metadata = ctx.sealer.seal_meta(t, meta_key(ctx, t, latest.ns, latest.checkpoint_id), metadata)
    return replace(latest, body=ctx.sealer.seal(t, object_key, body), metadata=metadata)


def _collect(ctx: Context, thread_id: str, entries: list[CheckpointEntry], created: int) -> Op[tuple[Archive, int]]:
    """The archive of ``entries``: every object they name (``closure.closure``),
    read in waves (bodies the index carries are not read again), under its
    logical name: tags go (an install writes every object anew). With encryption
    each is opened under the thread's key for its own place (the archive holds
    records in the clear; it is sealed whole), and so is each entry's metadata."""
    layout = ctx.layout
    needed = closure(entries)
    have: dict[ObjectKey, bytes] = {}
    for e in entries:
        if e.body is not None:
            have[own_object(e)] = e.body
        have.update((own_object(w), w.body) for w in e.writes or () if w.body is not None)
    wanted = [o for o in needed if o not in have]
    for i in range(0, len(wanted), _WAVE):
        chunk = wanted[i : i + _WAVE]
        results = yield from request(*(ctx.s3.get(layout.object_key(o)) for o in chunk))
        have.update((o, result["Body"]) for o, result in zip(chunk, results))
    live_bytes = sum(len(have[o]) for o in needed)
    where = f"thread {thread_id!r}"

    def record(o: ObjectKey, what: str) -> bytes:
        key = layout.object_key(o)
        return plain(ctx.sealer.open(thread_id, key, have[o], f"s3://{ctx.s3.bucket}/{key}"), f"{what} of {where}")

    out = []
    for e in sorted(entries, key=lambda e: (e.checkpoint_id, e.ns)):  # parents first
        writes = [
            replace(w, body=record(own_object(w), f"pending write of {e.checkpoint_id}"), gen=0, expires_at=None)
            for w in e.writes or ()
        ]
        body = record(own_object(e), f"checkpoint {e.checkpoint_id}")
        metadata = e.metadata
        if metadata is not None:
            source = f"index entry of checkpoint {e.checkpoint_id} of {where}"
            metadata = ctx.sealer.open_meta(thread_id, meta_key(ctx, thread_id, e.ns, e.checkpoint_id), metadata, source)
        loc = {ch: retag(ref, "") for ch, ref in e.loc.items()}
        out.append(replace(e, body=body, metadata=metadata, writes=writes, gen=0, expires_at=None, tag="", loc=loc))
    archive = Archive(thread_id, created, out)
    own = {(e.ns, e.checkpoint_id) for e in entries}
    for o in needed:
        if o.kind == "blob":
            archive.blobs[(o.ns, o.channel, o.version, o.checkpoint_id)] = record(o, "blob")
        elif o.kind == "checkpoint" and (o.ns, o.checkpoint_id) not in own:
            archive.records[(o.ns, o.checkpoint_id)] = record(o, f"checkpoint {o.checkpoint_id}")
    return archive, live_bytes


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


def export_thread(ctx: Context, thread_id: str) -> Op[bytes]:
    thread_id = _thread(thread_id)
    # The thread's key (with encryption) beside its record: to open its objects (or its
    # archive) and seal the export.
    ctx, own = yield from keyed_beside(ctx, [thread_id], ctx.index.archive_of(thread_id))
    if own.archive is not None:
        data = yield from read_archive(ctx, thread_id, own.archive)  # the archive is the export
        return _exported(ctx, thread_id, data)
    for attempt in range(_EXPORT_ATTEMPTS):
        try:
            entries = [e for e in (yield from ctx.index.contents(thread_id)) if not ctx.expired(e)]
        except Archived as archived:
            # Archived since the first read.
            return _exported(ctx, thread_id, (yield from read_archive(ctx, thread_id, archived.ref)))
        if not entries:
            raise ConfigurationError(f"thread {thread_id!r} has no checkpoints to export ({ctx.index.describe()})")
        try:
            archive, _ = yield from _collect(ctx, thread_id, entries, own.created or ctx.now())
        except MissingObjectError:
            # A prune took checkpoints out after the index was read (and deleted
            # their objects): read it again.
            if attempt == _EXPORT_ATTEMPTS - 1:
                raise
            continue
        return _exported(ctx, thread_id, encode_archive(archive))
    raise AssertionError("unreachable")


def _exported(ctx: Context, thread_id: str, data: bytes) -> bytes:
    """The export of a thread whose record (its archive's bytes) is ``data``: as it is
    without encryption; with it, the record sealed under the thread's key, behind a header
    naming where that key lives (``SealedExport``). The export is bound to that key: it
    reads wherever that key store can be read with the same KMS key or local master key,
    and nowhere once the thread is erased."""
    if ctx.crypt is None:
        return data
    record = ctx.sealer.seal_export(thread_id, data)
    return encode_sealed_export(SealedExport(thread_id, ctx.crypt.bucket, ctx.crypt.prefix, ctx.crypt.key_bucket, record))
