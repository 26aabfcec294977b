"""The thread listing and run hints spread over shards (issue 35, item 2).

DynamoDB: every new thread's listing item and every run's hints go to one of
``LISTING_SHARDS`` partitions, not to one; ``list_threads`` merges them with
the order and pagination it had, and reads the single partition of earlier
versions too until ``setup()`` moves its items (resumable: cut short at any
request and run again). Tables here are made "earlier" by moving items back
into that partition with boto3, as an earlier version wrote them.

Both modes: the requests of a ``list_threads`` page do not grow with the
number of threads.
"""

from __future__ import annotations

from collections import Counter

import boto3
import pytest
from conftest import TABLE, make_saver
from helpers import config, cut_points
from test_archive_cut import _cut_short
from test_list_threads import (
    LISTING,
    LISTING_READS,
    PER_THREAD,
    T0,
    Clock,
    _ids,
    _order,
    _put,
    _walk,
    quick_queries,  # noqa: F401 - a fixture
)

from s3_saver._format.keys import LISTING_SHARDS, KeyLayout, shard_of
from s3_saver._transport.sync import SyncDriver

LAYOUT = KeyLayout("")


def _table(endpoint: str):
    return boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")


def _items(endpoint: str, what: str) -> list[tuple[str, str]]:
    """Every (pk, sk) of the listing ("threads") or run-hint ("runs") partitions."""
    ddb, found, start = _table(endpoint), [], None
    while True:
        page = ddb.scan(TableName=TABLE, **({"ExclusiveStartKey": start} if start else {}))
        found += [(i["pk"]["S"], i["sk"]["S"]) for i in page["Items"] if i["pk"]["S"].split("#")[1:2] == [what]]
        start = page.get("LastEvaluatedKey")
        if start is None:
            return found


def _unshard(endpoint: str, what: str, keep=lambda sk: False) -> int:
    """Move items of ``what`` into the single partition earlier versions wrote
    (all but those ``keep`` names); returns how many moved."""
    ddb, moved = _table(endpoint), 0
    for pk, sk in _items(endpoint, what):
        if "#" in pk.partition("#")[2] and not keep(sk):
            ddb.put_item(TableName=TABLE, Item={"pk": {"S": f"#{what}"}, "sk": {"S": sk}})
            ddb.delete_item(TableName=TABLE, Key={"pk": {"S": pk}, "sk": {"S": sk}})
            moved += 1
    return moved


def _all_in_their_shards(endpoint: str) -> bool:
    """Every listing item in its thread's shard, every hint in its run's."""
    threads = [pk == LAYOUT.listing_partition("threads", shard_of(sk.partition("!")[2])) for pk, sk in _items(endpoint, "threads")]
    runs = [pk == LAYOUT.listing_partition("runs", shard_of(sk.partition("!")[0])) for pk, sk in _items(endpoint, "runs")]
    return all(threads) and all(runs)


def _grow(saver, count: int, start: int = 0, runs: int = 7) -> None:
    """``count`` one-checkpoint threads created a second apart, a run per 7."""
    clock = Clock(saver)
    for i in range(start, start + count):
        clock.now = T0 + i
        _put(saver, config(f"thread-{i:04d}"), {"n": i}, {"user": f"u{i % 3}", "run_id": f"run-{i % runs}"})


# -- 1. no hot partition ---------------------------------------------------------------------
@pytest.mark.parametrize("index_mode", ["dynamodb"])  # what quick_queries speeds up
@pytest.mark.usefixtures("quick_queries")
def test_four_hundred_new_threads_spread_over_the_shards(dynamo_saver, endpoint) -> None:
    clock = Clock(dynamo_saver)
    for i in range(400):
        clock.now = T0 + i
        # Every thread a run of its own: the hints spread by run id.
        _put(dynamo_saver, config(f"thread-{i:04d}"), {"n": i}, {"run_id": f"run-{i:04d}"})
    for what in ("threads", "runs"):
        per_partition = Counter(pk for pk, _ in _items(endpoint, what))
        assert sum(per_partition.values()) == 400
        # No partition key holds more than 1/8 of them (16 shards: about 25 each).
        assert max(per_partition.values()) <= 400 // 8, (what, per_partition)
        assert len(per_partition) == LISTING_SHARDS
        assert f"#{what}" not in per_partition  # nothing new in the single partition
    assert len(list(dynamo_saver.list_threads())) == 400


