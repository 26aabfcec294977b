"""S3Saver: the public checkpointer. Each method is one line: an operation and a driver."""

from __future__ import annotations

import dataclasses
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from datetime import timedelta
from typing import Any

from botocore.config import Config
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from s3_saver._crypto.config import KmsKey, LocalKey
from s3_saver._format.archive import check_live_class
from s3_saver._format.keys import KeyLayout
from s3_saver._ops import setup
from s3_saver._ops.context import Context
from s3_saver._regions.replica import Replica
from s3_saver._regions.sites import REPLICA, Route, make_site
from s3_saver._saver.archival import ThreadArchival
from s3_saver._saver.checkpoints import Checkpoints
from s3_saver._saver.keys import KeyRotation
from s3_saver._saver.options import check_options
from s3_saver._saver.regions import Regions, replica_site
from s3_saver._saver.threads import ThreadLifecycle
from s3_saver._transport.aio import AsyncDriver
from s3_saver._transport.budget import CacheBudget, CacheStats, default_bytes
from s3_saver._transport.protocol import PRIMARY, RequestStats
from s3_saver._transport.retry import RetryPolicy
from s3_saver._transport.retry import deadline as retry_deadline
from s3_saver._transport.sync import SyncDriver
from s3_saver.errors import ConfigurationError


