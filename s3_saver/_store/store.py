"""S3Store: LangGraph's ``BaseStore`` (long-term memory) on S3.

A facade: ``batch``/``abatch`` check and shape the ops (``prepare``: nothing is sent
when an op is refused), run the embedder (the user's code: ``embed_documents`` and
``embed_query`` on the sync path, their ``a*`` forms on the async one), then run one
operation (``_ops/memory/batch``) on the sync or the async driver. The convenience
methods (``get``, ``put``, ``search``, ``list_namespaces``... and their ``a*`` forms)
are BaseStore's, over ``batch``/``abatch``.

Both index modes: the bucket alone (``_index/manifest/memory``) and the saver's table
(``_index/dynamodb/memory``); each module says what it costs and what it does not do yet.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Iterable
from dataclasses import replace
from contextlib import AbstractAsyncContextManager, AbstractContextManager
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

from s3_saver._format.memory import rows
from s3_saver._format.memory.export import ExportedItem, MemoryExport, decode_export, encode_export
from s3_saver._format.memory.names import check_labels, registry_key, show
from s3_saver._format.memory import ttl as ttl_core
from s3_saver._format.memory.names import check_labels, registry_bounds, show
from s3_saver._ops import setup
from s3_saver._ops.memory import embedding
from s3_saver._ops.memory.batch import Memory, batch
from s3_saver._ops.memory.erase import NamespaceEraseReport, erase_namespace
from s3_saver._ops.memory.prepare import Prepared, prepare, query_vectors
from s3_saver._ops.memory.transfer import MemoryImportReport, export_items, import_items
from s3_saver._ops.memory.sweep import sweep_ttl
from s3_saver._regions.memory import memory_index, memory_site
from s3_saver._transport.aio import AsyncDriver
from s3_saver._transport.budget import CacheBudget, CacheStats, default_bytes
from s3_saver._transport.protocol import PRIMARY, RequestStats
from s3_saver._transport.retry import RetryPolicy
from s3_saver._transport.sync import SyncDriver
from s3_saver.errors import ConfigurationError, CorruptObjectError

log = logging.getLogger("s3_saver")
DEFAULT_SWEEP_LIMIT = 1000
DEFAULT_SWEEP_INTERVAL = 5.0  # minutes, as PostgresStore's


class S3Store(BaseStore, AbstractContextManager, AbstractAsyncContextManager):
    """Long-term memory (LangGraph's ``BaseStore``) in an S3 bucket, with no database.

    With no ``table`` (manifest mode, no database), items live in the bucket under
    ``<prefix>memory/``: per namespace one head holding its items, replaced by
    compare-and-swap, and a registry of namespaces for ``list_namespaces`` and prefix
    searches. With a ``table`` (the saver's DynamoDB table), each item is a table item
    and the registry a partition of the table. A saver and a store may share a bucket,
    a table and a prefix (a prefix belongs to one index mode: both must use the same).

    Args:
        bucket: S3 bucket name.
        table: The DynamoDB table (the saver's); None: the manifest mode, no database.
        prefix: Key prefix inside the bucket (as the saver's).
        region_name, endpoint_url, s3_endpoint_url, dynamodb_endpoint_url, boto3_session,
            s3_client, dynamodb_client, aioboto3_session, client_config, max_concurrency,
            retry: as for ``S3Saver``.
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
    ) -> None:
        self._settings(serde, index, ttl, vector_dtype, clock)
        self.bucket = bucket
        self.stats = RequestStats()
        """Round trips and requests sent so far, by both drivers."""
        self.table = table
        site, self._ctx, index_backend = memory_site(
            bucket,
            table,
            prefix=prefix,
            region_name=region_name,
            endpoints={"s3": s3_endpoint_url or endpoint_url, "dynamodb": dynamodb_endpoint_url or endpoint_url},
            given={"s3": s3_client, "dynamodb": dynamodb_client},
            boto3_session=boto3_session,
            aioboto3_session=aioboto3_session,
            client_config=client_config,
            max_concurrency=max_concurrency,
            serde=self.serde,
            budget=CacheBudget(cache_bytes if cache_bytes is not None else default_bytes()),
            clock=self.clock,
        )
        self.region_name = region_name
        self._site = site
        self._memory = self._memory_of(index_backend, refresh_slack, vector_dtype)
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
        Reads go to the saver's primary region (they do not fall over to a replica yet).
        """
        store = cls.__new__(cls)
        store._settings(saver.serde, index, ttl, vector_dtype, clock)
        ctx = saver._ctx
        site = saver._sites[PRIMARY]
        store.bucket, store.table, store.region_name = saver.bucket, saver.table, saver.region_name
        store.stats = saver.stats
        store._ctx, store._site = ctx, site
        store._memory = store._memory_of(memory_index(ctx, site.where, saver.table, store.clock), refresh_slack, vector_dtype)
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

    def _memory_of(self, index: Any, refresh_slack: float, vector_dtype: str) -> Memory:
        slack = ttl_core.check_slack(refresh_slack)
        return Memory(index, self._ctx.s3, self.serde, self.clock, self.ttl_config, slack, self._dims, vector_dtype)

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
        return self._sync.run(batch(self._memory, prepared, queries, vectors))

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
        return await self._async.run(batch(self._memory, prepared, queries, vectors))

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

    # -- export, import ----------------------------------------------------------------

    def export_memory(self, prefix: tuple[str, ...] = ()) -> bytes:
        """Every item under a namespace prefix, as bytes (see [import_memory()][s3_saver.S3Store.import_memory]).

        The file holds each item's value as the store's serializer wrote it (an
        encrypting serializer's values stay encrypted), its `created_at`, `updated_at`
        and expiry, and its vectors; items already expired are left out. Namespaces are
        read one after another: writes landing meanwhile may or may not be in it. The
        whole export is built in memory.

        Args:
            prefix: The namespace prefix to export (`()`: every namespace).

        Returns:
            A JSON-lines document, versioned (`s3_saver.memory-export/1`).
        """
        prefix = self._export_prefix(prefix)
        return self._encode(prefix, self._sync.run(export_items(self._memory, prefix)))

    async def aexport_memory(self, prefix: tuple[str, ...] = ()) -> bytes:
        """Async version of [export_memory()][s3_saver.S3Store.export_memory]."""
        prefix = self._export_prefix(prefix)
        return self._encode(prefix, await self._async.run(export_items(self._memory, prefix)))

    def import_memory(self, data: bytes) -> MemoryImportReport:
        """Write the items of [export_memory()][s3_saver.S3Store.export_memory]'s bytes into this
        store: any bucket, prefix or index mode.

        Each item keeps its `created_at`, `updated_at` and expiry (expired ones are not
        written). An item the store holds already with the same times is left alone, so
        an import cut short is finished by running it again. An item it holds in another
        version is replaced; other items stay.

        The whole file is checked first (its format, every line, every value read by this
        store's serializer): a bad file writes nothing. Vectors: without an index, or with
        the index (`dims` and `fields`) the file's were made for, they are written as
        they are; with another index, this store's embedder computes them again.

        Args:
            data: The export.

        Returns:
            What was written, and what was already there or expired.

        Raises:
            CorruptObjectError: Not an export this store reads, a line it does not
                write, or a file cut short (each named by its line).
            SerializationError: A value this store's serializer cannot read.
        """
        items, texts, places = self._import_plan(data)
        vectors = self.embeddings.embed_documents(texts) if texts and self.embeddings is not None else []
        items, embedded = self._embedded(items, texts, places, vectors)
        report = self._sync.run(import_items(self._memory, items, self.clock.now()))
        return replace(report, embedded=embedded)

    async def aimport_memory(self, data: bytes) -> MemoryImportReport:
        """Async version of [import_memory()][s3_saver.S3Store.import_memory]."""
        items, texts, places = self._import_plan(data)
        vectors = await self.embeddings.aembed_documents(texts) if texts and self.embeddings is not None else []
        items, embedded = self._embedded(items, texts, places, vectors)
        report = await self._async.run(import_items(self._memory, items, self.clock.now()))
        return replace(report, embedded=embedded)

    def _index_signature(self) -> dict[str, Any] | None:
        """What an export's vectors were made for: the store's ``dims`` and ``fields``."""
        if self.index_config is None:
            return None
        return {"dims": self._dims, "fields": list(self.index_config.get("fields") or ["$"])}

    def _export_prefix(self, prefix: Any) -> tuple[str, ...]:
        prefix = check_labels(prefix, what="namespace prefix")
        registry_key(prefix)
        return prefix

    def _encode(self, prefix: tuple[str, ...], items: list[ExportedItem]) -> bytes:
        return encode_export(MemoryExport(prefix, self.clock.now(), self._index_signature(), items))

    def _import_plan(self, data: Any) -> tuple[list[ExportedItem], list[str], list[list[tuple[int, str]]]]:
        """The file's items, checked, and (when this store re-embeds them) the texts to embed
        and where each one's vector goes (``embedding.TextPlan``)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ConfigurationError(f"import_memory takes the bytes export_memory returned, got {type(data).__name__}")
        where = "the memory export given to import_memory"
        export = decode_export(bytes(data), where)
        values = []
        for item in export.items:
            at = f"{where}: namespace {show(item.namespace)}, key {show(item.key)}"
            # Read by this store's serializer before anything is written: a file written
            # with another serializer (or key) is refused whole, never stored unreadable.
            values.append(rows.unpack_value(self.serde, item.value, at))
        signature = self._index_signature()
        if signature is None or export.index == signature:
            items = [self._carried(item, where) for item in export.items]
            return items, [], []
        # Another index (or none) made the file's vectors: this store's fields and embedder decide.
        assert self._fields is not None
        plan = embedding.plan_texts([(value, None) for value in values], self._fields)
        return [replace(item, vectors=None) for item in export.items], plan.texts, plan.places

    def _carried(self, item: ExportedItem, where: str) -> ExportedItem:
        """An item's vectors as the file holds them; with an index, in its ``dims`` and
        this store's element type."""
        cell = item.vectors
        if cell is None or self.index_config is None:
            return item
        if cell.dims != self._dims:
            raise CorruptObjectError(
                f"{where}: namespace {show(item.namespace)}, key {show(item.key)}: vectors of {cell.dims} dims;"
                f" the file's index has dims={self._dims}"
            )
        if cell.dtype == self._memory.dtype:
            return item
        return replace(item, vectors=rows.pack_vectors(cell.by_path(), self._dims, self._memory.dtype))

    def _embedded(
        self, items: list[ExportedItem], texts: list[str], places: list[list[tuple[int, str]]], answers: list[Any]
    ) -> tuple[list[ExportedItem], int]:
        if not texts:
            return items, 0
        plan = embedding.TextPlan(texts, places)
        found = embedding.vectors_for_puts(plan, answers, self._dims, [(i.namespace, i.key) for i in items])
        packed = [replace(item, vectors=rows.pack_vectors(v, self._dims, self._memory.dtype)) for item, v in zip(items, found)]
        return packed, sum(1 for v in found if v)

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
        Object Lock holds, and value objects younger than an hour that no item named
        when the erase read it (a put about to commit), reported in ``remaining``. A
        call cut short is finished by calling it again. The store writes to one region:
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


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"sweep_ttl(limit=...) takes a number of namespaces, 1 or more; got {limit!r}")
    return limit
