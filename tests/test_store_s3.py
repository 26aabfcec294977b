"""S3Store on a real bucket (moto), manifest index mode: the differential harness
against InMemoryStore (random call sequences, the TTL model, LangGraph's store cases),
request counts, concurrent writers, checked reads, bad input, and the store beside a
saver: one prefix, one index mode, and a saver's gc and audit never touching memory.
"""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta
from typing import Any

import boto3
import pytest
from conftest import BUCKET, make_saver
from helpers import grow_thread
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.store.base import InvalidNamespaceError, PutOp
from store_reference import (
    FakeTime,
    ReferenceStore,
    run_steps,
    run_steps_async,
    steps,
)
from test_store_differential import INDEX, LANGGRAPH_INDEX, SCENARIOS

from s3_saver._format.keys import check_prefix
from s3_saver._format.memory import ttl
from s3_saver._store.store import S3Store
from s3_saver.errors import (
    ConfigurationError,
    CorruptObjectError,
    IndexModeMismatchError,
    InvalidFilterError,
    NamespaceError,
    SerializationError,
)

_PREFIXES = itertools.count()


def make_store(endpoint: str, prefix: str = "", **kwargs: Any) -> S3Store:
    return S3Store(BUCKET, prefix=prefix, endpoint_url=endpoint, region_name="us-east-1", **kwargs)


def s3(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def keys(endpoint: str, prefix: str = "") -> list[str]:
    pages = s3(endpoint).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for p in pages for o in p.get("Contents", [])]


@pytest.fixture
def bucket(endpoint: str) -> str:
    with make_store(endpoint) as store:
        store.setup()
    return endpoint


def fresh(endpoint: str, **kwargs: Any) -> S3Store:
    """A store on a prefix of its own: one per hypothesis example, on one bucket."""
    return make_store(endpoint, f"run{next(_PREFIXES)}/", **kwargs)


# -- the differential harness ------------------------------------------------------------

_HARNESS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)


@_HARNESS
@given(calls=steps())
def test_s3store_agrees_with_inmemory(bucket: str, calls: list[Any]) -> None:
    with fresh(bucket, index=INDEX) as store:
        run_steps(calls, ReferenceStore(index=INDEX), store)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(calls=steps(max_size=15))
def test_s3store_agrees_with_inmemory_async(bucket: str, calls: list[Any]) -> None:
    with fresh(bucket, index=INDEX) as store:
        run_steps_async(calls, ReferenceStore(index=INDEX), store)


@_HARNESS
@given(calls=steps(ttl=True), refresh_on_read=st.booleans())
def test_s3store_agrees_with_the_ttl_model(bucket: str, calls: list[Any], refresh_on_read: bool) -> None:
    time = FakeTime()
    config = {"default_ttl": 1, "refresh_on_read": refresh_on_read}
    with fresh(bucket, index=INDEX, ttl=config, clock=ttl.Clock(time), refresh_slack=0) as store:
        run_steps(calls, ReferenceStore(index=INDEX, ttl=config, time=time), store, time=time)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(calls=steps(ttl=True, max_size=60), with_index=st.booleans(), asynchronous=st.booleans())
def test_s3store_agrees_with_inmemory_at_length(bucket: str, calls: list[Any], with_index: bool, asynchronous: bool) -> None:
    time = FakeTime()
    index = INDEX if with_index else None
    config = {"default_ttl": 2, "refresh_on_read": True}
    with fresh(bucket, index=index, ttl=config, clock=ttl.Clock(time), refresh_slack=0) as store:
        reference = ReferenceStore(index=index, ttl=config, time=time)
        (run_steps_async if asynchronous else run_steps)(calls, reference, store, time=time)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_langgraphs_store_cases_agree_on_s3store(bucket: str, name: str) -> None:
    for run in (run_steps, run_steps_async):
        with fresh(bucket, index=LANGGRAPH_INDEX) as store:
            run(SCENARIOS[name], ReferenceStore(index=LANGGRAPH_INDEX), store)


# -- requests ----------------------------------------------------------------------------


def _counted(store: S3Store, call: Any) -> tuple[int, int]:
    store.stats.reset()
    call()
    return store.stats.total_requests, store.stats.round_trips


def _opened(endpoint: str) -> S3Store:
    """A store whose process has made its first call: that call's first round trip also
    reads the prefix's index-mode marker (one more request, once per process)."""
    store = make_store(endpoint)
    assert _counted(store, lambda: store.get(("warm", "up"), "k")) == (2, 1)
    return store


def test_requests_per_call(bucket: str) -> None:
    """What each call sends (the numbers docs and the bench quote): a get 1 request; a
    put 1 from a process that knows the head, 2 from one that does not; the first put
    into a namespace adds the registry's swap (and its read, once per process); a search
    of a namespace with no sub-namespaces 2 requests in 1 round trip (its head and the
    registry); a list_namespaces page 1."""
    ns = ("users", "alice")
    with _opened(bucket) as store:
        assert _counted(store, lambda: store.put(ns, "k0", {"text": "first"})) == (4, 4)  # GET head, GET+PUT registry, PUT head
        assert _counted(store, lambda: store.put(ns, "k1", {"text": "warm"})) == (1, 1)
        assert _counted(store, lambda: store.delete(ns, "k1")) == (1, 1)
        assert _counted(store, lambda: store.get(ns, "k0")) == (1, 1)
        assert _counted(store, lambda: store.search(ns, filter={"text": "first"})) == (2, 1)
        assert _counted(store, lambda: store.list_namespaces()) == (1, 1)
        assert _counted(store, lambda: store.put(("users", "bob"), "k", {"a": 1})) == (3, 3)  # the registry known: not read
        # A prefix with sub-namespaces: its own head and the registry, then the heads under it.
        assert _counted(store, lambda: store.search(("users",))) == (4, 2)
    with _opened(bucket) as cold:
        assert _counted(cold, lambda: cold.put(ns, "k2", {"text": "cold"})) == (2, 2)
    with _opened(bucket) as cold:
        # A delete of a key the head does not hold: the head read proves it; nothing written.
        assert _counted(cold, lambda: cold.delete(ns, "absent")) == (1, 1)


