"""The saver's data keys: a cache within the saver's byte budget, and how an operation
loads the keys of its threads (and makes a thread's first key).

``Crypt.load`` is an operation: in the steady state every key is in the cache and it
returns without a request. A key not cached costs the key store's GET (one wave for all
the threads asked, sent beside the index read a read makes anyway, see ``gather``) and,
with KMS, one ``Decrypt`` wave. A writer of a thread that has no key yet makes it: a
``GenerateDataKey`` wave (none for a local key) and the record's conditional create, after
which every process uses the winner's key.

Invariant (the cache's, as every cache of the budget: ``_transport/budget``): a key
evicted is read again; no decision rests on finding one. A thread this process saw without
a key (a read's 404, LangGraph reads a thread before its first put) is remembered as such
only to skip that GET before the create, which the store's condition decides anyway.

A cached key may be stale: another process erased the thread (its key destroyed) and
maybe wrote it anew under a new key. The cache is never trusted past what can check it,
at no request in the steady state:

* a read opens what names another key than the cached one only after reading the
  thread's record again (``sealer``: the key is dropped, ``StaleKey`` raised, and the
  read runs again once with the record read: ``_ops/keyed.rekeying``);
* a write is committed only if its key is not one an erase destroyed: the erase records
  the destroyed ids in the thread's index record, and every commit's fence checks them
  (``Index.commit_checkpoint``'s ``key_id``); refused, the writer reads the record again
  and seals its content anew (``_ops/commit``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace

from s3_saver._crypto.config import Encryption, KmsKey
from s3_saver._crypto.envelope import DataKey, new_key_id
from s3_saver._crypto.keyrings import Keyring, Sealed, keyring_for
from s3_saver._crypto.records import LIVE, KeyRecord, context, next_life
from s3_saver._crypto.sealer import Sealer, ThreadKey
from s3_saver._crypto.store import KeyStore
from s3_saver._transport.budget import CacheBudget, key_bytes
from s3_saver._transport.protocol import Op, gather
from s3_saver._transport.s3 import S3Calls
from s3_saver.errors import Where

# A cached key: the cipher and its key (measured with tracemalloc: ~200 bytes) and the
# ids of a few earlier lives.
_KEY_ENTRY_BYTES = 256
_ABSENT = "absent"  # cached for a thread seen without a key record


class KeyCache:
    """Threads' keys this process unwrapped (or saw missing), charged to the budget."""

    def __init__(self, budget: CacheBudget) -> None:
        self._data = budget.cache("keys")

    def get(self, thread_id: str) -> ThreadKey | None:
        found = self._data.get(thread_id)
        return found if isinstance(found, ThreadKey) else None

    def absent(self, thread_id: str) -> bool:
        return self._data.get(thread_id) == _ABSENT

    def put(self, thread_id: str, key: ThreadKey) -> None:
        # From the cache, a key is not known to be the thread's still (``checked``).
        key = replace(key, checked=False)
        self._data.put(thread_id, key, key_bytes(thread_id) + _KEY_ENTRY_BYTES + 24 * len(key.erased))

    def put_absent(self, thread_id: str) -> None:
        self._data.put(thread_id, _ABSENT, key_bytes(thread_id))

    def forget(self, thread_id: str) -> None:
        self._data.pop(thread_id)


