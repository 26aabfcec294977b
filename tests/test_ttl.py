"""ttl=: index items carry expires_at, expired items are never served, old values are refreshed."""

from __future__ import annotations

import time
from datetime import timedelta

import boto3

from conftest import BUCKET, TABLE, make_saver
from helpers import checkpoint, config

DAY = 86_400


def _item_expiry(endpoint: str, thread_id: str) -> list[int]:
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    items = ddb.query(
        TableName=TABLE,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": thread_id}},
    )["Items"]
    # Checkpoint and writes items. Link items (a checkpoint's twin for the delta
    # walk) expire with their checkpoint; the thread's own item does not expire.
    return [int(i["expires_at"]["N"]) for i in items if "kind" in i]


def test_ttl_expires_items_and_refreshes_values_that_would_expire(endpoint) -> None:
    saver = make_saver(endpoint, ttl=timedelta(days=30))
    saver.setup()
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    assert ddb.describe_time_to_live(TableName=TABLE)["TimeToLiveDescription"] == {
        "TimeToLiveStatus": "ENABLED",
        "AttributeName": "expires_at",
    }
    start = int(time.time())
    clock = {"now": start}
    saver._ctx.now = lambda: clock["now"]

    big = "B" * 100_000  # over inline_threshold: stored in its own object
    first = saver.put(
        config("t"),
        checkpoint({"doc": "D", "big": big, "n": 0}, {"doc": "1", "big": "1", "n": "1"}),
        {},
        {"doc": "1", "big": "1", "n": "1"},
    )
    saver.put_writes(first, [("n", 5)], "task")
    assert sorted(_item_expiry(endpoint, "t")) == [start + 30 * DAY] * 2

    # Day 10: "doc" is unchanged and still young: the new item points at the first
    # checkpoint's objects (which the lifecycle rule, 1.5 x ttl, keeps until day
    # 45) and lives a full ttl from its own write.
    clock["now"] = start + 10 * DAY
    second = saver.put(first, checkpoint({"doc": "D", "big": big, "n": 1}, {"doc": "1", "big": "1", "n": "2"}), {}, {"n": "2"})
    assert max(_item_expiry(endpoint, "t")) == start + 40 * DAY

    # Day 20: "doc" is past half its life, so this checkpoint stores it again
    # and lives a full ttl from now.
    clock["now"] = start + 20 * DAY
    third = saver.put(second, checkpoint({"doc": "D", "big": big, "n": 2}, {"doc": "1", "big": "1", "n": "3"}), {}, {"n": "3"})
    assert max(_item_expiry(endpoint, "t")) == start + 50 * DAY
    assert saver.get_tuple(config("t")).checkpoint["channel_values"] == {"doc": "D", "big": big, "n": 2}
    # The large value got a new object (a new age for the lifecycle rule), not a
    # no-op rewrite of the old key.
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    blobs = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="live/t/=/blobs/")["Contents"]]
    assert sorted(k.rsplit("/", 1)[1] for k in blobs) == sorted(
        c["configurable"]["checkpoint_id"] for c in (first, third)
    )

    # Day 40: the first two checkpoints are expired (DynamoDB deletes lazily; the
    # saver never serves them), the third is alive and complete.
    clock["now"] = start + 40 * DAY
    assert saver.get_tuple(first) is None
    assert [t.config for t in saver.list(config("t"))] == [third]
    assert saver.get_tuple(config("t")).checkpoint["channel_values"] == {"doc": "D", "big": big, "n": 2}

    clock["now"] = start + 51 * DAY
    assert saver.get_tuple(config("t")) is None
    assert list(saver.list(config("t"))) == []
    saver.close()


def test_a_cold_process_puts_in_two_round_trips_with_ttl(endpoint) -> None:
    """The parent's item is read beside the object write; a third trip only to refresh."""
    warm = make_saver(endpoint, ttl=timedelta(days=30))
    warm.setup()
    start = int(time.time())
    clock = {"now": start}
    versions = {"doc": "1", "n": "1"}
    cfg = warm.put(config("cold"), checkpoint({"doc": "D", "n": 0}, versions), {}, versions)
    warm.close()

    for day, n, round_trips in [(5, 2, 2), (20, 3, 3)]:
        cold = make_saver(endpoint, ttl=timedelta(days=30))
        clock["now"] = start + day * DAY
        cold._ctx.now = lambda: clock["now"]
        versions = {"doc": "1", "n": str(n)}
        cfg = cold.put(cfg, checkpoint({"doc": "D", "n": n}, versions), {}, {"n": str(n)})
        assert cold.stats.round_trips == round_trips, day
        assert cold.get_tuple(config("cold")).checkpoint["channel_values"] == {"doc": "D", "n": n}
        cold.close()
    # Day 20: "doc" (stored day 0) was past half its life, so it was stored again
    # and the newest item lives a full ttl from day 20.
    assert max(_item_expiry(endpoint, "cold")) == start + 50 * DAY


def test_an_idle_thread_lives_a_full_ttl_and_a_fork_is_the_last_to_expire(endpoint, index_mode) -> None:
    """Each item expires a ttl after its own write, so an idle thread is readable for
    the whole ttl, and after a fork from an old checkpoint "latest" stays the fork
    (it used to expire with the oldest value it pointed at: day 30 here)."""
    saver = make_saver(endpoint, index_mode, ttl=timedelta(days=30))
    saver.setup()
    start = int(time.time())
    clock = {"now": start}
    saver._ctx.now = lambda: clock["now"]
    v1 = {"doc": "1", "n": "1"}
    first = saver.put(config("f"), checkpoint({"doc": "D", "n": 0}, v1), {}, v1)
    clock["now"] = start + 10 * DAY
    v2 = {"doc": "2", "n": "2"}
    saver.put(first, checkpoint({"doc": "E", "n": 1}, v2), {}, v2)
    # Day 12: a fork from the first checkpoint (update_state on an old config):
    # its values are 12 days old, under half the ttl, so it points at them.
    clock["now"] = start + 12 * DAY
    fork = saver.put(first, checkpoint({"doc": "D", "n": 7}, {"doc": "1", "n": "3"}), {"source": "fork"}, {"n": "3"})

    for day in (29, 31, 41):  # the first checkpoint expired on day 30, the second on day 40
        clock["now"] = start + day * DAY
        latest = saver.get_tuple(config("f"))
        assert latest is not None and latest.config == fork, day
        assert latest.checkpoint["channel_values"] == {"doc": "D", "n": 7}
    clock["now"] = start + 42 * DAY
    assert saver.get_tuple(config("f")) is None
    saver.close()
