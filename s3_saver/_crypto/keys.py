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

With a replica, each region has a key store of its own (a key bucket is never
replicated: it keeps no old copy of anything). The region written to decides: a thread's
key is created in its store and copied to the other region's (``partner``) in the same
wave (``KeyStore.offer``, then ``mirror`` when a record is there); a copy that gets no
answer is marked pending on the record, and made by the next process that reads it. An
erase destroys the key in both stores before it deletes anything (``destroy``). The
replica region's reads unwrap keys from its own store (its own ``Crypt``); a key that has
not arrived there reads as replication lag (``lags``), never as erased.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import replace

from s3_saver._crypto.config import Encryption, KmsKey
from s3_saver._crypto.envelope import DataKey, new_key_id
from s3_saver._crypto.keyrings import (
    Keyring,
    KmsKeyring,
    Sealed,
    keyring_for,
    unwrap_with,
)
from s3_saver._crypto.records import (
    LIVE,
    MEMORY,
    STORE_KEY,
    THREADS,
    KeyKind,
    KeyRecord,
    context,
    next_life,
)
from s3_saver._crypto.sealer import Sealer, ThreadKey
from s3_saver._crypto.store import KeyStore
from s3_saver._transport.budget import CacheBudget, key_bytes
from s3_saver._transport.protocol import Op, gather
from s3_saver._transport.s3 import S3Calls
from s3_saver.errors import Where

# What a create's copy to the replica region's store said (``KeyStore.offer``).
_WRITTEN, _TAKEN = "written", "taken"

# A cached key: the cipher and its key (measured with tracemalloc: ~200 bytes) and the
# ids of a few earlier lives.
_KEY_ENTRY_BYTES = 256
_ABSENT = "absent"  # cached for a thread seen without a key record


