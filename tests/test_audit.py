"""audit and collect_garbage against moto, in both index modes.

The index and the bucket of a store used by real graphs (interrupts, a
subgraph, values stored as their own objects, pending writes) and then pruned,
copied, archived and deleted must agree exactly: no false "missing", no false
"orphan". Each kind of damage that can be inflicted by hand is then detected,
and garbage collection deletes orphans only, never the object of a write that
is paused between its objects and its index entry.
"""

from __future__ import annotations

import secrets
import threading
import time
from datetime import timedelta

import boto3
import pytest
from langgraph.types import Command

from conftest import BUCKET, TABLE, make_saver
from faults import FaultProxy
from helpers import checkpoint, config, grow_thread, is_marker
from s3_saver import ConfigurationError, StoreReport
from s3_saver._format.keys import LegacyPrefix
from test_graphs import nested_builder, review_builder

NOW = timedelta(0)  # no grace period: every unreferenced object counts as garbage


def s3(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def keys(endpoint: str, prefix: str = "") -> list[str]:
    pages = s3(endpoint).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for p in pages for o in p.get("Contents", [])]


def populate(saver) -> None:
    """Threads made by real graphs, then changed by every lifecycle operation."""
    big = secrets.token_hex(35_000)  # above the inline threshold: a value object of its own
    review = review_builder().compile(checkpointer=saver)
    for tid in ("review-a", "review-b", "review-c"):
        review.invoke({"items": [big]}, {"configurable": {"thread_id": tid}})
    review.invoke(Command(resume="yes"), {"configurable": {"thread_id": "review-a"}})
    nested = nested_builder().compile(checkpointer=saver)
    nested.invoke({"items": []}, {"configurable": {"thread_id": "nested"}})
    grow_thread(saver, "long", 60)  # in manifest mode: sealed segments
    saver.prune(["long"], keep_last=5)
    saver.copy_thread("review-a", "review-copy")
    saver.archive_thread("review-b")
    saver.delete_thread("review-c")


def assert_clean(report: StoreReport) -> None:
    assert report.problems == [], "\n".join(f"{p.kind} {p.thread_id} {p.key}: {p.detail}" for p in report.problems)
    assert report.ok


def test_a_used_store_audits_clean(saver, endpoint) -> None:
    populate(saver)
    report = saver.audit(older_than=NOW)
    assert_clean(report)
    # Every thread the bucket or the index knows, the deleted one's leftovers included.
    assert report.threads >= 5
    # (The prefix's index-mode marker under live/ is no thread's object.)
    live = [k for k in keys(endpoint, "live/") if not is_marker(k)]
    assert report.objects == len(live) + len(keys(endpoint, "archive/")) + len(keys(endpoint, "manifests/"))
    assert report.bytes > 2 * 70_000
    assert_clean(saver.audit(["review-a", "long", "review-b"], older_than=NOW))


def test_a_copy_run_again_after_it_finished_leaves_no_orphan(saver) -> None:
    # The docs tell operators to run a copy again to finish one cut short; run again
    # after it finished, the copy keeps reading as its source and nothing is orphaned.
    review = review_builder().compile(checkpointer=saver)
    review.invoke({"items": [secrets.token_hex(35_000)]}, {"configurable": {"thread_id": "source"}})
    for _ in range(3):
        saver.copy_thread("source", "copy")
        assert_clean(saver.audit(["source", "copy"], older_than=NOW))
    source, copy = (list(saver.list(config(t))) for t in ("source", "copy"))
    assert [t.checkpoint for t in copy] == [t.checkpoint for t in source]
    assert [t.pending_writes for t in copy] == [t.pending_writes for t in source]


def test_missing_objects_are_named(saver, endpoint) -> None:
    populate(saver)
    tuple_ = saver.get_tuple(config("review-a"))
    cp_key = next(k for k in keys(endpoint, "live/review-a/") if tuple_.checkpoint["id"] in k and "/checkpoints/" in k)
    blob_key = next(k for k in keys(endpoint, "live/review-a/") if "/blobs/" in k)
    archive_key = keys(endpoint, "archive/")[0]
    s3(endpoint).delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in (cp_key, blob_key, archive_key)]})

    report = saver.audit()
    assert {(p.thread_id, p.key) for p in report.missing} == {
        ("review-a", cp_key), ("review-a", blob_key), ("review-b", archive_key)
    }
    by_key = {p.key: p.detail for p in report.missing}
    assert tuple_.checkpoint["id"] in by_key[cp_key]
    assert "archive" in by_key[archive_key]
    assert not report.ok and not report.orphans and not report.broken


