"""list_threads / alist_threads: the threads of a prefix, newest first, paginated.

Every test runs in both index modes (the ``index_mode`` fixture). Creation times
come from the saver's clock, which the tests set (``saver._ctx.now``), so the
expected order is known exactly. Request counts are the drivers' own
(``saver.stats``): deterministic, asserted exactly.
"""

from __future__ import annotations

import inspect
import threading
from collections import Counter
from datetime import datetime, timezone

import pytest
from langgraph.checkpoint.base import get_checkpoint_metadata

from conftest import make_saver
from helpers import checkpoint, config, grow_thread
from s3_saver import ConfigurationError
from s3_saver._format.keys import LISTING_SHARDS, encode
from s3_saver._ops.threads import ThreadInfo

T0 = 1_800_000_000  # 2027-01-15: creation times are T0 + a few seconds
N_THREADS = 500  # five listing pages of 100, the last exactly full

# What one page of k threads costs: the listing read (DynamoDB Queries of the
# listing's shards and of the unsharded partition of earlier versions, one
# wave / S3 ListObjectsV2 of listing/threads/) in the first round trip, then
# one read per thread (Query Limit=1 of its latest / GET of its manifest head)
# in the second. A call's later pages read again only the shards the page
# before took from (at most LISTING_READS).
LISTING = {"dynamodb": ("dynamodb", "query"), "manifest": ("s3", "list_objects_v2")}
LISTING_READS = {"dynamodb": LISTING_SHARDS + 1, "manifest": 1}
# Per thread: DynamoDB reads its latest item beside the thread's record (which
# says whether it is archived or deleted), the manifest its head.
PER_THREAD = {"dynamodb": (("dynamodb", "query"), ("dynamodb", "get_item")), "manifest": (("s3", "get_object"),)}

# What a put costs with a parent this process has seen (tests/test_requests.py
# EXACT_COSTS), in 2 round trips: the object and the index write. DynamoDB: the
# transaction, fenced at the generation the parent carries. Manifest: the head's
# compare-and-swap (the head this process holds stands in for a read). A put
# without a parent this process knows reads first (COLD_READ): the thread's
# record (any parentless checkpoint: nothing carries its generation), the head
# (a thread new to the process).
PUT_BEFORE_LISTING = {"dynamodb": (2, 2), "manifest": (2, 2)}
COLD_READ = {"dynamodb": ("dynamodb", "get_item"), "manifest": ("s3", "get_object")}
# Whether a parentless checkpoint of a thread the process knows reads COLD_READ.
ROOT_READS = {"dynamodb": 1, "manifest": 0}
# The one request a thread's first checkpoint adds: its listing entry (a
# TransactWriteItems that also stamps the thread item / an empty object).
LISTING_WRITE = {"dynamodb": ("dynamodb", "transact_write_items"), "manifest": ("s3", "put_object")}
# A thread's first write of a day records its activity (archive_idle's entries): in
# DynamoDB mode inside the commit's transaction, in manifest mode an empty object
# beside the checkpoint's (the old thread's entry of the day exists already).
ACTIVITY_WRITE = {"dynamodb": None, "manifest": ("s3", "put_object")}


# -- helpers ----------------------------------------------------------------------
@pytest.fixture
def quick_queries(index_mode: str, monkeypatch):
    """moto answers every Query by sorting every item of the table (its
    ``all_items``), so on a table of thousands of items one Query takes tens of
    milliseconds: a cost of the mock, which on DynamoDB reads one partition.
    Here a Query on the table's key reads only the queried partition: the same
    items, so the same answers (moto still filters and sorts them), and the
    saver sends exactly what it would send anyway."""
    if index_mode != "dynamodb":
        return
    from moto.dynamodb.models.table import Table

    query, all_items = Table.query, Table.all_items
    signature = inspect.signature(query)
    hint = threading.local()  # moto's server answers each request in a thread of its own

    def partition_query(self, *args, **kwargs):
        arguments = signature.bind(self, *args, **kwargs).arguments
        hint.key = arguments.get("hash_key") if arguments.get("index_name") is None else None
        try:
            return query(self, *args, **kwargs)
        finally:
            hint.key = None

    def partition_items(self):
        key = getattr(hint, "key", None)
        if key is None or not self.range_key_attr:
            return all_items(self)
        return list(self.items.get(key, {}).values())

    monkeypatch.setattr(Table, "query", partition_query)
    monkeypatch.setattr(Table, "all_items", partition_items)


