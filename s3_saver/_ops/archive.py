"""archive_thread, restore_thread, export/import (archive_idle: ``_ops/idle``).

Archive (read-decide-act, fenced at the commit): mark the thread with the key
of the archive object about to be written (``Index.mark_archive``), read its
whole history (``Index.snapshot``: every entry and every object they name,
``_reach.closure``), write it as one archive object, and switch the index to
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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from s3_saver._format.archive import (
    ARCHIVE_CLASSES,
    Archive,
    archive_metadata,
    check_class,
    decode_archive,
    encode_archive,
    latest_of,
    newest_of,
)
from s3_saver._format.codec import plain, squeeze
from s3_saver._index.activity import day_of
from s3_saver._index.terms import Archived
from s3_saver._format.entries import ArchiveRef, CheckpointEntry, retag
from s3_saver._format.keys import ObjectKey, new_tag, new_token
from s3_saver._format.closure import closure, moved, own_object
from s3_saver._ops.archived import RESTORE_DONE, archive_body, cold_error, read_archive
from s3_saver._ops.context import Context, target
from s3_saver._ops.delete import delete_keys, deleter
from s3_saver._transport.protocol import Op, Sleep, gather, raise_failure, request
from s3_saver._transport.s3 import put_immutable
from s3_saver._transport.failures import (
    CONDITIONAL_CONFLICT_CODES,
    PRECONDITION_FAILED_CODES,
    error_code,
)
from s3_saver.errors import (
    ConfigurationError,
    MissingObjectError,
    S3SaverError,
    ThreadArchivedError,
)

_WAVE = 100  # objects read or written per round trip
_EXPORT_ATTEMPTS = 3
_RESTORE_WAITS = (0.05, 0.1, 0.2, 0.4, 0.8)
# Reads of the thread's record by restore_thread when its archive object is gone
# under it (restored or deleted by another call, the thread archived again since).
_RESTORE_READS = 3
_TIERS = ("Standard", "Bulk", "Expedited")
# HeadObject's ArchiveStatus of an INTELLIGENT_TIERING object that must be restored first.
INTELLIGENT_TIERING_ARCHIVE_TIERS = frozenset({"ARCHIVE_ACCESS", "DEEP_ARCHIVE_ACCESS"})


@dataclass(frozen=True)
class ArchiveStatus:
    """Where a thread lives, as [S3Saver.archive_thread()][s3_saver.S3Saver.archive_thread] and
    [S3Saver.restore_thread()][s3_saver.S3Saver.restore_thread] leave it.

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
def archive_thread(
    ctx: Context, thread_id: str, storage_class: str, still: Callable[[Archive], bool] | None = None
) -> Op[ArchiveStatus | None]:
    """``still``: asked of the thread as read under the mark (``archive_idle``: is
    it idle still?); False takes the mark off and returns None, nothing archived."""
    thread_id = _thread(thread_id)
    check_class(storage_class, ARCHIVE_CLASSES, "storage_class")
    own = yield from ctx.index.archive_of(thread_id)
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
            raise ConfigurationError(f"thread {thread_id!r} has no checkpoints to archive ({ctx.index.describe()})")
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
    data = encode_archive(archive)
    newest = newest_of(archive.entries)
    yield from _put_archive(ctx, key, data, storage_class, archive_metadata(newest))
    runs = sorted({e.run_id for e in entries if e.run_id is not None})
    ref = ArchiveRef(key, storage_class, len(data), ctx.now(), newest, latest_of(archive), len(entries), live_bytes, runs)
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


def _collect(ctx: Context, thread_id: str, entries: list[CheckpointEntry], created: int) -> Op[tuple[Archive, int]]:
    """The archive of ``entries``: every object they name (``_reach.closure``),
    read in waves (bodies the index carries are not read again), under its
    logical name: tags go (an install writes every object anew)."""
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
    out = []
    for e in sorted(entries, key=lambda e: (e.checkpoint_id, e.ns)):  # parents first
        writes = [
            replace(w, body=plain(have[own_object(w)], f"pending write of {e.checkpoint_id}"), gen=0, expires_at=None)
            for w in e.writes or ()
        ]
        body = plain(have[own_object(e)], f"checkpoint {e.checkpoint_id} of {where}")
        loc = {ch: retag(ref, "") for ch, ref in e.loc.items()}
        out.append(replace(e, body=body, writes=writes, gen=0, expires_at=None, tag="", loc=loc))
    archive = Archive(thread_id, created, out)
    own = {(e.ns, e.checkpoint_id) for e in entries}
    for o in needed:
        if o.kind == "blob":
            archive.blobs[(o.ns, o.channel, o.version, o.checkpoint_id)] = plain(have[o], f"blob of {where}")
        elif o.kind == "checkpoint" and (o.ns, o.checkpoint_id) not in own:
            archive.records[(o.ns, o.checkpoint_id)] = plain(have[o], f"checkpoint {o.checkpoint_id} of {where}")
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