def test_orphans_are_collected_after_the_grace_period(saver, endpoint) -> None:
    grow_thread(saver, "t", 3)
    stray = "live/t/=/writes/1ef00000-0000-6000-8000-000000000000/task/r0.deadbeef"
    junk = "live/t/=/checkpoints/not-a-checkpoint-of-the-index"
    for key in (stray, junk):
        s3(endpoint).put_object(Bucket=BUCKET, Key=key, Body=b"crashed write")
    before = saver.get_tuple(config("t"))

    young = saver.audit()  # the default grace period: an hour
    assert {p.key for p in young.in_flight} == {stray, junk} and young.ok
    assert saver.collect_garbage().deleted == []

    dry = saver.collect_garbage(older_than=NOW, dry_run=True)
    assert {p.key for p in dry.orphans} == {stray, junk} and dry.deleted == []
    assert dry.garbage == sorted([stray, junk])
    assert stray in keys(endpoint)

    done = saver.collect_garbage(older_than=NOW)
    assert done.deleted == sorted([stray, junk])
    assert not set(done.deleted) & set(keys(endpoint))
    assert_clean(saver.audit(older_than=NOW))
    assert saver.get_tuple(config("t")) == before


def test_writes_whose_checkpoint_never_came_leave_the_index_after_the_grace_period(saver, endpoint) -> None:
    """A run that ended between a step's writes and that checkpoint's commit (its
    process died; a delete or delete_for_runs refused the checkpoint) leaves
    writes no read shows. Younger than the grace period they may be a run in
    flight's and stay; older, gc takes them out of the index, then their objects
    (issue 33: they outlived every prune and delete of the thread)."""
    last = grow_thread(saver, "t", 3)
    never = checkpoint({"counter": 9}, {"counter": "9"})
    saver.put_writes(config("t", checkpoint_id=never["id"]), [("counter", 1), ("__interrupt__", "why")], "task-1")
    written = [k for k in keys(endpoint, "live/t/") if never["id"] in k]
    assert len(written) == 2
    before = saver.get_tuple(config("t"))

    young = saver.collect_garbage()  # the default grace period: an hour
    assert young.deleted == [] and young.ok
    held = saver._sync.run(saver._ctx.index.holdings("t"))
    assert len([w for w in held.live if getattr(w, "checkpoint_id", None) == never["id"]]) == 2
    saver.prune(["t"], keep_last=1)  # a prune leaves them: a run in flight's, for all it can tell
    assert all(k in keys(endpoint, "live/t/") for k in written)

    assert {p.key for p in saver.audit(older_than=NOW).orphans} == set(written)
    done = saver.collect_garbage(older_than=NOW)
    assert sorted(done.deleted) == sorted(written)
    assert [k for k in keys(endpoint, "live/t/") if never["id"] in k] == []
    held = saver._sync.run(saver._ctx.index.holdings("t"))
    assert [e for e in held.live + held.kept if getattr(e, "checkpoint_id", None) == never["id"]] == []
    assert_clean(saver.audit(older_than=NOW))
    assert saver.get_tuple(config("t")).checkpoint == before.checkpoint == saver.get_tuple(last).checkpoint


def test_unindexed_threads_are_kept_unless_asked(saver, endpoint, index_mode) -> None:
    grow_thread(saver, "lost", 3)
    # The thread's index is lost (a table emptied, a manifest removed).
    if index_mode == "manifest":
        s3(endpoint).delete_object(Bucket=BUCKET, Key="manifests/lost/head")
    else:
        ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
        items = ddb.query(TableName=TABLE, KeyConditionExpression="pk = :p", ExpressionAttributeValues={":p": {"S": "lost"}})
        for item in items["Items"]:
            ddb.delete_item(TableName=TABLE, Key={"pk": item["pk"], "sk": item["sk"]})
    objects = keys(endpoint, "live/lost/")
    report = saver.collect_garbage(older_than=NOW)
    assert sorted(p.key for p in report.unindexed) == sorted(objects) and report.deleted == []
    assert saver.rebuild_index("lost") == 3  # what the unindexed objects are for
    assert_clean(saver.audit(older_than=NOW))


def test_unindexed_objects_deleted_when_asked(saver, endpoint) -> None:
    s3(endpoint).put_object(Bucket=BUCKET, Key="live/ghost/=/checkpoints/1", Body=b"x")
    report = saver.collect_garbage(older_than=NOW, include_unindexed=True)
    assert report.deleted == ["live/ghost/=/checkpoints/1"]
    assert keys(endpoint, "live/ghost/") == []


