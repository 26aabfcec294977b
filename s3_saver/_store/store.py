"""S3Store: LangGraph's ``BaseStore`` (long-term memory) on S3.

A facade: ``batch``/``abatch`` check and shape the ops (``prepare``: nothing is sent
when an op is refused), run the embedder (the user's code: ``embed_documents`` and
``embed_query`` on the sync path, their ``a*`` forms on the async one), then run one
operation (``_ops/memory/batch``) on the sync or the async driver. The convenience
methods (``get``, ``put``, ``search``, ``list_namespaces``... and their ``a*`` forms)
are BaseStore's, over ``batch``/``abatch``.

Both index modes: the bucket alone (``_index/manifest/memory``) and the saver's table
(``_index/dynamodb/memory``); each module says what it costs and what it does not do yet.
Export and import are the ``Transfer`` mixin's (``transfer``), erase and the TTL sweep the
``Upkeep`` mixin's (``upkeep``).

Regions: a store made by ``from_saver`` lives in its saver's regions, read at each call
(``_home``): its batches of reads alone go through the saver's ``Route`` (the primary,
then the replica when the primary is unavailable, lag-safe), everything else to the region
written to; the saver's ``promote()`` moves it. Each region has its own memory index
(``_memories``, by site), so caches and hints of one never stand for the other's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import replace
from typing import Any

from botocore.config import Config
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.store.base import (
    BaseStore,
    IndexConfig,
    Op,
    Result,
    TTLConfig,
    ensure_embeddings,
)

from s3_saver._crypto.config import Encryption, KmsKey, check_encryption
from s3_saver._format.memory import rows
from s3_saver._format.memory import ttl as ttl_core
from s3_saver._ops import setup
from s3_saver._ops.context import Context
from s3_saver._ops.memory import embedding
from s3_saver._ops.memory.batch import batch
from s3_saver._ops.memory.context import Memory
from s3_saver._ops.memory.prepare import Prepared, prepare, query_vectors
from s3_saver._ops.source import ReadSource
from s3_saver._regions.memory import memory_index, memory_site
from s3_saver._store.encrypting import Encrypting
from s3_saver._store.transfer import Transfer
from s3_saver._store.upkeep import Upkeep
from s3_saver._transport.aio import AsyncDriver
from s3_saver._transport.budget import CacheBudget, CacheStats, default_bytes
from s3_saver._transport.protocol import PRIMARY, RequestStats, T
from s3_saver._transport.protocol import Op as Operation
from s3_saver._transport.retry import RetryPolicy
from s3_saver._transport.sync import SyncDriver
from s3_saver.errors import ConfigurationError


class S3Store(Transfer, Upkeep, Encrypting, BaseStore, AbstractContextManager, AbstractAsyncContextManager):
    """Long-term memory (LangGraph's ``BaseStore``) in an S3 bucket, with no database.

    With no ``table`` (manifest mode, no database), items live in the bucket under
    ``<prefix>memory/``: per namespace one head holding its newest items, replaced by
    compare-and-swap (older items sealed into immutable segments past 256 KiB, 32 KiB
    on a versioned bucket), and a registry of namespaces for ``list_namespaces`` and prefix
    searches. With a ``table`` (the saver's DynamoDB table), each item is a table item
    and the registry a partition of the table. A saver and a store may share a bucket,
    a table and a prefix (a prefix belongs to one index mode: both must use the same).

    Args:
        bucket: S3 bucket name.
        table: The DynamoDB table (the saver's); None: the manifest mode, no database.
        prefix: Key prefix inside the bucket (as the saver's).
        region_name: AWS region of the clients the store creates.
        endpoint_url: Endpoint of S3 and DynamoDB (moto, LocalStack, MinIO...).
        s3_endpoint_url: Endpoint of S3; takes precedence over ``endpoint_url``.
        dynamodb_endpoint_url: Endpoint of DynamoDB; takes precedence over ``endpoint_url``.
        boto3_session: Session the sync clients are created from.
        s3_client: A ready boto3 S3 client (not closed by ``close()``).
        dynamodb_client: A ready boto3 DynamoDB client (not closed by ``close()``).
        aioboto3_session: Session the async clients are created from.
        client_config: ``botocore.config.Config`` merged over the defaults, as for
            [S3Saver][s3_saver.S3Saver].
        max_concurrency: Requests one call sends at once, at most.
        retry: How failed requests are retried ([RetryPolicy][s3_saver.RetryPolicy]).
        serde: Serializer of the values (``JsonPlusSerializer`` by default).
        index: ``IndexConfig(dims, embed, fields)`` for semantic search: items are
            embedded on put, vectors kept beside them, scored by exact cosine.
        ttl: ``TTLConfig``: ``default_ttl`` (minutes), ``refresh_on_read``,
            ``sweep_interval_minutes`` (``start_ttl_sweeper``'s). An expired item is never
            returned; ``sweep_ttl`` removes its bytes.
        refresh_slack: A read refreshes an item's expiry only once less than
            ``ttl x (1 - refresh_slack)`` remains (0: at every read).
        vector_dtype: ``"float64"`` (scores equal InMemoryStore's) or ``"float32"``.
        cache_bytes: The memory budget of the store's caches (as the saver's).
        clock: The store's clock (tests inject one).
        encryption: ``KmsKey(...)`` or ``LocalKey(...)``: every item's value and vectors
            encrypted under a data key of its namespace's own, kept in the key store
            (as a saver's threads: ``<bucket>-keys`` unless ``key_bucket=``), so that
            ``erase_namespace`` makes every copy unreadable. Item keys stay readable
            (use opaque ones). ``setup()`` creates the key store. See the encryption guide.
    """

    supports_ttl = True

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
        serde: Any = None,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        refresh_slack: float = 0.1,  # ttl.DEFAULT_REFRESH_SLACK, spelled out for the API page
        vector_dtype: str = "float64",
        max_concurrency: int = 16,
        retry: RetryPolicy | None = None,
        cache_bytes: int | None = None,
        clock: ttl_core.Clock | None = None,
        encryption: Encryption | None = None,
    ) -> None:
        check_encryption(encryption)
        self._settings(serde, index, ttl, vector_dtype, clock)
        self.stats = RequestStats()
        """Round trips and requests sent so far, by both drivers."""
        site, ctx, index_backend = memory_site(
            bucket,
            table,
            prefix=prefix,
            region_name=region_name,
            endpoints={
                "s3": s3_endpoint_url or endpoint_url,
                "dynamodb": dynamodb_endpoint_url or endpoint_url,
                "kms": (encryption.endpoint_url if isinstance(encryption, KmsKey) else None) or endpoint_url,
            },
            given={"s3": s3_client, "dynamodb": dynamodb_client},
            boto3_session=boto3_session,
            aioboto3_session=aioboto3_session,
            client_config=client_config,
            max_concurrency=max_concurrency,
            serde=self.serde,
            budget=CacheBudget(cache_bytes if cache_bytes is not None else default_bytes()),
            clock=self.clock,
            encryption=encryption,
        )
        self._home: Any = _Alone(ctx, bucket, table, region_name)
        self._site = site
        self._memories = {site.key: self._memory_of(ctx, index_backend, refresh_slack, vector_dtype)}
        policy = retry if retry is not None else RetryPolicy()
        # Checked on the first wave to the site, as the saver's: the prefix's index mode,
        # and (DynamoDB mode) that the table's prefix belongs to this bucket.
        marks = lambda _: site.mode
        owners = lambda _: site.owner
        self._sync = SyncDriver(
            lambda service, _: site.clients.make_sync(service), self.stats, max_concurrency, policy, owners, marks
        )
        self._async = AsyncDriver(lambda service, _: site.clients.make_async(service), self.stats, policy, owners, marks)
        self._owned = True  # the drivers and clients are this store's (not a saver's)

    @classmethod
    def from_saver(
        cls,
        saver: Any,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        refresh_slack: float = 0.1,  # ttl.DEFAULT_REFRESH_SLACK, spelled out for the API page
        vector_dtype: str = "float64",
        clock: ttl_core.Clock | None = None,
    ) -> S3Store:
        """A store on an ``S3Saver``'s bucket, table and prefix, in its index mode.

        It shares the saver's clients, drivers, request counts (``stats``), cache
        budget, the checks its first calls made (index mode, table owner) and its
        serializer (an ``EncryptedSerializer`` covers memory too); the saver's
        ``setup()`` is the store's. Closing the store closes nothing of the saver's.

        With a [Replica][s3_saver.Replica], it lives in the saver's regions: ``get``,
        ``search``, ``list_namespaces`` (a batch of reads alone) fall over to the replica
        when the primary is unavailable, as the saver's reads do, lag-safe: an item whose
        value object has not arrived there raises
        [ReplicationLagError][s3_saver.errors.ReplicationLagError], and ``last_read``
        says where a read was served from. A read served by the replica refreshes no
        expiry. Writes never fall over: they raise
        [PrimaryUnavailableError][s3_saver.errors.PrimaryUnavailableError] until
        [promote()][s3_saver.S3Saver.promote], which moves the store with the saver.

        Raises:
            ConfigurationError: The saver keeps its index in DynamoDB and its replica
                region's table is not a global table's replica (``Replica(global_table=False)``):
                memory items live in the table, and that one is filled only by
                ``promote()``'s rebuild from the bucket, which holds none of them.
        """
        route = getattr(saver, "_route", None)
        if route is not None and not route.replicated:
            # Nothing in the replica region could answer a read, and a promote would
            # leave every item behind in the primary's table.
            reader = route.reader
            raise ConfigurationError(
                f"S3Store.from_saver: memory items live in DynamoDB table {saver.table!r}, and the saver's replica "
                f"region {reader.clients.region_name or '(AWS default)'} has table {reader.where.table!r}, which "
                "promote() fills by a rebuild from the bucket: it would hold no memory item. Make the table a "
                "global table with a replica there (Replica(..., global_table=True)), or keep memory in the bucket "
                "(a saver without table=)"
            )
        store = cls.__new__(cls)
        store._settings(saver.serde, index, ttl, vector_dtype, clock)
        store.stats = saver.stats
        # The saver's regions, read at each call: its promote() moves the store too.
        store._home = saver
        store._site = saver._sites[PRIMARY]
        contexts = [saver._ctx] + ([saver._other_ctx] if route is not None else [])
        store._memories = {
            ctx.s3.where.site: store._memory_of(
                ctx, memory_index(ctx, ctx.s3.where, ctx.s3.where.table, store.clock), refresh_slack, vector_dtype
            )
            for ctx in contexts
        }
        store._sync, store._async = saver._sync, saver._async
        store._owned = False
        return store

    def _settings(
        self, serde: Any, index: IndexConfig | None, ttl: TTLConfig | None, vector_dtype: str, clock: ttl_core.Clock | None
    ) -> None:
        if vector_dtype not in rows.DTYPES:
            raise ConfigurationError(f"vector_dtype must be one of {sorted(rows.DTYPES)}, got {vector_dtype!r}")
        self.ttl_config = ttl_core.check_ttl_config(ttl)
        self.serde = serde if serde is not None else JsonPlusSerializer()
        self.clock = clock or ttl_core.PROCESS_CLOCK
        self.index_config = dict(index) if index else None  # as InMemoryStore's (LangGraph's tests read it)
        self.embeddings = ensure_embeddings(index.get("embed")) if index else None
        self._fields = embedding.tokenized_fields(index) if index else None
        self._dims = embedding.check_dims(index) if index else 0
        self._sweeper: threading.Thread | None = None
        self._sweeper_stop = threading.Event()

    def _memory_of(self, ctx: Context, index: Any, refresh_slack: float, vector_dtype: str) -> Memory:
        slack = ttl_core.check_slack(refresh_slack)
        crypt = ctx.crypt.for_memory() if ctx.crypt is not None else None
        return Memory(index, ctx.s3, self.serde, self.clock, self.ttl_config, slack, self._dims, vector_dtype, crypt=crypt)

    # -- regions -----------------------------------------------------------------------

    @property
    def bucket(self) -> str:
        """The bucket written to (after the saver's ``promote()``, the promoted region's)."""
        return str(self._home.bucket)

    @property
    def table(self) -> str | None:
        """The DynamoDB table written to; None in manifest mode."""
        return self._home.table  # type: ignore[no-any-return]

    @property
    def region_name(self) -> str | None:
        """The region written to, as configured (None: the AWS default)."""
        return self._home.region_name  # type: ignore[no-any-return]

    @property
    def last_read(self) -> ReadSource | None:
        """Where the last read of this thread (or asyncio task) was served from.

        Set by the reads of a store made by ``from_saver`` from a saver with a
        [Replica][s3_saver.Replica] (None otherwise), and shared with the saver's own
        reads (its ``last_read``): ``site`` is ``"replica"`` when the primary failed.
        """
        route = self._home._route
        return route.source.get() if route is not None else None

    @property
    def _ctx(self) -> Context:
        """The context of the region written to."""
        return self._home._ctx  # type: ignore[no-any-return]

    @property
    def _memory(self) -> Memory:
        """What the operations that write (or are admin calls) run on: the region written to."""
        return self._memory_at(self._ctx)

    @property
    def _replicas(self) -> list[Memory]:
        """The memory of the other region (a saver with a ``Replica``; none after its
        promote() when the region given up is not one any more): what an erase also erases
        in, as the saver's ``erase_thread`` does."""
        if self._home._route is None or self._home.replica is None:
            return []
        return [self._memories[self._home._other_ctx.s3.where.site]]

    def _memory_at(self, ctx: Context) -> Memory:
        """The memory of the region ``ctx`` reads, lag-safe when ``ctx`` is (``Route.as_reader``)."""
        memory = self._memories[ctx.s3.where.site]
        return replace(memory, reads=ctx.replica) if ctx.replica is not None else memory

    def _run(self, make: Callable[[Memory], Operation[T]], reads_only: bool) -> tuple[Operation[T], Any]:
        """The operation and its driver's retry policy: a batch of reads alone routed as the
        saver's reads (the primary first, the replica when it is unavailable), anything
        that writes on the region written to (never over: ``PrimaryUnavailableError``)."""
        if not reads_only:
            return make(self._memory), None
        return self._home._reading(lambda ctx: make(self._memory_at(ctx)))  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        # As the saver's: what tells two stores apart in a log line, never credentials.
        index = f"table={self.table!r}" if self.table is not None else "index='manifest'"
        parts = [repr(self.bucket), index, f"prefix={self._ctx.layout.prefix!r}"]
        return f"S3Store({', '.join(parts)})"

    # -- BaseStore ---------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        prepared = self._prepare(ops)
        queries: dict[str, list[float]] = {}
        vectors = None
        if self.embeddings is not None:
            if prepared.queries:
                answers = [self.embeddings.embed_query(q) for q in prepared.queries]
                queries = query_vectors(prepared.queries, answers, self._dims)
            if prepared.texts.texts:
                vectors = self._vectors(prepared, self.embeddings.embed_documents(prepared.texts.texts))
        return self._sync.run(*self._run(lambda mem: batch(mem, prepared, queries, vectors), not prepared.puts))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        prepared = self._prepare(ops)
        queries: dict[str, list[float]] = {}
        vectors = None
        if self.embeddings is not None:
            if prepared.queries:
                answers = await asyncio.gather(*(self.embeddings.aembed_query(q) for q in prepared.queries))
                queries = query_vectors(prepared.queries, list(answers), self._dims)
            if prepared.texts.texts:
                vectors = self._vectors(prepared, await self.embeddings.aembed_documents(prepared.texts.texts))
        return await self._async.run(*self._run(lambda mem: batch(mem, prepared, queries, vectors), not prepared.puts))

    def _prepare(self, ops: Iterable[Op]) -> Prepared:
        return prepare(ops, serde=self.serde, fields=self._fields, ttl_config=self.ttl_config)

    def _vectors(self, prepared: Prepared, answers: list[Any]) -> list[dict[str, list[float]]]:
        return embedding.vectors_for_puts(prepared.texts, answers, self._dims, [(p.namespace, p.key) for p in prepared.puts])

    # -- lifecycle ---------------------------------------------------------------------

    def setup(self) -> None:
        """Create the bucket (and the table) when missing, check them, and record the
        prefix's index mode (as ``S3Saver.setup()``)."""
        self._sync.run(setup.setup(self._ctx, self.region_name))

    async def asetup(self) -> None:
        """Async version of ``setup()``."""
        await self._async.run(setup.setup(self._ctx, self.region_name))

    def cache_stats(self) -> CacheStats:
        """What the store's caches hold now, within its budget (no request)."""
        return self._ctx.budget.stats()

    def close(self) -> None:
        """Stop the TTL sweeper (after the run under way), release the sync driver's thread
        pool and the boto3 clients the store created (none for a store made by
        ``from_saver``: they are the saver's)."""
        self.stop_ttl_sweeper()
        if self._owned:
            self._sync.close(keep=self._site.given)

    async def aclose(self) -> None:
        """Close the async clients of the running event loop (the store's own)."""
        if self._owned:
            await self._async.aclose()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _Alone:
    """A standalone store's one region, in the shape of a saver's regions (``from_saver``'s
    ``_home``): read and written there, no route."""

    _route = None

    def __init__(self, ctx: Context, bucket: str, table: str | None, region_name: str | None) -> None:
        self._ctx, self.bucket, self.table, self.region_name = ctx, bucket, table, region_name

    def _reading(self, make: Callable[[Context], Operation[T]]) -> tuple[Operation[T], None]:
        return make(self._ctx), None
