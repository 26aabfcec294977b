"""S3Store with ``encryption=``: every item's value and vectors sealed under its
namespace's own key, bound to its place; erase_namespace destroys the keys first; no
silent plaintext either way; the requests of the steady state unchanged. Both index
modes (the ``index_mode`` fixture), both drivers, on moto (S3, DynamoDB, KMS).

Several stores stand for several processes: each has its own key cache.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from typing import Any

import boto3
import pytest
from conftest import BUCKET, TABLE, make_saver, make_versioned
from store_reference import HashEmbeddings
from test_encryption import KEY_BUCKET, _kms, _leaks
from test_store_s3 import make_store

from s3_saver import (
    ConfigurationError,
    EncryptedObjectError,
    EncryptionKeyError,
    ForeignCiphertextError,
    LocalKey,
    NamespaceErasedError,
    PlaintextObjectError,
    S3Cache,
    S3Store,
    ThreadErasedError,
)
from s3_saver._crypto.envelope import is_sealed
from s3_saver._crypto.records import decode_record
from s3_saver._format.codec import pack, unpack
from s3_saver._format.memory.documents import VALUE_FORMAT
from s3_saver._format.memory.names import node_id
from s3_saver.errors import CorruptObjectError

NS = ("memories", "user-1")
OTHER = ("memories", "user-2")
BIG = 90_000  # random bytes, as hex: compressed still over 64 KiB, a value object of its own in both modes


def _store(endpoint: str, mode: str, encryption: Any, **kwargs: Any) -> S3Store:
    store = make_store(endpoint, mode, encryption=encryption, **kwargs)
    store.setup()
    store.stats.reset()
    return store


def _s3(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _record(endpoint: str, namespace: tuple[str, ...]):
    key = f"m/{node_id(namespace)}"
    found = _s3(endpoint).get_object(Bucket=KEY_BUCKET, Key=key)
    return decode_record(found["Body"].read(), found["ETag"], key)


def _run(store: S3Store, driver: str, name: str, *args: Any, **kwargs: Any) -> Any:
    if driver == "async":
        return asyncio.run(getattr(store, "a" + name)(*args, **kwargs))
    return getattr(store, name)(*args, **kwargs)


# -- no plaintext anywhere ---------------------------------------------------------------------
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_encrypted_store_keeps_no_plaintext_of_values_or_vectors(endpoint, index_mode, driver) -> None:
    """Values small and large, overwritten and deleted, with vectors; on a versioned
    bucket (every replaced head stays): no version of any object, no table attribute
    holds a value's text; every read returns what was written."""
    make_versioned(endpoint)
    encryption = _kms(endpoint) if driver == "sync" else LocalKey(os.urandom(32))
    store = _store(endpoint, index_mode, encryption, index={"dims": 4, "embed": HashEmbeddings(4), "fields": ["text"]})
    secret = {k: f"secret-{k}-{secrets.token_hex(8)}" for k in ("a", "b", "c", "gone")}
    big = "big-" + secrets.token_hex(BIG)
    for key, text in secret.items():
        _run(store, driver, "put", NS, key, {"text": text})
    _run(store, driver, "put", NS, "a", {"text": secret["a"], "again": True})
    _run(store, driver, "put", OTHER, "large", {"text": big})
    _run(store, driver, "delete", NS, "gone")
    assert _run(store, driver, "get", NS, "b").value == {"text": secret["b"]}
    assert _run(store, driver, "get", OTHER, "large").value == {"text": big}
    hits = _run(store, driver, "search", ("memories",), query=secret["c"], limit=10)
    assert {h.key for h in hits} == {"a", "b", "c", "large"} and hits[0].key == "c"
    # Another process (a cold key cache) reads the same.
    other = make_store(endpoint, index_mode, encryption=encryption)
    assert _run(other, driver, "get", NS, "a").value == {"text": secret["a"], "again": True}
    for text in (*secret.values(), big[:40]):
        assert _leaks(endpoint, text) == [], text
    # Each namespace has its own key, in the key store beside the saver's.
    assert _record(endpoint, NS).key_id != _record(endpoint, OTHER).key_id
    store.close()
    other.close()


