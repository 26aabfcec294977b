"""Round trips and requests per call, counted by the saver's drivers (deterministic).

The design's budget: put, put_writes and get_tuple in at most 2 round trips, and
requests that do not grow with the thread's length; no ListObjects anywhere.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import BUCKET, make_saver
from helpers import checkpoint, config, grow_thread
from s3_saver._format.keys import checkpoint_sort_key


def _counts(saver):
    snap = saver.stats.snapshot()
    saver.stats.reset()
    return snap.round_trips, dict(snap.requests)


def _no_listing(requests: dict) -> None:
    assert not [op for op in requests if "list" in op[1]], requests


def _measure(saver, thread_id: str, length: int) -> dict[str, tuple[int, dict]]:
    last = grow_thread(saver, thread_id, length)
    saver.stats.reset()
    out = {}
    saver.get_tuple(config(thread_id))
    out["get_tuple latest"] = _counts(saver)
    saver.get_tuple(last)
    out["get_tuple by id"] = _counts(saver)
    saver.put_writes(last, [("counter", 1), ("__interrupt__", "why")], "task-1", "path")
    out["put_writes"] = _counts(saver)
    version = saver.get_next_version(last_version(saver, last), None)
    saver.stats.reset()
    saver.put(
        last,
        checkpoint({"counter": -1, "doc": "a document"}, {"counter": version, "doc": "1"}),
        {"source": "loop", "step": length},
        {"counter": version},
    )
    out["put"] = _counts(saver)
    list(saver.list(config(thread_id), limit=5))
    out["list limit=5"] = _counts(saver)
    return out


def last_version(saver, cfg):
    return saver.get_tuple(cfg).checkpoint["channel_versions"]["counter"]


def test_budget_holds_and_does_not_grow_with_thread_length(saver, index_mode) -> None:
    single = _measure(saver, "single", 1)
    # In manifest mode a thread of 2 has every checkpoint in its head; one of 120
    # has its oldest sealed in segments, like one of 300: compare those.
    short = _measure(saver, "short", 2 if index_mode == "dynamodb" else 120)
    long = _measure(saver, "long", 300)
    for call in ("get_tuple latest", "get_tuple by id", "put_writes", "put"):
        round_trips, requests = long[call]
        assert round_trips <= 2, (call, long[call])
        _no_listing(requests)
        assert long[call] == short[call], (call, short[call], long[call])
        # A one-checkpoint thread holds every value in its newest entry: the
        # lookup of older holders of unchanged channels is skipped.
        assert single[call][0] <= 2
        assert sum(single[call][1].values()) <= sum(long[call][1].values())
    # list(limit=k) reads a bounded page of the index, whatever the length.
    assert long["list limit=5"][0] <= 2
    _no_listing(long["list limit=5"][1])
    # DynamoDB items carry the checkpoints; the manifest's head carries only each
    # namespace's newest one whole, the others are GETs (in one wave): requests
    # grow with the limit, never with the thread.
    # (DynamoDB: the page, the thread's record beside it, the holder of the unchanged channel.)
    assert sum(long["list limit=5"][1].values()) <= (3 if index_mode == "dynamodb" else 2 + 2 * 5)


# Per index mode, what each call sends (round trips, requests), on a thread of 10.
EXACT_COSTS = {
    "dynamodb": {
        # The object, then the item and its link (for the delta walk) in one
        # transaction, fenced on the thread's record at the generation the parent
        # carries (a deleted thread stays deleted: nothing is read first, issue 23)
        # and on the parent's item.
        "put": (2, {("s3", "put_object"): 1, ("dynamodb", "transact_write_items"): 1}),
        # A regular write and a special channel's: two parts, two objects, one transaction.
        "put_writes": (2, {("s3", "put_object"): 2, ("dynamodb", "transact_write_items"): 1}),
        # The newest item beside the thread's record, then its writes and the item that
        # holds the unchanged channel.
        "get_tuple latest": (2, {("dynamodb", "query"): 2, ("dynamodb", "get_item"): 1, ("dynamodb", "batch_get_item"): 1}),
        # The item, its writes and the thread's record; then the unchanged channel's holder.
        "get_tuple by id": (
            2,
            {("dynamodb", "get_item"): 2, ("dynamodb", "query"): 1, ("dynamodb", "batch_get_item"): 1},
        ),
        "list limit=5": (1, {("dynamodb", "query"): 1, ("dynamodb", "get_item"): 1}),
    },
    "manifest": {
        # The objects, then the head's compare-and-swap on the ETag this process
        # wrote last (no read of the head: issue 23's floor).
        "put": (2, {("s3", "put_object"): 2}),
        "put_writes": (2, {("s3", "put_object"): 3}),
        # The head carries the newest checkpoint whole, its writes and the checkpoint
        # holding the unchanged channel: one GET.
        "get_tuple latest": (1, {("s3", "get_object"): 1}),
        "get_tuple by id": (1, {("s3", "get_object"): 1}),
        # The head lists them and carries the bodies of the older ones too, in its
        # frame (manifest_bodies): one GET.
        "list limit=5": (1, {("s3", "get_object"): 1}),
    },
}


def test_exact_costs(saver, index_mode) -> None:
    counts = _measure(saver, "t", 10)
    assert counts == EXACT_COSTS[index_mode]


def test_full_history_reads_only_the_index(saver, index_mode) -> None:
    grow_thread(saver, "h", 50)
    saver.stats.reset()
    history = list(saver.list(config("h")))
    round_trips, requests = _counts(saver)
    assert len(history) == 50
    assert [t.checkpoint["channel_values"]["counter"] for t in history] == list(range(49, -1, -1))
    if index_mode == "dynamodb":
        # Query pages, and the thread's record beside the first.
        assert requests == {("dynamodb", "query"): round_trips, ("dynamodb", "get_item"): 1}
        assert round_trips <= 2
    else:
        # The head and the sealed segment: they carry every body (manifest_bodies),
        # and the head pins the body of the sealed first checkpoint, whose object
        # holds the unchanged channel every page reads (Head.pinned).
        assert requests == {("s3", "get_object"): 2}, requests
        assert round_trips == 2


@pytest.mark.parametrize("length", [1, 40])
def test_cold_process_put_stays_within_two_round_trips(endpoint, saver, index_mode, length) -> None:
    last = grow_thread(saver, "cold", length)
    fresh = make_saver(endpoint, index_mode)  # a new process: empty caches
    version = fresh.get_next_version(None, None)
    fresh.put(
        last,
        checkpoint({"counter": 99, "doc": "a document"}, {"counter": version, "doc": "1"}),
        {"source": "loop", "step": length},
        {"counter": version},
    )
    round_trips, requests = _counts(fresh)
    assert round_trips == 2
    if index_mode == "dynamodb":
        # The parent's item and the thread's record, beside the object write;
        # a new process also reads the table's owner (see _owner) and the
        # prefix's index-mode marker (see _mode) there, once.
        assert requests == {
            ("s3", "put_object"): 1, ("s3", "get_object"): 1, ("dynamodb", "get_item"): 3, ("dynamodb", "transact_write_items"): 1
        }
    else:
        # The parent is in the head. The thread's activity entry of the day (``_index/activity``)
        # goes beside the objects: a process without the head cannot know it is there.
        # A new process reads the prefix's index-mode marker there too, once (see _mode).
        assert requests == {("s3", "put_object"): 3, ("s3", "get_object"): 2}
    got = fresh.get_tuple(config("cold"))
    assert got.checkpoint["channel_values"] == {"counter": 99, "doc": "a document"}
    fresh.close()


async def test_async_driver_counts_the_same(saver, index_mode) -> None:
    last = grow_thread(saver, "a", 5)
    saver.stats.reset()
    await saver.aget_tuple(config("a"))
    latest = _counts(saver)
    await saver.aget_tuple(last)
    by_id = _counts(saver)
    await saver.aclose()
    costs = EXACT_COSTS[index_mode]
    assert (latest[0], by_id[0]) == (costs["get_tuple latest"][0], costs["get_tuple by id"][0])


def test_writes_before_their_checkpoint(saver, index_mode) -> None:
    """Writes for a checkpoint not stored yet: latest skips them (in DynamoDB they sort
    above the newest item, which costs one more Query)."""
    from langgraph.checkpoint.base.id import uuid6

    last = grow_thread(saver, "early", 3)
    future_id = str(uuid6(clock_seq=-1))
    saver.put_writes(config("early", checkpoint_id=future_id), [("counter", 7)], "task-early")
    saver.stats.reset()
    latest = saver.get_tuple(config("early"))
    round_trips, _ = _counts(saver)
    assert latest.config == last
    assert latest.pending_writes == []
    assert round_trips == (3 if index_mode == "dynamodb" else 1)
    assert [t.config for t in saver.list(config("early"))][0] == last

    version = saver.get_next_version(last_version(saver, last), None)
    saver.put(
        last,
        checkpoint({"counter": 3, "doc": "a document"}, {"counter": version, "doc": "1"}, future_id),
        {"source": "loop", "step": 3},
        {"counter": version},
    )
    now_latest = saver.get_tuple(config("early"))
    assert now_latest.config["configurable"]["checkpoint_id"] == future_id
    assert [w[1:] for w in now_latest.pending_writes] == [("counter", 7)]


def test_list_before_across_namespaces_reads_few_pages(saver) -> None:
    """list(before=) without a namespace: a few pages (Query pages or head and segments)."""
    last = grow_thread(saver, "ns-before", 120)
    grow_thread(saver, "ns-before", 30, ns="child:1")
    middle = list(saver.list(config("ns-before")))[60].config
    saver.stats.reset()
    got = list(saver.list({"configurable": {"thread_id": "ns-before"}}, before=middle, limit=3))
    round_trips, requests = _counts(saver)
    assert [t.checkpoint["channel_values"]["counter"] for t in got] == [58, 57, 56]
    # (DynamoDB: the thread's record is read beside the first page.)
    assert round_trips <= 4 and sum(requests.values()) <= 5, requests
    assert last["configurable"]["checkpoint_ns"] == ""


def test_source_item_not_visible_falls_back_to_its_object(endpoint, dynamo_saver) -> None:
    """BatchGetItem reads older items eventually consistently; one it misses is read from S3."""
    import boto3

    from conftest import TABLE

    grow_thread(dynamo_saver, "fallback", 3)
    first = list(dynamo_saver.list(config("fallback")))[-1].config["configurable"]["checkpoint_id"]
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    ddb.delete_item(TableName=TABLE, Key={"pk": {"S": "fallback"}, "sk": {"S": checkpoint_sort_key("", first)}})
    fresh = make_saver(endpoint)
    got = fresh.get_tuple(config("fallback"))
    round_trips, requests = _counts(fresh)
    assert got.checkpoint["channel_values"] == {"counter": 2, "doc": "a document"}
    # The item's object, and (beside the first wave, once per process) the index-mode marker.
    assert round_trips == 3 and requests[("s3", "get_object")] == 2
    fresh.close()


def test_dynamodb_commit_checks_the_record_and_the_parents_link_not_its_body(endpoint, monkeypatch) -> None:
    """A transaction bills each check by the size of the item it reads: the commit of
    a checkpoint that carries values from its parent checks the parent's link item
    (no body), beside the thread's record, and reads nothing before it."""
    from s3_saver._transport.sync import SyncDriver
    from s3_saver._format.keys import link_sort_key

    saver = make_saver(endpoint, "dynamodb")
    saver.setup()
    last = grow_thread(saver, "t", 3)
    version = saver.get_next_version(last_version(saver, last), None)
    sent: list = []
    real = SyncDriver._wave

    def wave(driver, calls):
        sent.extend(calls)
        return real(driver, calls)

    monkeypatch.setattr(SyncDriver, "_wave", wave)
    saver.put(last, checkpoint({"counter": -1, "doc": "a document"}, {"counter": version, "doc": "1"}), {}, {"counter": version})
    assert [c.operation for c in sent] == ["put_object", "transact_write_items"]
    checks = [a["ConditionCheck"]["Key"]["sk"]["S"] for a in sent[1].params["TransactItems"] if "ConditionCheck" in a]
    parent = last["configurable"]["checkpoint_id"]
    assert len(checks) == 2 and link_sort_key("", parent) in checks
    assert checkpoint_sort_key("", parent) not in checks
    saver.close()


