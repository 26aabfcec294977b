"""S3Cache, LangGraph's node cache in the bucket: real graphs, TTL, clear, the set-vs-clear
race, request counts, bad input, failures, and a saver's gc on the same prefix."""

from __future__ import annotations

import asyncio
import logging
import operator
from datetime import timedelta
from typing import Annotated

import boto3
import pytest
from hypothesis import strategies as st
from conftest import BUCKET, make_saver
from langgraph.graph import END, START, StateGraph
from langgraph.types import CachePolicy
from typing_extensions import TypedDict

from s3_saver import ConfigurationError, S3Cache, S3Saver, SerializationError
from s3_saver._format.node_cache import CacheKeys
from s3_saver._ops import node_cache
from s3_saver.errors import BucketNotFoundError

K1 = (("n", "fetch.v1"), "k1")
K2 = (("n", "fetch.v1"), "k2")
OTHER = (("n",), "k1")  # a namespace that is a prefix of K1's: a clear of one leaves the other


def _cache(endpoint: str, **kwargs) -> S3Cache:
    cache = S3Cache(BUCKET, endpoint_url=endpoint, region_name="us-east-1", **kwargs)
    cache.setup()
    cache.stats.reset()
    return cache


def _counts(stats) -> tuple[int, dict[str, int]]:
    snap = stats.snapshot()
    return snap.round_trips, {op: n for (_, op), n in sorted(snap.requests.items())}


def _cache_keys(endpoint: str, prefix: str = "") -> list[str]:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "node-cache/")
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


# -- a real graph --------------------------------------------------------------------------
class State(TypedDict):
    topic: str
    calls: Annotated[list[str], operator.add]


def _graph(saver, cache, runs: list[str]):
    def fetch(state: State) -> dict:
        runs.append(state["topic"])
        return {"calls": [f"fetched {state['topic']}"]}

    async def afetch(state: State) -> dict:
        return fetch(state)

    builder = StateGraph(State)
    builder.add_node("fetch", fetch, cache_policy=CachePolicy(ttl=600))
    builder.add_edge(START, "fetch")
    builder.add_edge("fetch", END)
    return builder.compile(checkpointer=saver, cache=cache)


@pytest.mark.parametrize("driver", ["invoke", "ainvoke"])
def test_a_cached_node_runs_once_across_invokes_and_processes(endpoint: str, index_mode: str, driver: str) -> None:
    """Two processes (two savers, two caches: one from its saver, one standalone) run the node
    once for one input; after clear_cache() it runs again, once."""
    runs: list[str] = []
    first_saver = make_saver(endpoint, index_mode)
    first_saver.setup()
    second_saver = make_saver(endpoint, index_mode)
    first = _graph(first_saver, S3Cache.from_saver(first_saver), runs)
    second = _graph(second_saver, _cache(endpoint), runs)

    def run(graph, thread: str) -> dict:
        config = {"configurable": {"thread_id": thread}}
        if driver == "invoke":
            return graph.invoke({"topic": "tides", "calls": []}, config)
        return asyncio.run(graph.ainvoke({"topic": "tides", "calls": []}, config))

    assert run(first, "t1")["calls"] == ["fetched tides"]
    assert run(first, "t2")["calls"] == ["fetched tides"]
    assert run(second, "t3")["calls"] == ["fetched tides"]
    assert runs == ["tides"]
    if driver == "invoke":
        second.clear_cache()
    else:
        asyncio.run(second.aclear_cache())
    run(first, "t4")
    run(second, "t5")
    assert runs == ["tides", "tides"]
    assert first_saver.get_tuple({"configurable": {"thread_id": "t3"}}) is not None


# -- semantics -----------------------------------------------------------------------------
def test_ttl_expires_on_the_readers_clock_and_none_keeps(endpoint: str) -> None:
    """now < expires, as InMemoryCache: a ttl of 10 s is there at +9.9 s, gone at +10 s;
    ttl None stays; an overwrite with a ttl replaces the one without."""
    cache = _cache(endpoint)
    now = [1_000_000.0]
    cache._clock = lambda: now[0]
    cache.set({K1: ("short", 10), K2: ("forever", None)})
    now[0] += 9.9
    assert cache.get([K1, K2]) == {K1: "short", K2: "forever"}
    now[0] += 0.1
    assert cache.get([K1, K2]) == {K2: "forever"}
    now[0] += 3600 * 24
    cache.set({K2: ("later", 5)})
    assert cache.get([K2]) == {K2: "later"}
    now[0] += 5
    assert cache.get([K1, K2]) == {}