def test_the_scan_finds_the_values_of_a_store_without_encryption(endpoint, index_mode) -> None:
    """The control: the same scan finds the values a plain store writes."""
    store = _store(endpoint, index_mode, None)
    text = f"secret-{secrets.token_hex(8)}"
    store.put(NS, "a", {"text": text})
    store.put(OTHER, "large", {"text": text + secrets.token_hex(BIG)})
    assert len(_leaks(endpoint, text)) >= 2


# -- bound to its place ------------------------------------------------------------------------
def _value_objects(endpoint: str, namespace: tuple[str, ...]) -> list[str]:
    found = _s3(endpoint).list_objects_v2(Bucket=BUCKET, Prefix=f"memory/n/{node_id(namespace)}/@v/")
    return [o["Key"] for o in found.get("Contents", [])]


def _renamed(body: bytes, namespace: tuple[str, ...], key: str) -> bytes:
    record = unpack(body, VALUE_FORMAT, "test")
    return pack({**record, "path": list(namespace), "key": key})


def test_a_value_object_moved_to_another_item_or_namespace_refuses_to_open(endpoint, index_mode) -> None:
    encryption = LocalKey(os.urandom(32))
    store = _store(endpoint, index_mode, encryption)
    s3 = _s3(endpoint)
    one = secrets.token_hex(BIG)
    store.put(NS, "k1", {"text": one})
    (first,) = _value_objects(endpoint, NS)
    store.put(NS, "k2", {"text": secrets.token_hex(BIG)})
    (second,) = set(_value_objects(endpoint, NS)) - {first}
    store.put(OTHER, "k1", {"text": secrets.token_hex(BIG)})
    (theirs,) = _value_objects(endpoint, OTHER)
    body = s3.get_object(Bucket=BUCKET, Key=first)["Body"].read()
    # The object names its item in the clear (a check before the tag's): moved with that
    # name changed too, it is the tag that refuses it.
    s3.put_object(Bucket=BUCKET, Key=second, Body=body)
    with pytest.raises(CorruptObjectError, match="key 'k1''s"):
        store.get(NS, "k2")
    s3.put_object(Bucket=BUCKET, Key=second, Body=_renamed(body, NS, "k2"))
    with pytest.raises(ForeignCiphertextError, match="key 'k2'"):
        store.get(NS, "k2")
    # Another namespace's item of the same key: another namespace's key.
    s3.put_object(Bucket=BUCKET, Key=theirs, Body=_renamed(body, OTHER, "k1"))
    with pytest.raises(ForeignCiphertextError, match="user-2"):
        make_store(endpoint, index_mode, encryption=encryption).get(OTHER, "k1")
    assert store.get(NS, "k1").value == {"text": one}


def test_plaintext_is_refused_and_an_encrypted_item_is_not_read_without_the_key(endpoint, index_mode) -> None:
    plain = _store(endpoint, index_mode, None)
    plain.put(NS, "old", {"text": "written before encryption"})
    sealed = _store(endpoint, index_mode, LocalKey(os.urandom(32)))
    with pytest.raises(PlaintextObjectError, match="not encrypted"):
        sealed.get(NS, "old")
    sealed.put(OTHER, "new", {"text": "written encrypted"})
    with pytest.raises(EncryptedObjectError, match="written encrypted"):
        plain.get(OTHER, "new")
    with pytest.raises(EncryptedObjectError):
        plain.search(("memories",))


# -- erase ---------------------------------------------------------------------------------------
def _backup(endpoint: str, mode: str) -> tuple[list[tuple[str, bytes, bool]], list[dict[str, Any]]]:
    """Every version of the bucket's memory (key, bytes, whether current) and every table item."""
    s3 = _s3(endpoint)
    versions = []
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=BUCKET, Prefix="memory/"):
        for v in page.get("Versions", []):
            body = s3.get_object(Bucket=BUCKET, Key=v["Key"], VersionId=v["VersionId"])["Body"].read()
            versions.append((v["Key"], body, v["IsLatest"]))
    items = []
    if mode == "dynamodb":
        client = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
        items = [i for p in client.get_paginator("scan").paginate(TableName=TABLE) for i in p["Items"]]
    return versions, items