class Clock:
    """The saver's clock, set by the test."""

    def __init__(self, saver, now: int = T0) -> None:
        self.now = now
        saver._ctx.now = lambda: self.now


def _counts(saver) -> tuple[int, dict]:
    snap = saver.stats.snapshot()
    saver.stats.reset()
    return snap.round_trips, dict(snap.requests)


def _page_cost(mode: str, k: int) -> tuple[int, dict]:
    """Round trips and requests of one list_threads page of ``k`` threads (k >= 1)."""
    cost: Counter = Counter({LISTING[mode]: LISTING_READS[mode]})
    for op in PER_THREAD[mode]:
        cost[op] += k
    return 2, dict(cost)


def _plus(cost: tuple[int, dict], key: tuple[str, str], n: int = 1) -> tuple[int, dict]:
    requests = Counter(cost[1])
    requests[key] += n
    return cost[0], dict(requests)


def _put(saver, cfg: dict, values: dict, metadata: dict, ts: str | None = None) -> tuple[dict, dict, str]:
    """Put one small checkpoint after ``cfg`` (a new thread when it names no
    checkpoint); returns (its config, the metadata stored, its ts)."""
    version = saver.get_next_version(None, None)
    cp = checkpoint(values, {ch: version for ch in values})
    if ts is not None:
        cp["ts"] = ts
    stored = saver.put(cfg, cp, metadata, {ch: version for ch in values})
    return stored, get_checkpoint_metadata(cfg, metadata), cp["ts"]


def _info(thread_id: str, created: int, stored: dict, metadata: dict, ts: str) -> ThreadInfo:
    return ThreadInfo(
        thread_id=thread_id,
        created_at=datetime.fromtimestamp(created, timezone.utc),
        checkpoint_id=stored["configurable"]["checkpoint_id"],
        ts=ts,
        metadata=metadata,
    )


def _order(infos: list[ThreadInfo]) -> list[ThreadInfo]:
    """Newest thread first; within one second, encoded thread id descending."""
    return sorted(infos, key=lambda i: (i.created_at, encode(i.thread_id)), reverse=True)


def _ids(infos) -> list[str]:
    return [i.thread_id for i in infos]


def _walk(saver, limit: int, **kwargs) -> list[list[ThreadInfo]]:
    """Pages of ``limit`` threads, each asked with before=<last ThreadInfo of the previous page>."""
    pages: list[list[ThreadInfo]] = []
    before = None
    while True:
        saver.stats.reset()
        page = list(saver.list_threads(limit=limit, before=before, **kwargs))
        if not page:
            return pages
        assert len(page) <= limit
        pages.append(page)
        before = page[-1]
        assert len(pages) <= 1000, "pagination does not end"


