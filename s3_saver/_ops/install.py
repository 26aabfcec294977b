"""restore_thread, import_thread and install: a thread written in whole from its archive or an export.

Restore: finish an archive's cleanup if it was cut short, read the archive, write every
object again under a fresh tag, install the entries and take the archive out (the commit
point), then delete the archive object. Import writes an export the same way (install
is what both, and copy_thread, share). A write to an archived thread restores it first
(restore_before_write). Archiving a thread into one object is archive.

With encryption, an archive is opened under the thread's key for its place (its object
key) before it is decoded (``archived.read_archive``), and ``install`` seals every object
it writes, and the entries' bodies and metadata, under the thread's key (made for a new
thread), each for its own place: a restored thread is encrypted as it was before its
archive, and an export imported into an encrypting saver is stored encrypted. An encrypted
export is opened under the exported thread's key, read from the key store the export names
(``_opened_export``), then encrypted anew under the target's: a plaintext export and an
encrypted one both import.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from s3_saver._crypto.envelope import is_sealed
from s3_saver._format.archive import (
    INSTANT_CLASSES,
    Archive,
    SealedExport,
    decode_archive,
    decode_sealed_export,
)
from s3_saver._format.closure import moved, own_object
from s3_saver._format.codec import squeeze
from s3_saver._format.entries import ArchiveRef
from s3_saver._format.keys import new_tag
from s3_saver._index.activity import day_of
from s3_saver._index.terms import Archived, Fenced
from s3_saver._ops.archived import (
    _WAVE,
    RESTORE_DONE,
    ArchiveStatus,
    _remove_stale,
    _thread,
    archive_body,
    cold_error,
    open_archive,
    read_archive,
)
from s3_saver._ops.context import Context, meta_key
from s3_saver._ops.delete import deleter
from s3_saver._ops.keyed import (
    MAX_REKEYS,
    key_gone,
    keyed,
    keyed_beside,
    not_gone,
    rekeyed,
    rekeyed_too_often,
)
from s3_saver._transport.failures import (
    error_code,
)
from s3_saver._transport.protocol import Op, Sleep, gather, raise_failure
from s3_saver._transport.s3 import put_immutable
from s3_saver.errors import (
    ConfigurationError,
    CorruptObjectError,
    EncryptedObjectError,
    ForeignCiphertextError,
    MissingObjectError,
    ThreadErasedError,
)

_RESTORE_WAITS = (0.05, 0.1, 0.2, 0.4, 0.8)
# Reads of the thread's record by restore_thread when its archive object is gone
# under it (restored or deleted by another call, the thread archived again since).
_RESTORE_READS = 3
_TIERS = ("Standard", "Bulk", "Expedited")
# HeadObject's ArchiveStatus of an INTELLIGENT_TIERING object that must be restored first.
INTELLIGENT_TIERING_ARCHIVE_TIERS = frozenset({"ARCHIVE_ACCESS", "DEEP_ARCHIVE_ACCESS"})


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
            if ref.storage_class in INSTANT_CLASSES:
                # The thread's key (with encryption) beside the archive's GET: to open
                # it, and to seal what the restore writes.
                ctx, (data, head) = yield from keyed_beside(ctx, [thread_id], archive_body(ctx, ref))
            else:
                # A cold class: most calls only ask S3 for a readable copy (no key needed).
                data, head = yield from archive_body(ctx, ref)
            if data is None:
                return (yield from _request_restore(ctx, thread_id, ref, head, days, tier))
            ctx = yield from keyed(ctx, [thread_id])  # loaded already, but once S3 restored a cold one
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
        archive = decode_archive(open_archive(ctx, thread_id, ref, data), f"s3://{ctx.s3.bucket}/{ref.key}")
        try:
            live_bytes = yield from install(ctx, thread_id, archive, ref)
        except Fenced as fenced:
            raise _erased_meanwhile(ctx, thread_id, ref, fenced) from None
        return ArchiveStatus(thread_id, "live", ref.storage_class, ref.key, ref.size, len(archive.entries), live_bytes)
    raise AssertionError("unreachable")


def _erased_meanwhile(ctx: Context, thread_id: str, ref: ArchiveRef, fenced: Fenced) -> ThreadErasedError:
    return ThreadErasedError(
        f"thread {thread_id!r} was erased while it was restored from s3://{ctx.s3.bucket}/{ref.key}: the key its "
        f"archive is sealed under was destroyed ({ctx.index.describe()} names it), so nothing of it was restored",
        bucket=ctx.s3.bucket, key=ref.key, thread_id=thread_id,
    )


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
    try:
        yield from install(ctx, thread_id, decode_archive(data, f"s3://{ctx.s3.bucket}/{ref.key}"), ref)
    except Fenced:
        # Erased meanwhile: not archived any more. The write goes on; its own commit
        # checks the key it sealed under (a new life's, or refused as any write is).
        return


def import_thread(ctx: Context, data: bytes, thread_id: str | None) -> Op[str]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ConfigurationError(f"import_thread takes the bytes export_thread returned, got {type(data).__name__}")
    data = bytes(data)
    where = "the archive given to import_thread"
    sealed = decode_sealed_export(data, where)
    archive: Archive | None = None
    if sealed is None:
        if is_sealed(data):
            raise ConfigurationError(
                f"{where} is an encrypted archive object's bytes, bound to its key in the bucket it was "
                "archived in: import_thread reads what export_thread returns (export the thread instead)"
            )
        archive = decode_archive(data, where)
        dest = _thread(archive.thread_id if thread_id is None else thread_id)
    else:
        dest = _thread(sealed.thread_id if thread_id is None else thread_id)
    # In one wave: the target's record and entries, with encryption its key (made for it:
    # an empty thread has none yet) and, for an encrypted export, the exported thread's
    # key, read from the key store the export names.
    own, existing, ctx, opened = yield from gather(
        ctx.index.archive_of(dest),
        ctx.index.contents(dest),
        keyed(ctx, [dest], create=True),
        _opened_export(ctx, sealed) if sealed is not None else _nothing(),
    )
    if sealed is not None:
        archive = decode_archive(opened, sealed.describe())
        if archive.thread_id != sealed.thread_id:
            raise CorruptObjectError(
                f"{sealed.describe()}: its record holds thread {archive.thread_id!r}, not the one it is sealed for"
            )
    assert archive is not None
    exported = archive.entries
    for _ in range(MAX_REKEYS):
        if existing or own.archive is not None:
            raise ConfigurationError(
                f"thread {dest!r} already has checkpoints ({ctx.index.describe()}); import_thread imports into "
                "an empty thread (delete_thread it first, or pass thread_id=...)"
            )
        archive.entries = [replace(e, gen=own.gen) for e in exported]
        # With encryption, the thread's key, not one an erase destroyed (this process may
        # have cached it before another's erase).
        ctx = yield from not_gone(ctx, dest, own)
        try:
            yield from install(ctx, dest, archive)
            return dest
        except Fenced as fenced:
            # An erase of the target (another process's, after the key was read here)
            # destroyed the key the import is sealed under: nothing was indexed. Sealed
            # again under the key read now (a new life's), the target read again.
            if not key_gone(ctx, fenced.record, dest):
                raise
            ctx = yield from rekeyed(ctx, dest)
            own, existing = yield from gather(ctx.index.archive_of(dest), ctx.index.contents(dest))
    raise rekeyed_too_often(dest)


def _nothing() -> Op[bytes]:
    yield from ()
    return b""


def _opened_export(ctx: Context, sealed: SealedExport) -> Op[bytes]:
    """The record of an encrypted export, opened under the exported thread's key as the
    key store it names holds it (this saver's, or another's: read with this saver's KMS
    key or local master key, which must be the one that wrapped it)."""
    if ctx.crypt is None:
        raise EncryptedObjectError(
            f"{sealed.describe()} is encrypted; this saver has no encryption=: pass the KmsKey(...) or "
            "LocalKey(...) it was written with"
        )
    source = ctx.crypt.elsewhere(sealed.bucket, sealed.prefix, sealed.key_bucket)
    keys = yield from source.load([sealed.thread_id])
    return source.sealer(keys).open_export(sealed.thread_id, sealed.record, sealed.describe())


def install(
    ctx: Context, thread_id: str, archive: Archive, ref: ArchiveRef | None = None, copied_from: str | None = None
) -> Op[int]:
    """Write the archive's objects under ``thread_id``, then its index entries:
    with ``ref``, in place of the thread's archive (restore: the archive's
    cleanup is finished first), as a copy of thread ``copied_from``, or into
    the empty thread (import). Returns the bytes written.

    Every object is written under keys no earlier call wrote (``closure.moved``):
    a cleanup or a garbage collection still running can never delete them."""
    layout = ctx.layout
    if ref is not None:
        yield from ctx.index.finish_archive(thread_id, ref, deleter(ctx, thread_id))
    # With encryption, the thread's key (made for a new thread): every object is sealed.
    ctx = yield from keyed(ctx, [thread_id], create=True)

    def stored(key: str, body: bytes) -> bytes:
        if ctx.crypt is not None and is_sealed(body):
            # An archive's records are plaintext (they are what is sealed): bytes
            # sealed already came from elsewhere, and would be sealed twice.
            raise ForeignCiphertextError(
                f"the archive of thread {thread_id!r} holds encrypted bytes where a record belongs ({key}): "
                "refused, nothing of it is installed",
                bucket=ctx.s3.bucket, key=key, thread_id=thread_id,
            )
        return ctx.sealer.seal(thread_id, key, squeeze(body))

    tag = new_tag()
    entries, writes = moved(archive.entries, thread_id, tag)
    objects: dict[str, bytes] = {}
    for e in entries:
        key = layout.object_key(own_object(e))
        objects[key] = stored(key, e.body or b"")
    for w in writes:
        key = layout.object_key(own_object(w))
        objects[key] = stored(key, w.body or b"")
    for (ns, ch, version, cid), body in archive.blobs.items():
        key = layout.blob_key(thread_id, ns, ch, version, cid, tag)
        objects[key] = stored(key, body)
    for (ns, cid), body in archive.records.items():
        key = layout.checkpoint_key(thread_id, ns, cid, tag)
        objects[key] = stored(key, body)
    # Live again (restored, imported, copied): archive_idle's clock starts anew. The
    # thread's activity entry of the day is staged with the last wave of objects and
    # recorded by the commit, as a write's is (``Index.stage_active``): the thread's
    # record names it, so a delete or an archive after this removes it, and a
    # commit refused takes it back. Written beside the commit and named by nothing,
    # it outlived every delete of the thread.
    keys = list(objects)
    last = max(len(keys) - 1, 0) // _WAVE * _WAVE
    same = ctx.sealer.same(thread_id)
    for i in range(0, last, _WAVE):
        yield from put_immutable(ctx.s3, {k: objects[k] for k in keys[i : i + _WAVE]}, same=same)
    _, active = yield from gather(
        put_immutable(ctx.s3, {k: objects[k] for k in keys[last:]}, same=same),
        ctx.index.stage_active(thread_id, day_of(ctx.now())),
    )
    expires_at = ctx.now() + ctx.ttl_seconds if ctx.ttl_seconds else None
    # The entries carry their objects' bytes as stored (sealed, with encryption), and
    # their metadata sealed for their checkpoints.
    writes = [replace(w, body=objects[layout.object_key(own_object(w))], expires_at=expires_at) for w in writes]
    entries = [
        replace(
            e,
            body=objects[layout.object_key(own_object(e))],
            metadata=None if e.metadata is None else ctx.sealer.seal_meta(
                thread_id, meta_key(ctx, thread_id, e.ns, e.checkpoint_id), e.metadata
            ),
            expires_at=expires_at,
        )
        for e in entries
    ]
    ctx.locs.forget_thread(thread_id)
    # With encryption, the key every copy above is sealed under: the index write is
    # refused if an erase destroyed it since it was read (``Index.restore``).
    key_id = ctx.sealer.key_id(thread_id)
    if ref is not None:
        try:
            switched = yield from ctx.index.unarchive(thread_id, ref, entries, writes, active, key_id)  # the commit point
        except Fenced:
            # An erase destroyed the key this restore sealed under (after it was read
            # here): nothing was indexed; what this call wrote goes, as below.
            yield from _discard_unswitched(ctx, thread_id, entries, writes, active)
            raise
        if not switched:
            # Another restore switched first, or took over (a step's put and
            # put_writes both restore), or a delete took the archive out: what this
            # call wrote and no entry names goes, its activity entry too (unless
            # the record names it: this call's switch landed, its answer lost).
            # No entry can come to name it: only this call writes under its tag, and
            # a restore that took over writes every entry again before it switches.
            yield from _discard_unswitched(ctx, thread_id, entries, writes, active)
            # The archive object is the winner's to delete, once switched (if it is
            # cut short, the archive is all there is). Give it a moment to switch.
            yield from _wait_restored(ctx, thread_id, ref)
        else:
            yield from _remove_stale(ctx, thread_id, ref.key)
    elif copied_from is not None:
        try:
            yield from ctx.index.copy_thread(
                copied_from, thread_id, entries, writes, ctx.now(), deleter(ctx, thread_id), active, key_id
            )
        except (ConfigurationError, Fenced):
            # Refused: the target got checkpoints of its own, or an erase destroyed its key
            # (the caller seals again: ``copy.copy_thread``).
            yield from ctx.index.untouch(active)
            raise
    else:
        try:
            yield from ctx.index.restore(thread_id, entries, writes, archive.created or ctx.now(), active, key_id)
        except Fenced:
            yield from ctx.index.untouch(active)  # an erase destroyed the key (see ``import_thread``)
            raise
        runs = sorted({e.run_id for e in entries if e.run_id is not None})
        yield from gather(*(ctx.index.note(thread_id, None, run) for run in runs))
    ctx.locs.forget_thread(thread_id)
    return sum(len(b) for b in objects.values())


def _discard_unswitched(
    ctx: Context, thread_id: str, entries: list[Any], writes: list[Any], active: Any
) -> Op[None]:
    """What a restore that did not switch wrote, and that no entry names, deleted; its
    activity entry too (unless the record names it: its switch landed, the answer lost)."""
    try:
        staying = yield from ctx.index.contents(thread_id)
    except Archived:
        staying = []
    yield from gather(deleter(ctx, thread_id)([*entries, *writes], staying), ctx.index.untouch(active))


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