def _restore(endpoint: str, versions: list[tuple[str, bytes, bool]], items: list[dict[str, Any]]) -> None:
    """Every old version made current again (the current one last), every table item
    put back as it was: what a backup or a point-in-time restore brings back."""
    s3 = _s3(endpoint)
    for key, body, _ in sorted(versions, key=lambda v: v[2]):
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    client = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    for item in items:
        client.put_item(TableName=TABLE, Item=item)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_erased_namespace_stays_unreadable_when_every_old_version_is_restored(endpoint, index_mode, driver) -> None:
    make_versioned(endpoint)
    encryption = LocalKey(os.urandom(32)) if driver == "sync" else _kms(endpoint)
    store = _store(endpoint, index_mode, encryption)
    for i in range(3):
        _run(store, driver, "put", NS, f"k{i}", {"text": f"doomed-{i}"})
    _run(store, driver, "put", NS, "k0", {"text": "doomed-again"})
    _run(store, driver, "put", NS, "large", {"text": secrets.token_hex(BIG)})
    _run(store, driver, "put", ("memories", "user-1", "notes"), "n", {"text": "doomed-note"})
    _run(store, driver, "put", OTHER, "k", {"text": "kept"})
    versions, items = _backup(endpoint, index_mode)
    report = _run(store, driver, "erase_namespace", NS)
    assert set(report.namespaces) == {NS, ("memories", "user-1", "notes")}
    for ns in report.namespaces:
        erased = _record(endpoint, ns)
        assert not erased.live and erased.settled and erased.wrapped is None
    assert all(r.crypto_erased for r in report.remaining if f"/n/{node_id(NS)}/" in r.key)
    assert report.complete == all(r.crypto_erased for r in report.remaining)
    assert _run(store, driver, "get", NS, "k1") is None  # gone for readers

    _restore(endpoint, versions, items)
    for reader in (make_store(endpoint, index_mode, encryption=encryption), store):
        for key in ("k1", "k0", "large"):
            with pytest.raises(NamespaceErasedError, match="erased") as found:
                _run(reader, driver, "get", NS, key)
            assert found.value.namespace == NS and isinstance(found.value, ThreadErasedError)
        with pytest.raises(NamespaceErasedError):
            _run(reader, driver, "search", ("memories",))
        assert _run(reader, driver, "get", OTHER, "k").value == {"text": "kept"}
        reader.close()


def test_a_namespace_written_again_after_its_erase_gets_a_new_key(endpoint, index_mode) -> None:
    encryption = LocalKey(os.urandom(32))
    store = _store(endpoint, index_mode, encryption)
    store.put(NS, "k", {"text": "first life"})
    old = _record(endpoint, NS).key_id
    store.erase_namespace(NS)
    store.put(NS, "k", {"text": "second life"})
    assert _record(endpoint, NS).live and _record(endpoint, NS).key_id != old
    for reader in (store, make_store(endpoint, index_mode, encryption=encryption)):
        assert reader.get(NS, "k").value == {"text": "second life"}


