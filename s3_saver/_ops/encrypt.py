"""encrypt_thread and encrypt_existing: encryption turned on for threads written without it.

A thread is migrated by the archive and restore paths, which already write a thread
whole under fresh keys and switch the index at a fenced commit, resumably:

1. the thread's key is made first (the key store's conditional create): from then on
   the key record says a migration may be under way, and every later step seals;
2. a live thread with plaintext content is archived into one object of the migration's
   class (``MIGRATION_CLASS``) by ``archive_thread``, reading its objects with a sealer
   that opens plaintext as it is (``Sealer.for_migration``; every other sealer refuses
   it), and sealing the archive under the thread's key. The switch is the commit point,
   fenced against any commit since the read (a writer wins: the step runs again). The
   cleanup then deletes the live plaintext objects and entries it read;
3. ``restore_thread`` writes the thread back from that archive under a fresh tag, every
   object and index copy sealed (``install``), and switches the index to them at its
   fenced commit (objects first, index last), then deletes the archive object;
4. a sweep deletes the versions a versioned bucket kept of what the steps deleted (the
   thread's ``live/``, ``manifests/`` and ``archive/`` ranges listed, as ``erase_thread``
   lists them: every noncurrent version and delete marker, and a current object no
   index entry names older than the grace period). What Object Lock holds is reported.

Cut short after any request, a call again finishes: the index says where the thread is
(live with plaintext: from 2; archived in the migration's class: from 3, whose restore
finishes the archive's cleanup first; live and sealed: 4), and at every cut the thread
reads from exactly one place. A thread archived by its owner stays archived: a plaintext
archive in an instant class is restored sealed and archived again in its class; one in
``GLACIER`` or ``DEEP_ARCHIVE`` cannot be read before S3 restores it, and is reported
(``state == "cold"``) rather than failing the run. An archive sealed already (its user
metadata names its key) is left as it is.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from s3_saver._crypto.envelope import HEADER_BYTES, is_sealed
from s3_saver._crypto.sealer import SEALED_TAG
from s3_saver._format.archive import INSTANT_CLASSES, metadata_key_id
from s3_saver._format.closure import closure, own_object
from s3_saver._format.entries import ArchiveRef, CheckpointEntry
from s3_saver._index.terms import Archived
from s3_saver._ops import archive, install
from s3_saver._ops.archived import _thread
from s3_saver._ops.bucket import _GONE, RemainingVersion, _listed, _purge
from s3_saver._ops.context import Context
from s3_saver._ops.erase import GRACE, NEWER, _belongs, _named, _sort_out, _versioned
from s3_saver._ops.keyed import keyed, not_gone
from s3_saver._transport.failures import error_code
from s3_saver._transport.protocol import (
    Emit,
    Op,
    gather,
    raise_failure,
    request_one,
)
from s3_saver.errors import ConfigurationError, MissingObjectError, ThreadArchivedError

# The class of the migration's own archive of a live thread (step 2): an archive found
# sealed in it is the migration's, cut short before its restore, and is restored. The
# owner's archives are never in it unless archived there by hand (restored then too).
MIGRATION_CLASS = "STANDARD"
# Attempts at a thread that writers keep committing to (each attempt's switch refused).
_ATTEMPTS = 3
_PAGE = 100  # thread listing entries per request

YOUNG_PLAINTEXT = (
    "plaintext written since the migration read the thread, younger than the grace period (a write "
    "without encryption, committed or about to): run the migration again in an hour"
)
ENCRYPTED = "encrypted"
EMPTY = "empty"
COLD = "cold"
BUSY = "busy"


@dataclass(frozen=True)
class EncryptStatus:
    """What [S3Saver.encrypt_thread()][s3_saver.S3Saver.encrypt_thread] did to one thread.

    Attributes:
        thread_id: The thread.
        state: ``"encrypted"`` (every checkpoint, value and write of the thread is
            encrypted now), ``"empty"`` (no checkpoints: nothing to encrypt),
            ``"cold"`` (archived without encryption in ``GLACIER`` or ``DEEP_ARCHIVE``:
            restore it with ``restore_thread()``, then run again) or ``"busy"``
            (written to through every attempt: run again).
        migrated: True when this call rewrote the thread (False: it was encrypted
            already, or could not be).
        deleted: Object versions and delete markers removed (plaintext the
            migration read, and what a versioned bucket kept of it).
        remaining: Versions that stay, with their reason: a lock holds them, or
            plaintext a writer without encryption wrote since the migration read
            the thread, younger than the grace period (``YOUNG_PLAINTEXT``: run again
            in an hour).
        storage_class: The thread's archive class, when archived.
    """

    thread_id: str
    state: str
    migrated: bool = False
    deleted: int = 0
    remaining: tuple[RemainingVersion, ...] = ()
    storage_class: str | None = None

    @property
    def complete(self) -> bool:
        """True when no plaintext of the thread is left: encrypted (or empty) and
        no version remains."""
        return self.state in (ENCRYPTED, EMPTY) and not self.remaining


def encrypt_thread(ctx: Context, thread_id: str, versioned: bool | None = None) -> Op[EncryptStatus]:
    """``versioned``: whether the bucket keeps versions, when the caller knows."""
    thread_id = _thread(thread_id)
    if ctx.crypt is None:
        raise ConfigurationError(
            "encrypt_thread encrypts with the saver's key: build the saver with encryption=KmsKey(...) or LocalKey(...)"
        )
    ctx = replace(ctx, sealer=ctx.sealer.for_migration())
    # The key first, beside the thread's record: every later step seals under it
    # (one an erase destroyed, cached by this process, is read again).
    ctx, own = yield from gather(keyed(ctx, [thread_id], create=True), ctx.index.archive_of(thread_id))
    ctx = yield from not_gone(ctx, thread_id, own)
    state, migrated, storage_class = BUSY, False, None
    for _ in range(_ATTEMPTS):
        if own.archive is not None:
            try:
                state, migrated, storage_class = yield from _archived(ctx, thread_id, own.archive)
            except MissingObjectError:
                # The archive the record named was gone: another process's migration
                # restored the thread since and deleted it. Read again when the record
                # names another archive or none; the same archive missing is a real loss.
                gone, own = own.archive.key, (yield from ctx.index.archive_of(thread_id))
                if own.archive is not None and own.archive.key == gone:
                    raise
                continue
            break
        try:
            entries = [e for e in (yield from ctx.index.contents(thread_id)) if not ctx.expired(e)]
        except Archived:
            own = yield from ctx.index.archive_of(thread_id)  # archived since: as archived
            continue
        if not entries:
            state = EMPTY
            break
        plain = yield from _plaintext(ctx, entries)
        if plain is None:
            continue  # an object the read named is gone: the thread changed, read again
        if not plain:
            state = ENCRYPTED
            break
        try:
            # Sealed into one object, the live plaintext deleted (its cleanup); fenced:
            # a commit since the read refuses the switch, and this runs again.
            yield from archive.archive_thread(ctx, thread_id, MIGRATION_CLASS)
        except ThreadArchivedError:
            own = yield from ctx.index.archive_of(thread_id)
            continue
        except archive.NothingToArchive:
            # Deleted or erased since the read above: read again ("empty", or a new life's
            # content to encrypt), never a failure that stops encrypt_existing's run.
            own = yield from ctx.index.archive_of(thread_id)
            continue
        except MissingObjectError:
            # An object the archive read was gone: another process moved the thread since
            # (a migration's own restore under fresh keys, a prune). Read again when the
            # index changed; the same index naming a missing object is a real loss: raised.
            if not (yield from _changed(ctx, thread_id, entries)):
                raise
            own = yield from ctx.index.archive_of(thread_id)
            continue
        yield from install.restore_thread(ctx, thread_id, 1, "Standard")
        state, migrated = ENCRYPTED, True
        break
    if state == COLD:
        return EncryptStatus(thread_id, state, storage_class=storage_class)
    if versioned is None:
        versioned = yield from _versioned(ctx)
    deleted, remaining = yield from _sweep(ctx, thread_id, versioned)
    return EncryptStatus(thread_id, state, migrated, deleted, tuple(remaining), storage_class)


def encrypt_existing(ctx: Context, thread_ids: Sequence[str] | None = None) -> Op[None]:
    """Every thread of the listing (or ``thread_ids``) through ``encrypt_thread``, one
    ``EncryptStatus`` emitted per thread. Each thread is done whole before the next:
    cut short, a call again passes quickly over those done (a read of their index, and
    a ranged GET of each pending-writes part kept in an object: see ``_plaintext``)."""
    versioned = yield from _versioned(ctx)
    if thread_ids is not None:
        for t in thread_ids:
            yield Emit((yield from encrypt_thread(ctx, t, versioned)))
        return
    cursor: Any = None
    seen: set[str] = set()
    while True:
        page, cursor = yield from ctx.index.threads(None, _PAGE, cursor)
        for ref, _ in page:
            if ref.thread_id in seen:
                continue
            seen.add(ref.thread_id)
            yield Emit((yield from encrypt_thread(ctx, ref.thread_id, versioned)))
        if cursor is None:
            return


def _changed(ctx: Context, thread_id: str, entries: list[CheckpointEntry]) -> Op[bool]:
    """Whether the thread's index names other objects than ``entries`` did (or it is
    archived now)."""
    try:
        now = [e for e in (yield from ctx.index.contents(thread_id)) if not ctx.expired(e)]
    except Archived:
        return True
    return set(closure(now)) != set(closure(entries))


def _archived(ctx: Context, thread_id: str, ref: ArchiveRef) -> Op[tuple[str, bool, str | None]]:
    """An archived thread: (state, migrated, its archive class after)."""
    head = yield from request_one(ctx.s3.head(ref.key))
    sealed = metadata_key_id(head.get("Metadata") or {}) is not None
    if sealed and ref.storage_class != MIGRATION_CLASS:
        # The owner's archive, sealed already (archived with encryption on).
        yield from archive.archive_thread(ctx, thread_id, ref.storage_class)  # its cleanup, if cut short
        return ENCRYPTED, False, ref.storage_class
    if not sealed and (ref.storage_class not in INSTANT_CLASSES or head.get("ArchiveStatus")):
        # Cannot be read before S3 restores it: reported, the run goes on.
        return COLD, False, head.get("StorageClass") or ref.storage_class
    status = yield from install.restore_thread(ctx, thread_id, 1, "Standard")
    if status.state != "live":
        return COLD, False, ref.storage_class
    if sealed or ref.storage_class == MIGRATION_CLASS:
        # The migration's own archive: the thread is live again. (An owner's archive in
        # the migration's class is left live too: archived there again, it could not be
        # told from the migration's on the next run.)
        return ENCRYPTED, True, None
    # The owner's plaintext archive: back into its class, sealed now. Written to in
    # between, the thread stays live (encrypted); archive_idle takes it later.
    try:
        yield from archive.archive_thread(ctx, thread_id, ref.storage_class)
    except ThreadArchivedError:
        return ENCRYPTED, True, None
    return ENCRYPTED, True, ref.storage_class


def _plaintext(ctx: Context, entries: list[CheckpointEntry]) -> Op[bool | None]:
    """Whether any of the thread's entries holds plaintext: its metadata or a body the
    index carries; an entry that carries neither, and every pending-writes part kept in
    an object, is asked of its object's first bytes (a ranged GET each, one wave).

    The writes are asked one by one because nothing else tells them: a saver without
    encryption that adds writes to a checkpoint the migration sealed writes plaintext
    objects under keys like the sealed ones, and its commit names them beside the
    sealed checkpoint (whose metadata says nothing of them). Missed, the thread would
    answer ``complete`` while a read of it is refused.

    None: an object asked is gone (a delete, a prune, a write replaced since the index
    was read), so the answer would be of a thread that is no more: the caller reads again."""
    unknown: list[str] = []
    for e in entries:
        if e.metadata is not None and e.metadata[0] != SEALED_TAG:
            return True
        if e.body is not None and not is_sealed(e.body):
            return True
        if e.metadata is None and e.body is None:
            unknown.append(ctx.layout.object_key(own_object(e)))
        for w in e.writes or ():
            if w.body is None:
                unknown.append(ctx.layout.object_key(own_object(w)))
            elif not is_sealed(w.body):
                return True
    if not unknown:
        return False
    starts = yield from _starts(ctx, [(k, None) for k in unknown])
    if any(b is None for b in starts):
        return None
    return any(not is_sealed(b) for b in starts if b is not None)


def _sweep(ctx: Context, thread_id: str, versioned: bool) -> Op[tuple[int, list[RemainingVersion]]]:
    """The versions a versioned bucket kept of what the migration deleted (and any
    leftover of a write cut short, as ``erase_thread`` takes them): the thread's
    ranges listed, then what the index names read; every noncurrent version and
    delete marker goes, and a current object no entry names older than the grace
    period (a younger one may be a write about to commit). Versions are immutable:
    deleted by id, each is what was listed. A failback's set-aside records are not
    the migration's to take."""
    layout = ctx.layout
    prefixes = [layout.thread_dir(thread_id), layout.manifest_dir(thread_id), layout.archive_dir(thread_id)]
    pages = yield from gather(*(_listed(ctx, p, versioned) for p in prefixes))
    # The index read after the listing: a write committed meanwhile is named.
    keep, own = yield from _named(ctx, thread_id)
    marks = layout.erase_key(thread_id, "")
    found = [
        v for listed in pages for v in listed
        if _belongs(layout, thread_id, v.key) and not v.key.startswith(marks) and layout.nested_prefix(v.key) is None
    ]
    purge, left = _sort_out(ctx, found, keep, own, time.time() - GRACE)
    # Versions first, then the markers of keys none of whose versions a lock kept.
    count, locked = yield from _purge(ctx, [v for v in purge if not v.marker])
    held = {r.key for r in locked}
    more, _ = yield from _purge(ctx, [v for v in purge if v.marker and v.key not in held])
    # A current object the index names is the thread's (sealed). A young unnamed one is a
    # write under way, never deleted: its commit would name a missing object. Written by a
    # saver without encryption since the migration read the thread, it is plaintext, and
    # reported (its first bytes read): a call again once it is older than the grace
    # period deletes it if no commit came, or encrypts the thread again if one did.
    young = [r for r in left if r.reason == NEWER]
    plaintext = yield from _plaintext_of(ctx, young)
    return count + more, locked + plaintext


def _plaintext_of(ctx: Context, versions: list[RemainingVersion]) -> Op[list[RemainingVersion]]:
    """Those of ``versions`` that hold plaintext; one gone meanwhile (its write's
    cleanup, a garbage collection) is not."""
    starts = yield from _starts(ctx, [(v.key, v.version_id) for v in versions])
    return [replace(v, reason=YOUNG_PLAINTEXT) for v, b in zip(versions, starts) if b is not None and not is_sealed(b)]


def _starts(ctx: Context, objects: list[tuple[str, str | None]]) -> Op[list[bytes | None]]:
    """The first bytes of each (key, version) object, a ranged GET each in one wave;
    None for one that is gone."""
    if not objects:
        return []
    calls = [ctx.s3.get_start(key, version_id, HEADER_BYTES) for key, version_id in objects]
    answers = yield tuple(calls)
    out: list[bytes | None] = []
    for call, answer in zip(calls, answers):
        if isinstance(answer, BaseException):
            if error_code(answer) not in _GONE:
                raise_failure(call, answer)
            out.append(None)
        else:
            out.append(bytes(answer["Body"]))
    return out