# -- 1. 500 threads: order, content, pages, filter --------------------------------
def _populate(saver, index_mode: str) -> dict[int, ThreadInfo]:
    """500 threads created at distinct seconds, in an order unrelated to their
    ids; every 5th gets a second checkpoint whose metadata differs from the first
    one's (a listing that read the first checkpoint would show it)."""
    clock = Clock(saver)
    expected: dict[int, ThreadInfo] = {}
    for i in range(N_THREADS):
        thread_id = f"thread-{i:04d}"
        created = T0 + (i * 337) % N_THREADS  # a permutation of 0..499: ids do not give the order
        clock.now = created
        user = "u7" if i % 7 == 0 else f"u{i % 7}"
        if i % 5 == 0:
            # The first checkpoint says the opposite of the latest one.
            first_user = "u7" if user != "u7" else "u0"
            stored, _, _ = _put(saver, config(thread_id), {"n": i}, {"user": first_user, "step": 0}, ts=f"first-{i}")
            clock.now = created + 5_000  # later, and never a creation time
            stored, metadata, ts = _put(saver, stored, {"n": -i}, {"user": user, "step": 1}, ts=f"second-{i}")
        else:
            stored, metadata, ts = _put(saver, config(thread_id), {"n": i}, {"user": user, "step": 0}, ts=f"first-{i}")
        expected[i] = _info(thread_id, created, stored, metadata, ts)
    saver.stats.reset()
    return expected


def _number(info: ThreadInfo) -> int:
    return int(info.thread_id.removeprefix("thread-"))


@pytest.mark.slow  # make test-all and CI (make test-slow): 500 threads; the smaller listing tests run in make test
def test_five_hundred_threads_order_pages_filter_and_costs(saver, index_mode, quick_queries) -> None:
    expected = _populate(saver, index_mode)
    everything = _order(list(expected.values()))
    assert [i.created_at.timestamp() for i in everything] == [T0 + k for k in range(N_THREADS - 1, -1, -1)]
    assert _ids(everything)[:2] == ["thread-0227", "thread-0454"]  # 227 * 337 % 500 == 499, 454 * 337 % 500 == 498

    # The whole listing: every thread once, newest first, with its latest checkpoint.
    got = list(saver.list_threads())
    round_trips, requests = _counts(saver)
    assert got == everything
    assert all(isinstance(i, ThreadInfo) for i in got)
    assert got[0].config == {
        "configurable": {"thread_id": "thread-0227", "checkpoint_ns": "", "checkpoint_id": got[0].checkpoint_id}
    }
    # Pages of 100 listing entries, each listing read followed by the 100 threads' reads.
    listing_reads = requests[LISTING[index_mode]] - (N_THREADS if index_mode == "dynamodb" else 0)
    # (moto ends an exactly full last page without a LastEvaluatedKey; DynamoDB
    # may hand one back, which costs one more, empty, listing Query.)
    assert 5 <= listing_reads <= 5 * LISTING_READS[index_mode]
    assert round_trips == 2 * 5
    assert sum(requests.values()) == listing_reads + N_THREADS * len(PER_THREAD[index_mode])
    assert set(requests) == {LISTING[index_mode], *PER_THREAD[index_mode]}

    # limit=N and before=<last ThreadInfo>: all 500 exactly once, in order, and
    # each page costs its listing read and one read per thread, in 2 round trips.
    pages = []
    before = None
    while True:
        page = list(saver.list_threads(limit=37, before=before))
        cost = _counts(saver)
        if not page:
            assert cost == (1, {LISTING[index_mode]: LISTING_READS[index_mode]})  # past the end: the listing read alone
            break
        assert cost == _page_cost(index_mode, len(page)), (len(pages), cost)
        pages.append(page)
        before = page[-1]
    assert [len(p) for p in pages] == [37] * 13 + [19]
    assert [i for p in pages for i in p] == everything

    # before= a thread id or a config naming a thread: the same page as before= its
    # ThreadInfo, for one more read (the thread's creation time) in one more round trip.
    middle = everything[249]
    by_info = list(saver.list_threads(limit=10, before=middle))
    assert by_info == everything[250:260]
    assert _counts(saver) == _page_cost(index_mode, 10)
    lookup = ("dynamodb", "get_item") if index_mode == "dynamodb" else ("s3", "get_object")
    assert list(saver.list_threads(limit=10, before=middle.thread_id)) == by_info
    assert _counts(saver) == (3, _plus(_page_cost(index_mode, 10), lookup)[1])
    assert list(saver.list_threads(limit=10, before=middle.config)) == by_info
    assert list(saver.list_threads(limit=10, before=config(middle.thread_id))) == by_info
    assert list(saver.list_threads(before=everything[-2])) == everything[-1:]
    assert list(saver.list_threads(before=everything[-1])) == []

    # filter= matches the latest checkpoint's metadata, never an older one's: every
    # 7th thread (72), whose first checkpoint (for every 35th) said otherwise, and
    # not every 5th, whose first checkpoint said "u7".
    saver.stats.reset()
    u7 = list(saver.list_threads(filter={"user": "u7"}))
    assert u7 == [i for i in everything if _number(i) % 7 == 0]
    assert len(u7) == 72
    round_trips, requests = _counts(saver)
    assert sum(requests.values()) == listing_reads + N_THREADS * len(PER_THREAD[index_mode])  # what it must touch, no more
    both = list(saver.list_threads(filter={"user": "u7", "step": 1}, limit=10))
    assert both == [i for i in everything if _number(i) % 35 == 0][:10]
    # filter with limit and before: the subset, page by page, in order.
    assert list(saver.list_threads(filter={"user": "u7"}, limit=50)) == u7[:50]
    assert list(saver.list_threads(filter={"user": "u7"}, limit=30, before=u7[29])) == u7[30:60]
    assert list(saver.list_threads(filter={"user": "u7"}, limit=30, before=u7[59])) == u7[60:]
    assert list(saver.list_threads(filter={"step": 1}, limit=5, before=everything[0])) == [
        i for i in everything[1:] if _number(i) % 5 == 0
    ][:5]
    assert list(saver.list_threads(filter={}, limit=3)) == everything[:3]

    # limit=0 yields nothing and sends nothing.
    saver.stats.reset()
    assert list(saver.list_threads(limit=0)) == []
    assert list(saver.list_threads(limit=0, filter={"user": "u7"}, before=everything[3])) == []
    assert _counts(saver) == (0, {})
    assert list(saver.list_threads(limit=1)) == everything[:1]
    assert _counts(saver) == _page_cost(index_mode, 1)


