"""S3Store on a real bucket (moto), in both index modes: the differential harness
against InMemoryStore (random call sequences, the TTL model, LangGraph's store cases),
request counts, concurrent writers, checked reads, bad input, and the store beside a
saver: one prefix, one index mode, and a saver's gc and audit never touching memory.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import threading
from datetime import timedelta
from typing import Any, TypedDict

import boto3
import pytest
from conftest import BUCKET, TABLE, make_saver, seaweedfs_session
from helpers import grow_thread
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore, InvalidNamespaceError, PutOp
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
from s3_saver._transport.retry import RetryPolicy
from s3_saver.errors import (
    BucketNotFoundError,
    ConfigurationError,
    CorruptObjectError,
    IndexModeMismatchError,
    InvalidFilterError,
    NamespaceError,
    S3SaverError,
    SerializationError,
    StoreUnavailableError,
    TableNotFoundError,
    TableOwnedError,
)

_PREFIXES = itertools.count()


def make_store(endpoint: str, mode: str, prefix: str = "", **kwargs: Any) -> S3Store:
    table = TABLE if mode == "dynamodb" else None
    return S3Store(BUCKET, table=table, prefix=prefix, endpoint_url=endpoint, region_name="us-east-1", **kwargs)


def s3(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def keys(endpoint: str, prefix: str = "") -> list[str]:
    pages = s3(endpoint).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for p in pages for o in p.get("Contents", [])]


@pytest.fixture
def bucket(endpoint: str, index_mode: str) -> tuple[str, str]:
    """The bucket (and in DynamoDB mode the table), set up: (endpoint, index mode)."""
    with make_store(endpoint, index_mode) as store:
        store.setup()
    return endpoint, index_mode


def fresh(bucket: tuple[str, str], **kwargs: Any) -> S3Store:
    """A store on a prefix of its own: one per hypothesis example, on one bucket."""
    return make_store(*bucket, f"run{next(_PREFIXES)}/", **kwargs)


# -- the differential harness ------------------------------------------------------------

_HARNESS = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)


@_HARNESS
@given(calls=steps())
def test_s3store_agrees_with_inmemory(bucket: tuple[str, str], calls: list[Any]) -> None:
    with fresh(bucket, index=INDEX) as store:
        run_steps(calls, ReferenceStore(index=INDEX), store)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(calls=steps(max_size=15))
def test_s3store_agrees_with_inmemory_async(bucket: tuple[str, str], calls: list[Any]) -> None:
    with fresh(bucket, index=INDEX) as store:
        run_steps_async(calls, ReferenceStore(index=INDEX), store)


@_HARNESS
@given(calls=steps(ttl=True), refresh_on_read=st.booleans())
def test_s3store_agrees_with_the_ttl_model(bucket: tuple[str, str], calls: list[Any], refresh_on_read: bool) -> None:
    time = FakeTime()
    config = {"default_ttl": 1, "refresh_on_read": refresh_on_read}
    with fresh(bucket, index=INDEX, ttl=config, clock=ttl.Clock(time), refresh_slack=0) as store:
        run_steps(calls, ReferenceStore(index=INDEX, ttl=config, time=time), store, time=time)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(calls=steps(ttl=True, max_size=60), with_index=st.booleans(), asynchronous=st.booleans())
def test_s3store_agrees_with_inmemory_at_length(bucket: tuple[str, str], calls: list[Any], with_index: bool, asynchronous: bool) -> None:
    time = FakeTime()
    index = INDEX if with_index else None
    config = {"default_ttl": 2, "refresh_on_read": True}
    with fresh(bucket, index=index, ttl=config, clock=ttl.Clock(time), refresh_slack=0) as store:
        reference = ReferenceStore(index=index, ttl=config, time=time)
        (run_steps_async if asynchronous else run_steps)(calls, reference, store, time=time)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_langgraphs_store_cases_agree_on_s3store(bucket: tuple[str, str], name: str) -> None:
    for run in (run_steps, run_steps_async):
        with fresh(bucket, index=LANGGRAPH_INDEX) as store:
            run(SCENARIOS[name], ReferenceStore(index=LANGGRAPH_INDEX), store)


# -- requests ----------------------------------------------------------------------------


def _counted(store: S3Store, call: Any) -> tuple[int, int]:
    store.stats.reset()
    call()
    return store.stats.total_requests, store.stats.round_trips


def _opened(bucket: tuple[str, str], **kwargs: Any) -> S3Store:
    """A store whose process has made its first call: that call's first round trip also
    carries the prefix's checks (its index-mode marker; in DynamoDB mode the table's
    owner), once per process."""
    store = make_store(*bucket, **kwargs)
    store.get(("warm", "up"), "k")
    return store


# (requests, round trips) per call, by index mode.
REQUESTS = {
    "manifest": {
        "first put": (6, 6),  # GET head (none), GET + PUT registry, GET + PUT ("users",)'s desc, PUT head
        "put": (1, 1),  # PUT head, IfMatch the ETag this process knows
        "delete": (1, 1),
        "get": (1, 1),
        "search": (1, 1),  # GET head: its desc says no namespace is below it
        "list": (1, 1),
        "new namespace": (3, 3),  # GET head (none), PUT registry (known), PUT head (desc known)
        "prefix search": (4, 3),  # GET head (desc), GET registry, then the two heads under it
        "cold put": (2, 2),  # GET head, PUT head
        "cold delete of nothing": (1, 1),  # GET head: no such key, nothing written
        "search of 100 items": (1, 1),  # GET head: every row is in it
        "filtered search of 100 items": (1, 1),
        "semantic search of 100 items": (1, 1),  # the vectors are in the rows
    },
    "dynamodb": {
        "first put": (2, 2),  # PutItem registry, UpdateItem
        "put": (1, 1),
        "delete": (1, 1),
        "get": (1, 1),
        "search": (2, 1),  # Query the namespace + Query the registry, together
        "list": (1, 1),
        "new namespace": (2, 2),
        "prefix search": (4, 2),
        "cold put": (2, 2),  # PutItem registry (there already), UpdateItem
        "cold delete of nothing": (1, 1),  # DeleteItem
        "search of 100 items": (2, 1),  # one Query page holds them all, + the registry's Query
        "filtered search of 100 items": (2, 1),
        "semantic search of 100 items": (2, 1),
    },
}


def test_requests_per_call(bucket: tuple[str, str]) -> None:
    """What each call sends (the numbers docs and the bench quote): at most 2 requests
    for a get, a put or a delete but a namespace's first put; a search of a namespace
    with no sub-namespaces 1 request (manifest) or 2 in 1 round trip (DynamoDB), also
    of a namespace of 100 small items, with a filter or a query; a list_namespaces
    page 1. (The long-term memory targets: get 1, put at most 2 with no read before
    the write, a search of 100 items at most 3, a list page at most 2.)"""
    want = REQUESTS[bucket[1]]
    ns = ("users", "alice")
    with _opened(bucket) as store:
        got = {
            "first put": _counted(store, lambda: store.put(ns, "k0", {"text": "first"})),
            "put": _counted(store, lambda: store.put(ns, "k1", {"text": "warm"})),
            "delete": _counted(store, lambda: store.delete(ns, "k1")),
            "get": _counted(store, lambda: store.get(ns, "k0")),
            "search": _counted(store, lambda: store.search(ns, filter={"text": "first"})),
            "list": _counted(store, lambda: store.list_namespaces()),
            "new namespace": _counted(store, lambda: store.put(("users", "bob"), "k", {"a": 1})),
            "prefix search": _counted(store, lambda: store.search(("users",))),
        }
    with _opened(bucket) as cold:
        got["cold put"] = _counted(cold, lambda: cold.put(ns, "k2", {"text": "cold"}))
    with _opened(bucket) as cold:
        got["cold delete of nothing"] = _counted(cold, lambda: cold.delete(ns, "absent"))
    hundred = ("team", "hundred")  # the "namespace of 100 small items"
    with _opened(bucket, index=INDEX) as store:
        store.batch([PutOp(hundred, f"m{i:03d}", {"text": f"memory {i} of a user", "kind": ("fact", "pref")[i % 2]})
                     for i in range(100)])
        got["search of 100 items"] = _counted(store, lambda: store.search(hundred, limit=10))
        got["filtered search of 100 items"] = _counted(store, lambda: store.search(hundred, filter={"kind": "pref"}))
        got["semantic search of 100 items"] = _counted(store, lambda: store.search(hundred, query="memory of a user"))
        assert len(store.search(hundred, limit=100)) == 100
    assert got == want


def test_a_bad_op_anywhere_in_a_batch_sends_nothing(bucket: tuple[str, str]) -> None:
    with make_store(*bucket) as store:
        before = _stored(bucket)
        store.stats.reset()
        with pytest.raises(InvalidNamespaceError):
            store.put(("a.b",), "k", {"v": 1})
        with pytest.raises(NamespaceError):
            store.batch([PutOp(("ok",), "k", {"v": 1}), PutOp(("a.b",), "k", {"v": 1})])
        with pytest.raises(InvalidFilterError):
            store.search(("a",), filter={"v": {"$regex": "x"}})
        with pytest.raises(SerializationError):
            store.put(("a",), "k", {"v": object()})  # the serializer refuses it
        assert store.stats.total_requests == 0 and _stored(bucket) == before


def _stored(bucket: tuple[str, str]) -> list[Any]:
    """Everything of the store's: its objects, and its table items (``#m`` partitions)."""
    endpoint, mode = bucket
    found: list[Any] = keys(endpoint, "memory/")
    tables = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1").list_tables()["TableNames"]
    if mode == "dynamodb" and TABLE in tables:
        table = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
        items = table.scan(TableName=TABLE, ConsistentRead=True)["Items"]
        found += sorted((i["pk"]["S"], i["sk"]["S"]) for i in items if "#m" in i["pk"]["S"])
    return found


