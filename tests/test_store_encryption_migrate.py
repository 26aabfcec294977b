"""Turning encryption on for a memory store written without it: ``S3Store.encrypt_namespaces``
(and the command line's ``encrypt``), both index modes, on moto (S3, DynamoDB, KMS).

A plaintext store (values small and large, vectors, an overwrite, a delete, items sealed
into segments in the manifest mode, a versioned bucket) is migrated; then every version of
every object and every table item is scanned for the strings written
(``test_encryption._leaks``): none is found, and get, search and list_namespaces answer as
before. Cut after any round trip, every item reads whole with one of the two stores (the
plaintext one or the encrypting one) and the migration run again finishes. A plaintext
writer's put landing at any round trip of the migration is never lost.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import urllib.request
from typing import Any

import pytest
from cli_support import cli_env, ok, run_cli
from conftest import make_versioned
from helpers import cut_points
from store_reference import HashEmbeddings
from test_archive_cut import _cut_short
from test_encryption import _leaks
from test_store_s3 import keys, make_store

from s3_saver import (
    ConfigurationError,
    EncryptedObjectError,
    LocalKey,
    NamespaceEncryptStatus,
    PlaintextObjectError,
    S3Store,
)
from s3_saver._format.memory.segments import SEGMENT_DIR
from s3_saver._ops.memory.encrypt import YOUNG_STRAY
from s3_saver._transport.sync import SyncDriver

NS = ("memories", "user-1")
OTHER = ("memories", "user-2")
DEEP = ("memories", "user-1", "notes")
INDEX = {"dims": 4, "embed": HashEmbeddings(4), "fields": ["text"]}
BIG = 90_000  # random bytes as hex: a value object of its own in both modes
SMALL_HEAD = 600  # manifest head budget (bytes of rows): the rows seal into segments
# encrypt_namespaces of _plain_store on a versioned bucket, local key: (round trips, requests).
MIGRATION_COST = {"dynamodb": (27, 33), "manifest": (35, 36)}


def _reset(endpoint: str) -> None:
    request = urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")
    urllib.request.urlopen(request).close()


def _store(endpoint: str, mode: str, encryption: Any = None, **kwargs: Any) -> S3Store:
    store = make_store(endpoint, mode, encryption=encryption, index=INDEX, **kwargs)
    if mode == "manifest":
        store._memory.index.head_budget = SMALL_HEAD
    return store


def _plain_store(endpoint: str, mode: str) -> dict[str, str]:
    """A store written without encryption on a versioned bucket; returns the strings
    written (to scan for)."""
    make_versioned(endpoint)
    plain = _store(endpoint, mode)
    plain.setup()
    texts = {k: f"secret-{k}-{secrets.token_hex(6)}" for k in ("a", "b", "c", "d", "e", "gone")}
    for key, text in texts.items():
        plain.put(NS, key, {"text": text})
    plain.put(NS, "a", {"text": texts["a"], "again": True})  # an overwrite
    plain.delete(NS, "gone")
    texts["big"] = "big-" + secrets.token_hex(BIG)
    plain.put(OTHER, "large", {"text": texts["big"]})
    texts["deep"] = f"secret-deep-{secrets.token_hex(6)}"
    plain.put(DEEP, "n", {"text": texts["deep"]}, index=False)  # no vectors
    plain.close()
    return texts


def _view(store: S3Store) -> tuple:
    """What a reader sees: every item (times included), a search, the namespaces."""
    items = [store.get(ns, k) for ns, k in [(NS, "a"), (NS, "b"), (NS, "e"), (NS, "gone"), (OTHER, "large"), (DEEP, "n")]]
    hits = store.search(("memories",), query="secret-c", limit=10)
    return (
        [(i.namespace, i.key, i.value, i.created_at, i.updated_at) if i is not None else None for i in items],
        [(h.namespace, h.key, h.value, h.score) for h in hits],
        store.list_namespaces(),
    )


def _migrate(store: S3Store, driver: str = "sync", prefix: tuple[str, ...] = ()) -> list[NamespaceEncryptStatus]:
    if driver == "async":

        async def run() -> list[NamespaceEncryptStatus]:
            return [s async for s in store.aencrypt_namespaces(prefix)]

        return asyncio.run(run())
    return list(store.encrypt_namespaces(prefix))


def _no_leaks(endpoint: str, texts: dict[str, str]) -> None:
    for name, text in texts.items():
        assert _leaks(endpoint, text[:40]) == [], name


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_plaintext_store_migrated_keeps_no_plaintext_and_reads_as_before(endpoint, index_mode, driver) -> None:
    texts = _plain_store(endpoint, index_mode)
    assert all(_leaks(endpoint, t[:40]) for n, t in texts.items() if n != "gone")  # the scan finds them before
    if index_mode == "manifest":
        assert any(f"/{SEGMENT_DIR}/" in k for k in keys(endpoint)), "rows sealed into segments"
    before = _view(_store(endpoint, index_mode))
    encryption = LocalKey(os.urandom(32))
    store = _store(endpoint, index_mode, encryption)
    store.setup()  # the key store
    with pytest.raises(PlaintextObjectError):
        store.get(NS, "a")

    statuses = {s.namespace: s for s in _migrate(store, driver)}
    assert set(statuses) == {NS, OTHER, DEEP}
    assert all(s.complete for s in statuses.values()), statuses
    assert statuses[NS].items == 5 and statuses[OTHER].items == 1 and statuses[DEEP].items == 1
    assert statuses[OTHER].deleted > 0  # the plaintext versions the bucket kept (the large value's object)
    _no_leaks(endpoint, texts)
    reader = _store(endpoint, index_mode, encryption)  # another process
    assert _view(reader) == before
    with pytest.raises(EncryptedObjectError):
        _store(endpoint, index_mode).get(NS, "b")
    # Run again: nothing to do, nothing rewritten.
    again = _migrate(reader, driver)
    assert all(s.complete and s.items == 0 and s.deleted == 0 for s in again), again
    store.close()
    reader.close()


def test_a_migrated_namespace_erased_by_another_process_keeps_a_stale_writers_put(endpoint, index_mode) -> None:
    """Across features: a namespace migrated (its items rewritten under a key, its
    registration and items written before encryption), then a process caches its key by
    writing, another erases it, and the first writes again: the write is refused at its
    commit, sealed anew under the new life's key, and a fresh process reads it; the
    migrated items stay erased."""
    texts = _plain_store(endpoint, index_mode)
    encryption = LocalKey(os.urandom(32))
    migrator = _store(endpoint, index_mode, encryption)
    migrator.setup()
    assert all(s.complete for s in _migrate(migrator))
    writer = _store(endpoint, index_mode, encryption)
    writer.put(NS, "b", {"text": "written after the migration"})  # caches the key
    _store(endpoint, index_mode, encryption).erase_namespace(NS)
    writer.put(NS, "late", {"text": "after the erase"})
    reader = _store(endpoint, index_mode, encryption)
    assert reader.get(NS, "late").value == {"text": "after the erase"}
    assert [reader.get(NS, k) for k in ("a", "b", "e")] == [None, None, None]
    assert reader.get(OTHER, "large").value == {"text": texts["big"]}
    _no_leaks(endpoint, texts)


def test_encrypt_namespaces_needs_encryption_and_refuses_before_sending(endpoint, index_mode) -> None:
    plain = _store(endpoint, index_mode)
    plain.setup()
    plain.stats.reset()
    with pytest.raises(ConfigurationError, match="encryption="):
        plain.encrypt_namespaces()
    assert plain.stats.total_requests == 0
    plain.close()


# -- cut short at any round trip ----------------------------------------------------------------
def _finished(monkeypatch, store: S3Store, cut: int) -> None:
    """The migration run again finishes: at once, or, when the cut left a value object or
    segment no item names (it was released, its delete not sent), once that is older than
    the grace period (a put about to commit could have written it)."""
    statuses = _migrate(store)
    if not all(s.complete for s in statuses):
        reasons = {r.reason for s in statuses for r in s.remaining}
        assert reasons == {YOUNG_STRAY} and all(s.state == "encrypted" for s in statuses), (cut, statuses)
        with monkeypatch.context() as patch:
            patch.setattr("s3_saver._ops.memory.encrypt.GRACE", 0.0)  # an hour later
            statuses = _migrate(store)
    assert all(s.complete for s in statuses), (cut, statuses)


ITEMS = [(NS, "a"), (NS, "b"), (NS, "e"), (NS, "gone"), (OTHER, "large"), (DEEP, "n")]


def _items(store: S3Store) -> list[Any]:
    return [_whole(store.get(ns, k)) for ns, k in ITEMS]


def _whole(item: Any) -> Any:
    return None if item is None else (item.namespace, item.key, item.value, item.created_at, item.updated_at)


def _either(endpoint: str, mode: str, encryption: Any) -> list[Any]:
    """Each item as read by the one store that reads it: plaintext (a store without
    encryption) or encrypted (the encrypting store); the other refuses it by name."""
    plain, sealed = _store(endpoint, mode), _store(endpoint, mode, encryption)
    found = []
    for ns, key in ITEMS:
        answers = []
        for reader in (plain, sealed):
            try:
                answers.append(_whole(reader.get(ns, key)))
            except (PlaintextObjectError, EncryptedObjectError):
                answers.append(EncryptedObjectError)
        if None in answers:  # absent: both say so
            assert answers == [None, None], (ns, key, answers)
        else:
            assert answers.count(EncryptedObjectError) == 1, (ns, key, answers)
        found.append(next(a for a in answers if a is not EncryptedObjectError))
    plain.close()
    sealed.close()
    return found


def _fresh(endpoint: str, mode: str, encryption: Any) -> tuple[dict[str, str], list[Any]]:
    _reset(endpoint)
    texts = _plain_store(endpoint, mode)
    with _store(endpoint, mode, encryption) as keyed:
        keyed.setup()  # the key store
    with _store(endpoint, mode) as plain:
        return texts, _items(plain)


def test_the_migration_cut_after_any_round_trip_finishes_when_run_again(endpoint, index_mode, monkeypatch) -> None:
    encryption = LocalKey(os.urandom(32))
    _fresh(endpoint, index_mode, encryption)
    counter = _store(endpoint, index_mode, encryption)
    counter.stats.reset()
    assert all(s.complete for s in _migrate(counter))
    total, requests = counter.stats.round_trips, counter.stats.total_requests
    counter.close()
    print(f"\n{index_mode}: encrypt_namespaces of 3 namespaces (7 items): {total} round trips, {requests} requests")
    assert (total, requests) == MIGRATION_COST[index_mode]

    for cut in cut_points(total):
        texts, before = _fresh(endpoint, index_mode, encryption)
        store = _store(endpoint, index_mode, encryption)
        _cut_short(monkeypatch, cut, lambda s=store: _migrate(s))
        assert _either(endpoint, index_mode, encryption) == before, cut
        again = _store(endpoint, index_mode, encryption)  # another process runs it again
        _finished(monkeypatch, again, cut)
        assert _items(again) == before, cut
        _no_leaks(endpoint, texts)
        assert all(s.items == 0 for s in _migrate(again)), cut
        store.close()
        again.close()


def test_a_plaintext_put_landing_at_any_round_trip_of_the_migration_is_kept(endpoint, index_mode, monkeypatch) -> None:
    """A writer without encryption puts and deletes while the namespaces are migrated:
    the migration's rewrite of an item a writer changed since it read it never lands (a
    put wins, a deleted item stays deleted); what lands in plaintext after its namespace
    was done, the migration run again encrypts."""
    encryption = LocalKey(os.urandom(32))
    _fresh(endpoint, index_mode, encryption)
    counter = _store(endpoint, index_mode, encryption)
    counter.stats.reset()
    _migrate(counter)
    total = counter.stats.round_trips
    counter.close()
    for at in cut_points(total):
        texts, _ = _fresh(endpoint, index_mode, encryption)
        writer = _store(endpoint, index_mode)
        store = _store(endpoint, index_mode, encryption)
        late = {"text": f"late-{secrets.token_hex(6)}"}
        done: list[bool] = []
        real = SyncDriver._wave

        def wave(driver, calls, at=at, writer=writer, store=store, late=late, done=done, real=real):
            if driver is store._sync:
                if wave.sent == at and not done:
                    done.append(True)
                    writer.put(NS, "b", late)  # over an item plaintext or encrypted
                    writer.delete(NS, "e")
                    writer.put(OTHER, "large", late, index=False)
                wave.sent += 1
            return real(driver, calls)

        wave.sent = 0
        with monkeypatch.context() as patch:
            patch.setattr(SyncDriver, "_wave", wave)
            _migrate(store)
        assert done, at
        statuses = _migrate(store)  # run again: what landed after
        assert all(s.complete for s in statuses), (at, statuses)
        assert store.get(NS, "b").value == late, at
        assert store.get(NS, "e") is None, at
        assert store.get(OTHER, "large").value == late, at
        _no_leaks(endpoint, {**texts, "late": late["text"]})
        writer.close()
        store.close()


# -- the command line -----------------------------------------------------------------------------
def test_the_command_line_encrypt_migrates_the_memory_store_too(endpoint, index_mode) -> None:
    """``encrypt --yes`` (no --thread) encrypts the memory store on the saver's prefix
    beside the threads: --json names the namespaces, no plaintext is left, ``memory
    show`` reads with the key; run again, nothing is rewritten. With --thread, memory is
    left alone."""
    import base64

    texts = _plain_store(endpoint, index_mode)
    env = {**cli_env(endpoint, index_mode), "S3_SAVER_LOCAL_KEY": base64.b64encode(os.urandom(32)).decode()}
    ok(run_cli(endpoint, "--local-key", "setup", mode=index_mode, env=env))  # the key store
    only = json.loads(ok(run_cli(endpoint, "--local-key", "--json", "encrypt", "--thread", "t", "--yes", mode=index_mode, env=env)))
    assert only["encrypted_namespaces"] == [] and _leaks(endpoint, texts["a"])

    done = json.loads(ok(run_cli(endpoint, "--local-key", "--json", "encrypt", "--yes", mode=index_mode, env=env)))
    assert sorted(map(tuple, done["encrypted_namespaces"])) == sorted([NS, OTHER, DEEP]), done
    assert done["memory_items"] == 7 and done["busy_namespaces"] == [] and done["remaining"] == [], done
    _no_leaks(endpoint, texts)
    shown = json.loads(ok(run_cli(endpoint, "--local-key", "--json", "memory", "show", "--ns", "memories.user-1", "b", mode=index_mode, env=env)))
    assert shown["value"] == {"text": texts["b"]}
    out = ok(run_cli(endpoint, "--local-key", "encrypt", "--yes", mode=index_mode, env=env))
    assert "memory: encrypted 3 namespaces, 0 items rewritten now" in out, out


def _rewrites(calls: Any) -> bool:
    """Whether a wave holds the migration's rewrite of a namespace (its commit): the
    head's swap (manifest) or the fenced item updates (DynamoDB)."""
    for call in calls:
        params = getattr(call, "params", {})
        if call.operation == "put_object" and str(params.get("Key", "")).endswith("/@head") and "IfMatch" in params:
            return True
        if call.operation == "update_item" and ":was" in params.get("ExpressionAttributeValues", {}):
            return True
    return False