def test_clear_exact_namespaces_and_everything_seen_by_another_process(endpoint: str) -> None:
    """clear(ns) drops that namespace only (not a prefix of it, not one below it); clear(None)
    drops everything; another process sees each clear at its next get; clear([]) sends nothing."""
    a, b = _cache(endpoint), _cache(endpoint)
    a.set({K1: (1, None), K2: (2, None), OTHER: (3, None)})
    assert b.get([K1, K2, OTHER]) == {K1: 1, K2: 2, OTHER: 3}
    b.clear([("n", "fetch.v1")])
    assert a.get([K1, K2, OTHER]) == {OTHER: 3}
    a.set({K1: (4, None)})
    assert b.get([K1, K2, OTHER]) == {K1: 4, OTHER: 3}
    b.stats.reset()
    b.clear([])
    assert b.stats.snapshot().round_trips == 0
    a.clear()
    assert b.get([K1, K2, OTHER]) == {}
    b.set({K2: (5, 1)})
    assert a.get([K1, K2, OTHER]) == {K2: 5}


def test_async_methods_share_the_sync_ones_operations(endpoint: str) -> None:
    cache = _cache(endpoint)

    async def main() -> None:
        await cache.aset({K1: ({"nested": [1, 2]}, None), OTHER: ("x", None)})
        assert await cache.aget([K1, OTHER]) == {K1: {"nested": [1, 2]}, OTHER: "x"}
        await cache.aclear([OTHER[0]])
        assert await cache.aget([K1, OTHER]) == {K1: {"nested": [1, 2]}}
        await cache.aclear()
        assert await cache.aget([K1]) == {}
        await cache.aclose()

    asyncio.run(main())
    cache.close()


def test_a_set_under_generations_a_clear_bumped_is_never_returned(endpoint: str) -> None:
    """A process that read the generations before another's clear: its PUT lands after the
    clear under the old ones. Cut right after that wave (the process dies): no get returns it.
    Run to its end, the set sees the change in the same wave and writes again under the new
    generations (it came after the clear): then it is returned."""
    a, b = _cache(endpoint), _cache(endpoint)
    a.set({K1: ("old", None)})  # a knows the generations
    b.clear([K1[0]])
    where = node_cache.Where(a._where().s3, a._keys)
    op = node_cache.put(where, a._state, {K1: (a.serde.dumps_typed("stale"), None)}, a._clock())
    wave = next(op)
    a._sync._wave(wave)  # the PUT under the old generations lands; the process dies here
    op.close()
    assert b.get([K1]) == {}
    assert a.get([K1]) == {}
    # A whole set from a process that last read the generations before the clear.
    c = _cache(endpoint)
    c.get([K2])
    b.clear([K1[0]])
    c.stats.reset()
    c.set({K1: ("after", None)})
    assert _counts(c.stats) == (2, {"get_object": 2, "put_object": 2})  # written again once
    assert b.get([K1]) == {K1: "after"}


def test_request_counts_of_get_set_and_clear(endpoint: str) -> None:
    """get of k keys: k + 1 GETs, 1 round trip. set of k: k PUTs + 1 GET, 1 round trip (a
    GET first in a process that read nothing yet). clear: 1 PUT (a GET first when cold;
    PUT, GET, PUT when another process cleared since)."""
    keys = [(("n", str(i)), f"k{i}") for i in range(5)]
    cold = _cache(endpoint)
    cold.set({k: (i, None) for i, k in enumerate(keys)})
    assert _counts(cold.stats) == (2, {"get_object": 2, "put_object": 5})
    cache = _cache(endpoint)
    assert cache.get(keys + keys[:1]) == {k: i for i, k in enumerate(keys)}  # a key asked twice: read once
    assert _counts(cache.stats) == (1, {"get_object": 6})
    cache.stats.reset()
    cache.set({k: (i, None) for i, k in enumerate(keys[:3])})
    assert _counts(cache.stats) == (1, {"get_object": 1, "put_object": 3})
    cache.stats.reset()
    cache.clear([keys[0][0]])
    assert _counts(cache.stats) == (1, {"put_object": 1})
    cold_clear = _cache(endpoint)
    cold_clear.clear()
    assert _counts(cold_clear.stats) == (2, {"get_object": 1, "put_object": 1})
    cache.stats.reset()
    cache.clear()  # its ETag is stale: the other process cleared since
    assert _counts(cache.stats) == (3, {"get_object": 1, "put_object": 2})
    cache.stats.reset()
    assert cache.get([]) == {} and cache.stats.snapshot().round_trips == 0