# -- writers, and what a read checks ----------------------------------------------------


def test_concurrent_writers_of_one_namespace_lose_no_item(bucket: tuple[str, str]) -> None:
    """Two stores (two processes) and two threads each put distinct keys into one
    namespace, and all overwrite one shared key: every item is there, and the shared
    key holds one of the written values, whole, with its first writer's created_at."""
    ns = ("team", "shared")
    stores = [make_store(*bucket), make_store(*bucket)]
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
    with make_store(*bucket) as reader:
        found = {i.key for i in reader.search(ns, limit=100)}
        assert found == {"same"} | {f"w{j}{k}-{i}" for j in range(2) for k in range(2) for i in range(12)}
        same = reader.get(ns, "same")
        assert same.value in [{"by": f"w{j}{k}", "n": 11} for j in range(2) for k in range(2)]
        assert same.created_at == created
    for store in stores:
        store.close()


def test_a_swap_still_refused_when_the_retry_budget_ends_raises_a_named_error(endpoint: str) -> None:
    """A manifest head swap refused (412: another writer replaced the head) once the
    retry budget has run out raises StoreUnavailableError naming the namespace and the
    key, never botocore's bare PreconditionFailed. One process's burst of concurrent
    writers of one namespace meets this (LangGraph's test_large_batches_async: 2,000
    aputs on two namespaces at once). Manifest only: DynamoDB writes swap no head."""
    ns = ("memories", "alice")
    with make_store(endpoint, "manifest") as other, make_store(endpoint, "manifest", retry=RetryPolicy(budget=0)) as store:
        other.setup()
        store.put(ns, "a", {"v": 1})  # its head, and the ETag, cached
        other.put(ns, "b", {"v": 2})  # replaced: the cached ETag is stale
        with pytest.raises(StoreUnavailableError) as caught:
            store.put(ns, "c", {"v": 3})  # refused, and no retry left
        message = str(caught.value)
        assert "namespace ('memories', 'alice')" in message and "key 'c'" in message and BUCKET in message
        assert isinstance(caught.value, S3SaverError)
        assert store.get(ns, "c") is None and store.get(ns, "b").value == {"v": 2}