def test_writes_sent_before_their_checkpoints_put_read_nothing_first(saver, index_mode) -> None:
    """LangGraph sends a step's writes while the put of their checkpoint may still
    be under way: the thread's generation this process knows stands in for the
    checkpoint's, so the writes cost their object and the commit, as in the steady
    state, and the put that follows too."""
    last = grow_thread(saver, "t", 3)
    version = saver.get_next_version(last_version(saver, last), None)
    ahead = checkpoint({"counter": -1, "doc": "a document"}, {"counter": version, "doc": "1"})
    saver.stats.reset()
    saver.put_writes(config("t", checkpoint_id=ahead["id"]), [("counter", 1)], "task-1", "path")
    if index_mode == "dynamodb":
        expected = {("s3", "put_object"): 1, ("dynamodb", "transact_write_items"): 1}
    else:
        expected = {("s3", "put_object"): 2}  # the object, the head's swap
    assert _counts(saver) == (2, expected)
    stored = saver.put(last, ahead, {"source": "loop", "step": 3}, {"counter": version})
    assert _counts(saver) == (2, expected)
    assert saver.get_tuple(stored).pending_writes == [("task-1", "counter", 1)]


def test_manifest_history_reads_sealed_checkpoints_from_their_segments(endpoint, monkeypatch) -> None:
    """A segment carries the bodies of the checkpoints and writes it seals, also
    after another writer's swap made the sealing process read the head back: a
    full history GETs the head, the segments, and the objects of the checkpoints
    still in the head only (the head carries no body but the newest's: each
    write re-uploads it, see ``manifest_doc.encode_head``)."""
    import boto3

    from s3_saver._transport.sync import SyncDriver
    from s3_saver._index.manifest.doc import decode_head

    writer, other = make_saver(endpoint, "manifest"), make_saver(endpoint, "manifest")
    writer.setup()
    stored, version = config("t"), None
    for step in range(130):
        version = writer.get_next_version(version, None)
        versions = {"counter": version, "doc": "1"}
        cp = checkpoint({"counter": step, "doc": "a document"}, versions)
        stored = writer.put(stored, cp, {"source": "loop", "step": step}, {"counter": version} if step else versions)
        writer.put_writes(stored, [("counter", step)], f"task-{step}", "path")
        if step in (30, 80):
            other.put_writes(stored, [("doc", "x")], "other-task", "path")  # the writer's next swap loses
    gets: list[str] = []
    real = SyncDriver._wave

    def wave(driver, calls):
        gets.extend(c.params["Key"] for c in calls if c.operation == "get_object")
        return real(driver, calls)

    reader = make_saver(endpoint, "manifest")
    monkeypatch.setattr(SyncDriver, "_wave", wave)
    history = list(reader.list(config("t")))
    assert len(history) == 130 and history[-1].pending_writes == [("task-0", "counter", 0)]
    objects = [k for k in gets if "/checkpoints/" in k or "/writes/" in k]
    head_key = next(k for k in gets if k.endswith("/head"))
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    head = decode_head("t", s3.get_object(Bucket=BUCKET, Key=head_key)["Body"].read(), head_key, None)
    # The segments carry every body they seal; the first checkpoint holds the
    # unchanged "doc", read before the page that loads its segment.
    unsealed = {e.checkpoint_id for e in head.entries} | {history[-1].checkpoint["id"]}
    assert objects and all(any(f"/{cid}" in k for cid in unsealed) for k in objects), objects
    assert len(objects) <= 2 * len(unsealed), objects  # each one's checkpoint and writes, no more
    assert len([k for k in gets if "/segments/" in k]) >= 2
    for s in (writer, other, reader):
        s.close()