def test_bad_input_is_refused_by_name_before_any_request(endpoint: str) -> None:
    cache = _cache(endpoint, prefix="app")
    bad_calls = [
        lambda: cache.get([(["n"], "k")]),
        lambda: cache.get([(("n", 1), "k")]),
        lambda: cache.get([(("n",), b"k")]),
        lambda: cache.get("k"),
        lambda: cache.set({K1: "no ttl"}),
        lambda: cache.set({K1: ("v", "10")}),
        lambda: cache.set({K1: ("v", float("nan"))}),
        lambda: cache.set([(K1, ("v", 1))]),
        lambda: cache.clear(("n",)),
        lambda: cache.clear([["n"]]),
    ]
    for call in bad_calls:
        with pytest.raises(ConfigurationError, match=r"s3://checkpoints/app/node-cache/"):
            call()
    with pytest.raises(SerializationError, match=r"cannot encode the value of"):
        cache.set({K1: (object(), None), K2: ("fine", None)})
    assert cache.stats.snapshot().round_trips == 0
    assert _cache_keys(endpoint, "app/") == []
    for refused in ("x/node-cache/y", "node-cache", "Node-Cache/a"):
        with pytest.raises(ConfigurationError, match="node-cache"):
            _cache(endpoint, prefix=refused)
        with pytest.raises(ConfigurationError, match="node-cache"):
            S3Saver(BUCKET, prefix=refused, endpoint_url=endpoint)