def test_a_record_of_another_namespace_is_refused_naming_both(bucket: tuple[str, str]) -> None:
    """Node ids are hashes: a head (manifest) or an item (DynamoDB) under another
    namespace's id (a collision, or a copy) is a CorruptObjectError naming where it lies
    and both namespaces, never answered."""
    endpoint, mode = bucket
    with make_store(*bucket) as store:
        store.put(("alice",), "k", {"secret": "alice's"})
        store.put(("bob",), "k", {"secret": "bob's"})
        index = store._memory.index
        if mode == "manifest":
            alice, bob = (index.describe((n,)).split(f"s3://{BUCKET}/")[1] for n in ("alice", "bob"))
            s3(endpoint).copy_object(Bucket=BUCKET, Key=bob, CopySource={"Bucket": BUCKET, "Key": alice})
            place = [BUCKET, bob]
        else:
            table = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
            pk = lambda n: index.describe((n,)).split("partition ")[1].strip("'")
            item = table.get_item(TableName=TABLE, Key={"pk": {"S": pk("alice")}, "sk": {"S": "kk"}})["Item"]
            table.put_item(TableName=TABLE, Item={**item, "pk": {"S": pk("bob")}})
            place = [TABLE, pk("bob")]
        with pytest.raises(CorruptObjectError) as caught:
            store.get(("bob",), "k")
        message = str(caught.value)
        assert all(p in message for p in place) and "('bob',)" in message and "('alice',)" in message


