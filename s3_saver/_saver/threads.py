"""The thread-as-a-whole methods of S3Saver: delete, copy, prune, delete runs, list,
rebuild, and the audit of index against bucket (with its garbage collection).

A mixin of [S3Saver][s3_saver.S3Saver] (it precedes ``BaseCheckpointSaver`` among
the bases, so these override the base class's ``NotImplementedError``). Each
method is one line: an operation and a driver, as in ``_saver``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig

from s3_saver._ops import audit, copy, delete, erase, prune, rebuild, threads
from s3_saver._ops.audit import StoreReport
from s3_saver._ops.erase import EraseReport
from s3_saver._ops.keyed import rekeying
from s3_saver._ops.rebuild_keys import Rebuilt
from s3_saver._ops.threads import ThreadInfo
from s3_saver.errors import ConfigurationError

if TYPE_CHECKING:
    from s3_saver._ops.context import Context
    from s3_saver._regions.replica import Replica
    from s3_saver._regions.sites import Route
    from s3_saver._transport.aio import AsyncDriver
    from s3_saver._transport.protocol import Op
    from s3_saver._transport.retry import RetryPolicy
    from s3_saver._transport.sync import SyncDriver




class ThreadLifecycle:
    """Operations on whole threads (S3Saver's ``_sync``, ``_async`` and ``_ctx`` run them)."""

    _sync: SyncDriver
    _async: AsyncDriver
    _ctx: Context
    _other_ctx: Context
    _route: Route | None
    replica: Replica | None
    table: str | None
    _reading: Callable[..., tuple[Op[Any], RetryPolicy | None]]

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and pending write of a thread (all namespaces).

        Tombstones go in first: from the first request on, a run of the thread
        still in flight elsewhere cannot continue it (its writes raise
        [ThreadDeletedError][s3_saver.errors.ThreadDeletedError]), and each namespace reads as
        empty before anything of it is deleted. A delete cut short (a Lambda
        timeout) never leaves a half-readable thread; calling it again finishes
        it. The thread id can then be used again by a run that starts afresh.
        """
        self._sync.run(delete.delete_thread(self._ctx, thread_id))

    async def adelete_thread(self, thread_id: str) -> None:
        """Async version of [delete_thread()][s3_saver.S3Saver.delete_thread]."""
        await self._async.run(delete.delete_thread(self._ctx, thread_id))

    def erase_thread(self, thread_id: str) -> EraseReport:
        """Delete a thread as [delete_thread()][s3_saver.S3Saver.delete_thread] does, then every version and
        delete marker of every object it ever had, in every region.

        [delete_thread()][s3_saver.S3Saver.delete_thread] removes the current objects; a versioned bucket
        (replication and Object Lock need one) keeps them as noncurrent
        versions until a lifecycle rule expires them. This lists the thread's
        own key ranges (an admin call: it needs ``s3:ListBucketVersions`` and
        ``s3:DeleteObjectVersion``, see ``infra/``) and deletes each version,
        in the replica's bucket and index too when a [Replica][s3_saver.Replica] is set.
        It works on an unversioned bucket as well.

        One small record stays per region (the index's delete record: no user
        content, under 1 KB), so that a run still in flight cannot bring the
        thread back. A version held by Object Lock stays and is reported; so
        are objects no index entry names that are younger than an hour (a
        write in flight may still commit them, as for [collect_garbage()][s3_saver.S3Saver.collect_garbage]). A call
        cut short is finished by calling it again. What only the operator can
        remove: the table's point-in-time recovery, AWS Backup copies, and
        versions whose retention has not ended.

        With ``encryption=``, the thread's data key is destroyed first: from then
        on none of those copies can be read (``EraseReport.key_destroyed_at``;
        each remaining version encrypted under the key is marked
        ``crypto_erased``), and a read of one raises ``ThreadErasedError``. The
        thread can be written again (under a new key) once the erase returns.

        Returns:
            [EraseReport][s3_saver.EraseReport]: what was removed, and what remains and why.
        """
        return self._sync.run(self._erasing(thread_id))

    async def aerase_thread(self, thread_id: str) -> EraseReport:
        """Async version of [erase_thread()][s3_saver.S3Saver.erase_thread]."""
        return await self._async.run(self._erasing(thread_id))

    def _erasing(self, thread_id: str) -> Op[EraseReport]:
        """The erase in the region written to, then in the replica's (whose index
        is its own to erase unless it is a global table's replica)."""
        others = []
        if self._route is not None and self.replica is not None:
            own = not (self.table and self.replica.global_table)
            others.append((self._route.as_writer(self._other_ctx), own))
        return erase.erase_thread(self._ctx, thread_id, others)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, value and pending write of a thread into another thread.

        Objects are copied server-side (``CopyObject``), all of them before the
        first index item; index items follow newest first. With ``encryption=``
        each object is read, decrypted under the source's key and encrypted
        under the target's instead (a ciphertext is bound to its thread). A copy cut short
        leaves the target's latest state readable and completes when called
        again: the target may hold copies from the same source, nothing else.

        Raises:
            ConfigurationError: The target thread has checkpoints of its own.
        """
        self._sync.run(rekeying(self._ctx, lambda ctx: copy.copy_thread(ctx, source_thread_id, target_thread_id)))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async version of [copy_thread()][s3_saver.S3Saver.copy_thread]."""
        await self._async.run(rekeying(self._ctx, lambda ctx: copy.copy_thread(ctx, source_thread_id, target_thread_id)))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest", keep_last: int | None = None) -> None:
        """Remove older checkpoints of threads, with their pending writes and objects.

        ``keep_latest`` keeps the newest checkpoint of each namespace (the newest
        ``keep_last`` with ``keep_last``); ``delete`` removes the threads (as
        [delete_thread()][s3_saver.S3Saver.delete_thread]). What a kept checkpoint still reads stays, hidden
        from ``list`` and ``get_tuple``: the checkpoints whose objects hold its
        unchanged values, and, for a ``DeltaChannel``, the ancestors back to the
        channel's last snapshot with their writes (so its state rebuilds the
        same). Costs one read of each thread's index and a few batched deletes.

        A prune cut short leaves every kept checkpoint readable; calling it again
        finishes it. Do not prune a thread while a run continues it from a
        checkpoint other than its latest (a fork in flight): that run could
        point at values the prune removes.

        Args:
            thread_ids: The threads to prune (a list: a bare string is refused).
            strategy: ``"keep_latest"`` or ``"delete"`` (``"delete_all"``, LangGraph
                Server's name for it, is taken as ``"delete"``).
            keep_last: With ``keep_latest``, how many checkpoints to keep per namespace.

        Raises:
            ConfigurationError: Wrong arguments (nothing is removed).
        """
        self._sync.run(rekeying(self._ctx, lambda ctx: prune.prune(ctx, thread_ids, strategy, keep_last)))

    async def aprune(
        self, thread_ids: Sequence[str], *, strategy: str = "keep_latest", keep_last: int | None = None
    ) -> None:
        """Async version of [prune()][s3_saver.S3Saver.prune]."""
        await self._async.run(rekeying(self._ctx, lambda ctx: prune.prune(ctx, thread_ids, strategy, keep_last)))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete every checkpoint (every thread and namespace) whose metadata
        ``run_id`` is one of ``run_ids``, with its pending writes and objects.

        Runs are found through the index (each put of a new run records which
        thread it wrote to), never by scanning. Checkpoints of other runs that
        read through a deleted one (unchanged values, a ``DeltaChannel``'s
        writes) stay readable: what they need stays, hidden.

        A run still in flight is marked deleted first: its next ``put`` raises
        [RunDeletedError][s3_saver.errors.RunDeletedError] and leaves nothing behind.

        Args:
            run_ids: The run ids (a list: a bare string is refused).
        """
        self._sync.run(rekeying(self._ctx, lambda ctx: prune.delete_for_runs(ctx, run_ids)))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async version of [delete_for_runs()][s3_saver.S3Saver.delete_for_runs]."""
        await self._async.run(rekeying(self._ctx, lambda ctx: prune.delete_for_runs(ctx, run_ids)))

    def threads_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[str]]:
        """The threads each run wrote to, through the index's run hints (never a scan).

        What [delete_for_runs()][s3_saver.S3Saver.delete_for_runs] would visit. A hint can outlive what the run
        left in a thread (a prune, a thread deleted since); a run whose delete
        finished is no longer named.

        Args:
            run_ids: The run ids (a list: a bare string is refused).

        Returns:
            Each known run id mapped to its thread ids, sorted; unknown runs are left out.
        """
        return self._sync.run(prune.threads_of_runs(self._ctx, run_ids))

    async def athreads_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[str]]:
        """Async version of [threads_of_runs()][s3_saver.S3Saver.threads_of_runs]."""
        return await self._async.run(prune.threads_of_runs(self._ctx, run_ids))

    def list_threads(
        self,
        *,
        filter: dict[str, Any] | None = None,
        limit: int | None = None,
        before: ThreadInfo | str | RunnableConfig | None = None,
    ) -> Iterator[ThreadInfo]:
        """List the threads of this prefix, newest thread first (by creation).

        Each thread comes with its latest checkpoint's id, time and metadata.
        Threads are found in a listing written once per thread (beside its first
        checkpoint), never by scanning: a page of 100 threads costs one listing
        read plus one read per thread, in two round trips.

        Args:
            filter: Metadata of the latest checkpoint must match (as in [list()][s3_saver.S3Saver.list]).
            limit: At most this many threads.
            before: Only threads created before this one (a ``ThreadInfo`` from
                an earlier page, a thread id, or a config naming one): pagination.

        Yields:
            [ThreadInfo][s3_saver.ThreadInfo] for each thread.
        """
        return self._sync.iterate(*self._reading(lambda ctx: threads.list_threads(ctx, filter, limit, before)))

    async def alist_threads(
        self,
        *,
        filter: dict[str, Any] | None = None,
        limit: int | None = None,
        before: ThreadInfo | str | RunnableConfig | None = None,
    ) -> AsyncIterator[ThreadInfo]:
        """Async version of [list_threads()][s3_saver.S3Saver.list_threads]."""
        async for item in self._async.iterate(*self._reading(lambda ctx: threads.list_threads(ctx, filter, limit, before))):
            yield item

    def rebuild_index(self, thread_id: str | None = None) -> Rebuilt:
        """Rebuild the index from the bucket: for one thread, or every thread under the prefix.

        The admin path for an index that was lost or damaged (a table deleted,
        a manifest removed, a replica bucket in another region): it lists the
        bucket and reads every object of the threads, so every read afterwards
        equals the reads before the index was lost. Run it while no writer works
        on those threads. What a surviving tombstone deleted stays deleted.

        With ``encryption=``, it reads each thread's key from the key store, and
        the index's copies of content are encrypted as a write encrypts them. A
        thread whose key was destroyed (``erase_thread``) is never indexed again,
        nor one whose objects cannot be opened (written without encryption, or
        with no key in the key store): each is named in ``unindexed``.

        Returns:
            How many checkpoints were indexed (an int), with ``unindexed``: what
            was left out and why ([Rebuilt][s3_saver.Rebuilt]).
        """
        return self._sync.run(rebuild.rebuild_index(self._ctx, thread_id))

    async def arebuild_index(self, thread_id: str | None = None) -> Rebuilt:
        """Async version of [rebuild_index()][s3_saver.S3Saver.rebuild_index]."""
        return await self._async.run(rebuild.rebuild_index(self._ctx, thread_id))

    def audit(
        self,
        thread_ids: Sequence[str] | None = None,
        *,
        older_than: timedelta = timedelta(hours=1),
        progress: Callable[[int, int, int], None] | None = None,
    ) -> StoreReport:
        """Check that the index and the bucket agree, thread by thread.

        The admin path: it lists the bucket (``live/``, ``archive/`` and the
        manifests), then reads each thread's whole index, and reports
        ([StoreReport][s3_saver.StoreReport]) every object an entry needs that is missing, every
        object no entry refers to (an orphan when older than ``older_than``,
        else a write that may still be in flight), threads with objects and no
        index (``rebuild_index`` brings them back), and threads whose index
        cannot be read (a damaged manifest). Nothing is changed.

        Args:
            thread_ids: The threads to check (default: every thread of the prefix).
            older_than: The grace period: an unreferenced object younger than
                this may belong to a write about to commit its index entry.
            progress: Called after each thread with (threads done, threads in
                all, bytes listed so far).
        """
        return self._sync.run(audit.audit(self._ctx, thread_ids, _seconds(older_than), progress))

    async def aaudit(
        self,
        thread_ids: Sequence[str] | None = None,
        *,
        older_than: timedelta = timedelta(hours=1),
        progress: Callable[[int, int, int], None] | None = None,
    ) -> StoreReport:
        """Async version of [audit()][s3_saver.S3Saver.audit]."""
        return await self._async.run(audit.audit(self._ctx, thread_ids, _seconds(older_than), progress))

    def collect_garbage(
        self,
        thread_ids: Sequence[str] | None = None,
        *,
        older_than: timedelta = timedelta(hours=1),
        dry_run: bool = False,
        include_unindexed: bool = False,
        progress: Callable[[int, int, int], None] | None = None,
    ) -> StoreReport:
        """Delete the objects no index entry refers to, once older than ``older_than``.

        What a crash leaves: a write cut short between its objects and its
        index entry (the commit point), a prune or delete cut short after its
        entries went. An object younger than ``older_than`` is never deleted:
        its write may still be about to commit, so keep the grace period well
        above the longest a write can take (a Lambda runs at most 15 minutes).
        Runs [audit()][s3_saver.S3Saver.audit] first; its report says what was deleted
        (``deleted``). A thread whose index cannot be read is left alone.

        Args:
            thread_ids: The threads to collect (default: every thread of the prefix).
            older_than: The grace period (see above).
            dry_run: Report what would be deleted, delete nothing.
            include_unindexed: Also delete the objects of threads the index
                knows nothing of. Off by default: after a lost index they are
                the data [rebuild_index()][s3_saver.S3Saver.rebuild_index] restores.
            progress: As for [audit()][s3_saver.S3Saver.audit].
        """
        op = audit.collect_garbage(self._ctx, thread_ids, _seconds(older_than), dry_run, include_unindexed, progress)
        return self._sync.run(op)

    async def acollect_garbage(
        self,
        thread_ids: Sequence[str] | None = None,
        *,
        older_than: timedelta = timedelta(hours=1),
        dry_run: bool = False,
        include_unindexed: bool = False,
        progress: Callable[[int, int, int], None] | None = None,
    ) -> StoreReport:
        """Async version of [collect_garbage()][s3_saver.S3Saver.collect_garbage]."""
        op = audit.collect_garbage(self._ctx, thread_ids, _seconds(older_than), dry_run, include_unindexed, progress)
        return await self._async.run(op)


def _seconds(older_than: timedelta) -> float:
    if not isinstance(older_than, timedelta):
        raise ConfigurationError(f"older_than must be a datetime.timedelta, got {type(older_than).__name__}: {older_than!r}")
    return older_than.total_seconds()