# -- from a saver, the node cache ---------------------------------------------------------------
def test_a_store_and_a_cache_from_an_encrypting_saver(endpoint, index_mode) -> None:
    encryption = LocalKey(os.urandom(32))
    saver = make_saver(endpoint, index_mode, encryption=encryption)
    saver.setup()
    store = S3Store.from_saver(saver)
    text = f"secret-{secrets.token_hex(8)}"
    store.put(NS, "k", {"text": text})
    assert store.get(NS, "k").value == {"text": text}
    cache = S3Cache.from_saver(saver)
    cache.set({(("node", "n1"), "key-1"): ({"text": text + "-cached"}, None)})
    assert cache.get([(("node", "n1"), "key-1")]) == {(("node", "n1"), "key-1"): {"text": text + "-cached"}}
    assert _leaks(endpoint, text) == []
    assert _record(endpoint, NS).live
    # The cache's entries are sealed under the store-wide key (``@store``), bound to their
    # object: one moved to another entry's key misses; a plaintext one is refused (a miss).
    s3 = _s3(endpoint)
    cache.set({(("node", "n1"), "key-2"): ({"text": "two"}, None)})
    entries = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="node-cache/")["Contents"] if "@gens" not in o["Key"]]
    bodies = {k: s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in entries}
    assert len(bodies) == 2 and all(is_sealed(b) for b in bodies.values())
    assert _s3(endpoint).head_object(Bucket=KEY_BUCKET, Key="@store")
    one, two = entries
    s3.put_object(Bucket=BUCKET, Key=two, Body=bodies[one])
    assert len(cache.get([(("node", "n1"), "key-1"), (("node", "n1"), "key-2")])) == 1
    plain = S3Cache.from_saver(make_saver(endpoint, index_mode))
    plain.set({(("node", "n1"), "key-3"): ({"text": "plain"}, None)})
    assert plain.get([(("node", "n1"), "key-3")]) and not plain.get([(("node", "n1"), "key-1")])
    assert cache.get([(("node", "n1"), "key-3")]) == {}
    saver.close()


@pytest.mark.parametrize("kind", ["kms", "local"])
def test_a_standalone_cache_with_encryption_seals_under_the_savers_store_key(endpoint, index_mode, kind) -> None:
    """``S3Cache(..., encryption=)``: entries sealed under the store-wide key (``@store``),
    the key a saver with the same encryption, bucket and prefix shares with its
    from_saver cache (each reads what the other wrote); sync and async; no plaintext
    anywhere; a cache without encryption reads none of it and its entries miss here."""
    from test_encryption import _encryption

    encryption = _encryption(endpoint, kind)
    cache = S3Cache(BUCKET, endpoint_url=endpoint, region_name="us-east-1", encryption=encryption)
    cache.setup()  # the bucket and the key store
    assert _s3(endpoint).get_bucket_versioning(Bucket=KEY_BUCKET).get("Status") is None
    text = f"secret-{secrets.token_hex(8)}"
    one, two = (("node", "n1"), "key-1"), (("node", "n1"), "key-2")
    cache.set({one: ({"text": text}, None)})
    asyncio.run(cache.aset({two: ({"text": text + "-async"}, None)}))
    assert cache.get([one]) == {one: {"text": text}}
    assert asyncio.run(cache.aget([one, two])) == {one: {"text": text}, two: {"text": text + "-async"}}
    assert _leaks(endpoint, text) == []
    s3 = _s3(endpoint)
    entries = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="node-cache/")["Contents"] if "@gens" not in o["Key"]]
    assert len(entries) == 2 and all(is_sealed(s3.get_object(Bucket=BUCKET, Key=k)["Body"].read()) for k in entries)
    assert s3.head_object(Bucket=KEY_BUCKET, Key="@store")
    # The saver's cache, another process: the same key, each reads the other's entries.
    saver = make_saver(endpoint, index_mode, encryption=encryption)
    saver.setup()
    from_saver = S3Cache.from_saver(saver)
    assert from_saver.get([one, two]) == {one: {"text": text}, two: {"text": text + "-async"}}
    three = (("node", "n2"), "key-3")
    from_saver.set({three: ({"text": "three"}, None)})
    assert S3Cache(BUCKET, endpoint_url=endpoint, region_name="us-east-1", encryption=encryption).get([three]) == {
        three: {"text": "three"}
    }
    # No silent plaintext either way.
    plain = S3Cache(BUCKET, endpoint_url=endpoint, region_name="us-east-1")
    assert plain.get([one, three]) == {}
    four = (("node", "n2"), "key-4")
    plain.set({four: ({"text": "plain"}, None)})
    assert plain.get([four]) == {four: {"text": "plain"}} and cache.get([four]) == {}
    for c in (cache, plain):
        c.close()
    saver.close()


