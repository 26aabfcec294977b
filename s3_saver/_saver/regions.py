"""The replica-region methods of S3Saver: where reads go, promote, verify, setup_replica.

A mixin of [S3Saver][s3_saver.S3Saver]; each method is one line, an operation
(which reads both regions: each call names its own) and a driver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from s3_saver._crypto.config import Encryption, key_bucket_of
from s3_saver._ops import setup
from s3_saver._ops.context import Context
from s3_saver._ops.keyed import rekeying
from s3_saver._ops.source import ReadSource
from s3_saver._regions import replication
from s3_saver._regions.replica import Promotion, Replica, ReplicationReport
from s3_saver._regions.sites import ONCE, REPLICA, Route, Site, make_site
from s3_saver._transport.protocol import PRIMARY, Op, RequestStats, T
from s3_saver._transport.retry import RetryPolicy
from s3_saver.errors import ConfigurationError

if TYPE_CHECKING:
    from s3_saver._transport.aio import AsyncDriver
    from s3_saver._transport.sync import SyncDriver


class Regions:
    """Failover and failback (S3Saver's ``_route`` and contexts run them)."""

    _sync: SyncDriver
    _async: AsyncDriver
    _ctx: Context
    _other_ctx: Context
    _route: Route | None
    _base_ctx: Context
    _reader_ctx: Context
    replica: Replica | None
    stats: RequestStats
    bucket: str
    table: str | None
    region_name: str | None

    def promote(self, *, rebuild: bool | None = None, force: bool = False) -> Promotion:
        """Make the replica region the one written to (failover), or the old
        primary again (failback, from a saver that promoted before or one
        configured with the regions swapped).

        Steps: when the region written to so far still answers, check that
        every checkpoint and pending write it holds has reached the replica
        (else raise). Then make the promoted region's index whole for every
        process (an operator's call: it lists the bucket):

        * the region left answers (a failback): the two indexes are merged
          into the promoted one: every entry of the region left, then the
          promoted region's own entries it lacks; per task of a checkpoint,
          one region's pending writes only: the region left's when it ran
          the task itself (it holds a call the promoted one lacks), else the
          promoted region's own run, whole. Both buckets must be versioned.
          What is not kept is recorded ([verify()][s3_saver.S3Saver.verify] lists it);
        * it does not (a failover), manifest mode: entries whose objects never
          arrived leave the index; a global table: they are only reported (its
          items are both regions'), and savers built with
          ``Replica(global_table=True)`` read past them;
        * it does not, DynamoDB without a global table: the table is rebuilt
          from the bucket (only complete checkpoints).

        Then the roles swap in this saver (and in the stores made from it by
        [S3Store.from_saver()][s3_saver.S3Store.from_saver]; their memory is not
        compared nor merged): writes go to the promoted region,
        and reads fall over to the other. Other processes follow once
        configured the same way (see the [Failover runbook][failover-runbook]).

        Args:
            rebuild: Rebuild the promoted region's index from its bucket
                instead (None: only as above). Indexes every complete
                checkpoint, committed or not: nothing else can say.
            force: Promote although the region left holds writes the promoted
                one lacks (they stay there; [verify()][s3_saver.S3Saver.verify] reports them).

        Returns:
            What was checked, rebuilt or left out ([Promotion][s3_saver.Promotion]).

        Raises:
            ReplicationLagError: The region left still answers and holds writes
                the promoted one lacks.
            ConfigurationError: The saver has no replica, or both regions
                answer and a bucket has versioning off (the error names it).
        """
        promotion = self._sync.run(self._promotion(rebuild, force))
        self._swap()
        return promotion

    async def apromote(self, *, rebuild: bool | None = None, force: bool = False) -> Promotion:
        """Async version of [promote()][s3_saver.S3Saver.promote]."""
        promotion = await self._async.run(self._promotion(rebuild, force))
        self._swap()
        return promotion

    def verify(self, thread_ids: Iterable[str] | None = None) -> ReplicationReport:
        """Compare the region written to with the replica, thread by thread (admin:
        lists both buckets' objects of each thread).

        After a failback, ``unreplicated`` holds the checkpoints and pending
        writes that reached the old primary and never replicated before the
        outage (and anything written since that replication has not copied
        yet), and ``set_aside`` every committed checkpoint and pending write
        that the failback's merge did not keep, with the reason (a task the
        promoted region ran again: its run won). Nothing is changed.

        Args:
            thread_ids: Threads to compare (None: every thread either index lists).
        """
        return self._sync.run(self._verification(thread_ids))

    async def averify(self, thread_ids: Iterable[str] | None = None) -> ReplicationReport:
        """Async version of [verify()][s3_saver.S3Saver.verify]."""
        return await self._async.run(self._verification(thread_ids))

    def setup_replica(self) -> None:
        """Create the replica region's bucket (versioned) and table (DynamoDB
        mode) when missing, then check that both buckets are versioned.

        Tests and S3-compatible stores; on AWS deploy ``infra/replica.yaml``,
        which also sets versioning and replication up.

        Raises:
            ConfigurationError: A bucket has versioning off or suspended
                (replication and a failback need it); the error names it.
        """
        self._sync.run(self._replica_setup())

    async def asetup_replica(self) -> None:
        """Async version of [setup_replica()][s3_saver.S3Saver.setup_replica]."""
        await self._async.run(self._replica_setup())

    # -- reads ------------------------------------------------------------------------
    def _reading(self, make: Callable[[Context], Op[T]]) -> tuple[Op[T], RetryPolicy | None]:
        """A read and the retry policy its driver applies: on the primary, or
        routed (the primary first, then the replica: each retries inside)."""
        # With encryption, a read that meets a key this process cached stale runs
        # again with the thread's key read (``keyed.rekeying``).
        if self._route is None:
            return rekeying(self._ctx, make), None
        return self._route.routed(lambda ctx: rekeying(ctx, make), self._ctx, self._other_ctx), ONCE

    @property
    def replica_stats(self) -> RequestStats:
        """Round trips and requests sent to the [Replica][s3_saver.Replica]'s region (also counted in ``stats``)."""
        return self.stats.site(REPLICA)

    @property
    def last_read(self) -> ReadSource | None:
        """Where the last read of this thread (or asyncio task) was served from, and how stale.

        Set by ``get_tuple``, ``list``, ``get_state``... of a saver with a
        [Replica][s3_saver.Replica] (None without one). A read served by the replica while
        replication lags names the newer checkpoints it passed over
        (``skipped``) and how far behind the answer is (``behind_seconds``).
        """
        return self._route.source.get() if self._route is not None else None

    # -- shared by the sync and async methods ---------------------------------------
    def _need_route(self, what: str) -> Route:
        if self._route is None:
            raise ConfigurationError(f"{what}() needs a replica: build the saver with replica=Replica(...)")
        return self._route

    def _replica_setup(self) -> Op[None]:
        route = self._need_route("setup_replica")
        yield from setup.setup(route.as_writer(self._other_ctx), route.reader.clients.region_name, versioned=True)
        yield from setup.require_versioning("setup_replica()", self._ctx, self._other_ctx)

    def _indexed(self) -> bool:
        """Does replication keep an index in the other region (manifest heads, a global table)?"""
        return self.table is None or bool(self.replica and self.replica.global_table)

    def _promotion(self, rebuild: bool | None, force: bool) -> Any:
        route = self._need_route("promote")
        shared = bool(self.table and self.replica and self.replica.global_table)
        return replication.promote(self._ctx, route.as_writer(self._other_ctx), rebuild, force, self._indexed(), shared)

    def _verification(self, thread_ids: Iterable[str] | None) -> Any:
        self._need_route("verify")
        ids = None if thread_ids is None else [str(t) for t in thread_ids]
        return replication.verify(self._ctx, self._other_ctx, ids, self._indexed())

    def _swap(self) -> None:
        route = self._need_route("promote")
        writer, reader = self._other_ctx, self._ctx
        route.swap()
        if writer.crypt is not None and reader.crypt is not None:
            # The key stores swap roles too. Keys are made in the promoted region now:
            # a key its store lacks is missing (erased, lost), not late, and reads as such;
            # the region left is the one a key reaches late (its copy made once it answers).
            writer.crypt.pair(reader.crypt, lags=False)
            reader.crypt.pair(writer.crypt, lags=True)
        # A promoted region's index can name what never arrived (the outage ate
        # it): its reads stay lag-safe (the newest complete checkpoint).
        self._base_ctx, self._reader_ctx = route.as_reader(writer, role=PRIMARY), route.as_reader(reader)
        where = route.writer.where
        self.bucket, self.table, self.region_name = where.bucket, where.table, route.writer.clients.region_name


def replica_site(
    replica: Replica, table: str | None, primary: str, encryption: Encryption | None = None, **common: Any
) -> tuple[Site, Context]:
    """The replica region's site and context (same prefix and settings: replication keeps keys;
    with ``encryption``, a key store of its own in that region, ``Replica.key_bucket``)."""
    if replica.table and not table:
        raise ConfigurationError(
            f"Replica(table={replica.table!r}) needs a DynamoDB index on the primary too (table=): "
            "in manifest mode the index travels in the bucket"
        )
    return make_site(
        REPLICA,
        replica.bucket,
        (replica.table or table) if table else None,
        region_name=replica.region_name,
        endpoints={
            "s3": replica.s3_endpoint_url or replica.endpoint_url,
            "dynamodb": replica.dynamodb_endpoint_url or replica.endpoint_url,
            "kms": replica.endpoint_url,
        },
        given={"s3": replica.s3_client, "dynamodb": replica.dynamodb_client},
        boto3_session=replica.boto3_session,
        aioboto3_session=replica.aioboto3_session,
        global_table=replica.global_table,
        partner=primary,
        partner_table=table,
        encryption=encryption,
        key_bucket=(replica.key_bucket or key_bucket_of(encryption, replica.bucket, own=False)) if encryption else None,
        **common,
    )
