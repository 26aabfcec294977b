"""Reads of an archived thread: the same operations, run against its archive.

An index read of an archived thread raises ``Archived`` (its marker, or its
head's reference, comes with the read: a live thread pays nothing for this).
``or_archive`` then reads the archive object once (one GET, cached by key: an
archive object never changes) and runs the operation again against an
``ArchiveIndex`` over it. So ``get_tuple``, ``list`` and the delta walk of an
archived thread cost 2 round trips cold (the index read, the GET) and 1 warm.

An archive in a class that cannot be read at once (``GLACIER``,
``DEEP_ARCHIVE``, moved there by a lifecycle rule, or an ``INTELLIGENT_TIERING``
object in an archive tier) raises ``ThreadArchivedError`` naming ``restore_thread``.

With encryption, an archive object is sealed whole under the thread's key, bound to
its own key (``archive.archive_thread``): ``read_archive`` loads the thread's key
beside the GET (from the cache, no request, when the index read before it loaded it)
and opens it; moved to another key or thread it does not open
(``ForeignCiphertextError``), a plaintext archive is refused (``PlaintextObjectError``),
and one sealed under a destroyed key says so (``ThreadErasedError``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from s3_saver._crypto.sealer import PLAIN
from s3_saver._format.archive import INSTANT_CLASSES, decode_archive
from s3_saver._format.entries import ArchiveRef
from s3_saver._index.archived import ArchiveIndex
from s3_saver._index.terms import Archived
from s3_saver._ops.context import Context, LocCache, target
from s3_saver._ops.delete import delete_keys
from s3_saver._ops.keyed import keyed_beside
from s3_saver._transport.failures import error_code
from s3_saver._transport.protocol import Op, T, raise_failure, request_one
from s3_saver.errors import (
    ConfigurationError,
    MissingObjectError,
    ThreadArchivedError,
)

# S3's answer to a GET of an object in a class that must be restored first.
_NOT_READABLE_CODES = frozenset({"InvalidObjectState"})
RESTORE_DONE = 'ongoing-request="false"'


def or_archive(ctx: Context, make: Callable[[Context], Op[T]]) -> Op[T]:
    """Run the read ``make(ctx)``; for an archived thread, again against its archive.

    A restore that finished since the index was read deletes the archive object
    (the thread is live again): the read then goes to the index again."""
    for attempt in range(2):
        try:
            return (yield from make(ctx))
        except Archived as archived:
            # With encryption, the keys the index read loaded beside it (``keyed_beside``).
            keyed_ctx = ctx if archived.sealer is None else replace(ctx, sealer=archived.sealer)
            try:
                actx = yield from archive_context(keyed_ctx, archived.thread_id, archived.ref)
            except MissingObjectError:
                if attempt:
                    raise
                continue
            return (yield from make(actx))
    raise AssertionError("unreachable")


def archive_context(ctx: Context, thread_id: str, ref: ArchiveRef) -> Op[Context]:
    index = ctx.archives.get(ref.key)
    if index is None:
        data = yield from read_archive(ctx, thread_id, ref)
        archive = decode_archive(data, f"s3://{ctx.s3.bucket}/{ref.key}")
        index = ArchiveIndex(archive, ref, ctx.layout, ctx.s3.bucket)
        ctx.archives.put(ref.key, index)
    # Its own loc cache (this read's alone, with a budget of its own: it goes
    # with the read): what a write learns must come from the live index.
    # With encryption, the archive was opened whole (its tag checked for its place
    # under the thread's key): the records it holds are plaintext, read as they are.
    # The read runs with no encryption of its own (it seals nothing, and no index
    # entry of it carries sealed bytes); a read never writes (a write restores first).
    return replace(ctx, index=index, locs=LocCache(), crypt=None, sealer=PLAIN)


def read_archive(ctx: Context, thread_id: str, ref: ArchiveRef) -> Op[bytes]:
    """The archive's bytes in the archive format (opened under the thread's key, with
    encryption); raises ThreadArchivedError when it must be restored first."""
    # The thread's key (with encryption) beside the GET: from the cache when the index
    # read that found the archive loaded it.
    ctx, (data, head) = yield from keyed_beside(ctx, [thread_id], archive_body(ctx, ref))
    if data is None:
        raise cold_error(ctx, thread_id, ref, head)
    return open_archive(ctx, thread_id, ref, data)


def open_archive(ctx: Context, thread_id: str, ref: ArchiveRef, data: bytes) -> bytes:
    """An archive object's bytes as read, opened for its place (its key, the thread)
    under the thread's key (``ctx`` holds it). Without encryption they pass as they
    are, unless sealed (``EncryptedObjectError``: the saver needs ``encryption=``)."""
    return ctx.sealer.open(thread_id, ref.key, data, f"archive s3://{ctx.s3.bucket}/{ref.key} of thread {thread_id!r}")


def archive_body(ctx: Context, ref: ArchiveRef) -> Op[tuple[bytes | None, dict[str, Any]]]:
    """The archive object's bytes, or (None, its HeadObject) when a cold class keeps it
    from being read: not restored (yet) by S3."""
    if ref.storage_class in INSTANT_CLASSES:
        call = ctx.s3.get(ref.key)
        (result,) = yield (call,)
        if not isinstance(result, BaseException):
            return result["Body"], {}
        if error_code(result) not in _NOT_READABLE_CODES:
            raise_failure(call, result)
        # A lifecycle rule moved it to a cold class: as for one.
    head = yield from request_one(ctx.s3.head(ref.key))
    if RESTORE_DONE not in (head.get("Restore") or ""):
        return None, head
    found = yield from request_one(ctx.s3.get(ref.key))
    return found["Body"], head


def cold_error(ctx: Context, thread_id: str, ref: ArchiveRef, head: dict[str, Any]) -> ThreadArchivedError:
    storage_class = head.get("StorageClass") or ref.storage_class
    # An Intelligent-Tiering archive tier is named too: the class alone reads as instant.
    where = f"{storage_class}, {head['ArchiveStatus']} tier" if head.get("ArchiveStatus") else storage_class
    state = head.get("Restore")
    progress = (
        "its restore is under way (S3 takes minutes to hours, up to 48 for DEEP_ARCHIVE); call it again after"
        if state
        else "this requests S3's restore of the object (minutes to hours, up to 48 for DEEP_ARCHIVE); call it again once done"
    )
    return ThreadArchivedError(
        f"thread {thread_id!r} is archived in s3://{ctx.s3.bucket}/{ref.key} ({where}), which cannot be read "
        f"at once: call saver.restore_thread({thread_id!r}) (or arestore_thread): {progress}",
        thread_id,
        storage_class,
        ref.key,
    )


_WAVE = 100  # objects read or written per round trip


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
