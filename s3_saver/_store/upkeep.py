"""S3Store's erase of a namespace prefix, its TTL sweep and its garbage collection (a mixin
of ``S3Store``): each one operation (``_ops/memory/erase``, ``_ops/memory/sweep``,
``_ops/memory/gc``) on the store's drivers, and the sweeper thread that runs the sweep on
a schedule, as LangGraph's PostgresStore's."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from datetime import timedelta
from typing import Any

from s3_saver._format.memory.names import check_labels, registry_bounds, show
from s3_saver._ops.memory.erase import NamespaceEraseReport, erase_namespace
from s3_saver._ops.memory.gc import MemoryGarbageReport, collect_garbage
from s3_saver._ops.memory.sweep import sweep_ttl
from s3_saver.errors import ConfigurationError

log = logging.getLogger("s3_saver")

DEFAULT_SWEEP_LIMIT = 1000
DEFAULT_SWEEP_INTERVAL = 5.0  # minutes, as PostgresStore's


class Upkeep:
    """``erase_namespace``, ``sweep_ttl``, ``start_ttl_sweeper``/``stop_ttl_sweeper``,
    ``collect_garbage`` (see ``S3Store``)."""

    # Set by S3Store.
    _memory: Any
    _sync: Any
    _async: Any
    ttl_config: Any
    _sweeper: threading.Thread | None
    _sweeper_stop: threading.Event

    # -- erase -------------------------------------------------------------------------

    def erase_namespace(self, prefix: tuple[str, ...], *, everything: bool = False) -> NamespaceEraseReport:
        """Erase every item of every namespace equal to or under ``prefix``: the items,
        their value objects and, on a versioned bucket, every version of every object
        that held one; then unregister the namespaces (``list_namespaces`` no longer
        lists them).

        A namespace prefix is a tuple prefix: ``("user1",)`` erases ``("user1",)`` and
        ``("user1", "notes")``, never ``("user10",)``. Erasing all memory needs
        ``erase_namespace((), everything=True)``; ``()`` alone is refused.

        An admin call: it lists each erased namespace's folder (``s3:ListBucketVersions``,
        ``s3:DeleteObjectVersion`` on a versioned bucket, as ``erase_thread``). A put
        racing the erase either has its item erased or keeps it whole and listed (the
        namespace is then reported in ``written_during``). What stays: in the manifest
        mode an empty head per erased namespace (no item, no namespace name); versions
        Object Lock holds, and value objects (or sealed segments) younger than an hour
        that no item named when the erase read it (a put about to commit), reported in
        ``remaining``; their namespaces stay registered (in ``written_during``), so that
        the erase, called again once they may go, finds them. A call cut short is
        finished by calling it again. The store writes to one region:
        copies that S3 Replication or a DynamoDB global table made elsewhere, the
        table's point-in-time recovery and backups are the operator's to remove.

        Args:
            prefix: The namespace prefix (a tuple of labels).
            everything: Required, and only allowed, with ``prefix=()``.

        Returns:
            [NamespaceEraseReport][s3_saver.NamespaceEraseReport]: what was removed,
            and what remains and why.

        Raises:
            NamespaceError: ``prefix`` is not a valid namespace prefix.
            ConfigurationError: ``()`` without ``everything=True``, or ``everything``
                with another prefix.
        """
        return self._sync.run(erase_namespace(self._memory, self._erase_prefix(prefix, everything)))

    async def aerase_namespace(self, prefix: tuple[str, ...], *, everything: bool = False) -> NamespaceEraseReport:
        """Async version of [erase_namespace()][s3_saver.S3Store.erase_namespace]."""
        return await self._async.run(erase_namespace(self._memory, self._erase_prefix(prefix, everything)))

    def _erase_prefix(self, prefix: tuple[str, ...], everything: bool) -> tuple[str, ...]:
        prefix = check_labels(prefix, what="namespace prefix")
        registry_bounds(prefix)  # KeyTooLongError for a prefix no namespace can have
        if not prefix and not everything:
            raise ConfigurationError(
                f"erase_namespace(()) would erase every namespace of {self!r}: pass everything=True to mean it"
            )
        if prefix and everything:
            raise ConfigurationError(f"erase_namespace({show(prefix)}, everything=True): everything=True goes with () only")
        return prefix

    # -- TTL sweep ---------------------------------------------------------------------

    def sweep_ttl(self, limit: int = 1000) -> int:  # DEFAULT_SWEEP_LIMIT, spelled out for the API page
        """Remove expired items' bytes, visiting at most ``limit`` namespaces.

        Reads never return an expired item, swept or not. A run visits up to ``limit``
        registered namespaces in path order, from where the last run (of any process)
        stopped: run it repeatedly (``start_ttl_sweeper``, or a schedule) and every
        namespace is visited once every ``ceil(namespaces / limit)`` runs. In each
        namespace it deletes the expired items (and their value objects), and
        unregisters a namespace left with no item. In DynamoDB mode the table's TTL
        deletes expired items too, within days; the sweep deletes them sooner, and is what
        deletes the value objects of large expired items.

        Args:
            limit: Namespaces visited in this run (the run's work is bounded by it).

        Returns:
            The number of expired items removed.
        """
        return self._sync.run(sweep_ttl(self._memory, _check_limit(limit))).removed

    async def asweep_ttl(self, limit: int = 1000) -> int:  # DEFAULT_SWEEP_LIMIT
        """Async version of [sweep_ttl()][s3_saver.S3Store.sweep_ttl]."""
        return (await self._async.run(sweep_ttl(self._memory, _check_limit(limit)))).removed

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> concurrent.futures.Future[None]:
        """Run [sweep_ttl()][s3_saver.S3Store.sweep_ttl] every ``sweep_interval_minutes``
        in a daemon thread, as LangGraph's ``PostgresStore.start_ttl_sweeper``: the
        interval given, else ``ttl_config["sweep_interval_minutes"]``, else 5 minutes.
        A store with no TTL configuration starts nothing. A failed run is logged and the
        next one runs on time.

        Returns:
            A future that is done once the sweeper stops; cancelling it stops the sweeper.
        """
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        if not self.ttl_config:
            future.set_result(None)
            return future
        future.add_done_callback(lambda f: self._sweeper_stop.set() if f.cancelled() else None)
        if self._sweeper is not None and self._sweeper.is_alive():
            log.info("%r: the TTL sweeper is running already", self)
            return future
        interval = float(sweep_interval_minutes or self.ttl_config.get("sweep_interval_minutes") or DEFAULT_SWEEP_INTERVAL)
        self._sweeper_stop.clear()

        def loop() -> None:
            while not self._sweeper_stop.wait(interval * 60):
                try:
                    removed = self.sweep_ttl()
                    if removed:
                        log.info("%r: the TTL sweep removed %d expired items", self, removed)
                except Exception:
                    log.exception("%r: a TTL sweep run failed (the next one runs on time)", self)
            if not future.done():
                future.set_result(None)

        self._sweeper = threading.Thread(target=loop, daemon=True, name="s3store-ttl-sweeper")
        self._sweeper.start()
        return future

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper thread (after the run under way, if any).

        Args:
            timeout: Seconds to wait for it to stop; None: until it stops.

        Returns:
            True if it stopped (or was not running), False if ``timeout`` passed first.
        """
        thread = self._sweeper
        if thread is None or not thread.is_alive():
            return True
        self._sweeper_stop.set()
        thread.join(timeout)
        if thread.is_alive():
            log.warning("%r: the TTL sweeper did not stop within %s s", self, timeout)
            return False
        self._sweeper = None
        return True

    # -- garbage collection ------------------------------------------------------------

    def collect_garbage(
        self, *, older_than: timedelta = timedelta(hours=1), limit: int = 10_000, dry_run: bool = False
    ) -> MemoryGarbageReport:
        """Delete the value objects no item names, once older than ``older_than``.

        A value too large for its item (over 64 KiB in the bucket alone, 16 KiB with a
        table) lives in an object of its own, written before the item that names it. A
        put cut short between the two, a commit whose replaced value was not deleted, or
        (with a table) an item DynamoDB's TTL deleted, leaves such an object named by
        nothing: no read returns it, this deletes it. The same name and arguments as
        [S3Saver.collect_garbage()][s3_saver.S3Saver.collect_garbage], for memory.

        An admin call: it lists the store's folders in the bucket (``s3:ListBucket``), at
        most ``limit`` keys a run, from where the last run (of any process) stopped; run
        it repeatedly (a schedule) and every folder is visited once every
        ``ceil(keys / limit)`` runs. It reads the items of each folder holding an object
        older than ``older_than``, and deletes the objects they do not name. An object
        younger than ``older_than`` is never deleted: a put may be about to name it. A put
        never names an object written more than ten minutes before (it copies it first),
        so with ``older_than`` of 15 minutes or more a deletion races no put; below that,
        stop every writer first. A run cut short is finished by running it again.

        Args:
            older_than: The grace period (see above).
            limit: Keys listed in this run (its work is bounded by it).
            dry_run: Report what would be deleted, delete nothing (and leave the cursor).

        Returns:
            [MemoryGarbageReport][s3_saver.MemoryGarbageReport]: what was examined, what
            is garbage and what was deleted.

        Raises:
            ConfigurationError: A negative ``older_than`` or a ``limit`` under 1.
        """
        return self._sync.run(collect_garbage(self._memory, limit, _micros(older_than), dry_run))

    async def acollect_garbage(
        self, *, older_than: timedelta = timedelta(hours=1), limit: int = 10_000, dry_run: bool = False
    ) -> MemoryGarbageReport:
        """Async version of [collect_garbage()][s3_saver.S3Store.collect_garbage]."""
        return await self._async.run(collect_garbage(self._memory, limit, _micros(older_than), dry_run))


def _micros(older_than: object) -> int:
    if not isinstance(older_than, timedelta):
        raise ConfigurationError(f"older_than must be a datetime.timedelta, got {type(older_than).__name__}: {older_than!r}")
    return older_than // timedelta(microseconds=1)


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"sweep_ttl(limit=...) takes a number of namespaces, 1 or more; got {limit!r}")
    return limit
