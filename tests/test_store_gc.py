"""S3Store.collect_garbage on a real bucket (moto), in both index modes: the value objects
no item names (a put whose commit failed after its object was written, a value whose
replacement did not delete it, an item DynamoDB's TTL deleted) are deleted past the grace
period, and nothing an item names; a run is bounded and the runs go on from a cursor; a
run cut after any round trip finishes when run again; and a put racing a collection
keeps its value (the lease: a put copies a value object it has held longer than ten
minutes before naming it, so the collection deletes what nothing will name).
"""

from __future__ import annotations

import base64
import secrets
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import boto3
import pytest
from conftest import BUCKET, TABLE
from test_store_erase import _after_wave, _Cut, _stop, _waves
from test_store_s3 import keys, make_store

from s3_saver import MemoryGarbageReport
from s3_saver._format.memory import ttl
from s3_saver._format.memory.names import node_id
from s3_saver._store.store import S3Store
from s3_saver.errors import ConfigurationError, StoreUnavailableError

NOW = timedelta(0)
MINUTE = 60 * 1_000_000


def _big(tag: str) -> dict[str, str]:
    # 120 KB that compress to about 90 KB: an object of its own in both modes.
    return {"tag": tag, "text": base64.b64encode(secrets.token_bytes(90_000)).decode()}


def _values(endpoint: str, prefix: str = "") -> set[str]:
    return {k for k in keys(endpoint, prefix + "memory/") if "/@v/" in k}


def _stray(endpoint: str, ns: tuple[str, ...], prefix: str = "") -> str:
    """A value object in the folder of ``ns`` that no item names (what a cut put leaves)."""
    key = f"{prefix}memory/n/{node_id(ns)}/@v/{secrets.token_hex(16)}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").put_object(Bucket=BUCKET, Key=key, Body=b"x" * 70_000)
    return key


def _failed_put(store: S3Store, ns: tuple[str, ...], value: dict[str, Any]) -> None:
    """A put whose commit fails after its value object was written."""
    index = store._memory.index
    real = index.commit

    def commit(groups: Any, stage: Any = None) -> Any:
        # Cut after the value objects (``stage``), before any row; the namespace's
        # registration skipped too: what a process leaves that saw the namespace
        # registered before a sweep unregistered it.
        index.commit = real
        yield from stage()
        raise StoreUnavailableError("the commit failed (a test)")

    index.commit = commit
    with pytest.raises(StoreUnavailableError):
        store.put(ns, "lost", value)


@pytest.fixture
def bucket(endpoint: str, index_mode: str) -> tuple[str, str]:
    with make_store(endpoint, index_mode) as store:
        store.setup()
    return endpoint, index_mode


def _orphans(bucket: tuple[str, str], store: S3Store, prefix: str = "") -> tuple[set[str], set[str]]:
    """Named value objects and orphans, of every kind the index mode can leave: returns
    (named, orphans)."""
    endpoint, mode = bucket
    store.put(("users", "ann"), "doc", _big("ann"))
    store.put(("users", "ann"), "doc", _big("ann again"))  # the replaced object is deleted by the put
    store.put(("users", "bob"), "doc", _big("bob"))
    named = _values(endpoint, prefix)
    _failed_put(store, ("users", "ann"), _big("lost"))  # a registered namespace
    _failed_put(store, ("users", "cid"), _big("lost"))  # a namespace never registered
    orphans = _values(endpoint, prefix) - named
    orphans.add(_stray(endpoint, ("users", "bob"), prefix))
    if mode == "dynamodb":
        # DynamoDB's TTL deletes an expired item: its value object is left.
        store.put(("users", "dan"), "doc", _big("dan"))
        table = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
        pk = store._memory.index._pk(("users", "dan"))
        ttl_gone = _values(endpoint, prefix) - named - orphans
        table.delete_item(TableName=TABLE, Key={"pk": {"S": pk}, "sk": {"S": "kdoc"}})
        orphans |= ttl_gone
    assert len(orphans) == (4 if mode == "dynamodb" else 3)
    return named, orphans