@pytest.mark.parametrize("damage", ["garbage head", "missing segment"])
def test_a_broken_manifest_is_reported_and_left_alone(endpoint, damage) -> None:
    saver = make_saver(endpoint, "manifest")
    saver.setup()
    grow_thread(saver, "t", 60)  # past SEAL_AT: the head names sealed segments
    grow_thread(saver, "ok", 2)
    segments = keys(endpoint, "manifests/t/segments/")
    assert segments
    if damage == "garbage head":
        s3(endpoint).put_object(Bucket=BUCKET, Key="manifests/t/head", Body=b"\x00not a manifest")
    else:
        s3(endpoint).delete_object(Bucket=BUCKET, Key=segments[0])
    fresh = make_saver(endpoint, "manifest")  # no cached head or segment
    objects = keys(endpoint, "live/t/")
    report = fresh.collect_garbage(older_than=NOW)
    broken = [p for p in report.broken if p.thread_id == "t"]
    assert len(broken) == 1 and "manifests/t/" in broken[0].detail
    assert not [p for p in report.problems if p.thread_id == "ok"]
    assert report.deleted == [] and keys(endpoint, "live/t/") == objects


def test_a_broken_dynamodb_item_is_reported(dynamo_saver, endpoint) -> None:
    grow_thread(dynamo_saver, "t", 2)
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    item = ddb.query(TableName=TABLE, KeyConditionExpression="pk = :p", ExpressionAttributeValues={":p": {"S": "t"}})["Items"][-1]
    item["loc"] = {"B": b"\xc1 not msgpack"}
    ddb.put_item(TableName=TABLE, Item=item)
    report = dynamo_saver.audit(["t"], older_than=NOW)
    assert [p.kind for p in report.problems] == ["broken"]
    assert TABLE in report.problems[0].detail


def test_gc_never_deletes_a_write_in_flight(endpoint, index_mode) -> None:
    """A put paused after its objects were stored and before its index entry
    (the commit point) survives a collection, then commits and reads back whole."""
    collector = make_saver(endpoint, index_mode)
    collector.setup()
    stored = grow_thread(collector, "t", 2)
    with FaultProxy(endpoint) as proxy:
        writer = make_saver(proxy.url, index_mode)
        # The key's own "/checkpoints/", not the bucket's name in the path ("/checkpoints/live/..."):
        # that matched the blob PUT sent beside it, which may land before the checkpoint's.
        proxy.pause_when = lambda req: req.is_object_put and "/checkpoints/" in req.path.split("/live/", 1)[-1]
        cp = checkpoint({"counter": 99, "doc": "y" * 70_000}, {"counter": "9", "doc": "2"})
        done: list = []

        def write() -> None:
            try:
                done.append(writer.put(stored, cp, {"step": 9}, {"counter": "9", "doc": "2"}))
            except Exception as exc:  # shown by the assertion below
                done.append(exc)

        thread = threading.Thread(target=write)
        thread.start()
        # Generous: the machine may be loaded by the other worker's subprocesses.
        assert proxy.paused.wait(60), done
        stored_keys = keys(endpoint, "live/t/")
        in_flight = [k for k in stored_keys if cp["id"] in k and "/checkpoints/" in k]
        assert len(in_flight) == 1, (cp["id"], stored_keys)
        in_flight_key = in_flight[0]

        report = collector.collect_garbage()  # the default grace period
        assert in_flight_key in {p.key for p in report.in_flight}
        assert report.deleted == [] and report.ok
        # Without the grace period the same object would be taken for garbage.
        assert in_flight_key in {p.key for p in collector.collect_garbage(older_than=NOW, dry_run=True).orphans}

        # Released, the proxy resets the writer's connection: its retry finds the
        # object stored (same bytes) and commits.
        proxy.release.set()
        thread.join(60)
    assert done and not isinstance(done[0], Exception), done
    assert done[0]["configurable"]["checkpoint_id"] == cp["id"]
    got = make_saver(endpoint, index_mode).get_tuple(config("t"))
    assert got.checkpoint["id"] == cp["id"] and got.checkpoint["channel_values"]["doc"] == "y" * 70_000
    assert_clean(collector.audit(older_than=NOW))


async def test_async_parity(saver, endpoint) -> None:
    grow_thread(saver, "t", 2)
    s3(endpoint).put_object(Bucket=BUCKET, Key="live/t/=/checkpoints/stray", Body=b"x")
    seen: list[tuple[int, int, int]] = []
    report = await saver.acollect_garbage(older_than=NOW, progress=lambda *a: seen.append(a))
    assert report.deleted == ["live/t/=/checkpoints/stray"]
    assert seen and seen[-1][:2] == (1, 1)
    assert (await saver.aaudit(older_than=NOW)).ok


def test_bad_arguments(saver) -> None:
    with pytest.raises(ConfigurationError, match="string 't'"):
        saver.audit("t")
    with pytest.raises(ConfigurationError, match="timedelta"):
        saver.collect_garbage(older_than=3600)
    with pytest.raises(ConfigurationError, match="negative"):
        saver.audit(older_than=timedelta(seconds=-1))