def test_a_put_or_delete_between_the_read_and_the_rewrite_wins(endpoint, index_mode, monkeypatch) -> None:
    """The window the fence is for: a writer without encryption puts over an item and
    deletes another after the migration read the namespace, before its rewrite: the
    rewrite of those items does not land (the put is not overwritten by the old value,
    the deleted item does not come back); the run again encrypts the put."""
    encryption = LocalKey(os.urandom(32))
    texts, _ = _fresh(endpoint, index_mode, encryption)
    writer = _store(endpoint, index_mode)
    store = _store(endpoint, index_mode, encryption)
    late = {"text": f"late-{secrets.token_hex(6)}"}
    fired: list[bool] = []
    real = SyncDriver._wave

    def wave(driver, calls):
        if driver is store._sync and not fired and _rewrites(calls):
            fired.append(True)
            writer.put(NS, "b", late)
            writer.delete(NS, "e")
            writer.put(OTHER, "large", late, index=False)
        return real(driver, calls)

    with monkeypatch.context() as patch:
        patch.setattr(SyncDriver, "_wave", wave)
        first = {s.namespace: s for s in _migrate(store)}
    assert fired and all(s.complete for s in first.values()), first
    assert first[NS].items > 5  # read again after the rewrites the writer won over
    assert store.get(NS, "b").value == late
    assert store.get(NS, "e") is None
    assert store.get(OTHER, "large").value == late
    _no_leaks(endpoint, {**texts, "late": late["text"]})
    writer.close()
    store.close()


def test_a_store_with_a_replica_is_refused_by_name_before_sending(regions) -> None:
    """The replica bucket keeps the plaintext versions replication copied there, which the
    migration cannot reach: refused, naming the replica's bucket, before any request."""
    from test_store_replica import _saver

    saver = _saver(regions, "manifest", encryption=LocalKey(os.urandom(32)))
    store = S3Store.from_saver(saver)
    saver.stats.reset()
    with pytest.raises(ConfigurationError, match=f"replica \\(s3://{regions.replica.bucket}\\)"):
        store.encrypt_namespaces()
    assert saver.stats.total_requests == 0
    saver.close()