# -- 2. costs: the page, not the table or bucket -------------------------------------
@pytest.mark.slow  # make test-all and CI (make test-slow): a cost invariant over a large store
def test_list_threads_costs_the_page_not_the_store(saver, index_mode, quick_queries) -> None:
    clock = Clock(saver)
    newest = []
    for i in range(12):
        clock.now = T0 + 1_000 + i
        stored, metadata, ts = _put(saver, config(f"page-{i:02d}"), {"n": i}, {"i": i})
        newest.append(_info(f"page-{i:02d}", clock.now, stored, metadata, ts))
    newest = _order(newest)

    saver.stats.reset()
    alone = list(saver.list_threads(limit=10))
    alone_cost = _counts(saver)
    assert alone == newest[:10]
    # DynamoDB: 17 Queries of the listing (16 shards, the unsharded partition) + 10
    # Queries (Limit=1) of each thread's latest beside its record; manifest: 1
    # ListObjectsV2 + 10 GETs of the threads' heads.
    assert alone_cost == {
        "dynamodb": (2, {("dynamodb", "query"): LISTING_SHARDS + 1 + 10, ("dynamodb", "get_item"): 10}),
        "manifest": (2, {("s3", "list_objects_v2"): 1, ("s3", "get_object"): 10}),
    }[index_mode]

    # A large unrelated thread and many other threads, all created earlier.
    clock.now = T0 + 500
    grow_thread(saver, "big-unrelated", 300)
    for i in range(150):
        clock.now = T0 + i
        _put(saver, config(f"other-{i:03d}"), {"n": i}, {"i": i})
    saver.stats.reset()
    crowded = list(saver.list_threads(limit=10))
    assert _counts(saver) == alone_cost
    assert crowded == alone
    # Without a limit, the cost follows the listing: 163 threads, two pages.
    everything = list(saver.list_threads())
    assert len(everything) == 163 and everything[:12] == newest
    assert _ids(everything)[12] == "big-unrelated"
    round_trips, requests = _counts(saver)
    assert round_trips == 4
    assert 2 <= sum(requests.values()) - 163 * len(PER_THREAD[index_mode]) <= 2 * LISTING_READS[index_mode]

    # The large thread on the page costs what a one-checkpoint thread does.
    saver.stats.reset()
    page = list(saver.list_threads(limit=10, before=newest[-1]))
    assert _counts(saver) == alone_cost
    assert _ids(page) == ["big-unrelated"] + [f"other-{i:03d}" for i in range(149, 140, -1)]
    assert page[0].metadata == {"source": "loop", "step": 299}
    # Nothing on a hot path ever lists live/ or scans the table.
    for op in requests:
        assert op in {LISTING[index_mode], *PER_THREAD[index_mode]}, op


