"""One memory budget, in bytes, for every cache of a saver.

A saver remembers what it read and wrote: manifest heads and sealed segments,
bodies it committed, decoded archives, list values (delta bases), loc maps and
pending-write slots. A long-lived process (LangGraph Server) reads thousands of
threads, so each of these is charged to one ``CacheBudget`` by an estimate of
its bytes (the byte lengths of the bodies and values it holds, plus a fixed
overhead per index entry measured with tracemalloc), and the least recently
used entries go first, whichever cache holds them.

Why one LRU across caches rather than a share per cache: what a process needs
changes with its work. A Lambda serving one thread wants the whole budget for
that thread's head, segments and lists; a server reading archives wants it for
archives. A fixed share would cap a busy cache while an idle one keeps its
share unused. One lock guards every cache of the budget: an eviction never
waits on another cache's lock, so no two locks are ever held together.

Invariant: every cache here is a hint or holds immutable-keyed data, so an
eviction changes what a call costs, never what it answers. Each user comments
why where it reads its cache. Entries a decision rests on (a thread's delete
generation, runs this process started: ``_ops.context``) are small and of a
fixed size: they keep a count bound and are never evicted for bytes, but their
bytes are charged too (``fixed``), so the total stays within the budget unless
those tables alone fill it.

An entry just put stays until the next put: an operation always finds what it
just read or wrote. So the resident bytes exceed the budget only while one
entry larger than the whole budget is the newest.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024
DEFAULT_BYTES = 64 * MIB
MIN_BYTES = 1 * MIB
# Estimates of what Python keeps beside the bytes, measured with tracemalloc on
# entries with 36-character ids (CPython 3.12): an index entry about 500 bytes
# plus about 270 per channel of its loc map, a writes entry about 420, a key
# of three ids mapped to a small value about 270.
ENTRY_BYTES = 512
LOC_ITEM_BYTES = 256
WRITES_BYTES = 448
KEY_BYTES = 272


def default_bytes(environ: Mapping[str, str] | None = None) -> int:
    """The budget when none is given: 64 MiB, less in a small Lambda function.

    A Lambda function's memory (``AWS_LAMBDA_FUNCTION_MEMORY_SIZE``, in MB, set
    by the runtime) also holds the interpreter with boto3 and LangGraph (about
    100 MB) and the graph's own state; an eighth of it goes to caches: 16 MiB
    at 128 MB, 64 MiB from 512 MB up. A handler serves a few threads: a warm
    start finds its head and lists in that. A server gets 64 MiB.
    """
    env = os.environ if environ is None else environ
    try:
        memory_mb = int(env.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", ""))
    except ValueError:
        return DEFAULT_BYTES
    return max(MIN_BYTES, min(DEFAULT_BYTES, memory_mb * MIB // 8))


@dataclass(frozen=True)
class CacheUse:
    """One cache's share of the budget.

    Attributes:
        bytes: The estimated bytes of its entries.
        entries: How many it holds.
        evictions: Entries it dropped to stay within the budget or its count.
    """

    bytes: int
    entries: int
    evictions: int


@dataclass(frozen=True)
class CacheStats:
    """What a saver's caches hold ([S3Saver.cache_stats()][s3_saver.S3Saver.cache_stats]).

    Attributes:
        budget: The budget in bytes (``cache_bytes``).
        used: The estimated bytes of every cache together.
        caches: Per cache (``heads``, ``segments``, ``bodies``, ``lists``,
            ``archives``, ``locs``, ``slots``, and the fixed tables ``gens``,
            ``began``, ``noted``, ``listed``): bytes, entries, evictions.
    """

    budget: int
    used: int
    caches: dict[str, CacheUse]


class CacheBudget:
    """The caches of one saver and their bytes. With a replica, each region's
    caches are kept apart (``site``: their keys would meet) in one budget."""

    def __init__(self, limit: int = DEFAULT_BYTES, *, _store: _Store | None = None, _prefix: str = "") -> None:
        self._store = _store if _store is not None else _Store(limit)
        self._prefix = _prefix

    @property
    def limit(self) -> int:
        return self._store.limit

    @property
    def used(self) -> int:
        return self._store.used

    def site(self, name: str, primary: bool) -> CacheBudget:
        """This budget, for the caches of a region (another's named apart)."""
        return self if primary else CacheBudget(_store=self._store, _prefix=f"{name}.")

    def cache(self, kind: str, *, entries: int | None = None, fixed: bool = False) -> Cache:
        """The cache named ``kind`` (made on first use). ``fixed``: evicted only
        past ``entries`` entries, never for bytes (see the module docstring)."""
        return self._store.cache(self._prefix + kind, entries, fixed)

    def stats(self) -> CacheStats:
        return self._store.stats()


class _Store:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        # Guards every cache of the budget (see the module docstring).
        self.lock = threading.RLock()
        self.used = 0
        # Every evictable entry, least recently used first: (kind, key) -> bytes.
        self.lru: OrderedDict[tuple[str, Hashable], int] = OrderedDict()
        self.caches: dict[str, Cache] = {}

    def cache(self, kind: str, entries: int | None, fixed: bool) -> Cache:
        with self.lock:
            found = self.caches.get(kind)
            if found is None:
                found = self.caches[kind] = Cache(self, kind, entries, fixed)
            return found

    def stats(self) -> CacheStats:
        with self.lock:
            caches = {k: CacheUse(c.bytes, len(c.data), c.evictions) for k, c in sorted(self.caches.items())}
            return CacheStats(self.limit, self.used, caches)

    def fit(self) -> None:
        """Evict least recently used entries until within the limit, but the
        newest (the entry just put: see the module docstring)."""
        while self.used > self.limit and len(self.lru) > 1:
            kind, key = next(iter(self.lru))
            self.caches[kind]._drop(key, evicted=True)


class Cache:
    """A map whose entries are charged to a budget: get, put (with its bytes),
    pop. Compound updates hold ``lock`` (the budget's) around their calls."""

    def __init__(self, store: _Store, kind: str, entries: int | None, fixed: bool) -> None:
        self._store, self.kind, self.lock = store, kind, store.lock
        self._max, self._fixed = entries, fixed
        # key -> (value, bytes), oldest first (the order a count bound evicts in)
        self.data: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self.bytes = 0
        self.evictions = 0

    def get(self, key: Hashable) -> Any:
        with self.lock:
            found = self.data.get(key)
            if found is None:
                return None
            self.data.move_to_end(key)
            if not self._fixed:
                self._store.lru.move_to_end((self.kind, key))
            return found[0]

    def __contains__(self, key: Hashable) -> bool:
        with self.lock:
            return key in self.data

    def put(self, key: Hashable, value: Any, size: int) -> None:
        with self.lock:
            self._drop(key, evicted=False)
            self.data[key] = (value, size)
            self.bytes += size
            self._store.used += size
            if self._fixed:
                while self._max is not None and len(self.data) > self._max:
                    self._drop(next(iter(self.data)), evicted=True)
            else:
                self._store.lru[(self.kind, key)] = size
                self._store.fit()

    def pop(self, key: Hashable) -> Any:
        with self.lock:
            found = self.data.get(key)
            self._drop(key, evicted=False)
            return None if found is None else found[0]

    def keys(self) -> list[Hashable]:
        with self.lock:
            return list(self.data)

    def values(self) -> list[Any]:
        with self.lock:
            return [v for v, _ in self.data.values()]

    def _drop(self, key: Hashable, evicted: bool) -> None:
        found = self.data.pop(key, None)
        if found is None:
            return
        self.bytes -= found[1]
        self._store.used -= found[1]
        if not self._fixed:
            del self._store.lru[(self.kind, key)]
        if evicted:
            self.evictions += 1


# -- estimates ---------------------------------------------------------------------------
def entry_bytes(entry: Any) -> int:
    """An index entry (checkpoint or writes part) with its body and metadata."""
    size = len(entry.body or b"")
    loc = getattr(entry, "loc", None)
    if loc is None:
        return WRITES_BYTES + size
    metadata = entry.metadata[1] if entry.metadata is not None else b""
    return ENTRY_BYTES + LOC_ITEM_BYTES * len(loc) + size + len(metadata)


def key_bytes(key: Any) -> int:
    """A small entry keyed by ids (a tuple or a string of them)."""
    parts = key if isinstance(key, tuple) else (key,)
    return KEY_BYTES + sum(len(p) for p in parts if isinstance(p, str))