def test_a_standalone_cache_refuses_an_encryption_that_is_not_one(endpoint) -> None:
    with pytest.raises(ConfigurationError, match="KmsKey"):
        S3Cache(BUCKET, endpoint_url=endpoint, encryption="alias/checkpoints")


# -- requests ------------------------------------------------------------------------------------
def _counts(store: S3Store, calls: list[Any]) -> list[tuple[int, dict[str, int]]]:
    out = []
    for call in calls:
        store.stats.reset()
        call()
        out.append((store.stats.round_trips, dict(store.stats.requests)))
    return out


def _steady(store: S3Store) -> list[tuple[int, dict[str, int]]]:
    store.put(NS, "k", {"text": "v"})
    store.get(NS, "k")
    return _counts(
        store,
        [
            lambda: store.put(NS, "k", {"text": "w"}),
            lambda: store.get(NS, "k"),
            lambda: store.search(NS, limit=5),
            lambda: store.put(NS, "k2", {"text": "x"}),
        ],
    )


def test_the_steady_state_sends_what_a_plain_store_sends(endpoint, index_mode) -> None:
    plain = _steady(_store(endpoint, index_mode, None, prefix="plain/"))
    encrypted = _steady(_store(endpoint, index_mode, LocalKey(os.urandom(32)), prefix="sealed/"))
    assert encrypted == plain


def test_a_cold_process_pays_the_key_get_beside_its_read_and_one_decrypt(endpoint, index_mode) -> None:
    encryption = _kms(endpoint)
    _store(endpoint, index_mode, encryption).put(NS, "k", {"text": "v"})
    plain = _store(endpoint, index_mode, None, prefix="plain/")
    plain.put(NS, "k", {"text": "v"})
    plain = make_store(endpoint, index_mode, prefix="plain/")  # a cold process with no key to load
    cold = make_store(endpoint, index_mode, encryption=encryption)
    (before,) = _counts(plain, [lambda: plain.get(NS, "k")])
    (read,) = _counts(cold, [lambda: cold.get(NS, "k")])
    # The key GET in the first wave, beside the index read (one more request, no more
    # round trip); then one KMS Decrypt (one more round trip).
    assert read[1].pop(("kms", "decrypt")) == 1
    assert read[1].pop(("s3", "get_object")) == before[1].pop(("s3", "get_object"), 0) + 1
    assert read[1] == before[1] and read[0] == before[0] + 1, (read, before)