def test_put_costs_more_only_when_it_creates_a_thread(saver, index_mode) -> None:
    clock = Clock(saver)
    old = grow_thread(saver, "old", 5)  # a thread that exists already
    clock.now += 1

    saver.stats.reset()
    first, _, _ = _put(saver, config("new"), {"n": 0}, {})
    created_cost = _counts(saver)
    second, _, _ = _put(saver, first, {"n": 1}, {})
    second_cost = _counts(saver)
    _put(saver, old, {"counter": 1}, {})
    old_cost = _counts(saver)

    # Later puts cost what they cost before the listing existed, on a new thread
    # as on an old one.
    assert second_cost == old_cost
    assert (old_cost[0], sum(old_cost[1].values())) == PUT_BEFORE_LISTING[index_mode]
    # The first checkpoint: its listing entry (and, in manifest mode, the read of
    # a head this process has not seen); same round trips.
    expected = _plus(old_cost, LISTING_WRITE[index_mode])
    if COLD_READ[index_mode] is not None:
        expected = _plus(expected, COLD_READ[index_mode])
    if ACTIVITY_WRITE[index_mode] is not None:
        expected = _plus(expected, ACTIVITY_WRITE[index_mode])
    assert created_cost == expected
    # A parentless root checkpoint of a listed thread (invoke with no checkpoint_id)
    # does not list it again.
    _put(saver, config("new"), {"n": 2}, {})
    assert sum(_counts(saver)[1].values()) <= sum(old_cost[1].values()) + ROOT_READS[index_mode]
    # Neither does a subgraph's first checkpoint.
    _put(saver, config("new", ns="child:1"), {"n": 3}, {})
    assert sum(_counts(saver)[1].values()) <= sum(old_cost[1].values()) + ROOT_READS[index_mode]
    assert _ids(saver.list_threads()) == ["new", "old"]


def test_latest_checkpoint_outside_its_index_entry_costs_one_more_round_trip(saver, index_mode) -> None:
    """A checkpoint whose object is too large for its index entry (here: 600 kB of
    incompressible metadata) is read from S3, in one more round trip of GETs."""
    import secrets

    clock = Clock(saver)
    small = []
    for i in range(5):
        clock.now = T0 + i
        stored, metadata, ts = _put(saver, config(f"small-{i}"), {"n": i}, {"i": i})
        small.append(_info(f"small-{i}", clock.now, stored, metadata, ts))
    clock.now = T0 + 10
    note = secrets.token_urlsafe(450_000)
    stored, metadata, ts = _put(saver, config("huge"), {"n": 0}, {"note": note})
    huge = _info("huge", T0 + 10, stored, metadata, ts)
    saver.stats.reset()

    assert list(saver.list_threads(limit=3)) == [huge, small[4], small[3]]
    assert _counts(saver) == (3, _plus(_page_cost(index_mode, 3), ("s3", "get_object"))[1])
    # Without it on the page: two round trips (after the lookup of before="huge").
    assert list(saver.list_threads(limit=3, before="huge")) == [small[4], small[3], small[2]]
    assert _counts(saver)[0] == 1 + 2
    assert list(saver.list_threads(limit=3, before=huge)) == [small[4], small[3], small[2]]
    assert _counts(saver) == _page_cost(index_mode, 3)


