"""S3Store's erase_namespace and TTL sweep on a real bucket (moto), in both index modes:
what an erase leaves (no version of an erased item, in the bucket or the table), what it
leaves alone (other namespaces, a saver's threads), a put racing it or following it from
another process, an erase cut after any round trip and made again, and the sweep: bounded
per run, complete over runs, never a returned expired item, an emptied namespace
unregistered, a put racing it kept listed; the sweeper thread; the request counts.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from conftest import BUCKET, TABLE, make_saver, make_versioned
from helpers import grow_thread
from store_reference import FakeTime
from test_store_s3 import make_store

from s3_saver import NamespaceEraseReport
from s3_saver._format.codec import plain
from s3_saver._format.memory import ttl
from s3_saver._format.memory.documents import loads_registry, registry_object_key, registry_partition
from s3_saver._format.memory.names import node_id
from s3_saver._store.store import S3Store
from s3_saver.errors import ConfigurationError, NamespaceError

ERASED = (("users", "u1"), ("users", "u1", "notes"))
KEPT = (("users", "u10"), ("users", "u2"), ("team",))  # ("users", "u10"): a string prefix, not a tuple prefix
PREFIX = ("users", "u1")


def _s3(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _versions(endpoint: str, prefix: str = "memory/") -> list[tuple[str, str, bool, bytes]]:
    """Every version under ``prefix``: (key, version id, is latest, bytes as stored, uncompressed)."""
    s3 = _s3(endpoint)
    out = []
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=BUCKET, Prefix=prefix):
        for v in page.get("Versions", []):
            body = s3.get_object(Bucket=BUCKET, Key=v["Key"], VersionId=v["VersionId"])["Body"].read()
            out.append((v["Key"], v["VersionId"], v["IsLatest"], plain(body, v["Key"])))
        for m in page.get("DeleteMarkers", []):
            out.append((m["Key"], m["VersionId"], m["IsLatest"], b""))
    return out


def _items(endpoint: str, mode: str) -> list[dict[str, Any]]:
    if mode != "dynamodb":
        return []
    client = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    return [i for p in client.get_paginator("scan").paginate(TableName=TABLE) for i in p["Items"]]


def _fill(store: S3Store) -> dict[tuple[str, ...], list[str]]:
    """Items in every namespace (an overwrite, a delete and a large value among the
    erased ones); returns each namespace's secrets (random, so stored as written)."""
    secret: dict[tuple[str, ...], list[str]] = {}
    for ns in (*ERASED, *KEPT):
        secret[ns] = [secrets.token_hex(12) for _ in range(3)]
        for i, s in enumerate(secret[ns]):
            store.put(ns, f"k{i}", {"text": s})
    store.put(ERASED[0], "k0", {"text": secret[ERASED[0]][0], "again": True})  # a replaced version
    store.delete(ERASED[0], "k2")
    big = secrets.token_hex(40_000)  # 80 KB: its own object in both modes
    secret[ERASED[1]].append(big[:64])
    store.put(ERASED[1], "big", {"text": big})
    store.put(ERASED[1], "big", {"text": big + "x"})  # a replaced value object
    return secret


@pytest.fixture
def bucket(endpoint: str, index_mode: str) -> tuple[str, str]:
    """The bucket (and in DynamoDB mode the table), set up: (endpoint, index mode)."""
    with make_store(endpoint, index_mode) as store:
        store.setup()
    return endpoint, index_mode


@pytest.fixture
def versioned(endpoint: str, index_mode: str) -> tuple[str, str]:
    make_versioned(endpoint)
    with make_store(endpoint, index_mode) as store:
        store.setup()
    return endpoint, index_mode