def test_an_erase_cut_after_it_destroyed_the_keys_fences_writes_and_finishes_when_called_again(
    endpoint, index_mode, monkeypatch
) -> None:
    """The keys go first: cut right after, nothing is deleted yet, yet nothing of the
    namespace reads (erased), and no process can write into it (no new key before the
    erase ends); the erase called again finishes, and the namespace lives again."""
    encryption = LocalKey(os.urandom(32))
    store = _store(endpoint, index_mode, encryption)
    store.put(NS, "k", {"text": "doomed"})
    store.put(OTHER, "k", {"text": "kept"})
    other = make_store(endpoint, index_mode, encryption=encryption)  # another process

    def cut(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("cut after the keys were destroyed")

    with monkeypatch.context() as patch:
        patch.setattr(type(store._memory.index), "erase_rows", cut)
        with pytest.raises(RuntimeError, match="cut"):
            store.erase_namespace(NS)
    erased = _record(endpoint, NS)
    assert not erased.live and not erased.settled
    with pytest.raises(NamespaceErasedError):
        other.get(NS, "k")
    with pytest.raises(NamespaceErasedError, match="being erased"):
        other.put(NS, "k2", {"text": "too early"})
    assert other.get(OTHER, "k").value == {"text": "kept"}

    report = store.erase_namespace(NS)
    assert report.namespaces == (NS,) and _record(endpoint, NS).settled
    assert other.get(NS, "k") is None
    other.put(NS, "k", {"text": "new life"})
    assert _record(endpoint, NS).live and store.get(NS, "k").value == {"text": "new life"}


def test_a_namespaces_key_errors_name_the_namespace_bucket_and_prefix(endpoint, index_mode, monkeypatch) -> None:
    """The key store's refusals reached through the memory store (a record wrapped by
    another master key, a record moved from another namespace, a write while an erase is
    under way) name the namespace, the store's bucket and prefix, never a "thread"."""
    encryption = LocalKey(os.urandom(32))
    store = _store(endpoint, index_mode, encryption, prefix="tenant/")
    store.put(NS, "k", {"text": "one"})
    store.put(OTHER, "k", {"text": "two"})
    where = f"s3://{BUCKET}/tenant/"

    def named(message: str, namespace: tuple[str, ...]) -> None:
        assert "('memories', " in message and repr(namespace[-1]) in message, message
        assert where in message and "thread" not in message, message

    # Another master key: the record says what wrapped it.
    with pytest.raises(EncryptionKeyError) as found:
        make_store(endpoint, index_mode, prefix="tenant/", encryption=LocalKey(os.urandom(32))).get(NS, "k")
    named(str(found.value), NS)
    # A record moved from another namespace: bound to its own, it does not unwrap here.
    s3 = _s3(endpoint)
    moved = s3.get_object(Bucket=KEY_BUCKET, Key=f"tenant/m/{node_id(NS)}")["Body"].read()
    s3.put_object(Bucket=KEY_BUCKET, Key=f"tenant/m/{node_id(OTHER)}", Body=moved)
    with pytest.raises(ForeignCiphertextError) as found:
        make_store(endpoint, index_mode, prefix="tenant/", encryption=encryption).get(OTHER, "k")
    named(str(found.value), OTHER)
    # An erase cut after the keys were destroyed: another process's write is refused.
    with monkeypatch.context() as patch:
        patch.setattr(type(store._memory.index), "erase_rows", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("cut")))
        with pytest.raises(RuntimeError, match="cut"):
            store.erase_namespace(NS)
    with pytest.raises(NamespaceErasedError, match="being erased") as found:
        make_store(endpoint, index_mode, prefix="tenant/", encryption=encryption).put(NS, "k2", {"text": "early"})
    named(str(found.value), NS)


def test_a_cold_write_pays_the_key_before_it_seals(endpoint, index_mode) -> None:
    """A write seals before its first index request: a cold process reads the
    namespace's key first (GET, then KMS Decrypt: 2 more requests); a namespace's first
    write makes it (GET 404, GenerateDataKey, the record's create: 3 more). The index
    requests are a plain store's (DynamoDB: the registration a transaction, not a PutItem)."""
    encryption = _kms(endpoint)
    _store(endpoint, index_mode, encryption).put(NS, "k", {"text": "v"})
    seed = _store(endpoint, index_mode, None, prefix="plain/")
    seed.put(NS, "k", {"text": "v"})

    def cold(plain: bool, namespace: tuple[str, ...]) -> tuple[int, dict[Any, int]]:
        if plain:
            store = make_store(endpoint, index_mode, prefix="plain/")
        else:
            store = make_store(endpoint, index_mode, encryption=encryption)
        ((trips, requests),) = _counts(store, [lambda: store.put(namespace, "k2", {"text": "w"})])
        return trips, requests

    existing = {("s3", "get_object"): 1, ("kms", "decrypt"): 1}
    new = {("s3", "get_object"): 1, ("kms", "generate_data_key"): 1, ("s3", "put_object"): 1}
    for namespace, extra in ((NS, existing), (("fresh",), new)):
        plain, sealed = cold(True, namespace), cold(False, namespace)
        wanted = dict(plain[1])
        for call, n in extra.items():
            wanted[call] = wanted.get(call, 0) + n
        if index_mode == "dynamodb":
            # The namespace's registration checks the erased keys' record in its own write:
            # a transaction instead of a PutItem, one request still.
            wanted[("dynamodb", "transact_write_items")] += wanted.pop(("dynamodb", "put_item"))
        # Round trips: at most one more per step (the first may ride beside the checks a
        # cold process's first wave carries anyway).
        assert sealed[1] == wanted and plain[0] < sealed[0] <= plain[0] + len(extra), (namespace, plain, sealed)