def test_a_store_that_fails_is_a_miss_for_get_and_set_and_an_error_for_clear(
    endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No bucket: get misses and set drops (both logged), clear raises naming the bucket."""
    cache = S3Cache("no-such-bucket", endpoint_url=endpoint, region_name="us-east-1")
    with caplog.at_level(logging.WARNING, logger="s3_saver"):
        assert cache.get([K1]) == {}
        cache.set({K1: ("v", None)})
        assert asyncio.run(cache.aget([K1])) == {}
    assert sum("no-such-bucket" in r.getMessage() for r in caplog.records) >= 3
    with pytest.raises(BucketNotFoundError, match="no-such-bucket"):
        cache.clear()


def test_an_entry_another_value_does_not_answer_for_and_an_unreadable_one_are_misses(
    endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An entry's object names its namespace and key: a body under the wrong key (as a hash
    collision would put it) is a miss; a body that is no entry is a logged miss."""
    cache = _cache(endpoint)
    cache.set({K1: ("one", None), K2: ("two", None)})
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    keys = CacheKeys("")
    body = s3.get_object(Bucket=BUCKET, Key=keys.entry_key(*K2))["Body"].read()
    s3.put_object(Bucket=BUCKET, Key=keys.entry_key(*K1), Body=body)
    assert cache.get([K1, K2]) == {K2: "two"}
    s3.put_object(Bucket=BUCKET, Key=keys.entry_key(*K2), Body=b"<html>sign in</html>")
    with caplog.at_level(logging.WARNING, logger="s3_saver"):
        assert cache.get([K1, K2]) == {}
    assert any("missed" in r.getMessage() for r in caplog.records)


# -- beside a saver -----------------------------------------------------------------------
def test_a_savers_gc_and_audit_leave_the_cache_alone(endpoint: str, index_mode: str) -> None:
    """A saver and a cache on one bucket and prefix: gc with no grace period, unindexed
    threads included (API and command line), deletes no cache object, and audit finds none."""
    from cli_support import ok, run_cli

    saver = make_saver(endpoint, index_mode)
    saver.setup()
    cache = S3Cache.from_saver(saver)
    _graph(saver, cache, []).invoke({"topic": "gc", "calls": []}, {"configurable": {"thread_id": "t"}})
    cache.set({K1: ("kept", None)})
    cache.clear([("elsewhere",)])
    before = _cache_keys(endpoint)
    assert len(before) == 3  # two entries and the generations
    report = saver.collect_garbage(older_than=timedelta(0), include_unindexed=True)
    assert not report.deleted and report.ok, report.problems
    ok(run_cli(endpoint, "gc", "--include-unindexed", "--older-than", "0s", "--force", "--yes", mode=index_mode))
    assert _cache_keys(endpoint) == before
    assert _cache(endpoint).get([K1]) == {K1: "kept"}
    assert saver.get_tuple({"configurable": {"thread_id": "t"}}) is not None


# -- against InMemoryCache ------------------------------------------------------------------
_NAMESPACES = [("a",), ("a", "b"), ("a.b",), ("a", "b", "")]
_KEYS = [(ns, key) for ns in _NAMESPACES for key in ("k", "")]
_OPS = st.one_of(
    st.tuples(
        st.just("set"),
        st.integers(0, 1),
        st.dictionaries(st.sampled_from(_KEYS), st.tuples(st.integers(0, 9), st.sampled_from([None, 0, 1, 3])), min_size=1),
    ),
    st.tuples(st.just("get"), st.integers(0, 1), st.just(None)),
    st.tuples(st.just("clear"), st.integers(0, 1), st.lists(st.sampled_from(_NAMESPACES), max_size=2)),
    st.tuples(st.just("clear"), st.integers(0, 1), st.none()),
    st.tuples(st.just("tick"), st.just(0), st.integers(1, 3)),
)


def _differential(endpoint: str, examples: int):
    """InMemoryCache (its clock the same injected one) and two S3Cache objects (two
    processes, on one prefix per example) given the same calls: every get answers alike."""
    import datetime as dt
    import itertools
    import types

    import langgraph.cache.memory as memory
    from hypothesis import HealthCheck, given, settings

    now = [1_000_000]

    class Clock(dt.datetime):
        @classmethod
        def now(cls, tz=None):  # noqa: ANN001, ANN206
            return dt.datetime.fromtimestamp(now[0], tz)

    prefixes = itertools.count()
    _cache(endpoint)  # the bucket

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(ops=st.lists(_OPS, max_size=10))
    def check(ops) -> None:
        prefix = f"run-{next(prefixes)}/"
        caches = [S3Cache(BUCKET, prefix=prefix, endpoint_url=endpoint, region_name="us-east-1") for _ in range(2)]
        for cache in caches:
            cache._clock = lambda: float(now[0])
        reference = memory.InMemoryCache()
        for kind, who, arg in ops:
            cache = caches[who]
            if kind == "set":
                cache.set(arg)
                reference.set(arg)
            elif kind == "clear":
                cache.clear(arg)
                reference.clear(arg)
            elif kind == "tick":
                now[0] += arg
            assert cache.get(_KEYS) == reference.get(_KEYS), (prefix, ops)
        for cache in caches:
            cache.close()

    original = memory.datetime
    memory.datetime = types.SimpleNamespace(datetime=Clock, timezone=dt.timezone, timedelta=dt.timedelta)
    try:
        check()
    finally:
        memory.datetime = original


def test_answers_equal_in_memory_caches(endpoint: str) -> None:
    _differential(endpoint, 15)


@pytest.mark.slow
def test_answers_equal_in_memory_caches_long(endpoint: str) -> None:
    _differential(endpoint, 200)


@pytest.mark.slow
def test_on_seaweedfs_a_clear_in_one_process_is_seen_by_the_other(seaweedfs_bucket: tuple[str, str]) -> None:
    """An S3-compatible store: plain PUTs, compare-and-swap of the generations (a stale ETag
    answered 412), GETs of missing entries; the set-vs-clear rewrite."""
    from conftest import seaweedfs_session

    endpoint, bucket = seaweedfs_bucket

    def cache() -> S3Cache:
        return S3Cache(bucket, s3_endpoint_url=endpoint, region_name="us-east-1", boto3_session=seaweedfs_session())

    a, b = cache(), cache()
    a.set({K1: (1, None), OTHER: (2, 60)})
    assert b.get([K1, K2, OTHER]) == {K1: 1, OTHER: 2}
    b.clear([K1[0]])
    a.clear([OTHER[0]])  # its ETag is stale: 412, read again, swapped
    assert b.get([K1, OTHER]) == {}
    a.set({K2: (3, None)})  # a's generations are current: one round trip
    b.clear()
    a.set({K1: (4, None)})  # a's are stale now: written again under b's
    assert b.get([K1, K2]) == {K1: 4}


def _without_list_bucket(cache: S3Cache, deny: set[str] | None = None) -> None:
    """S3's answers to a caller without s3:ListBucket: 403 AccessDenied for a missing key
    (and, for the keys in ``deny``, for a present one: a GET denied outright)."""
    from botocore.exceptions import ClientError

    send = cache._sync._send

    def answer(call):  # noqa: ANN001, ANN202
        result = send(call)
        key = call.params.get("Key", "")
        missing = isinstance(result, ClientError) and result.response["Error"]["Code"] == "NoSuchKey"
        if call.operation == "get_object" and (missing or key in (deny or set())):
            error = {"Error": {"Code": "AccessDenied", "Message": "Access Denied"}, "ResponseMetadata": {"HTTPStatusCode": 403}}
            return ClientError(error, "GetObject")
        return result

    cache._sync._send = answer


def test_without_list_bucket_a_missing_entry_is_a_quiet_miss_and_set_creates_the_generations(
    endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """S3 answers 403 for a missing key to a caller without s3:ListBucket. A set creates the
    generations document (IfNoneMatch) and goes on; once it exists, a 403 entry beside it is a
    miss, not logged; clear works. A document that exists but cannot be read: set drops,
    clear raises AccessDeniedError naming the bucket."""
    from s3_saver import AccessDeniedError

    cache = _cache(endpoint)
    _without_list_bucket(cache)
    with caplog.at_level(logging.WARNING, logger="s3_saver"):
        assert cache.get([K1]) == {}  # no document yet: cannot tell, all missed (logged)
        cache.stats.reset()
        cache.set({K1: ("v", None)})  # GET (403), create the document, then PUT and GET
        assert _counts(cache.stats) == (3, {"get_object": 2, "put_object": 2})
        caplog.clear()
        assert cache.get([K1, K2]) == {K1: "v"}
        assert caplog.records == []
    cache.clear([K1[0]])
    assert cache.get([K1]) == {}
    cold = _cache(endpoint)
    _without_list_bucket(cold)
    cold.clear()
    assert cache.get([K1]) == {}
    denied = _cache(endpoint)
    _without_list_bucket(denied, {CacheKeys("").gens_key})
    denied.set({K2: ("dropped", None)})
    assert _cache(endpoint).get([K2]) == {}
    with pytest.raises(AccessDeniedError, match="checkpoints"):
        denied.clear()


# -- set racing clear, every interleaving of their round trips ---------------------------------
def _interleavings(endpoint: str, stale: bool):
    """Every schedule of one process's set of V1 and another's clear of its namespace, round
    trip by round trip, the set possibly cut (its process gone) after any of its waves, after
    V0 was set and returned: (schedule, what a fresh get then returns)."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from s3_saver._transport.protocol import Sleep

    serde = JsonPlusSerializer(pickle_fallback=False)
    runs = iter(range(10_000))
    _cache(endpoint)  # the bucket

    def run(choices: list[str]) -> tuple[list[str], dict]:
        prefix = f"race-{next(runs)}/"

        def make() -> S3Cache:
            return S3Cache(BUCKET, prefix=prefix, endpoint_url=endpoint, region_name="us-east-1")

        setter, clearer = make(), make()
        setter.set({K1: ("V0", None)})
        clearer.get([K1])  # warm: it knows the generations' ETag
        if stale:
            make().clear([("elsewhere",)])  # both now hold a stale view
        where = lambda c: node_cache.Where(c._where().s3, c._keys)  # noqa: E731
        ops = {
            "set": node_cache.put(where(setter), setter._state, {K1: (serde.dumps_typed("V1"), None)}, setter._clock()),
            "clear": node_cache.clear(where(clearer), clearer._state, [K1[0]]),
        }
        pending = {name: next(op) for name, op in ops.items()}
        options: list[str] = []
        for choice in [*choices, None]:
            options = sorted(pending) + (["cut"] if "set" in pending else [])
            if choice is None:
                break
            if choice == "cut":
                ops["set"].close()
                del pending["set"]
                continue
            step = pending[choice]
            reply = setter._sync._wave(step) if isinstance(step, tuple) else (True if isinstance(step, Sleep) else None)
            try:
                pending[choice] = ops[choice].send(reply)
            except StopIteration:
                del pending[choice]
        got = make().get([K1]) if not pending else None
        return options if pending else [], {"value": got}

    def walk(choices: list[str]):
        options, seen = run(choices)
        if not options:
            yield choices, seen["value"]
            return
        for option in options:
            yield from walk([*choices, option])

    yield from walk([])


@pytest.mark.parametrize("stale", [False, True], ids=["current", "stale"])
def test_a_set_racing_a_clear_never_brings_back_what_the_clear_removed(endpoint: str, stale: bool) -> None:
    """Never V0 after the clear. A set that finished before the clear began is cleared; one
    that began after it returned is kept; in between, either (never a torn state)."""
    seen = 0
    for schedule, got in _interleavings(endpoint, stale):
        seen += 1
        assert got in ({}, {K1: "V1"}), (schedule, got)
        steps = [c for c in schedule if c != "cut"]
        if "cut" not in schedule and steps == sorted(steps, key=lambda c: c != "set"):  # set, then clear
            assert got == {}, schedule
        if "cut" not in schedule and steps == sorted(steps, key=lambda c: c != "clear"):  # clear, then set
            assert got == {K1: "V1"}, schedule
    assert seen >= (9 if stale else 4), seen