def test_shard_partitions_are_injective_and_apart_from_threads() -> None:
    seen = {}
    for prefix in ("", "app", "app#", "a/b", "threads"):
        layout = KeyLayout(prefix)
        names = [layout.listing_partition(w, k) for w in ("threads", "runs", "owner") for k in (None, *range(LISTING_SHARDS))]
        for name in names:
            assert seen.setdefault(name, prefix) == prefix, name
            assert layout.thread_of(name) is None  # never a thread's partition
    assert {shard_of(t) for t in ("", "#", "..", "a/b", "é", "%41")} <= set(range(LISTING_SHARDS))
    assert shard_of("thread-0001") == shard_of("thread-0001")


# -- 2. an earlier version's table: listed, found, moved --------------------------------------
def test_unsharded_items_are_listed_and_found_and_setup_moves_them(dynamo_saver, endpoint) -> None:
    _grow(dynamo_saver, 28)
    everything = list(dynamo_saver.list_threads())
    hints = dynamo_saver.threads_of_runs([f"run-{r}" for r in range(7)] + ["none"])
    assert [len(hints[f"run-{r}"]) for r in range(7)] == [4] * 7
    # Half of the threads (every other one) and of the hints as an earlier version wrote them.
    def even(sk: str) -> bool:  # the even-numbered threads stay in their shards
        return int(sk[-1]) % 2 == 0

    assert _unshard(endpoint, "threads", even) == 14
    assert _unshard(endpoint, "runs", even) == 14

    # Listed in one order, page by page, with before=, limit= and filter=, the
    # single partition's items merged in.
    saver = make_saver(endpoint)
    assert list(saver.list_threads()) == everything
    assert [i for page in _walk(saver, 7) for i in page] == everything
    assert list(saver.list_threads(limit=5, before=everything[10])) == everything[11:16]
    assert list(saver.list_threads(filter={"user": "u1"})) == [i for i in everything if i.metadata["user"] == "u1"]
    assert saver.threads_of_runs([f"run-{r}" for r in range(7)] + ["none"]) == hints

    # A thread listed the old way goes, with its hints, when deleted.
    gone = next(i.thread_id for i in everything if int(i.thread_id[-1]) % 2)
    saver.delete_thread(gone)
    assert not [sk for _, sk in _items(endpoint, "threads") if sk.endswith("!" + gone)]
    assert not [sk for _, sk in _items(endpoint, "runs") if sk.endswith("!" + gone)]
    everything = [i for i in everything if i.thread_id != gone]
    hints = {r: [t for t in ts if t != gone] for r, ts in hints.items()}

    # setup() moves what is left of the single partitions into the shards.
    saver.setup()
    assert _all_in_their_shards(endpoint)
    assert list(saver.list_threads()) == everything
    assert saver.threads_of_runs([f"run-{r}" for r in range(7)] + ["none"]) == hints
    # Run again on a moved table: two reads, nothing written.
    saver.stats.reset()
    saver.setup()
    moves = {op: n for (service, op), n in saver.stats.snapshot().requests.items() if service == "dynamodb" and op in ("query", "transact_write_items")}
    assert moves == {"query": 2}
    saver.close()