def test_an_erase_on_a_versioned_bucket_leaves_no_version_of_what_it_erased(versioned: tuple[str, str]) -> None:
    """After erase_namespace(("users", "u1")): no object version, no table item, and no
    registry version holds an erased item or names an erased namespace; what stays under
    the erased namespaces' folders is the current empty head (manifest mode), reported in
    ``records``. ("users", "u10") (a string prefix, not a tuple prefix), a sibling, and a
    saver's thread on the same prefix are untouched."""
    endpoint, mode = versioned
    saver = make_saver(endpoint, mode)
    grow_thread(saver, "t", 2)
    with make_store(endpoint, mode) as store:
        secret = _fill(store)
        report = store.erase_namespace(PREFIX)
        assert isinstance(report, NamespaceEraseReport)
        assert report.namespaces == ERASED and report.items == 2 + 4 and report.complete and not report.written_during
        assert report.buckets == (BUCKET,) and report.deleted > 0

        gone = [s.encode() for ns in ERASED for s in secret[ns]]
        stored = _versions(endpoint)
        assert not [k for k, _, _, body in stored if any(s in body for s in gone)]
        assert not [i for i in _items(endpoint, mode) if any(s in repr(i).encode() for s in gone)]
        folders = {f"memory/n/{node_id(ns)}/" for ns in ERASED}
        left = [(k, latest, body) for k, _, latest, body in stored if any(k.startswith(f) for f in folders)]
        if mode == "manifest":
            # One version each: the current empty head, which names no namespace.
            assert sorted(k for k, _, _ in left) == sorted(f + "@head" for f in folders)
            assert all(latest and b"u1" not in body for _, latest, body in left)
            assert sorted(report.records) == sorted(f"s3://{BUCKET}/{f}@head" for f in folders)
            registry = [body for k, _, _, body in stored if k == registry_object_key("")]
            assert len(registry) == 1  # its replaced versions named the erased namespaces
            assert sorted(loads_registry(registry[0], "registry").created) == sorted(KEPT)
        else:
            assert left == [] and report.records == ()
            paths = [tuple(x["S"] for x in i["path"]["L"]) for i in _items(endpoint, mode) if "path" in i]
            assert sorted(paths) == sorted(KEPT)

        assert store.list_namespaces() == sorted(KEPT)
        for ns in ERASED:
            assert store.search(ns) == [] and store.get(ns, "k0") is None
        for ns in KEPT:
            assert [i.value["text"] for i in store.search(ns)] == secret[ns]
        assert [i.key for i in store.search(("users",))] == ["k0", "k1", "k2"] * 2
    assert saver.get_tuple({"configurable": {"thread_id": "t"}}) is not None
    saver.close()


def test_erasing_every_namespace_must_be_asked_for(bucket: tuple[str, str]) -> None:
    """``()`` alone is refused (nothing sent); ``everything=True`` erases all memory."""
    with make_store(*bucket) as store:
        store.put(("a",), "k", {"v": 1})
        store.put(("b", "c"), "k", {"v": 2})
        store.stats.reset()
        with pytest.raises(ConfigurationError, match="everything=True"):
            store.erase_namespace(())
        with pytest.raises(ConfigurationError):
            store.erase_namespace(("a",), everything=True)
        with pytest.raises(NamespaceError):
            store.erase_namespace(("a.b",))
        assert store.stats.total_requests == 0
        report = store.erase_namespace((), everything=True)
        assert report.namespaces == (("a",), ("b", "c")) and report.items == 2
        assert store.list_namespaces() == [] and store.search(()) == []


def test_a_put_after_an_erase_by_a_process_that_knew_the_namespace_registers_it_again(bucket: tuple[str, str]) -> None:
    """Two stores (two processes): B has written the namespace (it knows its registration
    and, in manifest mode, holds its head); A erases it; B's next puts (a new key, and a
    key it wrote before) register it again: listed, found by a prefix search."""
    ns = ("users", "u1")
    with make_store(*bucket) as a, make_store(*bucket) as b:
        b.put(ns, "old", {"text": "before"})
        b.put(ns + ("deep",), "k", {"text": "below"})
        a.erase_namespace(ns)
        assert a.list_namespaces() == []
        b.put(ns, "old", {"text": "after"})  # a key B wrote: its first try is an overwrite
        assert a.list_namespaces() == [ns]
        b.put(ns + ("deep",), "k", {"text": "below, after"})
        b.put(ns, "new", {"text": "after too"})
        assert a.list_namespaces() == [ns, ns + ("deep",)]
        assert [(i.key, i.value["text"]) for i in a.search(("users",))] == [
            ("old", "after"),
            ("new", "after too"),
            ("k", "below, after"),
        ]