# -- beside a saver ----------------------------------------------------------------------


def test_a_prefix_may_not_hold_the_stores_folders() -> None:
    for prefix in ("memory/", "app/memory/", "node-cache/", "a/Node-Cache/b/"):
        with pytest.raises(ConfigurationError):
            check_prefix(prefix)
    assert check_prefix("memories/") == "memories/"


def test_a_savers_gc_and_audit_leave_memory_alone(endpoint: str, index_mode: str) -> None:
    """A saver and a store on one bucket, table and prefix: the saver's audit finds no
    problem and its garbage collection (unindexed threads included, no grace period)
    deletes nothing of the store's; the memory reads back whole."""
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    with make_store(endpoint, index_mode) as store:
        grow_thread(saver, "t", 3)
        for user in ("alice", "bob"):
            store.put(("memories", user), "k", {"text": f"{user} likes tea"})
        memory = _stored((endpoint, index_mode))
        # Two heads (and their ancestor's) or two items, and the registry (its items).
        assert len(memory) == 4
        report = saver.audit(older_than=timedelta(0))
        assert report.ok and not report.problems
        done = saver.collect_garbage(older_than=timedelta(0), include_unindexed=True)
        assert not [k for k in done.deleted if "memory/" in k]
        assert _stored((endpoint, index_mode)) == memory
        assert [i.value for i in store.search(("memories",))] == [{"text": "alice likes tea"}, {"text": "bob likes tea"}]
    saver.close()


def test_a_store_of_the_other_index_mode_is_refused(endpoint: str, index_mode: str) -> None:
    """The prefix's index-mode marker covers the store: on a prefix of a saver of the
    other mode, the store raises at its first call and writes nothing."""
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    other = "manifest" if index_mode == "dynamodb" else "dynamodb"
    with make_store(endpoint, other) as store, pytest.raises(IndexModeMismatchError):
        store.put(("memories", "alice"), "k", {"text": "tea"})
    assert _stored((endpoint, other)) == []
    saver.close()


def test_errors_name_the_bucket_or_table_the_namespace_and_the_key(bucket: tuple[str, str]) -> None:
    """A failed call names where (bucket or table, region) and what, in the user's words
    (namespace and key), not only the hashed key it was sent to."""
    endpoint, mode = bucket
    with make_store(endpoint, mode) as store:
        store.put(("memories", "alice"), "k", {"text": "tea"})
        if mode == "manifest":
            for key in keys(endpoint):
                s3(endpoint).delete_object(Bucket=BUCKET, Key=key)
            s3(endpoint).delete_bucket(Bucket=BUCKET)
            place, error = f"bucket {BUCKET!r}", BucketNotFoundError
        else:
            boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1").delete_table(TableName=TABLE)
            place, error = f"table {TABLE!r}", TableNotFoundError
        with pytest.raises(error) as caught:
            store.put(("memories", "alice"), "k2", {"text": "coffee"})
        message = str(caught.value)
        assert place in message and "namespace ('memories', 'alice')" in message and "key 'k2'" in message


