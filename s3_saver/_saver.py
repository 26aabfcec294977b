"""S3Saver: the public checkpointer. Each method is one line: an operation and a driver."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from datetime import timedelta
from typing import Any

from botocore.config import Config
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from s3_saver._clients import Clients
from s3_saver._clients import client_config as merged_config
from s3_saver._drivers.aio import AsyncDriver
from s3_saver._drivers.sync import SyncDriver
from s3_saver._index.dynamodb import DynamoIndex
from s3_saver._index.manifest import ManifestIndex
from s3_saver._keys import KeyLayout
from s3_saver._ops import copy, delete, delta, prune, put, read, rebuild, setup, threads
from s3_saver._ops.threads import ThreadInfo
from s3_saver._ops.context import Context
from s3_saver._protocol import RequestStats
from s3_saver._retry import RetryPolicy
from s3_saver._retry import deadline as retry_deadline
from s3_saver._s3 import S3Calls
from s3_saver.errors import ConfigurationError, Where

DEFAULT_INLINE_THRESHOLD = 64 * 1024


def _check_options(options: dict[str, Any]) -> None:
    """Refuse wrongly typed options by name, before they fail somewhere deeper."""

    def refuse(name: str, wanted: str) -> None:
        value = options[name]
        raise ConfigurationError(f"{name} must be {wanted}, got {type(value).__name__}: {value!r}")

    if not isinstance(options["bucket"], str) or not options["bucket"]:
        refuse("bucket", "a non-empty string")
    if options["table"] is not None and (not isinstance(options["table"], str) or not options["table"]):
        refuse("table", "a non-empty DynamoDB table name, or None for the manifest index in the bucket")
    if not isinstance(options["prefix"], str):
        refuse("prefix", "a string")
    for name in ("region_name", "endpoint_url", "s3_endpoint_url", "dynamodb_endpoint_url"):
        value = options[name]
        if value is not None and (not isinstance(value, str) or not value):
            refuse(name, "a non-empty string or None")
    for name in ("endpoint_url", "s3_endpoint_url", "dynamodb_endpoint_url"):
        value = options[name]
        if value is not None and not value.startswith(("http://", "https://")):
            refuse(name, "an http:// or https:// URL")
    if options["client_config"] is not None and not isinstance(options["client_config"], Config):
        refuse("client_config", "a botocore.config.Config or None")
    ttl = options["ttl"]
    if ttl is not None and (not isinstance(ttl, timedelta) or ttl.total_seconds() < 1):
        refuse("ttl", "a datetime.timedelta of at least one second, or None")
    if options["retry"] is not None and not isinstance(options["retry"], RetryPolicy):
        refuse("retry", "an s3_saver.RetryPolicy or None")
    for name, least in (("inline_threshold", 0), ("max_concurrency", 1)):
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            refuse(name, f"an int >= {least}")


class S3Saver(BaseCheckpointSaver[str], AbstractContextManager, AbstractAsyncContextManager):
    """A LangGraph checkpointer that keeps state in S3 as immutable objects, found through an index.

    Checkpoints, channel values and pending writes are immutable S3 objects
    (written with ``IfNoneMatch="*"``). The index orders them, so "latest",
    history and ``list`` never list the bucket: a DynamoDB table (``table=``), or
    with no table a manifest per thread in the bucket itself (a small head
    replaced by compare-and-swap, and sealed segments), for S3-compatible stores
    without a database. The same object serves ``graph.invoke`` (boto3) and
    ``graph.ainvoke`` (aioboto3, from the ``async`` extra).

    Constructing a saver makes no network call; run :meth:`setup` once (or deploy
    ``infra/``) to create the bucket and table.

    Example:
        ```python
        from s3_saver import S3Saver

        saver = S3Saver("my-bucket", table="langgraph-checkpoints", region_name="us-east-1")
        saver.setup()
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "t-1"}})
        ```

    Args:
        bucket: S3 bucket name.
        table: DynamoDB table name for the index; None (the default) keeps the
            index in the bucket (manifest mode: no database, needs a store that
            honours conditional writes, which :meth:`setup` checks).
        prefix: Key prefix inside the bucket (several savers can share a bucket).
        region_name: AWS region for the clients the saver creates.
        endpoint_url: Endpoint for both services (moto, LocalStack...). Use
            ``s3_endpoint_url`` / ``dynamodb_endpoint_url`` to set them apart.
        s3_endpoint_url: Endpoint for S3 only (MinIO, R2, SeaweedFS...).
        dynamodb_endpoint_url: Endpoint for DynamoDB only.
        boto3_session: Session the sync clients are created from.
        s3_client: A ready boto3 S3 client (not closed by :meth:`close`).
        dynamodb_client: A ready boto3 DynamoDB client (not closed by :meth:`close`).
        aioboto3_session: Session the async clients are created from. By default
            they get the endpoint, region, config and credentials of the sync
            clients (given or made from ``boto3_session``); credentials that refresh
            themselves outside a named profile cannot be copied, and the first
            async call then asks for this argument.
        client_config: ``botocore.config.Config`` merged over the saver's defaults
            (standard retry mode with 3 attempts in total, 2 s connect and 15 s read
            timeouts); its ``retries`` and ``s3`` dicts are merged key by key.
        serde: Serializer for checkpoints, metadata and values; its type tag is
            stored with every value.
        ttl: A thread untouched this long expires: every index item carries
            ``expires_at`` = its write time + ``ttl`` and is never served after
            it. Pair it with an S3 lifecycle expiration of at least 1.5 x ``ttl``
            on the ``live/`` prefix (values are stored again once half a ``ttl`` old).
        inline_threshold: Values up to this many serialized bytes are stored inside
            the checkpoint object (and so its index item); larger values get their
            own object.
        max_concurrency: Threads the sync driver uses to send one wave of requests.
        retry: How calls that failed transiently (no answer, a timeout, a 5xx,
            throttling) are sent again, the same for sync and async: by default
            4 attempts with jittered backoff (0.1 s doubling, at most 2 s), no
            backoff ending more than 10 s after a call's first attempt. See
            also :meth:`deadline`.
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
        inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
        max_concurrency: int = 16,
        retry: RetryPolicy | None = None,
    ) -> None:
        super().__init__(serde=serde)
        _check_options(locals())
        self.bucket = bucket
        self.table = table
        self.region_name = region_name
        self.stats = RequestStats()
        """Round trips and requests sent so far, by both drivers (see :class:`RequestStats`)."""
        endpoints = {
            "s3": s3_endpoint_url or endpoint_url,
            "dynamodb": dynamodb_endpoint_url or endpoint_url,
        }
        where = Where(bucket, table)
        layout = KeyLayout(prefix)
        s3_calls = S3Calls(bucket, where)
        self._base_ctx = Context(
            layout=layout,
            s3=s3_calls,
            index=DynamoIndex(table, layout, where) if table else ManifestIndex(s3_calls, layout),
            serde=self.serde,
            inline_threshold=inline_threshold,
            ttl_seconds=int(ttl.total_seconds()) if ttl else None,
        )
        config = merged_config(client_config, max_concurrency=max_concurrency, path_style=bool(endpoints["s3"]))
        given = {"s3": s3_client, "dynamodb": dynamodb_client}
        self._given_clients = [c for c in given.values() if c is not None]
        clients = Clients(
            where=where,
            region_name=region_name,
            endpoints=endpoints,
            config=config,
            boto3_session=boto3_session,
            given=given,
            aioboto3_session=aioboto3_session,
        )
        policy = retry if retry is not None else RetryPolicy()
        self._sync = SyncDriver(clients.make_sync, self.stats, max_concurrency, policy)
        self._async = AsyncDriver(clients.make_async, self.stats, policy)

    @property
    def _ctx(self) -> Context:
        """The operations' context, with this object's serializer.

        ``with_allowlist`` (and ``copy.copy``) make a shallow copy and give it
        its own ``serde``: the copy must use it, while sharing the clients and
        caches of the original.
        """
        ctx = self._base_ctx
        if ctx.serde is not self.serde:
            ctx = self._base_ctx = dataclasses.replace(ctx, serde=self.serde)
        return ctx

    def deadline(self, seconds: float) -> AbstractContextManager[None]:
        """Within this block, the saver starts no retry that would end more than
        ``seconds`` from now: tie it to a Lambda's remaining time.

        Example:
            ```python
            def handler(event, context):
                with saver.deadline(context.get_remaining_time_in_millis() / 1000 - 1):
                    return graph.invoke(event["input"], config)
            ```

        Works the same around ``await graph.ainvoke(...)``.
        """
        return retry_deadline(seconds)

    # -- lifecycle -------------------------------------------------------------
    def setup(self) -> None:
        """Create the bucket and the table when missing; check the table's shape when present.

        Idempotent. Needs broader rights than normal operation (``s3:CreateBucket``,
        ``dynamodb:CreateTable``...): run it from a deploy step, not from every Lambda.

        Raises:
            SetupMismatchError: The table exists with another key schema.
        """
        self._sync.run(setup.setup(self._ctx, self.region_name))

    async def asetup(self) -> None:
        """Async version of :meth:`setup`."""
        await self._async.run(setup.setup(self._ctx, self.region_name))

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

    # -- BaseCheckpointSaver ---------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Fetch a checkpoint (the latest of the thread/namespace without ``checkpoint_id``).

        Args:
            config: ``{"configurable": {"thread_id", "checkpoint_ns"?, "checkpoint_id"?}}``.

        Returns:
            The checkpoint tuple with channel values and pending writes, or None.
        """
        return self._sync.run(read.get_tuple(self._ctx, config))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async version of :meth:`get_tuple`."""
        return await self._async.run(read.get_tuple(self._ctx, config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """List checkpoints newest first.

        Args:
            config: Thread (and optionally namespace) to list. Without
                ``checkpoint_ns`` every namespace is listed, newest first within
                each namespace, namespaces in descending key order (so subgraph
                namespaces come before the root's); ``None`` lists every thread
                (a table scan: for admin use).
            filter: Metadata equality filter: every key must be present with an
                equal JSON value. Bools are not numbers (``True`` does not match
                ``1``), numbers compare as numbers (``1`` matches ``1.0``), lists and
                dicts compare whole by the same rules, and ``None`` matches only a
                present null.
            before: Only checkpoints older than this config's ``checkpoint_id``.
            limit: At most this many results (after filtering).

        Yields:
            Checkpoint tuples.
        """
        return self._sync.iterate(read.list_checkpoints(self._ctx, config, filter, before, limit))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async version of :meth:`list`."""
        async for item in self._async.iterate(read.list_checkpoints(self._ctx, config, filter, before, limit)):
            yield item

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint: its objects first, then its index item.

        Only channels in ``new_versions`` are stored; the others point at the
        object that already holds their version.

        Returns:
            The config of the stored checkpoint.

        Raises:
            ThreadDeletedError: The thread was deleted after the parent checkpoint
                was written (a run in flight cannot bring it back); its subclass
                RunDeletedError: this run was deleted by ``delete_for_runs``.
            KeyTooLongError: The ids leave no room for the keys the thread needs.
        """
        return self._sync.run(put.put(self._ctx, config, checkpoint, metadata, new_versions))

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async version of :meth:`put`."""
        return await self._async.run(put.put(self._ctx, config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for the checkpoint in ``config``.

        Regular writes are first-write-wins per ``(task_id, index)``; the special
        channels of ``WRITES_IDX_MAP`` (errors, interrupts, resumes) last-write-wins,
        both in the order the index commits them (never by a clock). Writes may
        arrive before their checkpoint is stored.

        Raises:
            ThreadDeletedError: The thread was deleted after the checkpoint was written.
        """
        self._sync.run(put.put_writes(self._ctx, config, writes, task_id, task_path))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async version of :meth:`put_writes`."""
        await self._async.run(put.put_writes(self._ctx, config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and pending write of a thread (all namespaces).

        Tombstones go in first: from the first request on, a run of the thread
        still in flight elsewhere cannot continue it (its writes raise
        :class:`~s3_saver.ThreadDeletedError`), and each namespace reads as
        empty before anything of it is deleted. A delete cut short (a Lambda
        timeout) never leaves a half-readable thread; calling it again finishes
        it. The thread id can then be used again by a run that starts afresh.
        """
        self._sync.run(delete.delete_thread(self._ctx, thread_id))

    async def adelete_thread(self, thread_id: str) -> None:
        """Async version of :meth:`delete_thread`."""
        await self._async.run(delete.delete_thread(self._ctx, thread_id))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, value and pending write of a thread into another thread.

        Objects are copied server-side (``CopyObject``), all of them before the
        first index item; index items follow newest first. A copy cut short
        leaves the target's latest state readable and completes when called
        again: the target may hold copies from the same source, nothing else.

        Raises:
            ConfigurationError: The target thread has checkpoints of its own.
        """
        self._sync.run(copy.copy_thread(self._ctx, source_thread_id, target_thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async version of :meth:`copy_thread`."""
        await self._async.run(copy.copy_thread(self._ctx, source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest", keep_last: int | None = None) -> None:
        """Remove older checkpoints of threads, with their pending writes and objects.

        ``keep_latest`` keeps the newest checkpoint of each namespace (the newest
        ``keep_last`` with ``keep_last``); ``delete`` removes the threads (as
        :meth:`delete_thread`). What a kept checkpoint still reads stays, hidden
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
            strategy: ``"keep_latest"`` or ``"delete"``.
            keep_last: With ``keep_latest``, how many checkpoints to keep per namespace.

        Raises:
            ConfigurationError: Wrong arguments (nothing is removed).
        """
        self._sync.run(prune.prune(self._ctx, thread_ids, strategy, keep_last))

    async def aprune(
        self, thread_ids: Sequence[str], *, strategy: str = "keep_latest", keep_last: int | None = None
    ) -> None:
        """Async version of :meth:`prune`."""
        await self._async.run(prune.prune(self._ctx, thread_ids, strategy, keep_last))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete every checkpoint (every thread and namespace) whose metadata
        ``run_id`` is one of ``run_ids``, with its pending writes and objects.

        Runs are found through the index (each put of a new run records which
        thread it wrote to), never by scanning. Checkpoints of other runs that
        read through a deleted one (unchanged values, a ``DeltaChannel``'s
        writes) stay readable: what they need stays, hidden.

        A run still in flight is marked deleted first: its next ``put`` raises
        :class:`~s3_saver.RunDeletedError` and leaves nothing behind.

        Args:
            run_ids: The run ids (a list: a bare string is refused).
        """
        self._sync.run(prune.delete_for_runs(self._ctx, run_ids))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async version of :meth:`delete_for_runs`."""
        await self._async.run(prune.delete_for_runs(self._ctx, run_ids))

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
            filter: Metadata of the latest checkpoint must match (as in :meth:`list`).
            limit: At most this many threads.
            before: Only threads created before this one (a ``ThreadInfo`` from
                an earlier page, a thread id, or a config naming one): pagination.

        Yields:
            :class:`ThreadInfo` for each thread.
        """
        return self._sync.iterate(threads.list_threads(self._ctx, filter, limit, before))

    async def alist_threads(
        self,
        *,
        filter: dict[str, Any] | None = None,
        limit: int | None = None,
        before: ThreadInfo | str | RunnableConfig | None = None,
    ) -> AsyncIterator[ThreadInfo]:
        """Async version of :meth:`list_threads`."""
        async for item in self._async.iterate(threads.list_threads(self._ctx, filter, limit, before)):
            yield item

    def rebuild_index(self, thread_id: str | None = None) -> int:
        """Rebuild the index from the bucket: for one thread, or every thread under the prefix.

        The admin path for an index that was lost or damaged (a table deleted,
        a manifest removed, a replica bucket in another region): it lists the
        bucket and reads every object of the threads, so every read afterwards
        equals the reads before the index was lost. Run it while no writer works
        on those threads. What a surviving tombstone deleted stays deleted.

        Returns:
            How many checkpoints were indexed.
        """
        return self._sync.run(rebuild.rebuild_index(self._ctx, thread_id))

    async def arebuild_index(self, thread_id: str | None = None) -> int:
        """Async version of :meth:`rebuild_index`."""
        return await self._async.run(rebuild.rebuild_index(self._ctx, thread_id))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Writes and seed of each channel along the parent chain (for ``DeltaChannel``).

        Reads the chain as one index range instead of one ``get_tuple`` per
        ancestor, then fetches the seeds in one more wave.
        """
        return self._sync.run(delta.delta_channel_history(self._ctx, config, channels))

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Async version of :meth:`get_delta_channel_history`."""
        return await self._async.run(delta.delta_channel_history(self._ctx, config, channels))

    def get_next_version(self, current: str | None, channel: None = None) -> str:
        """Next channel version: a zero-padded counter plus a random part.

        Monotonic, and unique across forks of one thread (two branches bumping the
        same version get different strings), so a (channel, version) key is never
        written with two different values.
        """
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"