# -- restore, export, import ----------------------------------------------------------------
def restore_thread(ctx: Context, thread_id: str, days: int, tier: str) -> Op[ArchiveStatus]:
    thread_id = _thread(thread_id)
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ConfigurationError(f"days must be an int >= 1 (how long S3 keeps the restored copy), got {days!r}")
    if tier not in _TIERS:
        raise ConfigurationError(f"tier must be one of {', '.join(_TIERS)}; got {tier!r}")
    own = yield from ctx.index.archive_of(thread_id)
    for attempt in range(_RESTORE_READS):
        if own.archive is None:
            if own.stale_archive is not None:
                yield from _remove_stale(ctx, thread_id, own.stale_archive)
            return ArchiveStatus(thread_id, "live")
        ref = own.archive
        try:
            data, head = yield from archive_body(ctx, ref)
            if data is None:
                return (yield from _request_restore(ctx, thread_id, ref, head, days, tier))
        except MissingObjectError:
            # The archive object went after the record was read: another restore
            # finished (and deleted it), or a delete_thread took the thread. The
            # record, read again, says which: no longer naming this archive, the
            # call answers as it would have had it begun now (a live or deleted
            # thread: "live"; archived again: that archive). Still naming it, the
            # object is lost: raised.
            own = yield from ctx.index.archive_of(thread_id)
            if attempt == _RESTORE_READS - 1 or (own.archive is not None and own.archive.key == ref.key):
                raise
            continue
        archive = decode_archive(data, f"s3://{ctx.s3.bucket}/{ref.key}")
        live_bytes = yield from install(ctx, thread_id, archive, ref)
        return ArchiveStatus(thread_id, "live", ref.storage_class, ref.key, ref.size, len(archive.entries), live_bytes)
    raise AssertionError("unreachable")


def _request_restore(
    ctx: Context, thread_id: str, ref: ArchiveRef, head: dict[str, Any], days: int, tier: str
) -> Op[ArchiveStatus]:
    """Ask S3 to restore a cold archive object (once: a restore under way is left alone)."""
    storage_class = head.get("StorageClass") or ref.storage_class
    if not head.get("Restore"):
        # An INTELLIGENT_TIERING object in an archive tier (HeadObject's ArchiveStatus) is
        # moved back to its Frequent Access tier for good, not copied for some days: S3
        # refuses a RestoreRequest with Days there. GLACIER and DEEP_ARCHIVE need them.
        tiered = head.get("ArchiveStatus") in INTELLIGENT_TIERING_ARCHIVE_TIERS
        call = ctx.s3.restore(ref.key, None if tiered else days, tier)
        (result,) = yield (call,)
        if isinstance(result, BaseException) and error_code(result) != "RestoreAlreadyInProgress":
            raise_failure(call, result)
    elif RESTORE_DONE in head["Restore"]:
        raise cold_error(ctx, thread_id, ref, head)  # restored, yet the GET refused: say so
    return ArchiveStatus(thread_id, "restoring", storage_class, ref.key, ref.size)


def restore_before_write(ctx: Context, thread_id: str, ref: ArchiveRef) -> Op[None]:
    """A write to an archived thread: bring it back first (ThreadArchivedError
    when its class cannot be read at once). Another writer restoring it at the
    same time may finish first and delete the archive object: then it is live."""
    try:
        data = yield from read_archive(ctx, thread_id, ref)
    except MissingObjectError:
        own = yield from ctx.index.archive_of(thread_id)
        if own.archive is not None and own.archive.key == ref.key:
            raise
        return
    yield from install(ctx, thread_id, decode_archive(data, f"s3://{ctx.s3.bucket}/{ref.key}"), ref)


def export_thread(ctx: Context, thread_id: str) -> Op[bytes]:
    thread_id = _thread(thread_id)
    own = yield from ctx.index.archive_of(thread_id)
    if own.archive is not None:
        return (yield from read_archive(ctx, thread_id, own.archive))  # the archive is the export
    for attempt in range(_EXPORT_ATTEMPTS):
        try:
            entries = [e for e in (yield from ctx.index.contents(thread_id)) if not ctx.expired(e)]
        except Archived as archived:
            return (yield from read_archive(ctx, thread_id, archived.ref))  # archived since the first read
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
        return encode_archive(archive)
    raise AssertionError("unreachable")


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
    yield from install(ctx, dest, archive)
    return dest