def test_a_large_value_lives_in_its_own_object_until_replaced(bucket: tuple[str, str]) -> None:
    """A value over the index's inline limit (64 KiB manifest, 16 KiB DynamoDB; a DynamoDB
    item holds at most 400 KB) is an object of its own, written before its row; reads
    fetch it (one more request); the write that replaces or deletes it deletes it."""
    endpoint = bucket[0]
    ns = ("docs", "big")
    big = {"text": secrets.token_urlsafe(300_000), "tag": "big"}  # 400 KB that do not compress away
    folder = lambda: [k for k in keys(endpoint, "memory/n/") if "/@v/" in k]  # noqa: E731
    with _opened(bucket) as store:
        store.put(ns, "small", {"text": "tiny", "tag": "small"})
        assert _counted(store, lambda: store.put(ns, "doc", big)) == (2, 2)  # PUT the value, then the row
        (first,) = folder()
        assert _counted(store, lambda: store.get(ns, "doc")) == (2, 2)
        assert store.get(ns, "doc").value == big
        assert [i.key for i in store.search(ns, filter={"tag": "big"})] == ["doc"]
        bigger = {**big, "text": secrets.token_urlsafe(400_000)}
        store.put(ns, "doc", bigger)
        (second,) = folder()
        assert second != first and store.get(ns, "doc").value == bigger
        store.put(ns, "doc", {"text": "now small"})
        assert folder() == [] and store.get(ns, "doc").value == {"text": "now small"}
        store.put(ns, "doc", big)
        store.delete(ns, "doc")
        assert folder() == [] and store.get(ns, "doc") is None
    with _opened(bucket) as other:
        assert [i.key for i in other.search(ns)] == ["small"]


# -- another S3 implementation -------------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(calls=steps(ttl=True), asynchronous=st.booleans())
def test_s3store_agrees_with_inmemory_on_seaweedfs(seaweedfs_bucket: tuple[str, str], calls: list[Any], asynchronous: bool) -> None:
    """The manifest mode on SeaweedFS (its own conditional writes, ETags and 404s)."""
    endpoint, name = seaweedfs_bucket
    time = FakeTime()
    config = {"default_ttl": 1, "refresh_on_read": True}
    store = S3Store(
        name,
        prefix=f"run{next(_PREFIXES)}/",
        s3_endpoint_url=endpoint,
        region_name="us-east-1",
        boto3_session=seaweedfs_session(),
        index=INDEX,
        ttl=config,
        clock=ttl.Clock(time),
        refresh_slack=0,
    )
    with store:
        reference = ReferenceStore(index=INDEX, ttl=config, time=time)
        (run_steps_async if asynchronous else run_steps)(calls, reference, store, time=time)


def test_a_store_on_another_buckets_table_prefix_is_refused(endpoint: str) -> None:
    """DynamoDB mode: a table's prefix belongs to one bucket (its owner record), for the
    store as for the saver: a store of another bucket raises at its first call and
    writes nothing into the table."""
    saver = make_saver(endpoint, "dynamodb")
    saver.setup()
    s3(endpoint).create_bucket(Bucket="another")
    store = S3Store("another", table=TABLE, endpoint_url=endpoint, region_name="us-east-1")
    with store, pytest.raises(TableOwnedError):
        store.put(("memories", "alice"), "k", {"text": "tea"})
    assert _stored((endpoint, "dynamodb")) == []
    saver.close()


# -- from a saver, in a graph ----------------------------------------------------------------


class _Turn(TypedDict):
    user: str
    said: str
    known: list[str]


def _remember(state: _Turn, *, store: BaseStore) -> dict[str, Any]:
    ns = ("memories", state["user"])
    store.put(ns, state["said"], {"text": state["said"]})
    return {"known": sorted(i.value["text"] for i in store.search(ns))}


async def _aremember(state: _Turn, *, store: BaseStore) -> dict[str, Any]:
    ns = ("memories", state["user"])
    await store.aput(ns, state["said"], {"text": state["said"]})
    return {"known": sorted(i.value["text"] for i in await store.asearch(ns))}


def _graph(node: Any, saver: Any, store: S3Store) -> Any:
    builder = StateGraph(_Turn)
    builder.add_node("remember", node)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", END)
    return builder.compile(checkpointer=saver, store=store)