# -- export and import ---------------------------------------------------------------------------
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_export_is_sealed_and_bound_to_the_namespace_keys(endpoint, index_mode, driver) -> None:
    """An encrypting store's export holds no value in plaintext; another store (another
    prefix, the same keyring) imports it, re-encrypting under its own keys; a store
    without encryption refuses it; once the namespace is erased, the export reads nowhere."""
    encryption = LocalKey(os.urandom(32)) if driver == "sync" else _kms(endpoint)
    store = _store(endpoint, index_mode, encryption, index={"dims": 4, "embed": HashEmbeddings(4), "fields": ["text"]})
    secret = f"secret-{secrets.token_hex(8)}"
    large = secrets.token_hex(BIG)
    _run(store, driver, "put", NS, "k", {"text": secret})
    _run(store, driver, "put", OTHER, "large", {"text": large})
    data = _run(store, driver, "export_memory", ("memories",))
    assert secret.encode() not in data and large[:40].encode() not in data
    assert b"s3_saver.sealed" in data

    target = _store(endpoint, index_mode, encryption, prefix="copy/", index={"dims": 4, "embed": HashEmbeddings(4), "fields": ["text"]})
    report = _run(target, driver, "import_memory", data)
    assert report.written == 2
    assert _run(target, driver, "get", NS, "k").value == {"text": secret}
    assert _run(target, driver, "search", ("memories",), query=secret, limit=1)[0].key == "k"
    assert _leaks(endpoint, secret) == []
    with pytest.raises(EncryptedObjectError, match="written encrypted by a store"):
        _run(_store(endpoint, index_mode, None, prefix="plain/"), driver, "import_memory", data)

    _run(store, driver, "erase_namespace", NS)
    with pytest.raises(NamespaceErasedError):
        _run(_store(endpoint, index_mode, encryption, prefix="again/"), driver, "import_memory", data)


def test_a_key_cached_before_another_process_erased_the_namespace_reads_its_new_life(endpoint, index_mode) -> None:
    """Process A cached the namespace's key; B erases the namespace and writes it anew
    (a new key). A's next read meets content sealed under a key it does not hold: it
    reads the key record again (once) and returns the new life, never an error."""
    encryption = LocalKey(os.urandom(32))
    a = _store(endpoint, index_mode, encryption)
    a.put(NS, "k", {"text": "old life"})
    assert a.get(NS, "k").value == {"text": "old life"}
    b = make_store(endpoint, index_mode, encryption=encryption)
    b.erase_namespace(NS)
    b.put(NS, "k", {"text": "new life"})
    assert a.get(NS, "k").value == {"text": "new life"}
    assert [h.value for h in a.search(NS)] == [{"text": "new life"}]


def test_rewrap_wraps_the_memory_keys_too(endpoint, index_mode) -> None:
    """The saver's rewrap wraps the namespaces' keys and the store-wide key anew: a
    process with the new key only reads the store and the cache."""
    old, new = LocalKey(os.urandom(32)), LocalKey(os.urandom(32))
    saver = make_saver(endpoint, index_mode, encryption=old)
    saver.setup()
    S3Store.from_saver(saver).put(NS, "k", {"text": "kept across a rotation"})
    S3Cache.from_saver(saver).set({(("node", "n"), "c"): ({"text": "cached"}, None)})
    report = saver.rewrap(new)
    assert report.rewrapped == 2  # the namespace's key and the store-wide key
    assert _record(endpoint, NS).kek == f"local:{new.fingerprint}"
    after = make_saver(endpoint, index_mode, encryption=new)
    assert S3Store.from_saver(after).get(NS, "k").value == {"text": "kept across a rotation"}
    assert S3Cache.from_saver(after).get([(("node", "n"), "c")]) == {(("node", "n"), "c"): {"text": "cached"}}
    assert saver.rewrap(new).rewrapped == 0