def test_manifest_documents_carry_bodies_compressed_together_and_read_the_formats_before(endpoint, monkeypatch) -> None:
    """A segment's bodies repeat one another (each checkpoint's copy of a growing
    list holds the previous one): one zstd frame over the plain bodies stores a
    fraction of the bodies compressed one by one. A segment in the format before
    (bodies in its rows) reads as before. The head carries no frame and no pinned
    bodies (every write re-uploads it); a head written with them (by an earlier
    version) reads them: a cold read of the latest state is one GET, a history
    reads no checkpoint object; and a thread of such a head and new ones (a new
    writer goes on from it) reads whole."""
    import boto3
    import ormsgpack

    from s3_saver._format.archive import _zstd
    from s3_saver._format.codec import pack, plain, squeeze
    from s3_saver._transport.sync import SyncDriver
    from s3_saver._index.manifest import bodies as manifest_bodies
    from s3_saver._index.manifest.doc import (
        BODY_IN_SEGMENT_MAX,
        HEAD_FORMAT,
        SEGMENT_FORMAT,
        _encode_entries,
        _encode_write,
        decode_segment,
    )

    writer = make_saver(endpoint, "manifest", inline_threshold=64 * 1024)
    writer.setup()
    stored, version, messages = config("t"), None, []
    for step in range(70):
        version = writer.get_next_version(version, None)
        messages = [*messages, f"message {step}: " + " ".join(f"w{(step * 7 + i) % 97}" for i in range(60))]
        cp = checkpoint({"messages": messages}, {"messages": version})
        stored = writer.put(stored, cp, {"source": "loop", "step": step}, {"messages": version})
        writer.put_writes(stored, [("messages", [f"reply {step}"])], f"task-{step}", "path")
    expected = [(t.checkpoint["id"], t.checkpoint["channel_values"], t.pending_writes) for t in writer.list(config("t"))]
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=writer.bucket)["Contents"] if "/segments/" in o["Key"]]
    assert keys
    for key in keys:
        data = client.get_object(Bucket=writer.bucket, Key=key)["Body"].read()
        assert manifest_bodies.FIELD in ormsgpack.unpackb(plain(data, key))
        entries, writes = decode_segment("t", data, key)
        assert all(e.body is not None for e in entries) and all(w.body is not None for w in writes)
        one_by_one = sum(len(squeeze(e.body)) for e in entries) + sum(len(squeeze(w.body)) for w in writes)
        assert len(data) * 3 < one_by_one, (len(data), one_by_one)
        # The same segment as the format before wrote it: bodies in its rows.
        old = pack({
            "format": SEGMENT_FORMAT,
            "entries": _encode_entries([replace(e, body=squeeze(e.body)) for e in entries], BODY_IN_SEGMENT_MAX, None),
            "writes": [_encode_write(replace(w, body=squeeze(w.body)), BODY_IN_SEGMENT_MAX) for w in writes],
        })
        client.put_object(Bucket=writer.bucket, Key=key, Body=old)
    head_key = next(o["Key"] for o in client.list_objects_v2(Bucket=writer.bucket)["Contents"] if o["Key"].endswith("/head"))
    doc = ormsgpack.unpackb(plain(client.get_object(Bucket=writer.bucket, Key=head_key)["Body"].read(), head_key))
    assert doc["format"] == HEAD_FORMAT
    assert manifest_bodies.FIELD not in doc and manifest_bodies.PINNED not in doc
    assert sum(row[6] is not None for row in doc["entries"]) == 1  # the newest checkpoint's body alone
    # The head as the version before wrote it: every body in a frame, and the
    # bodies of sealed checkpoints the newest one reads pinned.
    held = writer._ctx.index._cached("t")
    assert held.pinned and all(e.body is not None for e in held.entries)
    doc[manifest_bodies.FIELD] = manifest_bodies.pack(held.entries, held.writes)
    doc[manifest_bodies.PINNED] = _zstd().ZstdCompressor().compress(
        ormsgpack.packb([[*key, plain(b, "")] for key, b in held.pinned.items()]))
    client.put_object(Bucket=writer.bucket, Key=head_key, Body=pack(doc))
    writer.close()
    reader = make_saver(endpoint, "manifest")
    latest = reader.get_tuple(config("t"))
    assert (latest.checkpoint["id"], latest.checkpoint["channel_values"], latest.pending_writes) == expected[0]
    # The head (its frame and pinned bodies read), and beside it, once per process, the index-mode marker.
    assert _counts(reader) == (1, {("s3", "get_object"): 2})
    gets: list[str] = []
    real = SyncDriver._wave

    def wave(driver, calls):
        gets.extend(c.params["Key"] for c in calls if c.operation == "get_object")
        return real(driver, calls)

    monkeypatch.setattr(SyncDriver, "_wave", wave)
    got = [(t.checkpoint["id"], t.checkpoint["channel_values"], t.pending_writes) for t in reader.list(config("t"))]
    monkeypatch.undo()
    assert got == expected and len(got) == 70
    # The frame carried the bodies of the head's checkpoints: none of their objects is read.
    in_head = [e.checkpoint_id for e in held.entries]
    assert not [k for k in gets if any(cid in k for cid in in_head)], gets
    reader.close()
    # A new writer goes on from that head (it writes its own form), then a cold reader.
    later = make_saver(endpoint, "manifest")
    stored = config("t", checkpoint_id=expected[0][0])
    for step in range(70, 75):
        version = later.get_next_version(version, None)
        messages = [*messages, f"message {step}"]
        stored = later.put(stored, checkpoint({"messages": messages}, {"messages": version}),
                           {"source": "loop", "step": step}, {"messages": version})
    later.close()
    doc = ormsgpack.unpackb(plain(client.get_object(Bucket=BUCKET, Key=head_key)["Body"].read(), head_key))
    assert manifest_bodies.FIELD not in doc and manifest_bodies.PINNED not in doc
    fresh = make_saver(endpoint, "manifest")
    got = [(t.checkpoint["id"], t.checkpoint["channel_values"], t.pending_writes) for t in fresh.list(config("t"))]
    assert got[5:] == expected and len(got) == 75
    assert got[0][1] == {"messages": messages}
    fresh.close()