def test_a_store_from_a_saver_shares_its_checks_and_counts_and_a_graph_remembers_across_threads(saver: Any) -> None:
    """``S3Store.from_saver(saver)``: the saver's bucket, table, prefix, clients and
    request counts; the checks the saver's first call made are not made again (a new
    namespace's first put costs what it costs a warm store). In a graph, two threads of
    one user see each other's memories, sync and async; the store's close leaves the
    saver working."""
    store = S3Store.from_saver(saver)
    mode = "dynamodb" if saver.table else "manifest"
    assert _counted(store, lambda: store.put(("memories", "ann"), "first", {"text": "first"})) == REQUESTS[mode]["first put"]
    graph = _graph(_remember, saver, store)
    graph.invoke({"user": "ann", "said": "likes tea", "known": []}, {"configurable": {"thread_id": "t1"}})
    state = graph.invoke({"user": "ann", "said": "lives in Oslo", "known": []}, {"configurable": {"thread_id": "t2"}})
    assert state["known"] == ["first", "likes tea", "lives in Oslo"]
    agraph = _graph(_aremember, saver, store)
    state = asyncio.run(agraph.ainvoke({"user": "ann", "said": "async", "known": []}, {"configurable": {"thread_id": "t3"}}))
    assert state["known"] == ["async", "first", "likes tea", "lives in Oslo"]
    store.close()
    assert saver.get_tuple({"configurable": {"thread_id": "t2"}}).checkpoint["channel_values"]["known"][-1] == "lives in Oslo"


# -- a put cut short ---------------------------------------------------------------------------


class _Cut(Exception):
    """The process stops: the wave was sent (and applied), its answer never read."""


def _cut_after(store: S3Store, waves: int) -> None:
    sent = store._sync._wave
    count = [0]

    def wave(calls: Any) -> Any:
        answers = sent(calls)
        count[0] += 1
        if count[0] == waves:
            raise _Cut
        return answers

    store._sync._wave = wave  # type: ignore[method-assign]


def test_a_put_cut_after_any_round_trip_leaves_the_old_or_the_new_item_listed(bucket: tuple[str, str]) -> None:
    """Objects first, index last: a put (a large value into a new namespace, and then over
    an existing item) cut after each of its round trips leaves, to a new process, the
    old item or the new one, whole, and a namespace holding an item is listed; the put
    run again completes."""
    big = {"text": secrets.token_urlsafe(100_000)}
    for case, (ns, old) in enumerate([(("cut", "new"), None), (("cut", "old"), {"text": "old"})]):
        with _opened(bucket) as probe:  # the ancestors' heads, as the cut puts find them
            if old is not None:
                probe.put(ns + ("probe",), "k", old)
            probe.put(ns + ("probe",), "k", big)
        with make_store(*bucket) as setup:
            if old is not None:
                setup.put(ns + ("measure",), "k", old)
        with make_store(*bucket) as measure:  # how many round trips the put takes, in a new process as the cut ones
            measure.put(ns + ("measure",), "k", big)
            waves = measure.stats.round_trips
        assert waves >= 2
        for k in range(1, waves + 1):
            space = ns + (f"at{k}",)
            with make_store(*bucket) as setup:
                if old is not None:
                    setup.put(space, "k", old)
            with make_store(*bucket) as store:
                _cut_after(store, k)
                with pytest.raises(_Cut):
                    store.put(space, "k", big)
            with make_store(*bucket) as reader:
                item = reader.get(space, "k")
                assert (item.value if item else None) in (old, big), (case, k)
                if item is not None:
                    assert space in reader.list_namespaces(prefix=ns)
                    assert [i.key for i in reader.search(space)] == ["k"]
                reader.put(space, "k", big)
                assert reader.get(space, "k").value == big


# -- a write whose answer is lost ---------------------------------------------------------


def _lose_the_commits_answer(store: S3Store, meanwhile: Any = None) -> None:
    """The first index write of ``store`` that lands (DynamoDB UpdateItem or DeleteItem,
    manifest head swap): then ``meanwhile()`` runs (another writer), and its answer is
    lost (a read timeout)."""
    from botocore.exceptions import ReadTimeoutError

    sent = store._sync._wave
    lost = [False]

    def wave(calls: Any) -> Any:
        answers = sent(calls)
        for i, call in enumerate(calls):
            head = call.operation == "put_object" and str(call.params.get("Key", "")).endswith("/@head")
            item = call.operation in ("update_item", "delete_item")
            if (head or item) and not isinstance(answers[i], BaseException) and not lost[0]:
                lost[0] = True
                if meanwhile is not None:
                    meanwhile()
                answers = list(answers)
                answers[i] = ReadTimeoutError(endpoint_url="http://127.0.0.1:1")
        return answers

    store._sync._wave = wave  # type: ignore[method-assign]