class KeyCache:
    """Threads' keys this process unwrapped (or saw missing), charged to the budget."""

    def __init__(self, budget: CacheBudget, name: str = "keys") -> None:
        self._data = budget.cache(name)

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

    def __init__(
        self,
        config: Encryption,
        bucket: str,
        prefix: str,
        key_bucket: str,
        where: Where,
        budget: CacheBudget,
        kms_region: str | None = None,
        kind: KeyKind = THREADS,
    ) -> None:
        self.config = config
        self.kind = kind
        self._budget = budget
        self._memory: Crypt | None = None
        self.bucket = bucket
        self.prefix = prefix
        # The key store's calls name its own bucket, in the saver's regions and endpoints.
        self.where = Where(key_bucket, None, where.regions, where.endpoints, where.site)
        self.store = KeyStore(S3Calls(key_bucket, self.where), prefix, kind)
        self.kms_region = kms_region
        self.keyring: Keyring = keyring_for(config, self.where, kms_region)
        # What unwraps: this key, then the keys a rotation is moving away from (``previous=``).
        self.keyrings: list[Keyring] = [self.keyring, *(keyring_for(p, self.where, kms_region) for p in config.previous)]
        self.cache = KeyCache(budget, kind.cache)
        # With a replica: the other region's key store (``pair``), and whether a key
        # missing from this one is replication lag (this site's store is the replica's).
        self.partner: KeyStore | None = None
        self.lags = False

    def pair(self, other: Crypt, lags: bool) -> None:
        """With a replica: ``other`` is the other region's (its key store this one's
        partner); ``lags``: this is the replica region's (a key it lacks has not arrived)."""
        self.partner = other.store
        self.lags = lags
        if self._memory is not None or other._memory is not None:
            self.for_memory().pair(other.for_memory(), lags)

    def for_memory(self) -> Crypt:
        """The memory store's keys beside this saver's (the same keyring, key bucket,
        budget and regions): records ``m/<namespace id>`` and ``@store`` in the key
        store, bound to their names as a thread's key is to its thread (``KeyKind``).
        Made once per saver, so a store and a cache built on it share one key cache."""
        if self.kind is MEMORY:
            return self
        if self._memory is None:
            site = Where(self.bucket, None, self.where.regions, self.where.endpoints, self.where.site)
            memory = Crypt(self.config, self.bucket, self.prefix, self.key_bucket, site, self._budget, self.kms_region, MEMORY)
            memory.keyring, memory.keyrings = self.keyring, self.keyrings  # one keyring: its KMS checks made once
            if self.partner is not None:
                memory.partner = KeyStore(self.partner.s3, self.prefix, MEMORY)
                memory.lags = self.lags
            self._memory = memory
        return self._memory

    @property
    def key_bucket(self) -> str:
        return self.store.bucket

    def subject(self, name: str, names: Mapping[str, str] | None = None) -> str:
        """What the key ``name`` is the key of, for messages: a thread (by its id), or a
        namespace of the memory store, by its name when ``names`` (id -> shown name) has
        it, else by its id (a hash), with the store's bucket and prefix either way."""
        if self.kind is THREADS:
            return f"thread {name!r}"
        store = f"the memory store s3://{self.bucket}/{self.prefix}"
        if name == STORE_KEY:
            return f"the store-wide key of {store}"
        shown = (names or {}).get(name)
        return f"namespace {shown} (id {name}) of {store}" if shown else f"the namespace of id {name} of {store}"

    def describe(self) -> str:
        kind = "KmsKey" if isinstance(self.config, KmsKey) else "LocalKey"
        return f"{kind}, {self.keyring.describe()}, key store s3://{self.key_bucket}/{self.prefix}"

    def check_replicable(self) -> Op[None]:
        """With a replica: a KMS key must be multi-Region (``setup``); a local key is."""
        if isinstance(self.keyring, KmsKeyring):
            yield from self.keyring.check_multi_region()

    def sealer(self, keys: dict[str, ThreadKey] | None = None) -> Sealer:
        return Sealer(self, keys)

    def elsewhere(self, bucket: str, prefix: str, key_bucket: str) -> Crypt:
        """This saver's keyring reading the keys another saver (``bucket``, ``prefix``,
        ``key_bucket``) keeps: an export made there. Its cache is its own, for one call
        (a key cache is by thread id: another prefix's threads must not meet ours)."""
        if (prefix, key_bucket) == (self.prefix, self.key_bucket):
            return self
        other = Crypt(self.config, bucket, prefix, key_bucket, self.where, CacheBudget(), self.kms_region, self.kind)
        other.keyring, other.keyrings = self.keyring, self.keyrings
        return other

    def load(
        self, thread_ids: Iterable[str], *, create: bool = False, names: Mapping[str, str] | None = None
    ) -> Op[dict[str, ThreadKey]]:
        """The keys of ``thread_ids``; ``create``: a thread without a live key gets one
        (a writer's: the thread's first key, or a new life's after an erase). ``names``:
        the memory store's namespaces by id, shown (its errors name the namespace, not
        only its id, a hash).

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
        pending: dict[str, KeyRecord] = {}  # live keys still to copy to the partner
        for t, record in records.items():
            if record is not None and record.live:
                to_open[t] = record
                if record.pending_replica and self.partner is not None:
                    pending[t] = record
            elif create:
                if record is not None and not record.settled:
                    # An erase under way: no new key before the thread is gone in its index.
                    raise self.store.being_erased(t, record, self.subject(t, names))
                fresh[t] = record
            elif record is None:
                self.cache.put_absent(t)
                found[t] = ThreadKey(None, {}, self.store.where(t))
            else:
                found[t] = ThreadKey(None, record.erased_ids(), self.store.where(t))
        opened, made, _ = yield from gather(
            self._unwrap(to_open, names), self._generate(fresh), self._copy_pending(pending)
        )
        found.update(opened)
        if made:
            found.update((yield from self._create(made, names)))
        for t in wanted:
            if found[t].key is not None:
                self.cache.put(t, found[t])
        return {t: found[t] for t in wanted}

    def forget(self, thread_id: str) -> None:
        """Drop a thread's cached key (its record changed: an erase)."""
        self.cache.forget(thread_id)

    def destroy(self, thread_id: str, now: int) -> Op[tuple[KeyRecord | None, KeyRecord | None]]:
        """The thread's key destroyed in this store (``KeyStore.destroy``) and then, with
        a replica, in the partner's (``KeyStore.bury``): both before the erase deletes
        anything. Returns the erasures (this store's, the partner's), None where none."""
        erased = yield from self.store.destroy(thread_id, now)
        buried = None
        if erased is not None and self.partner is not None:
            buried = yield from self.partner.bury(thread_id, erased)
        return erased, buried

    def settle(self, thread_id: str, erased: KeyRecord, buried: KeyRecord | None) -> Op[None]:
        """Both erasures settled (``KeyStore.settle``), in one wave."""
        settling = [self.store.settle(thread_id, erased)]
        if buried is not None and self.partner is not None:
            settling.append(self.partner.settle(thread_id, buried))
        yield from gather(*settling)

    def settle_left(self, thread_id: str) -> Op[None]:
        """Settle the erasure an erase left unsettled (cut short after the thread or
        namespace was gone from its index, before its end), in both regions' stores: the
        caller has read the index and found it gone there. Records read first, one wave."""
        stores = [self.store] if self.partner is None else [self.store, self.partner]
        found = yield from gather(*(s.read_one(thread_id) for s in stores))
        yield from gather(
            *(s.settle(thread_id, r) for s, r in zip(stores, found) if r is not None and not r.live and not r.settled)
        )
        self.forget(thread_id)

    def sealed(self, t: str, record: KeyRecord) -> Sealed:
        """A thread's record with what its key is bound to, for a keyring."""
        return self._sealed(t, record)

    # -- the steps -------------------------------------------------------------------------
    def _sealed(self, t: str, record: KeyRecord, names: Mapping[str, str] | None = None) -> Sealed:
        bound = context(self.prefix, t, record.key_id, self.kind)
        subject = self.subject(t, names)
        return Sealed(record, bound, self.key_bucket, self.store.key_of(t), t, subject, self.kind.name)

    def _unwrap(self, records: dict[str, KeyRecord], names: Mapping[str, str] | None = None) -> Op[dict[str, ThreadKey]]:
        items = list(records.items())
        secrets = yield from unwrap_with(self.keyrings, [self._sealed(t, r, names) for t, r in items])
        return {t: ThreadKey(DataKey(r.key_id, s), r.erased_ids(), self.store.where(t)) for (t, r), s in zip(items, secrets)}

    def _generate(self, fresh: dict[str, KeyRecord | None]) -> Op[dict[str, tuple[KeyRecord, bytes, KeyRecord | None]]]:
        """A new key per thread (one wave), and the record that keeps it."""
        items = list(fresh.items())
        ids = [new_key_id() for _ in items]
        made = yield from self.keyring.generate([context(self.prefix, t, k, self.kind) for (t, _), k in zip(items, ids)])
        now = int(time.time())
        return {
            t: (KeyRecord(LIVE, k, now, m.wrapped, m.kek, earlier=next_life(over)), m.secret, over)
            for (t, over), k, m in zip(items, ids, made)
        }

    def _copy_pending(self, records: dict[str, KeyRecord]) -> Op[None]:
        """Keys whose copy to the partner is pending, copied there, and the mark taken
        off their records (``pending_replica``) once done."""
        if not records or self.partner is None:
            return
        partner = self.partner
        items = list(records.items())
        copied = yield from gather(*(partner.mirror(t, r) for t, r in items))
        yield from gather(*(self.store.mark_pending(t, r, False) for (t, r), done in zip(items, copied) if done))

    def _create(
        self, made: dict[str, tuple[KeyRecord, bytes, KeyRecord | None]], names: Mapping[str, str] | None = None
    ) -> Op[dict[str, ThreadKey]]:
        """Each record created (one wave: with a replica, the copy to its key store in
        the same); where another process made the thread's key first, its key is
        unwrapped and used instead of ours."""
        items = list(made.items())
        creates = [self.store.create(t, record, over, self.subject(t, names)) for t, (record, _, over) in items]
        if self.partner is None:
            stored = yield from gather(*creates)
        else:
            partner = self.partner
            stored, offered = yield from gather(
                gather(*creates), gather(*(partner.offer(t, record) for t, (record, _, _) in items))
            )
            yield from self._settle_copies(
                [(t, record, winner, said) for (t, (record, _, _)), winner, (said, _) in zip(items, stored, offered)]
            )
        keys: dict[str, ThreadKey] = {}
        theirs: dict[str, KeyRecord] = {}
        for (t, (record, secret, _)), winner in zip(items, stored):
            if winner.key_id == record.key_id:
                keys[t] = ThreadKey(DataKey(record.key_id, secret), winner.erased_ids(), self.store.where(t))
            else:
                theirs[t] = winner
        keys.update((yield from self._unwrap(theirs, names)))
        return keys

    def _settle_copies(self, copies: list[tuple[str, KeyRecord, KeyRecord, str]]) -> Op[None]:
        """After a create's wave (``thread, our record, the winner's, what the partner
        said``): where the partner holds no copy of the winner's key yet (another
        record there, ours of a create we lost), it is copied; where it got no answer,
        the winner's record is marked pending (the next process that reads it copies)."""
        partner = self.partner
        assert partner is not None
        again = [(t, winner, ours.key_id) for t, ours, winner, said in copies if said == _TAKEN or (
            said == _WRITTEN and winner.key_id != ours.key_id
        )]
        copied = yield from gather(*(partner.mirror(t, winner, mine) for t, winner, mine in again))
        missed = [(t, w) for (t, w, _), done in zip(again, copied) if not done]
        missed += [(t, winner) for t, _, winner, said in copies if said not in (_WRITTEN, _TAKEN)]
        yield from gather(*(self.store.mark_pending(t, w, True) for t, w in missed))