def test_the_move_cut_short_at_any_request_then_run_again(dynamo_saver, endpoint, monkeypatch) -> None:
    _grow(dynamo_saver, 60, runs=3)  # 60 listing items and 60 hints: two moves (50 a move) of each
    everything = list(dynamo_saver.list_threads())
    runs = [f"run-{r}" for r in range(3)]
    hints = dynamo_saver.threads_of_runs(runs)
    counter = make_saver(endpoint)
    _unshard(endpoint, "threads")
    _unshard(endpoint, "runs")
    counter.stats.reset()
    counter.setup()
    total = counter.stats.round_trips
    assert counter.stats.snapshot().requests[("dynamodb", "transact_write_items")] == 2 + 2
    counter.close()
    for cut in cut_points(total):  # make test-all: after every round trip
        _unshard(endpoint, "threads")
        _unshard(endpoint, "runs")
        mover = make_saver(endpoint)
        _cut_short(monkeypatch, cut, mover.setup)
        mover.close()
        # Cut short: every thread listed once, in order; every hint found.
        reader = make_saver(endpoint)
        assert list(reader.list_threads()) == everything, cut
        assert reader.threads_of_runs(runs) == hints, cut
        reader.setup()  # run again: finishes the move
        assert _all_in_their_shards(endpoint), cut
        assert len(_items(endpoint, "threads")) == 60 and len(_items(endpoint, "runs")) == 60
        reader.close()


def test_a_thread_deleted_while_its_item_moves_stays_unlisted(dynamo_saver, endpoint, monkeypatch) -> None:
    """The move reads the single partition, then moves what it read: a delete in
    between removed an item, and the move must not bring it back in a shard."""
    _grow(dynamo_saver, 10)
    _unshard(endpoint, "threads")
    real = SyncDriver._wave
    deleter = make_saver(endpoint)

    def wave(driver, calls):
        if any(c.operation == "transact_write_items" for c in calls) and driver is mover._sync:
            monkeypatch.setattr(SyncDriver, "_wave", real)  # once
            deleter.delete_thread("thread-0003")
        return real(driver, calls)

    mover = make_saver(endpoint)
    monkeypatch.setattr(SyncDriver, "_wave", wave)
    mover.setup()
    monkeypatch.setattr(SyncDriver, "_wave", real)
    assert not [sk for _, sk in _items(endpoint, "threads") if sk.endswith("!thread-0003")]
    assert _ids(mover.list_threads()) == [f"thread-{i:04d}" for i in range(9, -1, -1) if i != 3]
    assert _all_in_their_shards(endpoint)
    mover.close()
    deleter.close()


# -- 3. a page costs the same at 50 and at 500 threads -----------------------------------------
def _page_requests(saver, **kwargs) -> tuple[int, dict]:
    saver.stats.reset()
    assert len(list(saver.list_threads(limit=10, **kwargs))) == 10
    snap = saver.stats.snapshot()
    return snap.round_trips, dict(snap.requests)


@pytest.mark.slow  # make test-all and CI (make test-slow): 500 threads, as test_list_threads' own
@pytest.mark.usefixtures("quick_queries")
def test_a_page_costs_the_same_at_50_and_500_threads(saver, index_mode) -> None:
    _grow(saver, 50, start=450)
    small = _page_requests(saver)
    first = list(saver.list_threads(limit=30))
    deep_small = _page_requests(saver, before=first[-1])
    _grow(saver, 450)  # older threads: the newest page is the same
    assert _page_requests(saver) == small
    assert _page_requests(saver, before=first[-1]) == deep_small == small
    everything = list(saver.list_threads())
    assert everything == _order(everything) and len(everything) == 500
    assert _page_requests(saver, before=everything[250]) == small
    # 2 round trips: the listing (one wave), then the ten threads' latest.
    listing = small[1][LISTING[index_mode]] - (10 if index_mode == "dynamodb" else 0)
    assert small[0] == 2 and listing == LISTING_READS[index_mode]
    assert sum(small[1].values()) == LISTING_READS[index_mode] + 10 * len(PER_THREAD[index_mode])
