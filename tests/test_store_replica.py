"""S3Store in the saver's regions: reads fall over to the replica, lag-safe; writes never do.

Two regions on 127.0.0.1 (tests/regions.py): the primary behind a proxy a test takes
down, the replica on moto direct, replication done by the harness's Replicator. Each
test runs over the modes whose replica can answer before promote() ("manifest": the
memory index travels in the bucket; "dynamodb-global": the harness replicates the
table's items too) and both drivers (the store's sync methods, and its a* forms on a
loop of the test's own).

The savers here get generous timeouts and budgets (``_saver``): writes made while the
primary is up never race a short budget on a busy machine. The outage is a refused
connection or a 503, which fail at once, so the budgets cost the tests no time.
"""

from __future__ import annotations

import asyncio
import base64
import random
from typing import Any

import pytest
from botocore.config import Config

from s3_saver import (
    ConfigurationError,
    PrimaryUnavailableError,
    ReplicationLagError,
    RetryPolicy,
    S3Store,
)
from s3_saver._regions.sites import REPLICA
from s3_saver._transport.protocol import PRIMARY

MODES = ("manifest", "dynamodb-global")
KINDS = ("sync", "async")
ANN, BOB = ("users", "ann"), ("users", "bob")
# Over the inline limit of both modes once packed (random, so it does not compress):
# the value lives in an object of its own under memory/, replicated on its own.
BIG = base64.b64encode(random.Random(43).randbytes(100 * 1024)).decode()
WRITES = {("s3", "put_object"), ("s3", "delete_objects"), ("s3", "copy_object")} | {
    ("dynamodb", op) for op in ("put_item", "update_item", "delete_item", "transact_write_items", "batch_write_item")
}


def _saver(regions: Any, mode: str, **kw: Any) -> Any:
    index_mode = "manifest" if mode == "manifest" else "dynamodb"
    kw.setdefault("client_config", Config(connect_timeout=5, read_timeout=20))
    kw.setdefault("retry", RetryPolicy(attempts=3, base=0.05, cap=0.2, budget=30.0))
    saver = regions.make_saver(index_mode, global_table=mode == "dynamodb-global", failover_after=30.0, **kw)
    if index_mode == "dynamodb" and regions.replica.table not in regions.replica.dynamodb.list_tables()["TableNames"]:
        regions.create_replica_table()
    return saver