# -- interleavings, at round-trip granularity ---------------------------------------------


class _Cut(Exception):
    """The process stops: the wave was sent (and applied), its answer never read."""


def _after_wave(store: S3Store, k: int, act: Callable[[], None]) -> None:
    """Run ``act`` after the store's ``k``-th round trip (its answers not yet read)."""
    sent = store._sync._wave
    count = [0]

    def wave(calls: Any) -> Any:
        answers = sent(calls)
        count[0] += 1
        if count[0] == k:
            act()
        return answers

    store._sync._wave = wave  # type: ignore[method-assign]


def _waves(bucket: tuple[str, str], setup: Callable[[S3Store], None], run: Callable[[S3Store], Any]) -> int:
    with make_store(*bucket, prefix="probe/") as probe:
        setup(probe)
        probe.stats.reset()
        run(probe)
        return probe.stats.round_trips


def _stop() -> None:
    raise _Cut


def test_an_erase_cut_after_any_round_trip_finishes_when_made_again(versioned: tuple[str, str]) -> None:
    """An erase stopped after each of its round trips, then made again by a new process:
    the second report is complete and nothing of the erased items is left (every
    version), the other namespace untouched."""
    endpoint, mode = versioned
    big = secrets.token_hex(40_000)

    def setup(store: S3Store) -> None:
        store.put(("x", "u1"), "a", {"text": "alpha"})
        store.put(("x", "u1"), "big", {"text": big})
        store.put(("x", "u1"), "big", {"text": big + "!"})
        store.put(("x", "u1", "deep"), "b", {"text": "beta"})
        store.put(("x", "u2"), "c", {"text": "gamma"})

    waves = _waves(versioned, setup, lambda s: s.erase_namespace(("x", "u1")))
    assert waves >= 5
    for k in range(1, waves + 1):
        prefix = f"cut{k}/"
        with make_store(endpoint, mode, prefix=prefix) as store:
            setup(store)
        with make_store(endpoint, mode, prefix=prefix) as store:
            _after_wave(store, k, _stop)
            with pytest.raises(_Cut):
                store.erase_namespace(("x", "u1"))
        with make_store(endpoint, mode, prefix=prefix) as again:
            report = again.erase_namespace(("x", "u1"))
            assert report.complete and not report.written_during, k
            assert again.list_namespaces() == [("x", "u2")], k
            assert again.get(("x", "u1"), "a") is None and again.get(("x", "u2"), "c").value == {"text": "gamma"}
        stored = _versions(endpoint, prefix + "memory/")
        assert not [key for key, _, _, body in stored if b"alpha" in body or b"beta" in body or big[:64].encode() in body], k
        assert not [key for key, _, _, _ in stored if "/@v/" in key], k
        assert not [i for i in _items(endpoint, mode) if "alpha" in repr(i) or "beta" in repr(i)], k


def test_a_put_racing_an_erase_is_erased_or_stays_whole_and_listed(bucket: tuple[str, str]) -> None:
    """Another process puts into the namespace (a new key, and an overwrite) after each
    round trip of an erase: each item it wrote is either erased or there, whole, in a
    listed namespace that a prefix search finds, and the report says which."""
    ns = ("r", "u1")

    def setup(store: S3Store) -> None:
        store.put(ns, "old", {"text": "old"})
        store.put(ns + ("deep",), "d", {"text": "deep"})

    waves = _waves(bucket, setup, lambda s: s.erase_namespace(("r",)))
    outcomes = set()
    for k in range(1, waves + 1):
        prefix = f"race{k}/"
        with make_store(*bucket, prefix=prefix) as other, make_store(*bucket, prefix=prefix) as store:
            setup(other)

            def put() -> None:
                other.put(ns, "new", {"text": "racing"})
                other.put(ns, "old", {"text": "racing overwrite"})

            _after_wave(store, k, put)
            report = store.erase_namespace(("r",))
        with make_store(*bucket, prefix=prefix) as reader:
            found = {i.key: i.value["text"] for i in reader.search(("r",))}
            assert set(found.values()) <= {"racing", "racing overwrite"}, (k, found)
            listed = reader.list_namespaces()
            # Found, so listed. Listed and empty is possible: the put registered again and
            # the erase, still reading, deleted its items (a sweep unregisters it later).
            assert ns in listed or not found, (k, found, listed)
            # What the erase saw registered again it reports (a put after its registry
            # step, it cannot: that one came after the erase).
            assert ns in listed or ns not in report.written_during, (k, report)
            assert ns + ("deep",) not in listed and reader.get(ns + ("deep",), "d") is None
            outcomes.add(bool(found))
    assert outcomes == {True, False}  # some racing puts were erased, some stayed


