"""rebuild_index with encryption: the index lost, rebuilt from the bucket with each
thread's key read from the key store. Every read equals what it was; the rebuilt index
holds no plaintext (its bodies and metadata sealed as a write seals them); an erased
thread, a thread with no key and a plaintext thread are left out and named, never
indexed. Both index modes, both drivers, on moto (S3, DynamoDB, KMS).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

import boto3
import pytest
from conftest import BUCKET, make_saver, make_versioned
from helpers import cut_points
from test_archive_cut import _Cut
from test_encryption import _graph, _kms, _leaks, _run
from test_rebuild import _lose_the_index

from s3_saver import LocalKey, Rebuilt
from s3_saver._format.key_codec import encode

KEY_BUCKET = f"{BUCKET}-keys"


def _history(saver: Any, thread: str) -> list[Any]:
    """get_state_history as a graph shows it (every namespace's checkpoints too)."""
    cfg = {"configurable": {"thread_id": thread}}
    graph = _graph(saver, "unused")
    return [(s.config, s.values, s.next, s.metadata, s.parent_config, [t.interrupts for t in s.tasks]) for s in graph.get_state_history(cfg)]


def _s3(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _fill(endpoint: str, index_mode: str, encryption: Any, secret: str) -> Any:
    """Three encrypted threads (one erased after it was written), one whose key record is
    lost, and one written by a saver without encryption under the same prefix."""
    writer = make_saver(endpoint, index_mode, encryption=encryption)
    writer.setup()
    for thread in ("a", "b", "erased", "keyless"):
        _run(_graph(writer, f"{secret}{thread}"), f"{secret}{thread}", thread, "sync", 2)
    plain = make_saver(endpoint, index_mode)
    _run(_graph(plain, "plain-text"), "plain-text", "plain", "sync", 1)
    plain.close()
    # The erased thread's objects come back (a bucket restored from a backup taken before the erase).
    s3 = _s3(endpoint)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="live/erased/")
    kept = {o["Key"]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for p in pages for o in p.get("Contents", [])}
    assert kept
    assert make_saver(endpoint, index_mode, encryption=encryption).erase_thread("erased").key_destroyed_at is not None
    for key, body in kept.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    # The key record of "keyless" is lost (a key store that is not the thread's).
    s3.delete_object(Bucket=KEY_BUCKET, Key=f"t/{encode('keyless')}")
    return writer


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_rebuilt_encrypted_index_reads_as_before_and_holds_no_plaintext(endpoint, index_mode, driver) -> None:
    make_versioned(endpoint)
    encryption = _kms(endpoint) if driver == "sync" else LocalKey(os.urandom(32))
    secret = f"secret{uuid.uuid4().hex[:10]}"
    writer = _fill(endpoint, index_mode, encryption, secret)
    before = {t: _history(make_saver(endpoint, index_mode, encryption=encryption), t) for t in ("a", "b")}
    assert all(len(h) >= 5 for h in before.values())
    _lose_the_index(endpoint, index_mode)
    assert make_saver(endpoint, index_mode, encryption=encryption).get_tuple({"configurable": {"thread_id": "a"}}) is None

    # A process that held keys before (its cache) reads every record again: "erased" too.
    admin = make_saver(endpoint, index_mode, encryption=encryption)
    rebuilt = asyncio.run(admin.arebuild_index()) if driver == "async" else admin.rebuild_index()
    assert isinstance(rebuilt, Rebuilt)
    assert rebuilt == sum(len(h) for h in before.values())
    reasons = {u.thread_id: u.reason for u in rebuilt.unindexed}
    assert reasons == {"erased": "erased", "keyless": "no_key", "plain": "plaintext"}, rebuilt.unindexed
    erased = next(u for u in rebuilt.unindexed if u.thread_id == "erased")
    assert erased.key_destroyed_at is not None and all(k.startswith("live/erased/") for k in erased.keys)

    reader = make_saver(endpoint, index_mode, encryption=encryption)
    assert {t: _history(reader, t) for t in ("a", "b")} == before
    for thread in ("erased", "keyless", "plain"):
        assert reader.get_tuple({"configurable": {"thread_id": thread}}) is None, thread
    assert sorted(t.thread_id for t in reader.list_threads()) == ["a", "b"]
    # Nothing of the encrypted threads in the clear, in the rebuilt index or anywhere else.
    for thread in ("a", "b", "erased", "keyless"):
        assert _leaks(endpoint, f"{secret}{thread}") == [], thread
    # The thread goes on from the rebuilt index.
    _run(_graph(reader, f"{secret}a"), f"{secret}a", "a", "sync", 1)
    assert len(_history(make_saver(endpoint, index_mode, encryption=encryption), "a")) > len(before["a"])
    writer.close()


@pytest.mark.parametrize("kind", ["kms", "local"])
def test_a_rebuild_reads_each_batch_of_keys_beside_its_first_reads(endpoint, index_mode, kind) -> None:
    """Requests against the same rebuild without encryption (another prefix): one key
    GET per thread, in the wave of the first thread's object reads; with KMS one
    Decrypt per thread, in one more round trip."""
    encryption = _kms(endpoint) if kind == "kms" else LocalKey(os.urandom(32))
    counts = {}
    for name, kwargs in (("sealed", {"encryption": encryption, "prefix": "sealed/"}), ("plain", {"prefix": "plain/"})):
        writer = make_saver(endpoint, index_mode, **kwargs)
        writer.setup()
        for thread in ("a", "b", "c"):
            _run(_graph(writer, "v"), "v", thread, "sync", 1)
        writer.close()
    _lose_the_index(endpoint, index_mode)
    if index_mode == "manifest":
        # The whole index of each prefix: its heads, and its listing objects too. A listing
        # object kept would be met again by the rebuild's (one more GET, in a wave of its
        # own, to compare) only when the thread's first write and its oldest object fell in
        # the same second: 17 or 18 round trips by the clock, in either prefix.
        for prefix in ("sealed/", "plain/"):
            s3 = _s3(endpoint)
            for folder in ("manifests/", "listing/"):
                for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{prefix}{folder}"):
                    for obj in page.get("Contents", []):
                        s3.delete_object(Bucket=BUCKET, Key=obj["Key"])
    for name, kwargs in (("sealed", {"encryption": encryption, "prefix": "sealed/"}), ("plain", {"prefix": "plain/"})):
        admin = make_saver(endpoint, index_mode, **kwargs)
        found = admin.rebuild_index()
        # First sends: a timeout under load sends a call again, a request and a round
        # trip the rebuild did not ask for.
        sent = admin.stats.first_sends()
        counts[name] = (int(found), sent.round_trips, sent.requests)
        admin.close()
    (sealed_n, sealed_rt, sealed_req), (plain_n, plain_rt, plain_req) = counts["sealed"], counts["plain"]
    assert sealed_n == plain_n > 0
    # KMS adds its Decrypt round trip; the key GETs ride in waves the rebuild sends anyway.
    assert sealed_rt - plain_rt == (1 if kind == "kms" else 0), (sealed_rt, plain_rt)
    expected = {("s3", "get_object"): 3, ("kms", "decrypt"): 3} if kind == "kms" else {("s3", "get_object"): 3}
    assert dict(sealed_req - plain_req) == expected
    assert not (plain_req - sealed_req)


def test_a_rebuild_cut_after_any_round_trip_finishes_when_run_again(endpoint, index_mode, monkeypatch) -> None:
    encryption = LocalKey(os.urandom(32))
    writer = make_saver(endpoint, index_mode, encryption=encryption)
    writer.setup()
    for thread in ("a", "b"):
        _run(_graph(writer, f"cut-{thread}"), f"cut-{thread}", thread, "sync", 1)
    before = {t: _history(make_saver(endpoint, index_mode, encryption=encryption), t) for t in ("a", "b")}
    _lose_the_index(endpoint, index_mode)
    counter = make_saver(endpoint, index_mode, encryption=encryption)
    total = counter.rebuild_index()
    rounds = counter.stats.round_trips
    for cut in cut_points(rounds, most=5):
        _lose_the_index(endpoint, index_mode)
        cut_short = make_saver(endpoint, index_mode, encryption=encryption)
        with monkeypatch.context() as patch:
            cutter = _Cut(patch, cut)
            with pytest.raises(ConnectionError):
                cut_short.rebuild_index()
            assert cutter.fired
        again = make_saver(endpoint, index_mode, encryption=encryption).rebuild_index()
        assert again == total and not again.unindexed, cut
        reader = make_saver(endpoint, index_mode, encryption=encryption)
        assert {t: _history(reader, t) for t in ("a", "b")} == before, cut
    assert _leaks(endpoint, "cut-a") == [] and _leaks(endpoint, "cut-b") == []
    writer.close()


@pytest.mark.parametrize("storage_class", ["GLACIER_IR", "DEEP_ARCHIVE"])
def test_a_rebuild_brings_back_encrypted_archives_and_leaves_an_erased_one_out(endpoint, index_mode, storage_class) -> None:
    """An archived thread's reference comes back from its archive object, opened under the
    thread's key (a cold one judged by the key id its metadata names); the latest
    checkpoint it carries is sealed as archive_thread seals it. An archive of an erased
    thread (put back from a backup) is left out and named."""
    encryption = LocalKey(os.urandom(32))
    writer = make_saver(endpoint, index_mode, encryption=encryption)
    writer.setup()
    secret = f"archived{uuid.uuid4().hex[:8]}"
    for thread in ("cold", "doomed"):
        _run(_graph(writer, f"{secret}{thread}"), f"{secret}{thread}", thread, "sync", 1)
    before = _history(writer, "cold")
    listed = [(t.checkpoint_id, t.ts, t.metadata) for t in writer.list_threads() if t.thread_id == "cold"]
    writer.archive_thread("cold", storage_class=storage_class)
    writer.archive_thread("doomed", storage_class=storage_class)
    s3 = _s3(endpoint)
    (doomed_key,) = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="archive/").get("Contents", []) if "doomed" in o["Key"]]
    # Put back as a backup would (a cold object cannot be read: its metadata is what a rebuild reads).
    metadata = s3.head_object(Bucket=BUCKET, Key=doomed_key).get("Metadata", {})
    body = s3.get_object(Bucket=BUCKET, Key=doomed_key)["Body"].read() if storage_class == "GLACIER_IR" else b"cold"
    assert metadata.get("s3saver-key-id")
    assert writer.erase_thread("doomed").key_destroyed_at is not None
    s3.put_object(Bucket=BUCKET, Key=doomed_key, Body=body, Metadata=metadata, StorageClass=storage_class)
    _lose_the_index(endpoint, index_mode)

    rebuilt = make_saver(endpoint, index_mode, encryption=encryption).rebuild_index()
    assert [(u.thread_id, u.reason, u.keys) for u in rebuilt.unindexed] == [("doomed", "erased", (doomed_key,))]
    fresh = make_saver(endpoint, index_mode, encryption=encryption)
    if storage_class == "GLACIER_IR":
        assert {t.thread_id: t.archived for t in fresh.list_threads()} == {"cold": storage_class}
        assert rebuilt == len(before)
        assert [(t.checkpoint_id, t.ts, t.metadata) for t in fresh.list_threads()] == listed
        assert _history(fresh, "cold") == before
    else:
        assert rebuilt == 0  # the cold archive is not read
        while fresh.restore_thread("cold").state != "live":
            pass  # moto restores at once: the second call finds it restored
        assert _history(fresh, "cold") == before
    if storage_class == "GLACIER_IR":  # (a DEEP_ARCHIVE object cannot be read to scan)
        assert _leaks(endpoint, f"{secret}cold") == [] and _leaks(endpoint, f"{secret}doomed") == []
    writer.close()