def test_a_saver_nested_in_anothers_folders_is_never_collected(endpoint, index_mode) -> None:
    """Prefix ``app/live`` lies inside ``app``'s ``live/`` (refused now, written by an
    earlier version): ``app``'s gc must not take its keys for objects of a thread of
    its own (here even one named "live")."""
    outer = make_saver(endpoint, index_mode, prefix="app")
    inner = make_saver(endpoint, index_mode, prefix=LegacyPrefix("app/live"))
    outer.setup()
    grow_thread(outer, "live", 2)
    grow_thread(inner, "t1", 3)
    inner_keys = keys(endpoint, "app/live/live/")
    assert inner_keys
    report = outer.collect_garbage(older_than=NOW, include_unindexed=True)
    assert report.deleted == [] and report.problems == []
    assert report.notes and "app/live/" in report.notes[-1]
    assert keys(endpoint, "app/live/live/") == inner_keys
    assert_clean(inner.audit(older_than=NOW))
    assert len(list(make_saver(endpoint, index_mode, prefix=LegacyPrefix("app/live")).list(config("t1")))) == 3


def test_values_read_from_an_expired_ancestor_are_kept(endpoint, index_mode) -> None:
    """With a ttl, a child's unchanged value may live in an ancestor's checkpoint
    object whose own entry expired first: that object is not garbage."""
    day = 86_400
    saver = make_saver(endpoint, index_mode, ttl=timedelta(days=30))
    saver.setup()
    start = int(time.time())
    clock = {"now": start}
    saver._ctx.now = lambda: clock["now"]
    first = saver.put(config("t"), checkpoint({"doc": "D", "n": 0}, {"doc": "1", "n": "1"}), {}, {"doc": "1", "n": "1"})
    clock["now"] = start + 10 * day
    second = saver.put(first, checkpoint({"doc": "D", "n": 1}, {"doc": "1", "n": "2"}), {}, {"n": "2"})
    clock["now"] = start + 31 * day  # the first checkpoint's entry has expired, the second's lives
    first_key = next(k for k in keys(endpoint, "live/t/") if first["configurable"]["checkpoint_id"] in k)
    report = saver.collect_garbage(older_than=NOW)
    assert first_key not in report.deleted and report.missing == []
    assert first_key in keys(endpoint, "live/t/")
    reader = make_saver(endpoint, index_mode, ttl=timedelta(days=30))
    reader._ctx.now = lambda: clock["now"]
    got = reader.get_tuple(config("t"))
    assert got.checkpoint["id"] == second["configurable"]["checkpoint_id"]
    assert got.checkpoint["channel_values"] == {"doc": "D", "n": 1}


def test_a_write_reusing_an_old_orphan_and_committing_during_gc_keeps_it(endpoint, index_mode, monkeypatch) -> None:
    """A retried write finds its object stored already (same bytes: a success) and
    commits while the collector is between its audit and its deletes: the index is
    read again before each thread's delete, so the object stays."""
    good = make_saver(endpoint, index_mode)
    good.setup()
    first = good.put(config("t"), checkpoint({"a": 1}, {"a": "1"}), {"step": 0}, {"a": "1"})
    cp2 = checkpoint({"a": 2}, {"a": "2"})
    # Objects written, then the process dies before its commit (the index write).
    crashed = make_saver(endpoint, index_mode)

    def die(*args, **kwargs):
        raise ConnectionError("the Lambda timed out before its commit")
        yield  # a generator operation, as the index's own

    monkeypatch.setattr(crashed._ctx.index, "commit_checkpoint", die)
    with pytest.raises(ConnectionError):
        crashed.put(first, cp2, {"step": 1}, {"a": "2"})
    assert any(cp2["id"] in k for k in keys(endpoint, "live/t/"))
    retry = make_saver(endpoint, index_mode)

    def commit_meanwhile(done: int, total: int, size: int) -> None:
        retry.put(first, cp2, {"step": 1}, {"a": "2"})

    report = good.collect_garbage(older_than=NOW, progress=commit_meanwhile)
    assert any(cp2["id"] in k for k in report.garbage)  # the audit took it for garbage...
    assert report.deleted == []  # ...the read again before the delete did not
    assert make_saver(endpoint, index_mode).get_tuple(config("t")).checkpoint["channel_values"] == {"a": 2}
    assert_clean(good.audit(older_than=NOW))


def test_a_thread_neither_indexed_nor_stored_is_absent(saver) -> None:
    grow_thread(saver, "t", 1)
    report = saver.audit(["t", "nobody"])
    assert report.absent == ["nobody"] and report.ok