# -- the TTL sweep -----------------------------------------------------------------------


def _ttl_store(bucket: tuple[str, str], time_source: FakeTime, **kwargs: Any) -> S3Store:
    return make_store(*bucket, ttl={"default_ttl": 1, "refresh_on_read": False}, clock=ttl.Clock(time_source), **kwargs)


def test_the_sweep_is_bounded_per_run_complete_over_runs_and_never_returns_an_expired_item(bucket: tuple[str, str]) -> None:
    """Five namespaces, two holding only items that expire, one holding a large value that
    expires, two with an item that does not: expired items are never returned, before or
    after a sweep; a run visits at most ``limit`` namespaces; runs from the cursor cover all;
    the emptied namespaces are unregistered, their bytes gone (table items, value objects)."""
    endpoint, mode = bucket
    clock = FakeTime()
    spaces = [("s", f"n{i}") for i in range(5)]
    with _ttl_store(bucket, clock) as store:
        for ns in spaces:
            store.put(ns, "short", {"text": f"short {ns[1]}"})
        store.put(spaces[2], "big", {"text": secrets.token_hex(40_000)})
        for ns in spaces[3:]:
            store.put(ns, "long", {"text": "stays"}, ttl=None)
        clock.us += 61_000_000  # a minute and a second: every "short" and "big" expired
        for reader in (store, make_store(*bucket)):
            assert [i.key for i in reader.search(("s",))] == ["long", "long"]
            assert reader.get(spaces[0], "short") is None and reader.get(spaces[2], "big") is None
        removed, runs = [], 0
        while sum(removed) < 6:
            store.stats.reset()
            removed.append(store.sweep_ttl(limit=2))
            runs += 1
            assert runs <= 3
        assert removed == [2, 3, 1]  # n0 n1 | n2 (short, big) n3 | n4
        assert store.sweep_ttl(limit=2) == 0  # the cursor started over: nothing left
        assert store.list_namespaces(prefix=("s",)) == spaces[3:]
        assert [i.key for i in store.search(("s",))] == ["long", "long"]
    assert [k for k in _all_keys(endpoint) if "/@v/" in k] == []
    assert not [i for i in _items(endpoint, mode) if "short" in i["sk"]["S"] or "big" in i["sk"]["S"]]


def _all_keys(endpoint: str) -> list[str]:
    pages = _s3(endpoint).get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
    return [o["Key"] for p in pages for o in p.get("Contents", [])]


def test_a_put_racing_a_sweep_that_empties_its_namespace_stays_listed(bucket: tuple[str, str]) -> None:
    """Another process (whose knowledge of the namespace predates the sweep) puts into a
    namespace after each round trip of a sweep that finds it empty: the item is there and
    the namespace listed."""
    clock = FakeTime()
    ns = ("w", "u1")
    waves = 0
    with _ttl_store(bucket, clock, prefix="probe/") as probe:
        probe.put(ns, "gone", {"text": "expires"})
        clock.us += 61_000_000
        probe.stats.reset()
        probe.sweep_ttl()
        waves = probe.stats.round_trips
        assert probe.list_namespaces() == []
    for k in range(1, waves + 1):
        prefix = f"sweep{k}/"
        with _ttl_store(bucket, clock, prefix=prefix) as other, _ttl_store(bucket, clock, prefix=prefix) as store:
            other.put(ns, "gone", {"text": "expires"})
            clock.us += 61_000_000
            _after_wave(store, k, lambda k=k: other.put(ns, f"new{k}", {"text": "racing"}, ttl=None))
            store.sweep_ttl()
        with make_store(*bucket, prefix=prefix) as reader:
            assert [i.key for i in reader.search(("w",))] == [f"new{k}"], k
            assert reader.list_namespaces() == [ns], k