def test_collect_garbage_deletes_the_value_objects_no_item_names_past_the_grace_period(bucket: tuple[str, str]) -> None:
    endpoint, mode = bucket
    with make_store(*bucket) as store:
        named, orphans = _orphans(bucket, store)
        young = store.collect_garbage()  # the grace period: an hour
        assert young.garbage == () and young.deleted == () and set(young.in_flight) == named | orphans
        dry = store.collect_garbage(older_than=NOW, dry_run=True)
        assert set(dry.garbage) == orphans and dry.deleted == () and dry.bytes >= 70_000 * len(orphans)
        assert _values(endpoint) == named | orphans
        report = store.collect_garbage(older_than=NOW)
        assert isinstance(report, MemoryGarbageReport)
        assert set(report.deleted) == set(report.garbage) == orphans and report.finished and not report.broken
        assert _values(endpoint) == named
        assert store.get(("users", "ann"), "doc").value["tag"] == "ann again"
        assert store.get(("users", "bob"), "doc").value["tag"] == "bob"
        again = store.collect_garbage(older_than=NOW)
        assert again.garbage == () and again.finished
        with pytest.raises(ConfigurationError):
            store.collect_garbage(limit=0)
        with pytest.raises(ConfigurationError):
            store.collect_garbage(older_than=timedelta(seconds=-1))


def test_a_run_is_bounded_and_the_runs_go_on_from_where_the_last_stopped(bucket: tuple[str, str]) -> None:
    """Seven namespaces, each with an item and an orphan: a run lists at most ``limit``
    keys; runs of new processes (a schedule) go on from the cursor, and together delete
    every orphan and nothing else."""
    endpoint, mode = bucket
    with make_store(*bucket) as store:
        for i in range(7):
            store.put(("team", f"n{i}"), "doc", _big(f"n{i}"))
            _stray(endpoint, ("team", f"n{i}"))
    both = _values(endpoint)
    everything = len(keys(endpoint, "memory/n/"))
    runs = []
    for _ in range(10):
        with make_store(*bucket) as process:
            runs.append(process.collect_garbage(older_than=NOW, limit=5))
        if runs[-1].finished:
            break
    assert all(r.examined <= 5 for r in runs) and sum(r.examined for r in runs) == everything
    assert sum(len(r.deleted) for r in runs) == 7 and runs[-1].finished
    assert len(_values(endpoint)) == 7 and _values(endpoint) < both
    with make_store(*bucket) as reader:
        assert [reader.get(("team", f"n{i}"), "doc").value["tag"] for i in range(7)] == [f"n{i}" for i in range(7)]


def test_a_collection_cut_after_any_round_trip_finishes_when_run_again(bucket: tuple[str, str]) -> None:
    """A collection stopped after each of its round trips, then run again by a new
    process: every orphan is gone, every named object stays and reads back."""
    endpoint, mode = bucket

    def setup(store: S3Store) -> None:
        store.put(("c", "u1"), "doc", _big("kept"))
        _failed_put(store, ("c", "u1"), _big("lost"))
        _failed_put(store, ("c", "u2"), _big("lost"))

    waves = _waves(bucket, setup, lambda s: s.collect_garbage(older_than=NOW))
    assert waves >= 4  # the cursor, the listing, the items, the deletion (the cursor stays: it ran to the end)
    for k in range(1, waves + 1):
        prefix = f"cut{k}/"
        with make_store(endpoint, mode, prefix=prefix) as store:
            setup(store)
        named = _values(endpoint, prefix)  # the kept value's object, and the two a failed put left
        with make_store(endpoint, mode, prefix=prefix) as store:
            _after_wave(store, k, _stop)
            with pytest.raises(_Cut):
                store.collect_garbage(older_than=NOW)
        with make_store(endpoint, mode, prefix=prefix) as again:
            report = again.collect_garbage(older_than=NOW)
            assert report.finished and not report.broken, k
            assert len(_values(endpoint, prefix)) == 1 and _values(endpoint, prefix) < named, k
            assert again.get(("c", "u1"), "doc").value["tag"] == "kept", k


class _Clock:
    """Wall time plus an offset the test moves (the stores' clock: their lease and the
    collection's grace period are judged by it)."""

    def __init__(self) -> None:
        self.offset = 0

    def __call__(self) -> int:
        return time.time_ns() // 1000 + self.offset