class S3Saver(
    Checkpoints,
    Regions,
    ThreadArchival,
    ThreadLifecycle,
    KeyRotation,
    BaseCheckpointSaver[str],
    AbstractContextManager,
    AbstractAsyncContextManager,
):
    """A LangGraph checkpointer that keeps state in S3 as immutable objects, found through an index.

    Checkpoints, channel values and pending writes are immutable S3 objects
    (written with ``IfNoneMatch="*"``). The index orders them, so "latest",
    history and ``list`` never list the bucket: a DynamoDB table (``table=``), or
    with no table a manifest per thread in the bucket itself (a small head
    replaced by compare-and-swap, and sealed segments), for S3-compatible stores
    without a database. The same object serves ``graph.invoke`` (boto3) and
    ``graph.ainvoke`` (aioboto3, from the ``async`` extra).

    Constructing a saver makes no network call; run [setup()][s3_saver.S3Saver.setup] once (or deploy
    ``infra/``) to create the bucket and table.

    Example:
        ```python
        from s3_saver import S3Saver

        saver = S3Saver("my-bucket", table="langgraph-checkpoints")
        saver.setup()  # once, from a deploy step: creates the bucket and table
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "t-1"}})
        ```

    Args:
        bucket: S3 bucket name.
        table: DynamoDB table name for the index; None (the default) keeps the
            index in the bucket (manifest mode: no database, needs a store that
            honours conditional writes, which [setup()][s3_saver.S3Saver.setup] checks).
            A bucket prefix belongs to one index mode: a saver of the other
            mode raises [IndexModeMismatchError][s3_saver.errors.IndexModeMismatchError]
            at its first call, before it reads, writes or deletes.
        prefix: Key prefix inside the bucket (several savers can share a bucket).
        region_name: AWS region for the clients the saver creates.
        endpoint_url: Endpoint for both services (moto, LocalStack...). Use
            ``s3_endpoint_url`` / ``dynamodb_endpoint_url`` to set them apart.
        s3_endpoint_url: Endpoint for S3 only (MinIO, R2, SeaweedFS...).
        dynamodb_endpoint_url: Endpoint for DynamoDB only.
        boto3_session: Session the sync clients are created from.
        s3_client: A ready boto3 S3 client (not closed by [close()][s3_saver.S3Saver.close]).
        dynamodb_client: A ready boto3 DynamoDB client (not closed by [close()][s3_saver.S3Saver.close]).
        aioboto3_session: Session the async clients are created from. By default
            they get the endpoint, region, config and credentials of the sync
            clients (given or made from ``boto3_session``); credentials that refresh
            themselves outside a named profile cannot be copied, and the first
            async call then asks for this argument.
        client_config: ``botocore.config.Config`` merged over the saver's defaults
            (standard retry mode with 1 attempt in total, so that the saver's own
            ``retry`` policy is the only one; 2 s connect and 5 s read timeouts per
            attempt); its ``retries`` and ``s3`` dicts are merged key by key.
        serde: Serializer for checkpoints, metadata and values; its type tag is
            stored with every value.
        ttl: A thread untouched this long expires: every index item carries
            ``expires_at`` = its write time + ``ttl`` and is never served after
            it. Pair it with an S3 lifecycle expiration of at least 1.5 x ``ttl``
            on the ``live/`` prefix (values are stored again once half a ``ttl`` old).
        inline_threshold: Values up to this many serialized bytes are stored inside
            the checkpoint object (and so its index item); larger values get their
            own object.
        list_deltas: Store a list value that extends its parent's (an
            ``add_messages`` or ``operator.add`` channel) as the new elements
            plus a reference to the pieces it extends, so a conversation's
            storage grows linearly, not quadratically (see
            [Lists stored as deltas][list-deltas]). False stores every version whole: each
            checkpoint then reads no piece from its ancestors' objects, which
            only matters to a replica whose objects may arrive far apart.
        max_concurrency: Threads the sync driver uses to send one wave of requests.
        storage_class: The S3 storage class of the live objects (checkpoints,
            values, pending writes): ``"STANDARD"`` or ``"INTELLIGENT_TIERING"``
            (objects under 128 KB are billed at its frequent tier, with no minimum
            duration); None: the bucket's default (``STANDARD``). Manifests stay
            in the default class (they are rewritten at every write). The
            infrequent-access classes are refused (``ConfigurationError``):
            ``STANDARD_IA`` and ``ONEZONE_IA`` bill each object as at least
            128 KB for at least 30 days, ``GLACIER_IR`` for 90, and live objects
            are a few KB, replaced within days. For threads kept for years, see
            [archive_thread()][s3_saver.S3Saver.archive_thread] (one object per thread, in any class).
        retry: How calls that failed transiently (no answer, a timeout, a 5xx,
            throttling) are sent again, the same for sync and async, with
            full-jitter backoff (0.1 s doubling, at most 2 s) and no backoff
            ending more than 10 s after a call's first attempt. By default a
            store that fails gets 4 attempts (it gives up within about 10 s); a
            throttling one (S3 ``SlowDown``, DynamoDB throttling) is retried
            until 10 s, so throttling shorter than 8 s is always ridden out.
            See [RetryPolicy][s3_saver.RetryPolicy] and [deadline()][s3_saver.S3Saver.deadline].
        replica: A second region holding a replica of the bucket (S3
            replication) and of the index: reads fall over to it when this
            one fails, lag-safe; [promote()][s3_saver.S3Saver.promote] makes it the one written to.
            See [Replica][s3_saver.Replica].
        cache_bytes: The memory, in bytes, that the saver's caches may take
            together (manifest heads and segments, committed bodies, list
            values, decoded archives, loc maps; both regions' with a
            replica); least recently used entries go first. At least 1 MiB.
            None: 64 MiB, or in a Lambda function an eighth of its memory
            (``AWS_LAMBDA_FUNCTION_MEMORY_SIZE``), at most 64 MiB. A smaller
            budget costs requests (what was evicted is read again), never
            another answer. See [cache_stats()][s3_saver.S3Saver.cache_stats].
        encryption: Encrypt every thread with a key of its own:
            [KmsKey][s3_saver.KmsKey] (AWS KMS) or [LocalKey][s3_saver.LocalKey] (a
            master key you keep, for stores without KMS). Checkpoints, values,
            pending writes and the index's copies of them and of metadata are
            sealed with AES-256-GCM, bound to their place; a plaintext or moved
            object is refused by name. The steady state sends no extra request;
            a cold process reads a thread's key once (and, with KMS, unwraps it
            once). See [Encryption][encryption]. None: nothing is encrypted.
    """

    def __init__(
        self,
        bucket: str,
        *,
        table: str | None = None,
        prefix: str = "",
        region_name: str | None = None,
        endpoint_url: str | None = None,
        s3_endpoint_url: str | None = None,
        dynamodb_endpoint_url: str | None = None,
        boto3_session: Any = None,
        s3_client: Any = None,
        dynamodb_client: Any = None,
        aioboto3_session: Any = None,
        client_config: Config | None = None,
        serde: SerializerProtocol | None = None,
        ttl: timedelta | None = None,
        inline_threshold: int = 64 * 1024,
        list_deltas: bool = True,
        max_concurrency: int = 16,
        retry: RetryPolicy | None = None,
        storage_class: str | None = None,
        replica: Replica | None = None,
        cache_bytes: int | None = None,
        encryption: KmsKey | LocalKey | None = None,
    ) -> None:
        super().__init__(serde=serde)
        check_options(locals())
        if replica is not None and not isinstance(replica, Replica):
            raise ConfigurationError(f"replica must be an s3_saver.Replica or None, got {type(replica).__name__}: {replica!r}")
        self.bucket = bucket
        self.table = table
        self.region_name = region_name
        self.stats = RequestStats()
        """Round trips and requests sent so far, by both drivers (see [RequestStats][s3_saver.RequestStats])."""
        common = {
            "client_config": client_config,
            "max_concurrency": max_concurrency,
            "layout": KeyLayout(prefix),
            "storage_class": storage_class,
            "settings": {
                "serde": self.serde,
                "inline_threshold": inline_threshold,
                "list_deltas": list_deltas,
                "ttl_seconds": int(ttl.total_seconds()) if ttl else None,
                "budget": CacheBudget(cache_bytes if cache_bytes is not None else default_bytes()),
            },
        }
        if storage_class is not None:
            check_live_class(storage_class, bucket)
        primary, self._base_ctx = make_site(
            PRIMARY,
            bucket,
            table,
            region_name=region_name,
            endpoints={
                "s3": s3_endpoint_url or endpoint_url,
                "dynamodb": dynamodb_endpoint_url or endpoint_url,
                "kms": (encryption.endpoint_url if isinstance(encryption, KmsKey) else None) or endpoint_url,
            },
            given={"s3": s3_client, "dynamodb": dynamodb_client},
            boto3_session=boto3_session,
            aioboto3_session=aioboto3_session,
            global_table=bool(replica is not None and replica.global_table),
            partner=replica.bucket if replica is not None else None,
            partner_table=(replica.table or table) if replica is not None and table else None,
            encryption=encryption,
            **common,
        )
        sites = {PRIMARY: primary}
        policy = retry if retry is not None else RetryPolicy()
        self.replica = replica
        self._route: Route | None = None
        if replica is not None:
            sites[REPLICA], reader_ctx = replica_site(replica, table, bucket, encryption, **common)
            if self._base_ctx.crypt is not None and reader_ctx.crypt is not None:
                # Each region's key store is the other's partner: a key is made in both
                # (by the region written to), destroyed in both; the replica region's
                # reads find a key missing there as lag.
                self._base_ctx.crypt.pair(reader_ctx.crypt, lags=False)
                reader_ctx.crypt.pair(self._base_ctx.crypt, lags=True)
            self._route = Route(primary, sites[REPLICA], replica, policy)
            self._reader_ctx = self._route.as_reader(reader_ctx)
            if replica.global_table:
                # Both regions write one global table: after a failover, the
                # region left brings back items whose objects never replicated
                # here. Reads here pass them over, as a replica's reads do.
                self._base_ctx = self._route.as_reader(self._base_ctx, role=PRIMARY)
            self.stats.site(REPLICA)  # counted from the first call on
        self._sites = sites
        self._given_clients = [c for site in sites.values() for c in site.given]
        # With a replica, what is not a routed read (writes, admin calls) gets
        # the primary's share of the policy too: a write cannot go over, and
        # its caller hears PrimaryUnavailableError within failover_after (plus
        # one read timeout) rather than after every retry of every round trip.
        # Throttling is ridden out as without a replica (RetryPolicy.outage_budget).
        if self._route is not None:
            policy = self._route.fast
        # Each site's table names the bucket that owns it; checked on the first
        # wave sent there (see ``_transport/ownership``).
        owners = lambda site: sites[site].owner  # noqa: E731
        # Each site's prefix belongs to one index mode; checked on the first
        # wave sent there too (see ``_transport/mode``).
        marks = lambda site: sites[site].mode  # noqa: E731
        self._sync = SyncDriver(
            lambda service, site: sites[site].clients.make_sync(service), self.stats, max_concurrency, policy, owners, marks
        )
        self._async = AsyncDriver(lambda service, site: sites[site].clients.make_async(service), self.stats, policy, owners, marks)

    def __repr__(self) -> str:
        # What a log line needs to tell two savers apart: the store, never credentials.
        index = f"table={self.table!r}" if self.table is not None else "index='manifest'"
        parts = [repr(self.bucket), index, f"prefix={self._base_ctx.layout.prefix!r}"]
        region = self.region_name or self._sites[PRIMARY].clients.region_name
        parts += [f"region={region!r}"] if region else []
        parts += [f"replica={self.replica.bucket!r}"] if self.replica is not None else []
        return f"S3Saver({', '.join(parts)})"

    def _location(self) -> tuple[str, str, str | None]:
        """Where its objects live (bucket, prefix, S3 endpoint): savers that share
        it write the same keys, whatever their index."""
        return self.bucket, self._base_ctx.layout.prefix, self._sites[PRIMARY].clients.endpoints.get("s3")

    @property
    def _ctx(self) -> Context:
        """The operations' context (the region written to), with this object's serializer.

        ``with_allowlist`` (and ``copy.copy``) make a shallow copy and give it
        its own ``serde``: the copy must use it, while sharing the clients and
        caches of the original.
        """
        ctx = self._base_ctx
        if ctx.serde is not self.serde:
            ctx = self._base_ctx = dataclasses.replace(ctx, serde=self.serde)
        return ctx

    @property
    def _other_ctx(self) -> Context:
        """The replica region's context (reads there are lag-safe), with this object's serializer."""
        ctx = self._reader_ctx
        if ctx.serde is not self.serde:
            ctx = self._reader_ctx = dataclasses.replace(ctx, serde=self.serde)
        return ctx

    def cache_stats(self) -> CacheStats:
        """What the saver's caches hold now: their estimated bytes, entries and
        evictions, per cache, within the budget (``cache_bytes``). Costs no request.

        Example:
            ```python
            stats = saver.cache_stats()
            print(f"{stats.used} of {stats.budget} bytes")
            ```
        """
        return self._base_ctx.budget.stats()

    def deadline(self, seconds: float) -> AbstractContextManager[None]:
        """Within this block, the saver starts no retry that would end more than
        ``seconds`` from now: tie it to a Lambda's remaining time.

        Example:
            ```python
            def handler(event, context):
                with saver.deadline(context.get_remaining_time_in_millis() / 1000 - 1):
                    return graph.invoke(event["input"], config)
            ```

        Works the same around ``await graph.ainvoke(...)``. Zero or less (less than the
        margin left) means no retry at all: each request is still sent once.

        Raises:
            ConfigurationError: ``seconds`` is not a number.
        """
        return retry_deadline(seconds)

    # -- lifecycle -------------------------------------------------------------
    def setup(self) -> None:
        """Create the bucket and the table when missing; check the table's shape when present.

        With a [Replica][s3_saver.Replica], a bucket created here has versioning on
        (replication needs it). Idempotent. Needs broader rights than normal operation (``s3:CreateBucket``,
        ``dynamodb:CreateTable``...): run it from a deploy step, not from every Lambda.

        DynamoDB index: it also moves the thread listing and run hints of a
        table written by an earlier version (one partition each) into their
        shards; resumable, a run on a moved table reads two empty pages.

        Manifest index: it also reads the bucket's versioning. On a versioned bucket
        this saver then writes manifest heads without bodies, sealed twice as often
        (each replaced head stays as a noncurrent version; a saver that never runs
        ``setup()`` does the same from its first head write on), and it logs a
        warning when no lifecycle rule expires noncurrent versions under the
        manifest prefix.

        Both: it records the prefix's index mode (a marker object under
        ``live/``, written once), after refusing a prefix of the other mode.

        Raises:
            SetupMismatchError: The table exists with another key schema.
            IndexModeMismatchError: The bucket prefix belongs to the other index mode.
        """
        self._sync.run(setup.setup(self._ctx, self.region_name, self.replica is not None))

    async def asetup(self) -> None:
        """Async version of [setup()][s3_saver.S3Saver.setup]."""
        await self._async.run(setup.setup(self._ctx, self.region_name, self.replica is not None))

    def check(self) -> None:
        """Check that the bucket exists, that its prefix is of this saver's index
        mode and that it owns the table's prefix (an admin call: a few round trips).

        The command line runs it before each command: the index alone can
        answer for a bucket that is gone, a prefix of the other index mode, or
        another bucket's table.

        Raises:
            BucketNotFoundError: The bucket does not exist.
            IndexModeMismatchError: The bucket prefix belongs to the other index mode.
            TableOwnedError: The table's prefix belongs to another bucket.
        """
        self._sync.run(setup.check(self._ctx))

    def close(self) -> None:
        """Release the sync driver's thread pool and the boto3 clients the saver created."""
        self._sync.close(keep=self._given_clients)

    async def aclose(self) -> None:
        """Close the async clients of the running event loop."""
        await self._async.aclose()

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