# -- 3. delete_thread ----------------------------------------------------------------
def test_deleted_thread_is_not_listed_until_started_again(saver, index_mode) -> None:
    clock = Clock(saver)
    for i, thread_id in enumerate(["a", "b", "c"]):
        clock.now = T0 + i
        grow_thread(saver, thread_id, 2)
    assert _ids(saver.list_threads()) == ["c", "b", "a"]

    saver.delete_thread("b")
    assert _ids(saver.list_threads()) == ["c", "a"]
    assert _ids(saver.list_threads(before="c")) == ["a"]
    with pytest.raises(ConfigurationError, match="not in the thread listing"):
        list(saver.list_threads(before="b"))

    # Started again later: listed once, as created then, with its new checkpoint.
    clock.now = T0 + 100
    stored, metadata, ts = _put(saver, config("b"), {"n": 1}, {"again": True})
    assert list(saver.list_threads()) == [
        _info("b", T0 + 100, stored, metadata, ts),
        *list(saver.list_threads(before="b")),
    ]
    assert _ids(saver.list_threads()) == ["b", "c", "a"]
    stored, _, _ = _put(saver, stored, {"n": 2}, {"again": 2})
    listed = list(saver.list_threads())
    assert _ids(listed) == ["b", "c", "a"] and listed[0].checkpoint_id == stored["configurable"]["checkpoint_id"]

    # Deleted and started again within the second it was created in: once.
    saver.delete_thread("a")
    clock.now = T0
    _put(saver, config("a"), {"n": 1}, {})
    assert _ids(saver.list_threads()) == ["b", "c", "a"]

    # Everything deleted: nothing listed.
    for thread_id in ("a", "b", "c"):
        saver.delete_thread(thread_id)
    assert list(saver.list_threads()) == []
    assert list(saver.list_threads(limit=5)) == []


def test_thread_with_only_expired_checkpoints_is_not_listed(endpoint, index_mode) -> None:
    from datetime import timedelta

    saver = make_saver(endpoint, index_mode, ttl=timedelta(days=1))
    saver.setup()
    clock = Clock(saver, T0)
    grow_thread(saver, "short-lived", 2)
    clock.now = T0 + 3_600
    grow_thread(saver, "fresh", 1)
    assert _ids(saver.list_threads()) == ["fresh", "short-lived"]
    clock.now = T0 + 86_400 + 1
    assert _ids(saver.list_threads()) == ["fresh"]
    clock.now = T0 + 3_600 + 86_400
    assert list(saver.list_threads()) == []
    saver.close()


# -- 4. copy_thread --------------------------------------------------------------------
def test_copy_thread_lists_the_target(saver, index_mode) -> None:
    clock = Clock(saver)
    source, metadata, ts = _put(saver, config("source"), {"n": 1}, {"user": "u1"})
    source, metadata, ts = _put(saver, source, {"n": 2}, {"user": "u2"})
    clock.now = T0 + 60
    saver.copy_thread("source", "target")
    listed = list(saver.list_threads())
    assert listed == [
        _info("target", T0 + 60, source, metadata, ts),
        _info("source", T0, source, metadata, ts),
    ]
    assert listed[0].config["configurable"]["thread_id"] == "target"
    assert list(saver.list_threads(filter={"user": "u2"})) == listed
    # Copied again (brought up to date): still listed once, as first created.
    clock.now = T0 + 120
    saver.copy_thread("source", "target")
    assert list(saver.list_threads()) == listed
    # Its own checkpoint after the copy: still once, with that checkpoint.
    stored, metadata, ts = _put(saver, listed[0].config, {"n": 3}, {"user": "t"})
    assert list(saver.list_threads(limit=1)) == [_info("target", T0 + 60, stored, metadata, ts)]