def test_a_bad_op_anywhere_in_a_batch_sends_nothing(bucket: str) -> None:
    with make_store(bucket) as store:
        before = keys(bucket, "memory/")
        store.stats.reset()
        with pytest.raises(InvalidNamespaceError):
            store.put(("a.b",), "k", {"v": 1})
        with pytest.raises(NamespaceError):
            store.batch([PutOp(("ok",), "k", {"v": 1}), PutOp(("a.b",), "k", {"v": 1})])
        with pytest.raises(InvalidFilterError):
            store.search(("a",), filter={"v": {"$regex": "x"}})
        with pytest.raises(SerializationError):
            store.put(("a",), "k", {"v": object()})  # the serializer refuses it
        assert store.stats.total_requests == 0 and keys(bucket, "memory/") == before


# -- writers, and what a read checks ----------------------------------------------------


def test_concurrent_writers_of_one_namespace_lose_no_item(bucket: str) -> None:
    """Two stores (two processes) and two threads each put distinct keys into one
    namespace, and all overwrite one shared key: every item is there, and the shared
    key holds one of the written values, whole, with its first writer's created_at."""
    ns = ("team", "shared")
    stores = [make_store(bucket), make_store(bucket)]
    stores[0].put(ns, "same", {"by": "setup", "n": -1})
    created = stores[0].get(ns, "same").created_at

    def work(store: S3Store, name: str) -> None:
        for i in range(12):
            store.put(ns, f"{name}-{i}", {"i": i})
            store.put(ns, "same", {"by": name, "n": i})

    threads = [threading.Thread(target=work, args=(s, f"w{j}{k}")) for j, s in enumerate(stores) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with make_store(bucket) as reader:
        found = {i.key for i in reader.search(ns, limit=100)}
        assert found == {"same"} | {f"w{j}{k}-{i}" for j in range(2) for k in range(2) for i in range(12)}
        same = reader.get(ns, "same")
        assert same.value in [{"by": f"w{j}{k}", "n": 11} for j in range(2) for k in range(2)]
        assert same.created_at == created
    for store in stores:
        store.close()


def test_a_head_of_another_namespace_is_refused_naming_both(bucket: str) -> None:
    """Node ids are hashes: a head under another namespace's id (a collision, or a copy)
    is a CorruptObjectError naming the bucket, the key and the namespace, never answered."""
    with make_store(bucket) as store:
        store.put(("alice",), "k", {"secret": "alice's"})
        store.put(("bob",), "k", {"secret": "bob's"})
        client = s3(bucket)
        alice, bob = (store._memory.index.describe((n,)).split(f"s3://{BUCKET}/")[1] for n in ("alice", "bob"))
        client.copy_object(Bucket=BUCKET, Key=bob, CopySource={"Bucket": BUCKET, "Key": alice})
        with pytest.raises(CorruptObjectError) as caught:
            store.get(("bob",), "k")
        message = str(caught.value)
        assert BUCKET in message and bob in message and "('bob',)" in message and "('alice',)" in message


# -- beside a saver ----------------------------------------------------------------------


def test_a_prefix_may_not_hold_the_stores_folders() -> None:
    for prefix in ("memory/", "app/memory/", "node-cache/", "a/Node-Cache/b/"):
        with pytest.raises(ConfigurationError):
            check_prefix(prefix)
    assert check_prefix("memories/") == "memories/"


@pytest.mark.parametrize("index_mode", ["manifest", "dynamodb"])
def test_a_savers_gc_and_audit_leave_memory_alone(endpoint: str, index_mode: str) -> None:
    """A saver and a store on one bucket (the same prefix in manifest mode; in DynamoDB
    mode the store has a prefix of its own, as a prefix belongs to one index mode): the
    saver's audit finds no problem and its garbage collection, unindexed threads and no
    grace period included, deletes nothing of the store's; the memory reads back whole."""
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    store_prefix = "" if index_mode == "manifest" else "agent/"
    with make_store(endpoint, store_prefix) as store:
        grow_thread(saver, "t", 3)
        for user in ("alice", "bob"):
            store.put(("memories", user), "k", {"text": f"{user} likes tea"})
        memory = keys(endpoint, f"{store_prefix}memory/")
        assert len(memory) == 3  # two heads and the registry
        report = saver.audit(older_than=timedelta(0))
        assert report.ok and not report.problems
        done = saver.collect_garbage(older_than=timedelta(0), include_unindexed=True)
        assert not [k for k in done.deleted if "memory/" in k]
        assert keys(endpoint, f"{store_prefix}memory/") == memory
        assert [i.value for i in store.search(("memories",))] == [{"text": "alice likes tea"}, {"text": "bob likes tea"}]
    saver.close()


def test_a_store_of_the_bucket_index_is_refused_on_a_dynamodb_prefix(endpoint: str) -> None:
    """The prefix's index-mode marker covers the store: on a prefix of a DynamoDB saver,
    the manifest-mode store raises at its first call and writes nothing."""
    saver = make_saver(endpoint, "dynamodb")
    saver.setup()
    with make_store(endpoint) as store, pytest.raises(IndexModeMismatchError):
        store.put(("memories", "alice"), "k", {"text": "tea"})
    assert keys(endpoint, "memory/") == []
    saver.close()