# Requests of a put of a large value over a large value whose index write's answer is lost,
# with no writer between. Before: the write sent again as is (manifest: refused, 412, then
# judged on the head read), leaving the replaced value's object behind in DynamoDB mode.
LOST_ANSWER_REQUESTS = {
    # PUT @v, PUT head (lost), PUT head again (412: its own swap), GET head (its rows
    # stand: done), DELETE the replaced value
    "manifest": {("s3", "put_object"): 3, ("s3", "get_object"): 1, ("s3", "delete_objects"): 1},
    # PUT @v, the creation (a key this process never saw: refused, the item exists),
    # UpdateItem (lost), GetItem (its write token: landed; ``pv`` names the replaced
    # value), DELETE it
    "dynamodb": {
        ("s3", "put_object"): 1,
        ("dynamodb", "transact_write_items"): 1,
        ("dynamodb", "update_item"): 1,
        ("dynamodb", "get_item"): 1,
        ("s3", "delete_objects"): 1,
    },
}


def test_a_put_whose_answer_is_lost_keeps_the_value_and_leaves_no_object(bucket: tuple[str, str]) -> None:
    """A put of a large value over another, its index write landed but its answer lost:
    the key holds its value (or, with another writer's put landed between, either
    value, whole: never a value object that writer deleted), and the only value object
    left is the one the item names (the replaced ones deleted)."""
    for between in (False, True):
        prefix = f"lost{next(_PREFIXES)}/"
        ns = ("lost", "answer")
        old, mine, theirs = ({"text": c + secrets.token_urlsafe(100_000)} for c in "OMT")
        with make_store(*bucket, prefix) as setup:
            setup.put(ns, "k", old)
        with make_store(*bucket, prefix) as other, make_store(*bucket, prefix) as store:
            store.put(ns, "warm", {"a": 1})  # checks, registration, head known: the put's own requests alone
            _lose_the_commits_answer(store, (lambda: other.put(ns, "k", theirs)) if between else None)
            store.stats.reset()
            store.put(ns, "k", mine)
            requests = {k: v for k, v in store.stats.requests.items() if v}
        if not between:
            assert requests == LOST_ANSWER_REQUESTS[bucket[1]]
        with make_store(*bucket, prefix) as reader:
            assert reader.get(ns, "k").value in ((mine, theirs) if between else (mine,)), between
            assert [i.value for i in reader.search(ns) if i.key == "k"] == [reader.get(ns, "k").value]
        assert len([k for k in keys(bucket[0], prefix + "memory/") if "/@v/" in k]) == 1, between


def test_a_delete_whose_answer_is_lost_leaves_no_object(bucket: tuple[str, str]) -> None:
    """The delete of a large value, its index write landed but its answer lost: the key
    is gone and so is its value object."""
    prefix = f"lost{next(_PREFIXES)}/"
    ns = ("lost", "delete")
    with make_store(*bucket, prefix) as store:
        store.put(ns, "k", {"text": secrets.token_urlsafe(100_000)})
        _lose_the_commits_answer(store)
        store.delete(ns, "k")
        assert store.get(ns, "k") is None
    assert [k for k in keys(bucket[0], prefix + "memory/") if "/@v/" in k] == []


def test_dynamodb_reads_only_the_registry_range_a_search_or_a_page_needs(endpoint: str) -> None:
    """DynamoDB mode: a search, or a list_namespaces page with a fixed prefix, reads the
    registry items under its prefix (a Query BETWEEN its bounds), not every namespace."""
    with make_store(endpoint, "dynamodb") as store:
        store.setup()
        for i in range(20):
            store.put(("other", f"u{i:02d}"), "k", {"i": i})
        store.put(("users", "alice"), "k", {"text": "tea"})
        store.put(("users", "alice", "notes"), "k", {"text": "notes"})
        read: list[int] = []
        sent = store._sync._wave

        def wave(calls: Any) -> Any:
            answers = sent(calls)
            read.extend(a["Count"] for c, a in zip(calls, answers) if c.operation == "query" and "#mreg" in str(c.params))
            return answers

        store._sync._wave = wave  # type: ignore[method-assign]
        assert [i.key for i in store.search(("users", "alice"))] == ["k", "k"]
        assert store.list_namespaces(prefix=("users", "*")) == [("users", "alice"), ("users", "alice", "notes")]
        assert read == [2, 2]
        assert len(store.list_namespaces(limit=100)) == 22 and read[-1] == 22