def test_the_sweeper_thread_sweeps_until_stopped(bucket: tuple[str, str]) -> None:
    """``start_ttl_sweeper`` (PostgresStore's): a daemon thread runs a sweep every
    interval; ``stop_ttl_sweeper`` stops it. A store with no TTL configuration starts none."""
    with make_store(*bucket) as plain_store:
        future = plain_store.start_ttl_sweeper()
        assert future.done() and plain_store.stop_ttl_sweeper()
    clock = FakeTime()
    with _ttl_store(bucket, clock) as store:
        store.put(("z",), "k", {"text": "expires"})
        clock.us += 61_000_000
        future = store.start_ttl_sweeper(sweep_interval_minutes=0.002)  # every 0.12 s
        deadline = time.monotonic() + 20
        while store.list_namespaces() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.list_namespaces() == []
        assert store.stop_ttl_sweeper(timeout=20) and future.done()


# -- requests ----------------------------------------------------------------------------

# (requests, round trips), unversioned bucket, a process that has made its first call.
ERASE_REQUESTS = {
    # GET versioning, GET registry, GET head, PUT the empty head, LIST the folder, PUT registry
    "manifest": lambda n: (6, 6),
    # GET versioning, Query registry, retire, Query items, a DeleteItem per item (one wave),
    # LIST the folder, DeleteItem of the registry item
    "dynamodb": lambda n: (6 + n, 7),
}
SWEEP_REQUESTS = {
    # GET cursor + GET registry; a GET per head visited, then a PUT per head with expired
    # items (one round trip each); PUT registry (the emptied namespace unregistered); PUT
    # cursor (only when it moves)
    "manifest": (2 + 3 + 3 + 1 + 1, 5),
    # GetItem cursor; Query registry; a Query per namespace visited; a DeleteItem per
    # expired item; for the emptied namespace: retire, Query again, DeleteItem registry;
    # PutItem cursor
    "dynamodb": (1 + 1 + 3 + 3 + 3 + 1, 8),
}


def test_requests_of_an_erase_and_a_sweep_run(bucket: tuple[str, str]) -> None:
    """What the docs quote: an erase of one namespace of N items is a fixed number of
    requests in the manifest mode (one head), N + 6 in DynamoDB mode (one conditional delete
    per item, in one round trip); a sweep run is a request per namespace visited plus a
    write per namespace (manifest) or per item (DynamoDB) it removes items from."""
    mode = bucket[1]
    for n in (3, 12):
        with make_store(*bucket) as store:
            for i in range(n):
                store.put(("e", f"n{n}"), f"k{i}", {"i": i})
        with make_store(*bucket) as store:
            store.get(("warm", "up"), "k")
            store.stats.reset()
            assert store.erase_namespace(("e", f"n{n}")).items == n
            assert (store.stats.total_requests, store.stats.round_trips) == ERASE_REQUESTS[mode](n)
    clock = FakeTime()
    with _ttl_store(bucket, clock, prefix="sweep/") as store:
        store.put(("s", "a"), "x", {"i": 0})  # expires: the namespace is emptied
        store.put(("s", "b"), "x", {"i": 1})  # expires, "y" stays
        store.put(("s", "b"), "y", {"i": 2}, ttl=None)
        store.put(("s", "c"), "x", {"i": 3})  # expires
        store.put(("s", "c"), "z", {"i": 4}, ttl=None)
        store.put(("s", "d"), "z", {"i": 5}, ttl=None)  # not visited (limit 3)
        clock.us += 61_000_000
    with _ttl_store(bucket, clock, prefix="sweep/") as store:
        store.get(("warm", "up"), "k")
        store.stats.reset()
        assert store.sweep_ttl(limit=3) == 3
        assert (store.stats.total_requests, store.stats.round_trips) == SWEEP_REQUESTS[mode]