class Crypt:
    """One saver's encryption: its keyring, its key store and its key cache.

    Attributes:
        config: The ``encryption=`` setting.
        bucket: The saver's bucket (named in errors about its objects).
        prefix: The saver's prefix (every ciphertext's associated data starts with it).
    """

    def __init__(self, config: Encryption, bucket: str, prefix: str, key_bucket: str, where: Where, budget: CacheBudget) -> None:
        self.config = config
        self.bucket = bucket
        self.prefix = prefix
        # The key store's calls name its own bucket, in the saver's regions and endpoints.
        self.where = Where(key_bucket, None, where.regions, where.endpoints, where.site)
        self.store = KeyStore(S3Calls(key_bucket, self.where), prefix)
        self.keyring: Keyring = keyring_for(config, self.where)
        self.cache = KeyCache(budget)

    @property
    def key_bucket(self) -> str:
        return self.store.bucket

    def describe(self) -> str:
        kind = "KmsKey" if isinstance(self.config, KmsKey) else "LocalKey"
        return f"{kind}, {self.keyring.describe()}, key store s3://{self.key_bucket}/{self.prefix}"

    def sealer(self, keys: dict[str, ThreadKey] | None = None) -> Sealer:
        return Sealer(self, keys)

    def elsewhere(self, bucket: str, prefix: str, key_bucket: str) -> Crypt:
        """This saver's keyring reading the keys another saver (``bucket``, ``prefix``,
        ``key_bucket``) keeps: an export made there. Its cache is its own, for one call
        (a key cache is by thread id: another prefix's threads must not meet ours)."""
        if (prefix, key_bucket) == (self.prefix, self.key_bucket):
            return self
        return Crypt(self.config, bucket, prefix, key_bucket, self.where, CacheBudget())

    def load(self, thread_ids: Iterable[str], *, create: bool = False) -> Op[dict[str, ThreadKey]]:
        """The keys of ``thread_ids``; ``create``: a thread without a live key gets one
        (a writer's: the thread's first key, or a new life's after an erase).

        Requests only for what the cache lacks: one wave of GETs, then one of KMS
        ``Decrypt`` (and ``GenerateDataKey``) together, then the creates' PUTs.
        """
        wanted = list(dict.fromkeys(thread_ids))
        found: dict[str, ThreadKey] = {}
        unknown: list[str] = []
        fresh: dict[str, KeyRecord | None] = {}  # threads to make a key for (over an erased record)
        for t in wanted:
            cached = self.cache.get(t)
            if cached is not None and (cached.key is not None or not create):
                found[t] = cached
            elif create and self.cache.absent(t):
                fresh[t] = None  # seen without a record: the create's condition decides
            else:
                unknown.append(t)
        records = yield from self.store.read(unknown)
        to_open: dict[str, KeyRecord] = {}
        for t, record in records.items():
            if record is not None and record.live:
                to_open[t] = record
            elif create:
                if record is not None and not record.settled:
                    # An erase under way: no new key before the thread is gone in its index.
                    raise self.store.being_erased(t, record)
                fresh[t] = record
            elif record is None:
                self.cache.put_absent(t)
                found[t] = ThreadKey(None, {}, self.store.where(t))
            else:
                found[t] = ThreadKey(None, record.erased_ids(), self.store.where(t))
        opened, made = yield from gather(self._unwrap(to_open), self._generate(fresh))
        found.update(opened)
        if made:
            found.update((yield from self._create(made)))
        for t in wanted:
            if found[t].key is not None:
                self.cache.put(t, found[t])
        return {t: found[t] for t in wanted}

    def forget(self, thread_id: str) -> None:
        """Drop a thread's cached key (its record changed: an erase)."""
        self.cache.forget(thread_id)

    # -- the steps -------------------------------------------------------------------------
    def _sealed(self, t: str, record: KeyRecord) -> Sealed:
        return Sealed(record, context(self.prefix, t, record.key_id), self.key_bucket, self.store.key_of(t), t)

    def _unwrap(self, records: dict[str, KeyRecord]) -> Op[dict[str, ThreadKey]]:
        items = list(records.items())
        secrets = yield from self.keyring.unwrap([self._sealed(t, r) for t, r in items])
        return {t: ThreadKey(DataKey(r.key_id, s), r.erased_ids(), self.store.where(t)) for (t, r), s in zip(items, secrets)}

    def _generate(self, fresh: dict[str, KeyRecord | None]) -> Op[dict[str, tuple[KeyRecord, bytes, KeyRecord | None]]]:
        """A new key per thread (one wave), and the record that keeps it."""
        items = list(fresh.items())
        ids = [new_key_id() for _ in items]
        made = yield from self.keyring.generate([context(self.prefix, t, k) for (t, _), k in zip(items, ids)])
        now = int(time.time())
        return {
            t: (KeyRecord(LIVE, k, now, m.wrapped, m.kek, earlier=next_life(over)), m.secret, over)
            for (t, over), k, m in zip(items, ids, made)
        }

    def _create(self, made: dict[str, tuple[KeyRecord, bytes, KeyRecord | None]]) -> Op[dict[str, ThreadKey]]:
        """Each record created (one wave); where another process made the thread's
        key first, its key is unwrapped and used instead of ours."""
        items = list(made.items())
        stored = yield from gather(*(self.store.create(t, record, over) for t, (record, _, over) in items))
        keys: dict[str, ThreadKey] = {}
        theirs: dict[str, KeyRecord] = {}
        for (t, (record, secret, _)), winner in zip(items, stored):
            if winner.key_id == record.key_id:
                keys[t] = ThreadKey(DataKey(record.key_id, secret), winner.erased_ids(), self.store.where(t))
            else:
                theirs[t] = winner
        keys.update((yield from self._unwrap(theirs)))
        return keys