class Api:
    """The store's calls, sync or async (on a loop of the test's own)."""

    def __init__(self, kind: str, saver: Any, **store_kw: Any) -> None:
        self.kind, self.saver = kind, saver
        self.store = S3Store.from_saver(saver, **store_kw)
        self.loop = asyncio.new_event_loop() if kind == "async" else None
        self._source: Any = None

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.loop is None:
            try:
                return getattr(self.store, name)(*args, **kwargs)
            finally:
                self._source = self.store.last_read
        return self.loop.run_until_complete(self._acall(name, *args, **kwargs))

    async def _acall(self, name: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return await getattr(self.store, "a" + name)(*args, **kwargs)
        finally:
            # last_read is per asyncio task: read it inside the task that read.
            self._source = self.store.last_read

    @property
    def source(self) -> Any:
        """``store.last_read`` after the last call."""
        return self._source

    def get(self, namespace: tuple, key: str) -> Any:
        item = self._call("get", namespace, key)
        return None if item is None else item.value

    def search(self, prefix: tuple, **kw: Any) -> list:
        return [(i.namespace, i.key, i.value) for i in self._call("search", prefix, **kw)]

    def namespaces(self, **kw: Any) -> list:
        return self._call("list_namespaces", **kw)

    def put(self, namespace: tuple, key: str, value: dict) -> None:
        self._call("put", namespace, key, value)

    def delete(self, namespace: tuple, key: str) -> None:
        self._call("delete", namespace, key)

    def batch(self, ops: list) -> list:
        return self._call("batch", ops)

    def promote(self) -> Any:
        if self.loop is None:
            return self.saver.promote()
        return self.loop.run_until_complete(self.saver.apromote())

    def close(self) -> None:
        if self.loop is not None:
            self.loop.run_until_complete(self.saver.aclose())
            self.loop.close()


@pytest.fixture
def apis() -> Any:
    made: list[Api] = []

    def make(kind: str, saver: Any, **store_kw: Any) -> Api:
        made.append(Api(kind, saver, **store_kw))
        return made[-1]

    yield make
    for api in made:
        api.close()


def _sent_to_replica(saver: Any) -> set:
    return {op for op, n in saver.stats.site(REPLICA).requests.items() if n}


def _sent_to_primary(saver: Any) -> int:
    return saver.stats.total_requests - saver.stats.site(REPLICA).total_requests


def _fill(api: Api) -> dict:
    """Items in two namespaces (one value in an object of its own); what the primary reads."""
    api.put(ANN, "diet", {"text": "tea", "n": 1})
    api.put(ANN, "notes", {"text": BIG, "n": 2})
    api.put(BOB, "diet", {"text": "none", "n": 3})
    return {
        "get": (api.get(ANN, "diet"), api.get(ANN, "notes")),
        "search": api.search(("users",)),
        "filtered": api.search(("users",), filter={"n": {"$gte": 2}}),
        "namespaces": api.namespaces(prefix=("users",)),
    }


def _read(api: Api) -> dict:
    return {
        "get": (api.get(ANN, "diet"), api.get(ANN, "notes")),
        "search": api.search(("users",)),
        "filtered": api.search(("users",), filter={"n": {"$gte": 2}}),
        "namespaces": api.namespaces(prefix=("users",)),
    }


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("failure", ("refuse", "fail"))
@pytest.mark.parametrize("mode", MODES)
def test_reads_come_from_the_replica_during_an_outage_and_back_from_the_primary(
    regions, apis, mode: str, failure: str, kind: str
) -> None:
    # recheck_after=0: every read tries the primary first, so the first read after the
    # outage is the primary's again. Refresh on read at every read: a read the replica
    # serves must not write one there.
    saver = _saver(regions, mode, recheck_after=0)
    api = apis(kind, saver, ttl={"default_ttl": 60, "refresh_on_read": True}, refresh_slack=0)
    replicated = _fill(api)
    assert replicated["get"][1] == {"text": BIG, "n": 2} and len(replicated["search"]) == 3
    assert api.source.site == "primary" and not api.source.failover
    regions.replicator.run()
    # The primary goes on: never replicated.
    api.put(ANN, "late", {"text": "after replication", "n": 9})
    api.put(("users", "cat"), "diet", {"text": "fish", "n": 4})
    newest = _read(api)
    assert newest != replicated

    regions.proxy.fail(503) if failure == "fail" else regions.proxy.refuse()
    saver.stats.reset()
    assert _read(api) == replicated  # what had replicated, whole
    source = api.source
    assert source.site == "replica" and source.failover and source.cause, source
    assert api.get(ANN, "late") is None
    assert _sent_to_primary(saver) > 0  # each read tried the primary first (recheck_after=0)
    sent = _sent_to_replica(saver)
    assert sent and not sent & WRITES, sent  # no refresh written in the replica

    # Writes never fall over: a put, a delete, and a batch that reads and writes.
    from langgraph.store.base import GetOp, PutOp

    for write in (
        lambda: api.put(ANN, "diet", {"text": "coffee"}),
        lambda: api.delete(ANN, "diet"),
        lambda: api.batch([GetOp(ANN, "diet"), PutOp(ANN, "x", {"n": 0})]),
    ):
        with pytest.raises(PrimaryUnavailableError, match=r"promote\(\)"):
            write()
    assert not _sent_to_replica(saver) & WRITES

    regions.proxy.up()
    saver.stats.reset()
    assert _read(api) == newest  # the primary serves again, its newest writes included
    assert api.source.site == "primary" and not api.source.failover and api.source.cause is None
    assert saver.stats.site(REPLICA).total_requests == 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_a_value_object_not_replicated_yet_is_replication_lag(regions, apis, mode: str, kind: str) -> None:
    saver = _saver(regions, mode, recheck_after=3600)
    api = apis(kind, saver)
    api.put(ANN, "diet", {"text": "tea", "n": 1})
    api.put(ANN, "notes", {"text": "short", "n": 2})
    regions.replicator.run()
    # The value grows into an object of its own: the head (or the item) replicates, the
    # object is held back.
    api.put(ANN, "notes", {"text": BIG, "n": 2})
    replicator = regions.replicator
    replicator.capture()
    held = replicator.drop_pending(lambda e: e.kind == "object" and "/@v/" in str(e.key))
    assert len(held) == 1
    replicator.deliver()

    regions.proxy.refuse()
    for read in (lambda: api.get(ANN, "notes"), lambda: api.search(ANN), lambda: api.search(("users",))):
        with pytest.raises(ReplicationLagError, match="replication lag") as raised:
            read()
        message = str(raised.value)
        assert regions.replica.bucket in message and "'ann'" in message and "'notes'" in message, message
    assert api.source.site == "replica" and api.source.failover
    # What needs no missing object is served: an item beside it, the namespaces.
    assert api.get(ANN, "diet") == {"text": "tea", "n": 1}
    assert api.namespaces() == [ANN]

    # The object arrives: the item is read whole.
    replicator.pending.extend(held)
    replicator.deliver()
    assert api.get(ANN, "notes") == {"text": BIG, "n": 2}
    assert [k for _, k, _ in api.search(ANN)] == ["diet", "notes"]
    assert api.source.site == "replica"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_put_replicate_outage_read_promote_put_failback(regions, apis, mode: str, kind: str) -> None:
    saver = _saver(regions, mode, recheck_after=3600)
    api = apis(kind, saver)
    api.put(ANN, "diet", {"text": "tea"})
    api.put(ANN, "notes", {"text": BIG})
    regions.replicator.run()

    # Outage: the replica serves what replicated; writes wait for promote().
    regions.proxy.refuse()
    assert api.get(ANN, "notes") == {"text": BIG} and api.source.site == "replica"
    with pytest.raises(PrimaryUnavailableError):
        api.put(ANN, "diet", {"text": "coffee"})

    # Failover: the saver's promote() moves the store with it.
    promotion = api.promote()
    assert not promotion.checked
    assert (api.store.bucket, api.store.region_name) == (regions.replica.bucket, regions.replica.region)
    saver.stats.reset()
    left = saver.stats.site(PRIMARY)  # the calls to the region left (calls name regions as configured)
    api.put(ANN, "diet", {"text": "coffee"})
    api.put(BOB, "notes", {"text": BIG + "!"})
    api.delete(ANN, "notes")
    assert api.get(ANN, "diet") == {"text": "coffee"} and api.get(ANN, "notes") is None
    assert api.source.site == "primary" and api.source.bucket == regions.replica.bucket
    assert api.namespaces() == [ANN, BOB]
    assert left.total_requests == 0 and saver.stats.site(REPLICA).total_requests > 0
    # Written in the promoted region's bucket (BOB's large value), not in the old primary's.
    assert _holds(regions.replica, BOB) and not _holds(regions.primary, BOB)

    # Failback: the old primary is back, the promoted region's writes replicate to it,
    # and promote() makes it the region written to again.
    regions.proxy.up()
    regions.reverse.run()
    back = api.promote()
    assert back.checked
    assert api.store.bucket == regions.primary.bucket
    assert api.get(ANN, "diet") == {"text": "coffee"} and api.get(ANN, "notes") is None
    assert api.get(BOB, "notes") == {"text": BIG + "!"}
    assert api.source.site == "primary" and api.source.bucket == regions.primary.bucket
    api.put(ANN, "diet", {"text": "water"})  # written in the old primary again
    assert api.get(ANN, "diet") == {"text": "water"}
    assert [k for _, k, _ in api.search(("users",))] == ["diet", "notes"]


def _holds(site: Any, namespace: tuple) -> bool:
    """Does the site's bucket hold an object of ``namespace`` (its head, a value's object)?"""
    from s3_saver._format.memory.names import node_id

    return any(f"/{node_id(namespace)}/" in key for key in site.keys("memory/"))


def test_from_saver_refuses_a_dynamodb_replica_without_a_global_table(regions) -> None:
    saver = regions.make_saver("dynamodb", setup=False)
    with pytest.raises(ConfigurationError, match="global_table=True") as raised:
        S3Store.from_saver(saver)
    message = str(raised.value)
    assert regions.replica.region in message and repr(regions.replica.table) in message, message
