"""S3Store with ``encryption=``: a write sealed under a namespace key that another
process's erase destroyed is refused at its commit, sealed again under the namespace's
key as read then, and committed: never lost. Both index modes (the ``index_mode``
fixture), both drivers, on moto.

Several stores stand for several processes: each has its own key cache.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import boto3
import pytest
from conftest import TABLE
from faults import FaultProxy, calls
from langgraph.store.base import PutOp
from test_store_encryption import BIG, NS, OTHER, _counts, _record, _store
from test_store_s3 import make_store

from s3_saver import LocalKey, NamespaceErasedError, S3Store
from s3_saver._format.memory.documents import registry_partition
from s3_saver._format.memory.names import registry_key


def _run(store: S3Store, driver: str, name: str, *args: Any, **kwargs: Any) -> Any:
    if driver == "async":
        return asyncio.run(getattr(store, "a" + name)(*args, **kwargs))
    return getattr(store, name)(*args, **kwargs)


def _fresh(endpoint: str, mode: str, encryption: Any) -> S3Store:
    """A third process, with no key cached."""
    return make_store(endpoint, mode, encryption=encryption)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_put_with_a_key_cached_before_another_process_erased_the_namespace_is_kept(
    endpoint, index_mode, driver
) -> None:
    """A caches the namespace's key; B erases the namespace; A's put, sealed under the
    destroyed key, is refused at its commit, sealed again under a new key, and every
    reader reads it."""
    encryption = LocalKey(os.urandom(32))
    a = _store(endpoint, index_mode, encryption)
    _run(a, driver, "put", NS, "k", {"text": "before"})
    old = _record(endpoint, NS).key_id
    _store(endpoint, index_mode, encryption).erase_namespace(NS)
    _run(a, driver, "put", NS, "k2", {"text": "after the erase"})
    assert _record(endpoint, NS).live and _record(endpoint, NS).key_id != old
    for reader in (_fresh(endpoint, index_mode, encryption), a):
        assert reader.get(NS, "k2").value == {"text": "after the erase"}
        assert reader.get(NS, "k") is None
        assert [h.key for h in reader.search(NS)] == ["k2"]


def test_a_registration_cancelled_by_a_conflict_is_sent_again(endpoint) -> None:
    """DynamoDB: an encrypting process's first put registers the namespace in one
    transaction with a check of the erase's destroyed ids. An erase writing those ids at
    that moment cancels it (``TransactionConflict``): nothing applied, so it is sent again
    (two conflicts here), and the put lands, at one more request per conflict."""
    encryption = LocalKey(os.urandom(32))
    _store(endpoint, "dynamodb", encryption).close()
    with FaultProxy(endpoint) as proxy:
        store = make_store(proxy.url, "dynamodb", encryption=encryption)
        proxy.configure(seed=1, kinds=("ddb_tx_conflict",), rate=1.0, operations=calls("transact_write_items"), max_faults=2)
        store.put(NS, "k", {"text": "registered"})
        assert proxy.faults["ddb_tx_conflict"] == 2
        sent = store.stats.first_sends().requests
        # The registration and the item's creation, and the registration twice more.
        assert sent[("dynamodb", "transact_write_items")] == 2 + 2 and not store.stats.resent
        store.close()
    assert _fresh(endpoint, "dynamodb", encryption).get(NS, "k").value == {"text": "registered"}


def test_a_put_with_a_stale_key_into_a_new_life_joins_it(endpoint, index_mode) -> None:
    """B erases the namespace and writes it anew (a new key); A, still holding the old
    key, overwrites B's item and adds one: both sealed again under B's key."""
    encryption = LocalKey(os.urandom(32))
    a = _store(endpoint, index_mode, encryption)
    a.put(NS, "k", {"text": "old life"})
    b = _store(endpoint, index_mode, encryption)
    b.erase_namespace(NS)
    b.put(NS, "k", {"text": "new life"})
    new = _record(endpoint, NS).key_id
    a.put(NS, "k", {"text": "A over the new life"})
    a.put(NS, "k3", {"text": "A's new key"})
    assert _record(endpoint, NS).key_id == new
    for reader in (_fresh(endpoint, index_mode, encryption), b, a):
        assert reader.get(NS, "k").value == {"text": "A over the new life"}
        assert reader.get(NS, "k3").value == {"text": "A's new key"}


def test_a_batch_with_a_stale_key_commits_whole_and_a_large_value_too(endpoint, index_mode) -> None:
    """A batch of puts into the erased namespace (one of them a value object) and into
    another one, and a delete: committed once, under the new key."""
    encryption = LocalKey(os.urandom(32))
    a = _store(endpoint, index_mode, encryption)
    a.put(NS, "gone", {"text": "erased"})
    a.put(NS, "k", {"text": "erased too"})
    a.put(OTHER, "o", {"text": "kept"})
    _store(endpoint, index_mode, encryption).erase_namespace(NS)
    big = {"text": os.urandom(BIG).hex()}
    a.batch(
        [
            PutOp(NS, "x", {"text": "x"}),
            PutOp(NS, "big", big),
            PutOp(NS, "gone", None),
            PutOp(OTHER, "o2", {"text": "other"}),
        ]
    )
    reader = _fresh(endpoint, index_mode, encryption)
    assert reader.get(NS, "x").value == {"text": "x"}
    assert reader.get(NS, "big").value == big
    assert reader.get(NS, "gone") is None and reader.get(NS, "k") is None
    assert reader.get(OTHER, "o").value == {"text": "kept"}
    assert reader.get(OTHER, "o2").value == {"text": "other"}


def test_a_namespace_erased_twice_fences_both_old_keys(endpoint, index_mode) -> None:
    """A holds the first life's key, C the second's; after the second erase both write,
    and both writes land under the third key."""
    encryption = LocalKey(os.urandom(32))
    a = _store(endpoint, index_mode, encryption)
    a.put(NS, "a", {"text": "1"})
    b = _store(endpoint, index_mode, encryption)
    b.erase_namespace(NS)
    c = _store(endpoint, index_mode, encryption)
    c.put(NS, "c", {"text": "2"})
    b.erase_namespace(NS)
    a.put(NS, "a", {"text": "A"})
    c.put(NS, "c", {"text": "C"})
    reader = _fresh(endpoint, index_mode, encryption)
    assert reader.get(NS, "a").value == {"text": "A"}
    assert reader.get(NS, "c").value == {"text": "C"}


def test_the_refused_put_pays_the_key_once_and_the_next_put_is_steady(endpoint, index_mode) -> None:
    """No extra request in the steady state: a put with a key cached sends what a store
    without encryption sends, before the erase and after the writer took the new key.
    The put refused once pays the key record's read and the new key's creation, and its
    commit again."""
    encryption = LocalKey(os.urandom(32))
    plain = _store(endpoint, index_mode, None, prefix="plain/")
    plain.put(NS, "k", {"text": "v"})
    a = _store(endpoint, index_mode, encryption)
    a.put(NS, "k", {"text": "v"})
    (plain_put,) = _counts(plain, [lambda: plain.put(NS, "k", {"text": "w"})])
    (steady,) = _counts(a, [lambda: a.put(NS, "k", {"text": "w"})])
    assert steady == plain_put
    _store(endpoint, index_mode, encryption).erase_namespace(NS)
    (refused, after) = _counts(a, [lambda: a.put(NS, "k", {"text": "x"}), lambda: a.put(NS, "k", {"text": "y"})])
    assert after == plain_put, (after, plain_put)
    requests = refused[1]
    # The key record read again (and its new life created): the only key-store requests.
    assert requests.get(("s3", "put_object"), 0) >= 1
    print("refused put:", refused, "steady put:", steady)
    assert _fresh(endpoint, index_mode, encryption).get(NS, "k").value == {"text": "y"}



def test_a_put_with_a_cached_key_while_the_erase_runs_is_refused_and_lands_after_it(
    endpoint, index_mode, monkeypatch
) -> None:
    """An erase cut after it emptied the namespace (its key destroyed, not yet settled):
    A's put with the key it cached is refused as every write is while the erase runs
    (never sealed under the destroyed key); once the erase is called again and returns,
    the put lands under the new key."""
    encryption = LocalKey(os.urandom(32))
    a = _store(endpoint, index_mode, encryption)
    a.put(NS, "k", {"text": "before"})
    b = _store(endpoint, index_mode, encryption)

    def cut(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("cut before the namespace was unregistered")

    with monkeypatch.context() as patch:
        patch.setattr(type(b._memory.index), "erase_registrations", cut)
        with pytest.raises(RuntimeError, match="cut"):
            b.erase_namespace(NS)
    with pytest.raises(NamespaceErasedError, match="being erased"):
        a.put(NS, "k2", {"text": "during"})
    b.erase_namespace(NS)
    a.put(NS, "k2", {"text": "after"})
    reader = _fresh(endpoint, index_mode, encryption)
    assert reader.get(NS, "k2").value == {"text": "after"} and reader.get(NS, "k") is None


def test_an_import_with_a_key_cached_before_another_process_erased_the_namespace_is_kept(endpoint, index_mode) -> None:
    """``import_memory`` commits as a batch does: refused under the destroyed key, sealed
    again under the new one."""
    encryption = LocalKey(os.urandom(32))
    source = _store(endpoint, index_mode, encryption, prefix="source/")
    source.put(NS, "imported", {"text": "from the export"})
    data = source.export_memory(NS)
    a = _store(endpoint, index_mode, encryption)
    a.put(NS, "k", {"text": "before"})
    _store(endpoint, index_mode, encryption).erase_namespace(NS)
    report = a.import_memory(data)
    assert report.written == 1
    reader = _fresh(endpoint, index_mode, encryption)
    assert reader.get(NS, "imported").value == {"text": "from the export"} and reader.get(NS, "k") is None


@pytest.mark.parametrize("first", ["get", "search"])
def test_a_key_read_before_a_whole_erase_by_a_process_that_never_registered_the_namespace_is_fenced(
    endpoint, index_mode, first
) -> None:
    """A process that has only read the namespace (its key loaded, no registration of
    its own, so it knows nothing of the namespace's registry entry): another process
    erases the namespace whole (key destroyed, items and registration gone), then the
    first puts. Its registration carries the destroyed key's id: refused, sealed again
    under a new key, and the value is read by every process, later writers too."""
    encryption = LocalKey(os.urandom(32))
    _store(endpoint, index_mode, encryption).put(NS, "k", {"text": "before"})
    a = _fresh(endpoint, index_mode, encryption)
    if first == "get":
        assert a.get(NS, "k").value == {"text": "before"}
    else:
        assert [h.key for h in a.search(NS)] == ["k"]
    old = _record(endpoint, NS).key_id
    report = _store(endpoint, index_mode, encryption).erase_namespace(NS)
    assert report.namespaces == (NS,) and not report.written_during
    if index_mode == "dynamodb":  # what stays of the erased keys: their ids, no namespace name
        assert len(report.records) == 1 and "#mgone" in report.records[0] and "memories" not in report.records[0]
    plain = _store(endpoint, index_mode, None, prefix="plain/")
    plain.put(NS, "k", {"text": "v"})
    (plain_put,) = _counts(plain, [lambda: plain.put(NS, "k2", {"text": "w"})])
    (refused, steady) = _counts(
        a, [lambda: a.put(NS, "k2", {"text": "after the erase"}), lambda: a.put(NS, "k4", {"text": "steady"})]
    )
    print("refused first put:", refused, "next put:", steady, "plain put:", plain_put)
    assert steady == plain_put
    if index_mode == "dynamodb":
        # The registration refused (its check of the destroyed ids), the key record read
        # and a new life's key made, the registration again, the creation: 5 round trips.
        assert refused == (
            5,
            {("dynamodb", "transact_write_items"): 3, ("s3", "get_object"): 1, ("s3", "put_object"): 1},
        ), refused
    assert _record(endpoint, NS).live and _record(endpoint, NS).key_id != old
    later = _fresh(endpoint, index_mode, encryption)
    later.put(NS, "k3", {"text": "a later writer"})
    for reader in (_fresh(endpoint, index_mode, encryption), a, later):
        assert reader.get(NS, "k2").value == {"text": "after the erase"}
        assert reader.get(NS, "k3").value == {"text": "a later writer"}
        assert reader.get(NS, "k") is None
        assert sorted(h.key for h in reader.search(NS)) == ["k2", "k3", "k4"]


def _registered_before_the_fence(endpoint: str, index_mode: str, marked: bool) -> None:
    """DynamoDB mode: the namespace's registry item as code before the fence (or a
    process without encryption) wrote it: no key id; ``marked``: with the mark of an
    erase of that code under way (no destroyed ids on it). The manifest registry holds
    neither."""
    if index_mode != "dynamodb":
        return
    table = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    key = {"pk": {"S": registry_partition("")}, "sk": {"S": registry_key(NS)}}
    if marked:
        table.update_item(
            TableName=TABLE, Key=key, UpdateExpression="REMOVE kid SET retiring = :t", ExpressionAttributeValues={":t": {"S": "old"}}
        )
    else:
        table.update_item(TableName=TABLE, Key=key, UpdateExpression="REMOVE kid")


@pytest.mark.parametrize("marked", [False, True])
def test_a_stale_key_overwriting_a_new_lifes_item_under_a_registry_item_without_a_key_id_goes_on(
    endpoint, index_mode, marked
) -> None:
    """A cached the key and wrote ``k``; B erased the namespace; C wrote ``k`` in its new
    life; the registry item carries no key id (and an old erase's mark). A's overwrite of
    ``k`` is refused (another key's item) and so is its creation (the item is there, or
    the mark): judged on the item, A reads the key record and seals again, never a
    StoreUnavailableError after every try."""
    encryption = LocalKey(os.urandom(32))
    a = _store(endpoint, index_mode, encryption)
    a.put(NS, "k", {"text": "old life"})
    _store(endpoint, index_mode, encryption).erase_namespace(NS)
    c = _store(endpoint, index_mode, encryption)
    c.put(NS, "k", {"text": "new life"})
    _registered_before_the_fence(endpoint, index_mode, marked)
    ((trips, requests),) = _counts(a, [lambda: a.put(NS, "k", {"text": "A over the new life"})])
    print("stale overwrite:", trips, requests)
    if index_mode == "dynamodb" and not marked:
        # Overwrite refused, creation refused, the item read, the key record read, the
        # overwrite again: 5 requests in 5 round trips (the item's read the only one more).
        assert (trips, requests) == (
            5,
            {("dynamodb", "update_item"): 2, ("dynamodb", "transact_write_items"): 1, ("dynamodb", "get_item"): 1, ("s3", "get_object"): 1},
        )
    for reader in (_fresh(endpoint, index_mode, encryption), c, a):
        assert reader.get(NS, "k").value == {"text": "A over the new life"}