def _racing(bucket: tuple[str, str], clock: _Clock, pause: int, during: Callable[[S3Store, Callable[[], None]], Any]) -> Any:
    """A put of a large value whose process pauses ``pause`` µs (by the stores' clock)
    between writing the value object and its commit. ``during(collector, release)`` runs in
    the pause, on another process's store; ``release()`` lets the put go on and waits for
    its answer. Returns what the put raised (None: it answered)."""
    ns = ("r", "u1")
    with make_store(*bucket, clock=ttl.Clock(clock)) as writer:
        writer.put(ns, "doc", _big("old"))  # the namespace registered
    written, go, answered = threading.Event(), threading.Event(), threading.Event()
    outcome: list[Any] = [None]

    def put() -> None:
        with make_store(*bucket, clock=ttl.Clock(clock)) as store:
            # A warm process that knows the namespace registered: its put's first round
            # trip writes the value object.
            store.put(ns, "warm", {"tag": "warm"})

            def paused() -> None:
                clock.offset += pause
                written.set()
                go.wait(30)

            _after_wave(store, 1, paused)
            try:
                store.put(ns, "doc", _big("new"))
            except Exception as exc:
                outcome[0] = exc
            finally:
                answered.set()

    def release() -> None:
        go.set()
        assert answered.wait(30)

    thread = threading.Thread(target=put)
    thread.start()
    assert written.wait(30)
    with make_store(*bucket, clock=ttl.Clock(clock)) as collector:
        during(collector, release)
    release()
    thread.join(30)
    return outcome[0]


def test_a_put_racing_a_collection_keeps_its_value(bucket: tuple[str, str]) -> None:
    """The put writes its value object, then waits 16 minutes (a process paused, a Lambda
    frozen) before its commit. A collection with a 15-minute grace period lists the
    object, reads the items (none names it: it is garbage), and the put commits before
    the collection deletes it. The put had held the object past its lease: it named a
    fresh copy, and keeps its value. (Naming the object itself, the key would have named
    a deleted object.)"""
    clock = _Clock()
    seen: list[MemoryGarbageReport] = []

    def collect(collector: S3Store, release: Callable[[], None]) -> None:
        # After the collection read the items (its third round trip), before it deletes.
        _after_wave(collector, 3, release)
        seen.append(collector.collect_garbage(older_than=timedelta(minutes=15)))

    assert _racing(bucket, clock, 16 * MINUTE, collect) is None
    assert len(seen[0].deleted) == 1  # the object the put wrote first: named by nothing, ever
    with make_store(*bucket) as reader:
        assert reader.get(("r", "u1"), "doc").value["tag"] == "new"
    with make_store(*bucket, clock=ttl.Clock(clock)) as collector:
        assert collector.collect_garbage(older_than=timedelta(minutes=15)).garbage == ()


def test_a_put_whose_value_object_was_collected_while_it_waited_writes_nothing(bucket: tuple[str, str]) -> None:
    """The put waits 20 minutes between its value object and its commit, and a
    collection (15-minute grace period) deletes the object meanwhile: the put raises
    StoreUnavailableError saying so, and the key keeps its old value (never an item
    naming a deleted object)."""
    clock = _Clock()
    reports: list[MemoryGarbageReport] = []
    error = _racing(bucket, clock, 20 * MINUTE, lambda c, _: reports.append(c.collect_garbage(older_than=timedelta(minutes=15))))
    assert len(reports[0].deleted) == 1
    assert isinstance(error, StoreUnavailableError) and "key 'doc'" in str(error) and "put it again" in str(error)
    with make_store(*bucket) as reader:
        assert reader.get(("r", "u1"), "doc").value["tag"] == "old"


def test_requests_of_a_collection_run(bucket: tuple[str, str]) -> None:
    """What the docs quote: a run that lists K keys (one page per 1,000) and finds F folders
    holding value objects past the grace period costs the cursor, the listing, one read per
    folder (in one round trip), one DeleteObjects per 1,000 objects and, when it stops
    before the end, the cursor written: F + 3 requests in 4 round trips here (a run over
    every key), one more request and round trip for a run that stops early."""
    endpoint, mode = bucket
    with make_store(*bucket) as store:
        for name in ("a", "b", "c"):
            store.put(("q", name), "doc", _big(name))
            _stray(endpoint, ("q", name))
        _stray(endpoint, ("q", "never-registered"))
    with make_store(*bucket) as store:
        store.get(("warm", "up"), "k")
        store.stats.reset()
        assert len(store.collect_garbage(older_than=NOW).deleted) == 4
        assert (store.stats.total_requests, store.stats.round_trips) == (4 + 3, 4)
        for name in ("a", "b", "c"):
            _stray(endpoint, ("q", name))
        store.stats.reset()
        report = store.collect_garbage(older_than=NOW, limit=3)  # three keys: not the end
        assert not report.finished
        # The cursor read, the listing, the folders' reads, the deletion (if any), the cursor written.
        reads, deletes = report.namespaces, 1 if report.deleted else 0
        assert (store.stats.total_requests, store.stats.round_trips) == (3 + reads + deletes, 3 + (reads > 0) + deletes)