def test_a_namespace_keeps_its_place_when_a_process_that_read_it_empty_writes_it(bucket: tuple[str, str]) -> None:
    """Registering again is for namespaces an erase or a sweep emptied: a process that read
    a namespace before any item was put there (a get) and puts into it after another
    process filled it does not move it in the namespace order of a search."""
    with make_store(*bucket) as a, make_store(*bucket) as b:
        assert a.get(("o", "first"), "k") is None
        b.put(("o", "first"), "k", {"i": 1})
        b.put(("o", "second"), "k", {"i": 2})
        a.put(("o", "first"), "k2", {"i": 3})
        assert [i.value["i"] for i in a.search(("o",))] == [1, 3, 2]


# -- a removal write whose answer is lost -------------------------------------------------


def _index_write(call: Any) -> bool:
    """A write of the index (an item or registry write; a head, registry or cursor swap)."""
    if call.service == "dynamodb":
        return call.operation in ("put_item", "update_item", "delete_item", "transact_write_items")
    return call.operation == "put_object" and "/@v/" not in str(call.params.get("Key", ""))


def _lose_the_answer_of_write(store: S3Store, k: int) -> list[int]:
    """The ``k``-th index write ``store`` sends that lands has its answer lost (a read
    timeout; 0: none). Returns a counter of the writes that landed."""
    from botocore.exceptions import ReadTimeoutError

    sent = store._sync._wave
    count = [0]

    def wave(calls: Any) -> Any:
        answers = list(sent(calls))
        for i, call in enumerate(calls):
            if _index_write(call) and not isinstance(answers[i], BaseException):
                count[0] += 1
                if count[0] == k:
                    answers[i] = ReadTimeoutError(endpoint_url="http://127.0.0.1:1")
        return answers

    store._sync._wave = wave  # type: ignore[method-assign]
    return count


def test_a_removal_whose_write_lost_its_answer_reports_what_it_did(bucket: tuple[str, str]) -> None:
    """An erase, then a sweep that empties a namespace, each with the answer of one of its
    index writes lost (each write in turn): the report is what was done (every item
    counted, the namespace unregistered, not "written during"), and nothing stays behind:
    no item, no value object, no removal's mark on a registration."""
    endpoint, mode = bucket
    ns = ("lost", "u1")
    big = secrets.token_hex(40_000)  # its own object in both modes

    def fill(store: S3Store) -> None:
        store.put(ns, "a", {"text": "alpha"})
        store.put(ns, "big", {"text": big})
        store.put(ns + ("deep",), "b", {"text": "beta"})
        store.put(("kept",), "c", {"text": "gamma"}, ttl=None)

    for removal in ("erase", "sweep"):
        clock = FakeTime()
        k, writes = 0, 1
        while k < writes:
            k += 1
            prefix = f"lost-{removal}{k}/"
            with _ttl_store(bucket, clock, prefix=prefix) as store:
                fill(store)
            clock.us += 61_000_000  # every item but "c" expired
            with _ttl_store(bucket, clock, prefix=prefix) as store:
                store.get(("warm",), "up")
                count = _lose_the_answer_of_write(store, k)
                if removal == "erase":
                    report = store.erase_namespace(("lost",))
                    done = (report.namespaces, report.items, report.written_during)
                    assert done == ((ns, ns + ("deep",)), 3, ()), (k, done)
                else:
                    assert store.sweep_ttl() == 3, k
                writes = count[0]
            with make_store(*bucket, prefix=prefix) as reader:
                assert reader.list_namespaces() == [("kept",)], (removal, k)
                assert reader.search(("lost",)) == [] and reader.get(("kept",), "c").value == {"text": "gamma"}
            assert [key for key in _all_keys(endpoint) if key.startswith(prefix) and "/@v/" in key] == [], (removal, k)
            ours = registry_partition(prefix).removesuffix("mreg")
            left = [i for i in _items(endpoint, mode) if i["pk"]["S"].startswith(ours) and ("retiring" in i or "ns" in i)]
            assert [i["sk"]["S"] for i in left] == (["kc"] if mode == "dynamodb" else []), (removal, k, left)
        assert writes >= 3, (removal, writes)
