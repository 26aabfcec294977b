"""S3Store's manifest mode past its head budget: a namespace's older rows sealed into
immutable segments, and those compacted (moto; the DynamoDB mode keeps no head).

What is checked: the segment and head formats (a head naming no segment is written as
before and old heads read as before; Bloom filters never miss a key); a store sealing
at every put agrees with InMemoryStore (random call sequences, TTL, both drivers); the
requests a get, a search and a put send on a sealed namespace, cold and warm; a head
that stays within its budget as its namespace grows; compaction and the deletion of
what it retires; a put cut after any round trip across a seal or a compaction; a read
that meets a segment compacted away under it; erase (versioned bucket: nothing left),
the TTL sweep and export/import of sealed items.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from conftest import BUCKET, make_versioned
from hypothesis import HealthCheck, given, settings
from store_reference import FakeTime, ReferenceStore, run_steps, run_steps_async, steps
from test_store_differential import INDEX
from test_store_s3 import _Cut, _cut_after, make_store

from s3_saver._format.codec import pack, plain, unpack
from s3_saver._format.memory import ttl
from s3_saver._format.memory.documents import (
    HEAD_FORMAT,
    SEALED_HEAD_FORMAT,
    Head,
    dumps_head,
    head_key,
    is_memory_key,
    loads_head,
)
from s3_saver._format.memory.names import node_id
from s3_saver._format.memory.rows import Row, ValueCell, row_to_wire
from s3_saver._format.memory.segments import bloom_of, make_ref
from s3_saver._index.manifest.memory_segments import SEGMENT_MAX, TAIL_MAX, tail_start
from s3_saver._store.store import S3Store

_PREFIXES = itertools.count()


def _s3(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _keys(endpoint: str, prefix: str) -> list[str]:
    pages = _s3(endpoint).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for p in pages for o in p.get("Contents", [])]


def sealing(endpoint: str, budget: int, prefix: str | None = None, **kwargs: Any) -> S3Store:
    """A manifest-mode store whose heads seal past ``budget`` bytes of rows."""
    store = make_store(endpoint, "manifest", prefix=prefix if prefix is not None else f"s{next(_PREFIXES)}/", **kwargs)
    store._memory.index.head_budget = budget
    return store


def head_of(endpoint: str, store: S3Store, ns: tuple[str, ...]) -> Head:
    key = head_key(store._memory.index.prefix, node_id(ns))
    return loads_head(_s3(endpoint).get_object(Bucket=BUCKET, Key=key)["Body"].read(), ns, key)


def segments_in(endpoint: str, store: S3Store) -> list[str]:
    return [k for k in _keys(endpoint, store._memory.index.prefix + "memory/") if "/@s/" in k]


def _counted(store: S3Store, call: Callable[[], Any]) -> tuple[int, int]:
    store.stats.reset()
    call()
    return store.stats.total_requests, store.stats.round_trips


def _opened(endpoint: str, budget: int, prefix: str) -> S3Store:
    """A process that has made its first call (the prefix's checks ride on it)."""
    store = sealing(endpoint, budget, prefix)
    store.get(("warm", "up"), "k")
    return store


@pytest.fixture
def manifest(endpoint: str) -> str:
    with make_store(endpoint, "manifest") as store:
        store.setup()
    return endpoint


# -- formats ---------------------------------------------------------------------------------


def _row(key: str, seq: int, text: str = "x") -> Row:
    return Row(key, seq, 1_000 + seq, 2_000 + seq, None, None, 0, ValueCell("json", text.encode()))


def test_bloom_filters_hold_every_key_and_refuse_most_others() -> None:
    keys = [f"memory-{i}" for i in range(2_000)]
    ref = make_ref(0, "0" * 16, [_row(k, i) for i, k in enumerate(sorted(keys))])
    assert all(ref.may_hold(k) for k in keys)
    others = [f"other-{i}" for i in range(20_000)]
    false = sum(ref.may_hold(k) for k in others if ref.min_key <= k <= ref.max_key)
    assert false / len(others) < 0.02  # 10 bits a key: about 1%
    assert len(bloom_of(keys)) == 2_000 * 10 // 8
    assert not ref.may_hold("a-before-every-key") and not ref.may_hold("z-after-every-key")


def test_a_head_naming_no_segment_is_written_and_read_as_before() -> None:
    """Heads that name no segment keep the format every version of the store reads
    (a namespace under its budget is stored as before), and a head as earlier versions
    wrote it reads the same; a head naming segments has a format of its own, which a
    version that predates segments refuses by name rather than dropping its segments."""
    ns = ("memories", "alice")
    head = Head(ns, 2, {"a": _row("a", 0), "b": _row("b", 1)})
    record = unpack(dumps_head(head), HEAD_FORMAT, "here")
    assert record["format"] == HEAD_FORMAT and "segments" not in record and "retired" not in record
    # Exactly the fields (and nothing else) the store wrote before segments.
    old = pack({"format": HEAD_FORMAT, "path": list(ns), "seq": 2, "desc": False,
                "rows": [row_to_wire(r) for r in head.rows.values()], "emptied": False, "nonce": "0011223344556677"})
    assert loads_head(old, ns, "here") == head
    sealed = Head(ns, 3, {"c": _row("c", 2)}, segments=[make_ref(0, "ab" * 8, [_row("a", 0), _row("b", 1)])])
    data = dumps_head(sealed)
    assert ormsgpack_format(data) == SEALED_HEAD_FORMAT
    assert loads_head(data, ns, "here") == sealed


def ormsgpack_format(data: bytes) -> str:
    import ormsgpack

    return ormsgpack.unpackb(plain(data, "here"))["format"]


def test_segment_keys_are_the_stores_own() -> None:
    node = "a" * 64
    assert is_memory_key("p/", f"p/memory/n/{node}/@s/00000012.0123456789abcdef")
    assert not is_memory_key("p/", f"p/memory/n/{node}/@s/12.0123456789abcdef")
    assert not is_memory_key("p/", f"p/memory/n/{node}/@s/00000012.0123456789abcdef/x")


# -- a store sealing at every put agrees with InMemoryStore ----------------------------------

_HARNESS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_store_that_seals_at_every_put_agrees_with_inmemory(manifest: str, driver: str) -> None:
    """Heads of one byte: every swap seals every row, merges past eight segments and
    compacts when shadowed rows outweigh the rest. Random call sequences (puts,
    overwrites, deletes, gets, searches with filters and queries, listings, TTL with
    refreshes) answer as InMemoryStore's; the examples did seal."""
    sealed: list[int] = []
    run = run_steps if driver == "sync" else run_steps_async

    @_HARNESS
    @given(calls=steps(ttl=True))
    def check(calls: list[Any]) -> None:
        time = FakeTime()
        config = {"default_ttl": 1, "refresh_on_read": True}
        with sealing(manifest, 1, index=INDEX, ttl=config, clock=ttl.Clock(time), refresh_slack=0) as store:
            run(calls, ReferenceStore(index=INDEX, ttl=config, time=time), store, time=time)
            sealed.append(len(segments_in(manifest, store)))

    check()
    assert sum(sealed) > 0


# -- requests ------------------------------------------------------------------------------------

NS = ("memories", "bob")


def _grow(store: S3Store, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        store.put(NS, f"m{i:04d}", {"text": f"memory {i} " + "x" * 150})


def test_requests_on_a_sealed_namespace_cold_and_warm(manifest: str) -> None:
    """A namespace of 200 items, its head keeping 2 KiB of rows: a get of a sealed item is
    1 request more for a process that has not read its segment (2 requests, 2 round
    trips) and 1 once it has; a get of a row in the head is 1; a search is its head and
    every segment it has not read, in one more wave; a put of a new key sends what it
    sends on a small head (the head's GET from a cold process, then its PUT); an
    overwrite or a delete of a sealed item from a process that has not read its segment
    GETs that segment first. (The writing processes' heads hold up to 64 KiB: no seal
    falls due in the calls counted.)"""
    prefix = "req/"
    with sealing(manifest, 2048, prefix) as grower:
        _grow(grower, 200)
    head = head_of(manifest, grower, NS)
    segments = len(head.segments)
    assert segments >= 3 and "m0000" not in head.rows and "m0199" in head.rows
    got = {}
    with _opened(manifest, 2048, prefix) as cold:
        got["cold get of a sealed item"] = _counted(cold, lambda: cold.get(NS, "m0000"))
        got["warm get of it"] = _counted(cold, lambda: cold.get(NS, "m0000"))
    with _opened(manifest, 2048, prefix) as cold:
        got["cold get of a head row"] = _counted(cold, lambda: cold.get(NS, "m0199"))
        got["cold search"] = _counted(cold, lambda: cold.search(NS, limit=5))
        got["warm search"] = _counted(cold, lambda: cold.search(NS, limit=5))
        cold._memory.index.head_budget = 64 * 1024
        got["warm overwrite of a sealed item"] = _counted(cold, lambda: cold.put(NS, "m0001", {"text": "again"}))
    with _opened(manifest, 64 * 1024, prefix) as cold:
        got["cold put of a new key"] = _counted(cold, lambda: cold.put(NS, "new-key", {"text": "new"}))
        got["warm put"] = _counted(cold, lambda: cold.put(NS, "new-key-2", {"text": "new"}))
    with _opened(manifest, 64 * 1024, prefix) as cold:
        got["cold overwrite of a sealed item"] = _counted(cold, lambda: cold.put(NS, "m0002", {"text": "again"}))
    with _opened(manifest, 64 * 1024, prefix) as cold:
        got["cold delete of a sealed item"] = _counted(cold, lambda: cold.delete(NS, "m0003"))
    assert got == {
        "cold get of a sealed item": (2, 2),
        "warm get of it": (1, 1),
        "cold get of a head row": (1, 1),
        "cold search": (1 + segments, 2),
        "warm search": (1, 1),
        "warm overwrite of a sealed item": (1, 1),
        "cold put of a new key": (2, 2),
        "warm put": (1, 1),
        "cold overwrite of a sealed item": (3, 3),
        "cold delete of a sealed item": (3, 3),
    }
    with make_store(manifest, "manifest", prefix=prefix) as reader:
        found = {i.key: i for i in reader.search(NS, limit=1000)}
        assert len(found) == 200 + 2 - 1 and "m0003" not in found
        assert found["m0002"].value == {"text": "again"} and found["m0002"].created_at < found["m0002"].updated_at
        assert [i.key for i in reader.search(NS, limit=3)] == ["m0000", "m0001", "m0002"]  # order of creation kept


def test_a_head_stays_within_its_budget_as_its_namespace_grows(manifest: str) -> None:
    """300 puts of 200-byte items, one by one, into a namespace whose head holds 4 KiB of
    rows: the head object never passes the budget by more than its segments' refs, the
    small segments after the last large one stay at most eight, no segment passes 1 MiB,
    and every item reads back, in creation order."""
    with sealing(manifest, 4096) as store:
        sizes = []
        for i in range(300):
            store.put(NS, f"k{i:04d}", {"text": f"item {i} " + secrets.token_hex(80)})
            if i % 25 == 24:
                key = head_key(store._memory.index.prefix, node_id(NS))
                sizes.append(_s3(manifest).head_object(Bucket=BUCKET, Key=key)["ContentLength"])
        head = head_of(manifest, store, NS)
        refs = sum(len(r.bloom) + 60 for r in head.segments)
        assert max(sizes) <= 4096 + refs + 512, sizes
        assert len(head.segments) - tail_start(head.segments) <= TAIL_MAX
        assert all(r.size <= SEGMENT_MAX for r in head.segments)
        assert sorted(segments_in(manifest, store)) == sorted(store._memory.index.segment_key(NS, r) for r in head.segments)
        assert head.segments[-1].number >= 2 * TAIL_MAX > len(head.segments)  # sealed often, merged
        assert [i.key for i in store.search(NS, limit=1000)] == [f"k{i:04d}" for i in range(300)]


def test_compaction_drops_shadowed_rows_and_deletes_what_it_retires(manifest: str) -> None:
    """Every item of a sealed namespace overwritten (large values among them) and some
    deleted: once shadowed rows outweigh live ones the segments are merged; what remains
    in the namespace's folder is its head, the segments it names and the value objects
    of live items, and every item reads its last value."""
    big = lambda i: {"text": secrets.token_urlsafe(70_000), "i": i}
    with sealing(manifest, 2048) as store:
        want: dict[str, Any] = {}
        for i in range(40):
            want[f"k{i:02d}"] = big(i) if i % 10 == 0 else {"text": f"first {i} " + "x" * 100}
            store.put(NS, f"k{i:02d}", want[f"k{i:02d}"])
        before = head_of(manifest, store, NS)
        assert len(before.segments) >= 3
        for i in range(40):
            want[f"k{i:02d}"] = big(i) if i % 10 == 5 else {"text": f"second {i} " + "y" * 100}
            store.put(NS, f"k{i:02d}", want[f"k{i:02d}"])
        for i in range(0, 40, 7):
            store.delete(NS, f"k{i:02d}")
            del want[f"k{i:02d}"]
        head = head_of(manifest, store, NS)
        assert head.segments and not {r.token for r in before.segments} & {r.token for r in head.segments}  # merged away
        folder = store._memory.index.node_folder(NS)
        named = {store._memory.index.segment_key(NS, r) for r in head.segments}
        values = {store._memory.index.value_key(NS, r.value.token) for r in store._sync.run(
            store._memory.index.read([NS], {})).nodes[NS].values() if not hasattr(r.value, "data")}
        assert sorted(_keys(manifest, folder)) == sorted({folder + "@head"} | named | values)
        assert len(values) == sum(1 for v in want.values() if "i" in v) == 3
        assert {i.key: i.value for i in store.search(NS, limit=100)} == want
        dead = sum(r.dead for r in head.segments)
        assert dead * 2 <= sum(r.size for r in head.segments)


# -- cuts and races ----------------------------------------------------------------------------


CUT_CASES = {
    # Heads of one byte: the put seals its row (and the head's others) into a new segment.
    "seal": 3,
    # Eight segments already (one per put): the put's seal would make a ninth, so its swap
    # merges them all (the key's old row shadowed) into new ones.
    "compaction": TAIL_MAX - 1,
}


@pytest.mark.parametrize("case", list(CUT_CASES))
def test_a_put_cut_after_any_round_trip_across_a_seal_or_a_compaction_leaves_old_or_new(manifest: str, case: str) -> None:
    """A put of a large value over an item (a new process: GET head, GET the segment that
    holds the item, PUT the value object, PUT the new segments, PUT the head, DELETE the
    retired ones) cut after each round trip: a new process reads the item old or new,
    whole, every other item as it was, and every segment the head names is there; the
    put made again completes."""
    budget, others = 1, CUT_CASES[case]
    big = {"text": secrets.token_urlsafe(100_000)}
    old = {"text": "old"}

    def setup(store: S3Store) -> None:
        store.put(NS, "k", old)
        for i in range(others):
            store.put(NS, f"other{i}", {"text": f"other {i}"})

    with sealing(manifest, budget, "probe/") as probe:
        setup(probe)
    with _opened(manifest, budget, "probe/") as probe:
        probe.stats.reset()
        probe.put(NS, "k", big)
        waves = probe.stats.round_trips
        head = head_of(manifest, probe, NS)
        assert head.retired if case == "compaction" else not head.retired
    assert waves >= 5
    for k in range(1, waves + 1):
        prefix = f"cut-{case}-{k}/"
        with sealing(manifest, budget, prefix) as store:
            setup(store)
        with _opened(manifest, budget, prefix) as store:
            _cut_after(store, k)
            with pytest.raises(_Cut):
                store.put(NS, "k", big)
        with sealing(manifest, budget, prefix) as reader:
            head = head_of(manifest, reader, NS)
            present = set(segments_in(manifest, reader))
            assert {reader._memory.index.segment_key(NS, r) for r in head.segments} <= present, k
            item = reader.get(NS, "k")
            assert item is not None and item.value in (old, big), k
            found = {i.key: i.value for i in reader.search(NS, limit=100)}
            assert found == {"k": item.value, **{f"other{i}": {"text": f"other {i}"} for i in range(others)}}, k
            reader.put(NS, "k", big)
            assert reader.get(NS, "k").value == big


def test_a_read_that_meets_a_segment_compacted_away_reads_the_head_again(manifest: str) -> None:
    """A search reads the head, then (before it fetches the segments) another process
    overwrites a sealed item, which merges the segments and deletes the old ones: the
    search finds a segment gone, reads the head again and answers from what it names."""
    prefix = "race/"
    with sealing(manifest, 1, prefix) as writer:
        writer.put(NS, "b", {"v": 2})
        writer.put(NS, "a", {"v": 1})
        writer.put(NS, "b", {"v": 2})  # b's first row shadowed: the next overwrite of a merges
    gone = set(segments_in(manifest, writer))
    with _opened(manifest, 1, prefix) as reader, _opened(manifest, 1, prefix) as other:
        sent = reader._sync._wave
        waves: list[list[str]] = []

        def wave(batch: Any) -> Any:
            answers = sent(batch)
            waves.append([c.params["Key"].rsplit("/", 2)[-1] for c in batch])
            if len(waves) == 1:
                other.put(NS, "a", {"v": 3})  # after the reader's head GET, before its segments
            return answers

        reader._sync._wave = wave  # type: ignore[method-assign]
        found = {i.key: i.value for i in reader.search(NS)}
    assert found == {"a": {"v": 3}, "b": {"v": 2}}
    # Head; the segments it named (gone); the head again; the segments that one names.
    assert len(waves) == 4 and waves[0] == waves[2] == ["@head"]
    assert all(name[:8].isdigit() for name in waves[1] + waves[3]) and set(waves[1]) != set(waves[3])
    assert not gone & set(segments_in(manifest, reader))  # the old ones were deleted


# -- erase, sweep, export -------------------------------------------------------------------------


def test_an_erase_of_sealed_namespaces_on_a_versioned_bucket_leaves_nothing(endpoint: str) -> None:
    """Sealed namespaces (merged segments, large values, overwrites, deletes) erased on a
    versioned bucket: no version of any segment, value object or head holding an item is
    left, only each namespace's current empty head."""
    make_versioned(endpoint)
    secret = secrets.token_hex(8)
    spaces = [("users", "u1"), ("users", "u1", "notes")]
    with sealing(endpoint, 1, "") as store:
        store.setup()
        for ns in spaces:
            for i in range(12):
                store.put(ns, f"k{i}", {"text": f"{secret} {i}", "big": secrets.token_urlsafe(70_000) if i % 5 == 0 else ""})
            for i in range(0, 12, 2):
                store.put(ns, f"k{i}", {"text": f"{secret} again {i}"})
            store.delete(ns, "k3")
        store.put(("users", "u2"), "kept", {"text": "kept"})
        assert segments_in(endpoint, store)
        report = store.erase_namespace(("users", "u1"))
        assert report.complete and report.items == 22 and sorted(report.namespaces) == sorted(spaces)
        s3 = _s3(endpoint)
        left = []
        for page in s3.get_paginator("list_object_versions").paginate(Bucket=BUCKET, Prefix="memory/"):
            left += [(v["Key"], v["IsLatest"]) for v in page.get("Versions", [])]
            left += [(m["Key"], False) for m in page.get("DeleteMarkers", [])]
        folders = [store._memory.index.node_folder(ns) for ns in spaces]
        mine = [(k, latest) for k, latest in left if any(k.startswith(f) for f in folders)]
        assert sorted(mine) == sorted((f + "@head", True) for f in folders)
        for key, _ in left:
            for v in s3.list_object_versions(Bucket=BUCKET, Prefix=key).get("Versions", []):
                body = s3.get_object(Bucket=BUCKET, Key=v["Key"], VersionId=v["VersionId"])["Body"].read()
                assert secret.encode() not in plain(body, key)
        assert store.get(("users", "u2"), "kept").value == {"text": "kept"}
        assert store.search(("users", "u1")) == []


def test_the_sweep_removes_sealed_expired_items(manifest: str) -> None:
    """TTL items sealed in segments: once expired, the sweep deletes their value objects,
    empties and unregisters a namespace left with nothing (its segments deleted after
    the swap), and in a namespace with live items merges the segments without them."""
    time = FakeTime()
    with sealing(manifest, 1, clock=ttl.Clock(time), ttl={"default_ttl": 10}) as store:
        gone, mixed = ("t", "gone"), ("t", "mixed")
        for i in range(12):
            value = {"text": f"item {i}", "big": secrets.token_urlsafe(70_000) if i % 4 == 0 else ""}
            store.put(gone, f"k{i}", value)
            store.put(mixed, f"k{i}", value, ttl=10 if i % 3 else None)
        assert len(head_of(manifest, store, gone).segments) >= 2
        time.us += 11 * 60 * 1_000_000
        assert store.search(mixed, limit=100) != [] and store.search(gone) == []
        assert store.sweep_ttl() == 12 + 8
        assert store.list_namespaces() == [mixed]
        index = store._memory.index
        assert _keys(manifest, index.node_folder(gone)) == [index.node_folder(gone) + "@head"]
        head = head_of(manifest, store, mixed)
        folder = index.node_folder(mixed)
        assert sorted(_keys(manifest, folder)) == sorted(
            {folder + "@head"} | {index.segment_key(mixed, r) for r in head.segments}
            | {index.value_key(mixed, r.value.token) for r in store._sync.run(index.read([mixed], {})).nodes[mixed].values()
               if not hasattr(r.value, "data")}
        )
        assert [i.key for i in store.search(mixed, limit=100)] == ["k0", "k3", "k6", "k9"]
        assert sum(r.dead for r in head.segments) == 0


def test_export_and_import_carry_sealed_items(manifest: str) -> None:
    """An export reads every segment: a sealed namespace exports whole, and imports into a
    store of the default budget (no segments) with the same items and times."""
    with sealing(manifest, 1, "exp/") as store:
        for i in range(20):
            store.put(NS, f"k{i:02d}", {"text": f"item {i}"})
        store.put(NS, "k05", {"text": "again"})
        store.delete(NS, "k07")
        assert len(head_of(manifest, store, NS).segments) >= 2
        data = store.export_memory()
        items = store.search(NS, limit=100)
    with make_store(manifest, "manifest", prefix="imp/") as target:
        report = target.import_memory(data)
        assert report.written == 19
        assert target.search(NS, limit=100) == items