# -- 5. alist_threads ------------------------------------------------------------------
async def test_alist_threads_gives_what_list_threads_gives(saver, index_mode) -> None:
    clock = Clock(saver)
    for i in range(25):
        clock.now = T0 + i // 2  # two threads per second: ties too
        stored, _, _ = _put(saver, config(f"t{i}"), {"n": i}, {"odd": i % 2})
        if i % 4 == 0:
            _put(saver, stored, {"n": -i}, {"odd": 1 - i % 2})
    saver.delete_thread("t3")
    everything = list(saver.list_threads())
    assert len(everything) == 24

    async def alist(**kwargs):
        return [i async for i in saver.alist_threads(**kwargs)]

    assert await alist() == everything
    for kwargs in (
        {"limit": 7},
        {"limit": 0},
        {"filter": {"odd": 1}},
        {"filter": {"odd": 0}, "limit": 3},
        {"before": everything[4]},
        {"before": everything[4].thread_id, "limit": 2},
        {"before": everything[4].config, "filter": {"odd": 1}},
    ):
        assert await alist(**kwargs) == list(saver.list_threads(**kwargs)), kwargs
    # Same requests from both drivers.
    saver.stats.reset()
    list(saver.list_threads(limit=10))
    sync_cost = _counts(saver)
    await alist(limit=10)
    assert _counts(saver) == sync_cost == _page_cost(index_mode, 10)
    with pytest.raises(ConfigurationError):
        await alist(limit=-1)
    with pytest.raises(ConfigurationError):
        await alist(before="t3")
    await saver.aclose()


# -- 6. bad arguments --------------------------------------------------------------------
def test_bad_arguments_raise_configuration_error(saver, index_mode) -> None:
    _put(saver, config("exists"), {"n": 1}, {})
    saver.stats.reset()
    with pytest.raises(ConfigurationError, match=r"limit must be an int >= 0 or None, got -1"):
        list(saver.list_threads(limit=-1))
    with pytest.raises(ConfigurationError, match="limit"):
        list(saver.list_threads(limit=2.5))
    with pytest.raises(ConfigurationError, match="limit"):
        list(saver.list_threads(limit=True))
    with pytest.raises(ConfigurationError, match=r"filter must be a dict of metadata values, got str"):
        list(saver.list_threads(filter="x"))
    assert _counts(saver) == (0, {})  # refused before any request
    with pytest.raises(ConfigurationError, match=r"before='no-such-thread': thread is not in the thread listing"):
        list(saver.list_threads(before="no-such-thread"))
    with pytest.raises(ConfigurationError, match="thread is not in the thread listing"):
        list(saver.list_threads(before=config("no-such-thread")))
    with pytest.raises(ConfigurationError, match="thread_id"):
        list(saver.list_threads(before={"configurable": {}}))
    assert _ids(saver.list_threads()) == ["exists"]


# -- ties: one order in both index modes ------------------------------------------------
def test_threads_created_in_one_second_are_in_one_order_in_both_modes(saver, index_mode) -> None:
    """Within one second, encoded thread id ascending: S3 lists the manifest's
    listing keys in that order, and the DynamoDB sort key (inverted time, then the
    id, read ascending) gives the same, so a thread moved between index modes keeps
    its place and pages are the same."""
    Clock(saver)
    ids = ["b", "a", "ab", "c", "a-1"]
    for thread_id in ids:
        _put(saver, config(thread_id), {"n": 1}, {})
    # Each mode pages through its own order consistently...
    listed = list(saver.list_threads())
    assert [i for p in _walk(saver, 2) for i in p] == listed
    # ...and both modes have one order.
    want = sorted(ids, key=encode)
    assert want == ["a", "a-1", "ab", "b", "c"]
    assert _ids(listed) == want
    assert _ids(saver.list_threads(before="ab")) == ["b", "c"]
