"""S3Cache: LangGraph's node cache (``graph.compile(cache=...)``) in the bucket.

Each method is an operation of ``_ops/node_cache`` run by a driver: the same
operation for ``get`` and ``aget``, ``set`` and ``aset``, ``clear`` and ``aclear``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any

from botocore.config import Config
from langgraph.cache.base import BaseCache, ValueT
from langgraph.checkpoint.serde.base import SerializerProtocol

from s3_saver._crypto.config import Encryption, KmsKey, check_encryption, key_bucket_of
from s3_saver._crypto.keys import Crypt
from s3_saver._format.codec import Typed
from s3_saver._format.keys import check_prefix
from s3_saver._format.node_cache import CacheKeys, FullKey, Namespace, check_full_key, check_namespace, check_ttl
from s3_saver._ops import node_cache
from s3_saver._transport.aio import AsyncDriver
from s3_saver._transport.budget import CacheBudget, default_bytes
from s3_saver._transport.clients import Clients
from s3_saver._transport.clients import client_config as merged_config
from s3_saver._transport.protocol import Op, RequestStats, T
from s3_saver._transport.retry import RetryPolicy
from s3_saver._transport.s3 import S3Calls
from s3_saver._transport.sync import SyncDriver
from s3_saver.errors import ConfigurationError, S3SaverError, SerializationError, Where

log = logging.getLogger("s3_saver")


class S3Cache(BaseCache[ValueT], AbstractContextManager, AbstractAsyncContextManager):
    """LangGraph's node cache (``graph.compile(cache=...)``) in an S3 bucket.

    A node with a ``CachePolicy`` runs once per input, across invocations and
    processes (a Lambda's cold starts included), until its ``ttl`` ends or the
    cache is cleared. Entries live under ``<prefix>node-cache/``, beside a
    saver's threads on the same bucket and prefix, which the saver's garbage
    collection and audits never touch; the layout is the same whichever index
    mode the saver has (no DynamoDB table is used).

    Costs: ``get`` of k keys is k + 1 GETs in one round trip; ``set`` of k entries
    is k PUTs and 1 GET in one round trip (one GET before them in a process that
    has not read the cache yet); ``clear`` is one PUT of a small document (a GET
    before it in a process that has not read the cache yet). Clearing never lists
    the bucket and deletes nothing: cleared and expired entries stay until
    overwritten, or until a lifecycle rule on ``node-cache/`` expires them.

    A ``get`` or ``set`` that fails (after the retries of ``retry``) is logged
    (logger ``s3_saver``, warning) and counts as a miss or is dropped: the node
    then runs, as it would without a cache. ``clear`` raises.

    Constructing a cache makes no network call; [setup()][s3_saver.S3Cache.setup]
    creates the bucket when missing (as [S3Saver.setup()][s3_saver.S3Saver.setup] does).

    Example:
        ```python
        from langgraph.types import CachePolicy
        from s3_saver import S3Cache

        cache = S3Cache("my-bucket", prefix="agents/")
        builder.add_node("fetch", fetch, cache_policy=CachePolicy(ttl=600))
        graph = builder.compile(checkpointer=saver, cache=cache)
        ```

    Args:
        bucket: S3 bucket name.
        prefix: Key prefix inside the bucket: the saver's, to keep a graph's
            threads and cache together.
        region_name: AWS region of the client the cache creates.
        endpoint_url: Endpoint of S3 (moto, LocalStack, MinIO, SeaweedFS...).
        s3_endpoint_url: The same; takes precedence over ``endpoint_url``.
        boto3_session: Session the sync client is created from.
        s3_client: A ready boto3 S3 client (not closed by [close()][s3_saver.S3Cache.close]).
        aioboto3_session: Session the async client is created from (by default,
            the sync client's endpoint, region and credentials).
        client_config: ``botocore.config.Config`` merged over the defaults, as
            for [S3Saver][s3_saver.S3Saver].
        serde: Serializer of the cached values (``dumps_typed``/``loads_typed``;
            its type tag is stored with every value). Default: LangGraph's
            ``JsonPlusSerializer(pickle_fallback=False)``.
        max_concurrency: Threads the sync driver uses to send one wave of requests.
        retry: How failed calls are sent again (see [RetryPolicy][s3_saver.RetryPolicy]).
        encryption: ``KmsKey(...)`` or ``LocalKey(...)``, as a saver's: every entry is
            sealed with AES-256-GCM under one store-wide data key (record ``@store`` in the
            key store, ``<bucket>-keys`` unless ``key_bucket=``), the key a saver with the
            same ``encryption=``, bucket and prefix (and its
            [from_saver()][s3_saver.S3Cache.from_saver] cache) uses; a plaintext entry
            misses. [setup()][s3_saver.S3Cache.setup] creates the key store.
        cache_bytes: The memory budget of the cache's data key (as the saver's
            ``cache_bytes``); only with ``encryption=``.

    Raises:
        ConfigurationError: ``bucket`` is not a name, ``prefix`` is refused
            (a segment named like a folder a saver keeps, such as ``live``), or
            ``encryption`` is not a ``KmsKey``/``LocalKey``.
    """

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        region_name: str | None = None,
        endpoint_url: str | None = None,
        s3_endpoint_url: str | None = None,
        boto3_session: Any = None,
        s3_client: Any = None,
        aioboto3_session: Any = None,
        client_config: Config | None = None,
        serde: SerializerProtocol | None = None,
        max_concurrency: int = 16,
        retry: RetryPolicy | None = None,
        encryption: Encryption | None = None,
        cache_bytes: int | None = None,
    ) -> None:
        super().__init__(serde=serde)
        check_encryption(encryption)
        if not isinstance(bucket, str) or not bucket:
            raise ConfigurationError(f"bucket must be a non-empty string, got {bucket!r}")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ConfigurationError(f"max_concurrency must be a positive int, got {max_concurrency!r}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigurationError(f"retry must be an s3_saver.RetryPolicy or None, got {retry!r}")
        where = Where(bucket, None)
        endpoint = s3_endpoint_url or endpoint_url
        # KMS calls go to the key's region (its ARN's, or KmsKey.region_name), as a saver's.
        kms_region = encryption.region_name if isinstance(encryption, KmsKey) else None
        clients = Clients(
            where=where,
            region_name=region_name,
            endpoints={
                "s3": endpoint,
                "dynamodb": None,
                "kms": (encryption.endpoint_url if isinstance(encryption, KmsKey) else None) or endpoint_url,
            },
            config=merged_config(client_config, max_concurrency=max_concurrency, path_style=bool(endpoint)),
            boto3_session=boto3_session,
            given={"s3": s3_client, "dynamodb": None},
            aioboto3_session=aioboto3_session,
            service_regions={"kms": kms_region} if kms_region else None,
        )
        s3 = S3Calls(bucket, where)
        self._keys = CacheKeys(check_prefix(prefix, bucket))
        crypt = None
        if encryption is not None:
            budget = CacheBudget(cache_bytes if cache_bytes is not None else default_bytes())
            key_bucket = key_bucket_of(encryption, bucket)
            # The memory store's keys of a saver on this bucket and prefix (record @store).
            crypt = Crypt(encryption, bucket, self._keys.prefix, key_bucket, where, budget, kms_region or region_name)
            crypt = crypt.for_memory()
        self._bind(lambda: s3, lambda: crypt)
        self.bucket = bucket
        self.stats = RequestStats()
        """Round trips and requests sent so far (see [RequestStats][s3_saver.RequestStats])."""
        policy = retry if retry is not None else RetryPolicy()
        # No index-mode check: the cache's objects are the same in both modes.
        self._sync = SyncDriver(lambda service, site: clients.make_sync(service), self.stats, max_concurrency, policy)
        self._async = AsyncDriver(lambda service, site: clients.make_async(service), self.stats, policy)
        self._given = [s3_client] if s3_client is not None else []
        self._owns_drivers = True
        self._state = node_cache.CacheState()
        self._region = region_name
        self._clock = time.time

    @classmethod
    def from_saver(cls, saver: Any, *, serde: SerializerProtocol | None = None) -> S3Cache[Any]:
        """A cache on the saver's bucket and prefix, sharing its clients, retry
        policy and request counts (``saver.stats``).

        Args:
            saver: An [S3Saver][s3_saver.S3Saver], of either index mode.
            serde: Serializer of the cached values; by default the saver's (so an
                ``EncryptedSerializer`` covers the cache too).

        Example:
            ```python
            graph = builder.compile(checkpointer=saver, cache=S3Cache.from_saver(saver))
            ```
        """
        # Read duck-typed: the cache's wing does not import the saver's.
        required = ("_ctx", "_sync", "_async", "stats", "serde", "bucket")
        if not all(hasattr(saver, name) for name in required):
            raise ConfigurationError(f"from_saver needs an s3_saver.S3Saver, got {type(saver).__name__}: {saver!r}")
        cache: S3Cache[Any] = cls.__new__(cls)
        BaseCache.__init__(cache, serde=serde or saver.serde)
        cache._keys = CacheKeys(saver._ctx.layout.prefix)
        # The context of the region written to, read at each call (promote() swaps it).
        cache._bind(
            lambda: saver._ctx.s3, lambda: saver._ctx.crypt.for_memory() if saver._ctx.crypt is not None else None
        )
        cache.bucket = saver.bucket
        cache.stats = saver.stats
        cache._sync, cache._async = saver._sync, saver._async
        cache._given, cache._owns_drivers = [], False
        cache._state = node_cache.CacheState()
        cache._clock = time.time
        cache._region = None
        return cache

    def _bind(self, s3: Any, crypt: Any) -> None:
        """The cache's place, read at each call: its bucket's calls and, with encryption,
        the memory store's keys (``Crypt.for_memory``), with which every entry is sealed
        (``node_cache._sealer``). One path for both constructors: a standalone cache with
        ``encryption=`` and a cache of an encrypting saver seal and open alike."""
        self._where = lambda: node_cache.Where(s3(), self._keys, crypt())

    def __repr__(self) -> str:
        return f"S3Cache({self.bucket!r}, prefix={self._keys.prefix!r})"

    # -- what each call sends (its input checked first, before any request) -------------
    def _get_op(self, keys: Sequence[FullKey]) -> Op[dict[FullKey, Typed]]:
        wanted = list(dict.fromkeys(check_full_key(k, self._describe()) for k in _listed(keys, "keys", self._describe())))
        return self._logged(node_cache.get(self._where(), self._state, wanted, self._clock()))

    def _set_op(self, pairs: Mapping[FullKey, tuple[Any, int | None]]) -> Op[None]:
        if not isinstance(pairs, Mapping):
            raise ConfigurationError(f"{self._describe()}: set takes a mapping of keys to (value, ttl), got {pairs!r}")
        now = self._clock()
        entries: dict[FullKey, tuple[Typed, float | None]] = {}
        for full_key, pair in pairs.items():
            fk = check_full_key(full_key, self._describe())
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ConfigurationError(f"{self._describe()}: the value of {fk!r} must be a (value, ttl) pair, got {pair!r}")
            value, ttl = pair
            seconds = check_ttl(ttl, fk, self._describe())
            try:
                typed = self.serde.dumps_typed(value)
            except Exception as exc:
                raise SerializationError(
                    f"{self._describe()}: the serializer cannot encode the value of {fk!r} "
                    f"({type(exc).__name__}: {exc}); nothing of this set was stored"
                ) from exc
            entries[fk] = (typed, None if seconds is None else now + seconds)
        return self._logged(node_cache.put(self._where(), self._state, entries, now))

    def _clear_op(self, namespaces: Sequence[Namespace] | None) -> Op[None]:
        listed = None
        if namespaces is not None:
            listed = [check_namespace(ns, self._describe()) for ns in _listed(namespaces, "namespaces", self._describe())]
        return node_cache.clear(self._where(), self._state, listed)

    @staticmethod
    def _logged(op: Op[tuple[T, list[str]]] | Op[list[str]]) -> Op[Any]:
        """``op``'s result, its problems (what missed or was dropped) logged."""
        result = yield from op
        found, problems = result if isinstance(result, tuple) else (None, result)
        for problem in problems:
            log.warning("%s", problem)
        return found

    def _describe(self) -> str:
        return f"the node cache in s3://{self.bucket}/{self._keys.root}"

    def _decoded(self, found: dict[FullKey, Typed]) -> dict[FullKey, ValueT]:
        values: dict[FullKey, ValueT] = {}
        for full_key, typed in found.items():
            try:
                values[full_key] = self.serde.loads_typed(typed)
            except Exception as exc:  # the serializer's own: a miss, as a failed read is
                log.warning(
                    "%s: %r missed: the serializer cannot decode it (%s: %s)",
                    self._describe(), full_key, type(exc).__name__, exc,
                )
        return values

    def _failed(self, exc: S3SaverError, what: str) -> None:
        # Only the store's failures reach here (input is checked before the run).
        log.warning("%s: %s (%s: %s)", self._describe(), what, type(exc).__name__, exc)

    # -- BaseCache -------------------------------------------------------------------
    def get(self, keys: Sequence[FullKey]) -> dict[FullKey, ValueT]:
        """The values of ``keys`` that are cached and unexpired (a key absent: a miss).

        Raises:
            ConfigurationError: A key is not a (tuple of strings, string) pair.
        """
        op = self._get_op(keys)
        try:
            found = self._sync.run(op)
        except S3SaverError as exc:
            self._failed(exc, "get failed: every key missed")
            return {}
        return self._decoded(found)

    async def aget(self, keys: Sequence[FullKey]) -> dict[FullKey, ValueT]:
        """Async version of [get()][s3_saver.S3Cache.get]."""
        op = self._get_op(keys)
        try:
            found = await self._async.run(op)
        except S3SaverError as exc:
            self._failed(exc, "get failed: every key missed")
            return {}
        return self._decoded(found)

    def set(self, pairs: Mapping[FullKey, tuple[ValueT, int | None]]) -> None:
        """Store each value with its ttl in seconds (None: no expiry), replacing
        what the key held.

        Raises:
            ConfigurationError: A key is not a (tuple of strings, string) pair, or a
                ttl is not a number of seconds or None (nothing stored).
            SerializationError: The serializer cannot encode a value (nothing stored).
        """
        op = self._set_op(pairs)
        try:
            self._sync.run(op)
        except S3SaverError as exc:
            self._failed(exc, "set failed: its entries were dropped")

    async def aset(self, pairs: Mapping[FullKey, tuple[ValueT, int | None]]) -> None:
        """Async version of [set()][s3_saver.S3Cache.set]."""
        op = self._set_op(pairs)
        try:
            await self._async.run(op)
        except S3SaverError as exc:
            self._failed(exc, "set failed: its entries were dropped")

    def clear(self, namespaces: Sequence[Namespace] | None = None) -> None:
        """Remove every entry of these namespaces (exact namespaces, not prefixes);
        None: every entry of the cache.

        Raises:
            ConfigurationError: A namespace is not a tuple of strings.
            S3SaverError: The store failed (after retries); the error names the bucket
                and key, e.g. [BucketNotFoundError][s3_saver.errors.BucketNotFoundError]
                or [StoreUnavailableError][s3_saver.errors.StoreUnavailableError].
        """
        self._sync.run(self._clear_op(namespaces))

    async def aclear(self, namespaces: Sequence[Namespace] | None = None) -> None:
        """Async version of [clear()][s3_saver.S3Cache.clear]."""
        await self._async.run(self._clear_op(namespaces))

    # -- lifecycle ---------------------------------------------------------------------
    def setup(self) -> None:
        """Create the bucket when missing (a cache made by
        [from_saver()][s3_saver.S3Cache.from_saver] has its saver's
        [setup()][s3_saver.S3Saver.setup] for that). Idempotent.

        Raises:
            S3SaverError: The store refused (e.g. no ``s3:CreateBucket`` right).
        """
        self._sync.run(node_cache.setup(self._where(), self._region))

    async def asetup(self) -> None:
        """Async version of [setup()][s3_saver.S3Cache.setup]."""
        await self._async.run(node_cache.setup(self._where(), self._region))

    def close(self) -> None:
        """Release the sync driver's thread pool and the client the cache created
        (nothing of a saver's, for a cache made by [from_saver()][s3_saver.S3Cache.from_saver])."""
        if self._owns_drivers:
            self._sync.close(keep=self._given)

    async def aclose(self) -> None:
        """Close the async client of the running event loop (as [close()][s3_saver.S3Cache.close])."""
        if self._owns_drivers:
            await self._async.aclose()

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()


def _listed(items: Any, what: str, where: str) -> list[Any]:
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence | tuple | list):
        raise ConfigurationError(f"{where}: {what} must be a sequence, got {items!r}")
    return list(items)


__all__ = ["S3Cache"]