def install(
    ctx: Context, thread_id: str, archive: Archive, ref: ArchiveRef | None = None, copied_from: str | None = None
) -> Op[int]:
    """Write the archive's objects under ``thread_id``, then its index entries:
    with ``ref``, in place of the thread's archive (restore: the archive's
    cleanup is finished first), as a copy of thread ``copied_from``, or into
    the empty thread (import). Returns the bytes written.

    Every object is written under keys no earlier call wrote (``_reach.moved``):
    a cleanup or a garbage collection still running can never delete them."""
    layout = ctx.layout
    if ref is not None:
        yield from ctx.index.finish_archive(thread_id, ref, deleter(ctx, thread_id))
    tag = new_tag()
    entries, writes = moved(archive.entries, thread_id, tag)
    objects: dict[str, bytes] = {}
    for e in entries:
        objects[layout.object_key(own_object(e))] = squeeze(e.body or b"")
    for w in writes:
        objects[layout.object_key(own_object(w))] = squeeze(w.body or b"")
    for (ns, ch, version, cid), body in archive.blobs.items():
        objects[layout.blob_key(thread_id, ns, ch, version, cid, tag)] = squeeze(body)
    for (ns, cid), body in archive.records.items():
        objects[layout.checkpoint_key(thread_id, ns, cid, tag)] = squeeze(body)
    # Live again (restored, imported, copied): archive_idle's clock starts anew. The
    # thread's activity entry of the day is staged with the last wave of objects and
    # recorded by the commit, as a write's is (``Index.stage_active``): the thread's
    # record names it, so a delete or an archive after this removes it, and a
    # commit refused takes it back. Written beside the commit and named by nothing,
    # it outlived every delete of the thread.
    keys = list(objects)
    last = max(len(keys) - 1, 0) // _WAVE * _WAVE
    for i in range(0, last, _WAVE):
        yield from put_immutable(ctx.s3, {k: objects[k] for k in keys[i : i + _WAVE]})
    _, active = yield from gather(
        put_immutable(ctx.s3, {k: objects[k] for k in keys[last:]}), ctx.index.stage_active(thread_id, day_of(ctx.now()))
    )
    expires_at = ctx.now() + ctx.ttl_seconds if ctx.ttl_seconds else None
    writes = [replace(w, body=squeeze(w.body or b""), expires_at=expires_at) for w in writes]
    entries = [replace(e, body=squeeze(e.body or b""), expires_at=expires_at) for e in entries]
    ctx.locs.forget_thread(thread_id)
    if ref is not None:
        if not (yield from ctx.index.unarchive(thread_id, ref, entries, writes, active)):  # the commit point
            # Another restore switched first, or took over (a step's put and
            # put_writes both restore), or a delete took the archive out: what this
            # call wrote and no entry names goes, its activity entry too (unless
            # the record names it: this call's switch landed, its answer lost).
            # No entry can come to name it: only this call writes under its tag, and
            # a restore that took over writes every entry again before it switches.
            try:
                staying = yield from ctx.index.contents(thread_id)
            except Archived:
                staying = []
            yield from gather(deleter(ctx, thread_id)([*entries, *writes], staying), ctx.index.untouch(active))
            # The archive object is the winner's to delete, once switched (if it is
            # cut short, the archive is all there is). Give it a moment to switch.
            yield from _wait_restored(ctx, thread_id, ref)
        else:
            yield from _remove_stale(ctx, thread_id, ref.key)
    elif copied_from is not None:
        try:
            yield from ctx.index.copy_thread(copied_from, thread_id, entries, writes, ctx.now(), deleter(ctx, thread_id), active)
        except ConfigurationError:
            yield from ctx.index.untouch(active)  # refused: the target got checkpoints of its own
            raise
    else:
        yield from ctx.index.restore(thread_id, entries, writes, archive.created or ctx.now(), active)
        runs = sorted({e.run_id for e in entries if e.run_id is not None})
        yield from gather(*(ctx.index.note(thread_id, None, run) for run in runs))
    ctx.locs.forget_thread(thread_id)
    return sum(len(b) for b in objects.values())


def _wait_restored(ctx: Context, thread_id: str, ref: ArchiveRef) -> Op[None]:
    """Wait (about 1.5 s at most) until another call's restore of ``ref`` switched:
    a write that then goes on finds the thread live instead of taking the
    restore over (two writers of one step restore at once)."""
    for pause in _RESTORE_WAITS:
        own = yield from ctx.index.archive_of(thread_id)
        if own.archive is None or own.archive.key != ref.key:
            if own.stale_archive == ref.key:
                # Switched: the archive object goes (the winner may have been cut short).
                yield from _remove_stale(ctx, thread_id, ref.key)
            return
        yield Sleep(pause)


def _remove_stale(ctx: Context, thread_id: str, key: str) -> Op[None]:
    """Delete an archive object the index holds as one to delete, then its mark
    (cut between the two, the next call deletes it again: a key never comes
    back as an archive, each archive writes one of its own)."""
    yield from delete_keys(ctx, [key], f"thread {thread_id!r}")
    yield from ctx.index.forget_archive(thread_id, key)


def _thread(thread_id: Any) -> str:
    if not isinstance(thread_id, str):
        raise ConfigurationError(f"thread_id must be a string, got {type(thread_id).__name__}: {thread_id!r}")
    checked, _, _ = target({"configurable": {"thread_id": thread_id}})
    return checked

