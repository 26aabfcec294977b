"""The archival methods of S3Saver: archive, restore, export, import, archive idle threads.

A mixin of [S3Saver][s3_saver.S3Saver], like ``_saver/threads``: each method is
one line, an operation (``_ops.archive``) and a driver.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from s3_saver._ops import archive, encrypt, idle, install
from s3_saver._ops.archived import ArchiveStatus
from s3_saver._ops.encrypt import EncryptStatus
from s3_saver._ops.idle import IdleReport
from s3_saver.errors import ConfigurationError

if TYPE_CHECKING:
    from s3_saver._ops.context import Context
    from s3_saver._transport.aio import AsyncDriver
    from s3_saver._transport.sync import SyncDriver


class ThreadArchival:
    """Archival of whole threads (S3Saver's ``_sync``, ``_async`` and ``_ctx`` run them)."""

    _sync: SyncDriver
    _async: AsyncDriver
    _ctx: Context
    replica: Any

    def archive_thread(self, thread_id: str, *, storage_class: str = "GLACIER_IR") -> ArchiveStatus:
        """Pack a thread into one compressed object under ``archive/``, in a cold storage class.

        Every namespace, checkpoint, pending write and value goes into one
        object (written with ``IfNoneMatch``; cold classes bill per object and
        have minimum sizes), then the index points at it, then the live objects
        and entries are removed. Cut short at any request, the thread stays
        readable from exactly one place, and a call again finishes the job.

        With an instant-access class (``GLACIER_IR``, ``STANDARD_IA``,
        ``ONEZONE_IA``, ``INTELLIGENT_TIERING``) ``get_tuple``, ``list`` and
        ``get_state_history`` keep working, read from the archive (one more GET
        per process), and the next write restores the thread first. With
        ``GLACIER`` or ``DEEP_ARCHIVE`` they raise
        [ThreadArchivedError][s3_saver.errors.ThreadArchivedError] until [restore_thread()][s3_saver.S3Saver.restore_thread].
        Archive threads no run is writing to (see [archive_idle()][s3_saver.S3Saver.archive_idle]): a write
        that races the archive is kept, and shows once the thread is restored.
        With ``encryption=``, the archive object is encrypted whole under the
        thread's key, bound to its own key.

        Args:
            thread_id: The thread.
            storage_class: The archive object's S3 storage class.

        Returns:
            The archive's key, class and size (``state == "archived"``).

        Raises:
            ConfigurationError: An unknown storage class, or a thread with no checkpoints.
            ThreadArchivedError: The thread changed while it was read (manifest
                index; nothing was archived: call again).
        """
        return self._sync.run(archive.archive_thread(self._ctx, thread_id, storage_class))

    async def aarchive_thread(self, thread_id: str, *, storage_class: str = "GLACIER_IR") -> ArchiveStatus:
        """Async version of [archive_thread()][s3_saver.S3Saver.archive_thread]."""
        return await self._async.run(archive.archive_thread(self._ctx, thread_id, storage_class))

    def restore_thread(self, thread_id: str, *, days: int = 3, tier: str = "Standard") -> ArchiveStatus:
        """Bring an archived thread back to live objects and index entries.

        An archive in an instant-access class is restored at once. One in
        ``GLACIER`` or ``DEEP_ARCHIVE``, or in an archive tier of
        ``INTELLIGENT_TIERING`` (Archive Access, Deep Archive Access), must first
        be restored by S3: the first call sends ``RestoreObject`` and returns
        ``state == "restoring"``; call again later (S3 takes minutes to 48 hours,
        by class and ``tier``) and it returns ``"live"``. Afterwards every read
        equals what it was before the archive, and the archive object is
        deleted. A live thread is left as it is, and so is one that another
        call deletes or restores while this one runs (``"live"`` either way).
        With ``encryption=``, the archive is decrypted and what is written back
        encrypted under the thread's key.

        Args:
            thread_id: The thread.
            days: How long S3 keeps the temporary readable copy of a ``GLACIER``
                or ``DEEP_ARCHIVE`` archive. Not sent for an Intelligent-Tiering
                archive tier (S3 refuses it there: the object moves back to the
                Frequent Access tier for good).
            tier: ``"Standard"``, ``"Bulk"`` (cheapest, slowest) or ``"Expedited"``
                (not for ``DEEP_ARCHIVE``).

        Returns:
            ``state``: ``"live"`` or ``"restoring"``.
        """
        return self._sync.run(install.restore_thread(self._ctx, thread_id, days, tier))

    async def arestore_thread(self, thread_id: str, *, days: int = 3, tier: str = "Standard") -> ArchiveStatus:
        """Async version of [restore_thread()][s3_saver.S3Saver.restore_thread]."""
        return await self._async.run(install.restore_thread(self._ctx, thread_id, days, tier))

    def archive_idle(
        self,
        older_than: timedelta = timedelta(days=30),
        *,
        storage_class: str = "GLACIER_IR",
        limit: int | None = None,
        budget: int = 1000,
        backfill: bool = False,
    ) -> IdleReport:
        """Archive live threads whose latest checkpoint is older than ``older_than``.

        For the operator's schedule (a Lambda on an EventBridge rule). Threads
        are found through their activity entries: each write records the day
        it wrote the thread (once a day per thread, in requests it sends
        anyway). A run walks those days oldest first from a cursor the index
        keeps, so its cost follows what it reads (at most ``budget`` entries)
        and archives (at most ``limit`` threads), not the number of threads
        ever written. A thread written to while it is archived is skipped and
        taken by a later run.

        Threads last written before activity entries existed have none: run
        with ``backfill=True`` (again while the report says ``backfill_more``)
        to give each one, from the thread listing.

        Args:
            older_than: Idle time after which a thread is archived.
            storage_class: As for [archive_thread()][s3_saver.S3Saver.archive_thread].
            limit: Archive at most this many threads per call (to fit a Lambda's time).
            budget: Read at most this many activity entries per call (and, with
                ``backfill``, list at most this many threads).
            backfill: First give threads of the listing without an entry one.

        Returns:
            An [IdleReport][s3_saver.IdleReport]: the list of what each archived
            thread became, with ``more`` (run again: entries are left) and the cursor.
        """
        return self._sync.run(idle.archive_idle(self._ctx, older_than, storage_class, limit, budget, backfill))

    async def aarchive_idle(
        self,
        older_than: timedelta = timedelta(days=30),
        *,
        storage_class: str = "GLACIER_IR",
        limit: int | None = None,
        budget: int = 1000,
        backfill: bool = False,
    ) -> IdleReport:
        """Async version of [archive_idle()][s3_saver.S3Saver.archive_idle]."""
        return await self._async.run(idle.archive_idle(self._ctx, older_than, storage_class, limit, budget, backfill))

    def export_thread(self, thread_id: str) -> bytes:
        """A whole thread as bytes, in the archive format (see [import_thread()][s3_saver.S3Saver.import_thread]).

        For moving a thread between buckets, prefixes, regions and index modes,
        or keeping it outside S3. An archived thread's export is its archive
        (restore a cold one first). With ``encryption=``, the thread's record is
        encrypted under the thread's key, behind a header naming the key store it
        lives in: the export holds no plaintext, imports wherever that key can be
        read, and nowhere once the thread is erased.
        """
        return self._sync.run(archive.export_thread(self._ctx, thread_id))

    async def aexport_thread(self, thread_id: str) -> bytes:
        """Async version of [export_thread()][s3_saver.S3Saver.export_thread]."""
        return await self._async.run(archive.export_thread(self._ctx, thread_id))

    def import_thread(self, data: bytes, *, thread_id: str | None = None) -> str:
        """Write a thread from [export_thread()][s3_saver.S3Saver.export_thread]'s bytes (or an archive object's):
        its objects, then its index entries; it reads exactly as where it came from.
        With ``encryption=``, every object and the index's copies are encrypted under
        the thread's key (made for it) as they are written; an encrypted export is
        first decrypted under its thread's key, read from the key store it names.

        Args:
            data: The export.
            thread_id: The thread to write it as (default: its own id).

        Returns:
            The thread id it was written as.

        Raises:
            ConfigurationError: The thread has checkpoints already.
            CorruptObjectError: ``data`` is not an archive this version reads.
            EncryptedObjectError: An encrypted export, and no ``encryption=``.
            ThreadErasedError: An encrypted export of a thread since erased.
        """
        return self._sync.run(install.import_thread(self._ctx, data, thread_id))

    async def aimport_thread(self, data: bytes, *, thread_id: str | None = None) -> str:
        """Async version of [import_thread()][s3_saver.S3Saver.import_thread]."""
        return await self._async.run(install.import_thread(self._ctx, data, thread_id))

    # -- turning encryption on -------------------------------------------------------------
    def encrypt_thread(self, thread_id: str) -> EncryptStatus:
        """Encrypt a thread written without encryption, under its own key (made for it).

        For turning ``encryption=`` on for an existing store (``encrypt_existing()``
        walks every thread). The thread is written again whole, every object and the
        index's copies encrypted under fresh keys, and the index switched to them at
        one commit; then the plaintext objects it read are deleted, with every
        version a versioned bucket kept of them (as ``erase_thread`` deletes them).
        Cut short at any request, the thread reads from exactly one place, and a call
        again finishes; a thread encrypted already costs a few reads. A writer that
        commits to the thread meanwhile wins, and the thread is read again.

        A thread archived without encryption in an instant class is restored
        encrypted and archived again in its class; one in ``GLACIER`` or
        ``DEEP_ARCHIVE`` is reported (``state == "cold"``): restore it first.

        Returns:
            An [EncryptStatus][s3_saver.EncryptStatus]: ``complete`` when no plaintext
            of the thread is left.

        Raises:
            ConfigurationError: The saver has no ``encryption=``, or has a replica.
        """
        self._migrating()
        return self._sync.run(encrypt.encrypt_thread(self._ctx, thread_id))

    async def aencrypt_thread(self, thread_id: str) -> EncryptStatus:
        """Async version of [encrypt_thread()][s3_saver.S3Saver.encrypt_thread]."""
        self._migrating()
        return await self._async.run(encrypt.encrypt_thread(self._ctx, thread_id))

    def encrypt_existing(self, thread_ids: Sequence[str] | None = None) -> Iterator[EncryptStatus]:
        """[encrypt_thread()][s3_saver.S3Saver.encrypt_thread] for every thread of the
        thread listing (or ``thread_ids``), one after another.

        Yields:
            An [EncryptStatus][s3_saver.EncryptStatus] per thread, as it is done.
        """
        self._migrating()
        return self._sync.iterate(encrypt.encrypt_existing(self._ctx, thread_ids))

    async def aencrypt_existing(self, thread_ids: Sequence[str] | None = None) -> AsyncIterator[EncryptStatus]:
        """Async version of [encrypt_existing()][s3_saver.S3Saver.encrypt_existing]."""
        self._migrating()
        async for status in self._async.iterate(encrypt.encrypt_existing(self._ctx, thread_ids)):
            yield status

    def _migrating(self) -> None:
        if self.replica is not None:
            # The replica bucket keeps the plaintext versions replication copied there,
            # which the migration would not reach.
            raise ConfigurationError(
                f"encrypt_thread does not run with a replica (bucket {self.replica.bucket!r}): the replica "
                "keeps the plaintext versions replication copied there. Encrypt before adding the replica"
            )
