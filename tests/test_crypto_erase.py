"""Erase with encryption: the key first, then the rest; a key another process cached
before the erase never seals the thread's new life; a read of what an erase could not
delete raises ``ThreadErasedError``, never garbage; what a lock keeps is reported
crypto-erased. Both index modes, on moto (S3, DynamoDB, KMS).

Several savers stand for several processes: each has its own key cache.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from conftest import BUCKET, TABLE, make_saver
from helpers import checkpoint, config, cut_points
from test_archive_cut import _Cut

from s3_saver import KmsKey, LocalKey, ThreadErasedError
from s3_saver._crypto.envelope import is_sealed, key_id_of
from s3_saver._crypto.records import decode_record
from s3_saver._format.key_codec import encode

KEY_BUCKET = f"{BUCKET}-keys"


def _kms(endpoint: str) -> KmsKey:
    kms = boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1")
    key_id = kms.create_key(Description="s3_saver tests")["KeyMetadata"]["KeyId"]
    kms.create_alias(AliasName="alias/checkpoints", TargetKeyId=key_id)
    return KmsKey("alias/checkpoints")


def _s3() -> Any:
    return boto3.client("s3", endpoint_url=_s3.endpoint, region_name="us-east-1")  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _remember_endpoint(endpoint: str) -> None:
    _s3.endpoint = endpoint  # type: ignore[attr-defined]


def _record(thread: str):
    key = f"t/{encode(thread)}"
    found = _s3().get_object(Bucket=KEY_BUCKET, Key=key)
    return decode_record(found["Body"].read(), found["ETag"], key)


def _live_objects(thread: str) -> dict[str, bytes]:
    s3 = _s3()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"live/{thread}/").get("Contents", [])]
    return {k: s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys}


def _put(saver: Any, thread: str, value: str, driver: str = "sync") -> dict[str, Any]:
    """A checkpoint that starts a run (no parent), with a value in an object of its
    own and one in the checkpoint, and a pending write."""
    cp = checkpoint({"doc": value, "big": value * 40}, {"doc": "1", "big": "1"})
    args = (config(thread), cp, {"source": "input", "step": -1}, {"doc": "1", "big": "1"})
    write = [("doc", f"{value}-write")]
    if driver == "async":

        async def go() -> dict[str, Any]:
            stored = await saver.aput(*args)
            await saver.aput_writes(stored, write, "task-1")
            return stored

        return asyncio.run(go())
    stored = saver.put(*args)
    saver.put_writes(stored, write, "task-1")
    return stored


def _get(saver: Any, thread: str, driver: str = "sync") -> Any:
    if driver == "async":
        return asyncio.run(saver.aget_tuple(config(thread)))
    return saver.get_tuple(config(thread))


def _value(found: Any) -> tuple[str, list[Any]]:
    return found.checkpoint["channel_values"]["doc"], [w[2] for w in found.pending_writes]


# -- a key cached before another process's erase ---------------------------------------------
@pytest.mark.parametrize(
    "first, driver", [("stale", "sync"), ("other", "async")], ids=["stale-writes-first", "other-writes-first"]
)
def test_a_key_cached_before_another_process_erased_the_thread_never_seals_its_new_life(
    endpoint, index_mode, first, driver
) -> None:
    """Process A cached thread t's key; process B erases t. Whoever starts t's new life,
    A's writes are sealed under the new life's key (its commit under the old one is
    refused: the erase recorded that key destroyed), and A reads the new life (its
    cached key met another: the key record is read again), never as foreign or erased."""
    encryption = _kms(endpoint) if first == "stale" else LocalKey(os.urandom(32))
    a, b = (make_saver(endpoint, index_mode, encryption=encryption) for _ in range(2))
    a.setup()
    _put(a, "t", "old-life", driver)
    assert _value(_get(a, "t", driver)) == ("old-life", ["old-life-write"])
    old = _record("t").key_id

    report = b.erase_thread("t")
    assert report.key_destroyed_at is not None and not _record("t").live and _record("t").settled
    assert _get(a, "t", driver) is None  # gone for A too: the index says so

    if first == "other":
        c = make_saver(endpoint, index_mode, encryption=encryption)
        _put(c, "t", "from-c")
        assert _record("t").live and _record("t").key_id != old
        # A's cached key meets the new life's: the record is read again, the read runs again.
        assert _value(_get(a, "t", driver)) == ("from-c", ["from-c-write"])
        c.close()

    # A starts a run afresh on t, with the key it cached before the erase (or, having
    # read C's checkpoint, the new one): sealed under the live key, read by others.
    stored = _put(a, "t", "from-a", driver)
    live = _record("t")
    assert live.live and live.key_id != old
    for key, body in _live_objects("t").items():
        assert is_sealed(body) and key_id_of(body) == live.key_id, key
    d = make_saver(endpoint, index_mode, encryption=encryption)
    assert _value(_get(d, "t")) == ("from-a", ["from-a-write"])
    # A's next write is the steady state's: its cache holds the live key now.
    a.stats.reset()
    a.put_writes(stored, [("doc", "again")], "task-2")
    assert a.stats.total_requests == 2, a.stats.requests
    for s in (a, b, d):
        s.close()


# -- erase: the key first ------------------------------------------------------------------------
def _erased_read(saver: Any, thread: str, driver: str = "sync") -> ThreadErasedError:
    with pytest.raises(ThreadErasedError) as found:
        _get(saver, thread, driver)
    return found.value


def test_an_erase_cut_after_it_destroyed_the_key_leaves_nothing_readable_and_finishes_when_called_again(
    endpoint, index_mode, monkeypatch
) -> None:
    encryption = LocalKey(os.urandom(32))
    writer = make_saver(endpoint, index_mode, encryption=encryption)
    writer.setup()
    _put(writer, "t", "doomed")
    _put(writer, "kept", "kept")
    # The erase's first two round trips destroy the key (read its record, replace it by
    # its erasure); cut after them, the index and the objects are all still there.
    cut_short = make_saver(endpoint, index_mode, encryption=encryption)
    with monkeypatch.context() as patch:
        cutter = _Cut(patch, 2)
        with pytest.raises(ConnectionError):
            cut_short.erase_thread("t")
        assert cutter.fired
    record = _record("t")
    assert not record.live and not record.settled and record.wrapped is None
    # Every copy is unreadable from then on: a named error, naming the thread, the
    # bucket and when the key was destroyed; never garbage.
    reader = make_saver(endpoint, index_mode, encryption=encryption)
    for driver in ("sync", "async"):
        found = _erased_read(reader, "t", driver)
        assert (found.thread_id, found.bucket, found.erased_at) == ("t", BUCKET, record.erased_at)
        assert "'t'" in str(found) and BUCKET in str(found) and str(record.erased_at) in str(found)
    with pytest.raises(ThreadErasedError):
        list(reader.list(config("t")))
    assert _value(_get(reader, "kept")) == ("kept", ["kept-write"])
    # No new life while the erase is unfinished: a key made now could seal what the
    # erase is about to delete.
    with pytest.raises(ThreadErasedError, match="is being erased"):
        _put(reader, "t", "too-early")

    report = make_saver(endpoint, index_mode, encryption=encryption).erase_thread("t")
    assert report.complete and report.unreadable
    assert report.key_destroyed_at == datetime.fromtimestamp(record.erased_at, UTC)
    assert any("key" in r for r in report.records)
    assert _record("t").settled and _record("t").key_id == record.key_id
    assert _live_objects("t") == {}
    # Now a new life begins, under a new key.
    _put(reader, "t", "new-life")
    assert _record("t").live and _record("t").key_id != record.key_id
    assert _value(_get(make_saver(endpoint, index_mode, encryption=encryption), "t")) == ("new-life", ["new-life-write"])
    assert _value(_get(reader, "kept")) == ("kept", ["kept-write"])
    for s in (writer, cut_short, reader):
        s.close()


def test_an_encrypted_erase_cut_after_any_round_trip_finishes_when_called_again(endpoint, index_mode, monkeypatch) -> None:
    import urllib.request

    from conftest import make_versioned

    encryption = LocalKey(os.urandom(32))

    def fresh_bucket() -> Any:
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")).close()
        make_versioned(endpoint)
        writer = make_saver(endpoint, index_mode, encryption=encryption)
        writer.setup()
        _put(writer, "t", "doomed")
        _put(writer, "kept", "kept")
        return writer

    writer = fresh_bucket()
    counter = make_saver(endpoint, index_mode, encryption=encryption)
    counter.erase_thread("t")
    total = counter.stats.round_trips
    for cut in cut_points(total, most=5):
        writer = fresh_bucket()
        cut_short = make_saver(endpoint, index_mode, encryption=encryption)
        with monkeypatch.context() as patch:
            cutter = _Cut(patch, cut)
            with pytest.raises(ConnectionError):
                cut_short.erase_thread("t")
            assert cutter.fired
        # Between the cut and the call again, a read returns the thread or none of it, or
        # says it is erased: never garbage, never a foreign or corrupt object.
        reader = make_saver(endpoint, index_mode, encryption=encryption)
        try:
            found = _get(reader, "t")
            assert found is None or _value(found) == ("doomed", ["doomed-write"]), cut
        except ThreadErasedError:
            pass
        report = make_saver(endpoint, index_mode, encryption=encryption).erase_thread("t")
        assert report.complete and report.key_destroyed_at is not None, (cut, report.remaining)
        assert not _record("t").live and _record("t").settled, cut
        assert _get(reader, "t") is None and _value(_get(reader, "kept")) == ("kept", ["kept-write"]), cut
        _put(reader, "t", "again")
        assert _value(_get(make_saver(endpoint, index_mode, encryption=encryption), "t"))[0] == "again", cut
        for s in (writer, cut_short, reader):
            s.close()


def test_what_a_lock_keeps_is_reported_crypto_erased_by_its_bytes(endpoint, index_mode) -> None:
    s3 = _s3()
    s3.create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)
    saver = make_saver(endpoint, index_mode, encryption=_kms(endpoint))
    saver.setup()
    _put(saver, "t", "locked")
    live = sorted(_live_objects("t"))
    until = datetime.now(UTC).replace(microsecond=0) + timedelta(days=30)
    retained, held = live[0], live[-1]
    s3.put_object_retention(Bucket=BUCKET, Key=retained, Retention={"Mode": "GOVERNANCE", "RetainUntilDate": until})
    s3.put_object_legal_hold(Bucket=BUCKET, Key=held, LegalHold={"Status": "ON"})
    # A plaintext version put by hand over a thread object, and held: the erase reads
    # its bytes and does not call it crypto-erased.
    planted = s3.put_object(Bucket=BUCKET, Key=held, Body=b"\x81\xa1aplaintext")["VersionId"]
    s3.put_object_legal_hold(Bucket=BUCKET, Key=held, VersionId=planted, LegalHold={"Status": "ON"})

    report = saver.erase_thread("t")
    assert not report.complete and not report.unreadable
    by_version = {r.version_id: r for r in report.remaining}
    assert {r.key for r in report.remaining} == {retained, held}, report.remaining
    plain = by_version.pop(planted)
    assert plain.reason == "object lock" and not plain.crypto_erased and plain.key_destroyed_at is None
    assert len(by_version) == 2
    for r in by_version.values():
        assert r.reason == "object lock" and r.crypto_erased and r.key_destroyed_at == report.key_destroyed_at
    assert report.key_destroyed_at is not None
    assert abs(report.key_destroyed_at - datetime.now(UTC)) < timedelta(minutes=5)
    saver.close()


# -- restored from history ----------------------------------------------------------------------
def _backup(index_mode: str) -> tuple[list[tuple[str, bytes]], list[dict[str, Any]]]:
    """What a backup of the bucket and the table holds: every version of every object
    (oldest first per key) and every table item. The key store is not in it."""
    s3 = _s3()
    versions: dict[str, list[bytes]] = {}
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=BUCKET):
        for v in page.get("Versions", []):  # newest first, per key
            body = s3.get_object(Bucket=BUCKET, Key=v["Key"], VersionId=v["VersionId"])["Body"].read()
            versions.setdefault(v["Key"], []).append(body)
    objects = [(key, body) for key, bodies in versions.items() for body in reversed(bodies)]
    items: list[dict[str, Any]] = []
    if index_mode == "dynamodb":
        ddb = boto3.client("dynamodb", endpoint_url=_s3.endpoint, region_name="us-east-1")  # type: ignore[attr-defined]
        for page in ddb.get_paginator("scan").paginate(TableName=TABLE):
            items += page["Items"]
    return objects, items


def _restore(objects: list[tuple[str, bytes]], items: list[dict[str, Any]]) -> None:
    """Every old version made current again (oldest first: a key's newest version ends
    current), every item put back as it was: a restore of the bucket and a point-in-time
    restore of the table to before the erase."""
    s3 = _s3()
    for key, body in objects:
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    if items:
        ddb = boto3.client("dynamodb", endpoint_url=_s3.endpoint, region_name="us-east-1")  # type: ignore[attr-defined]
        for item in items:
            ddb.put_item(TableName=TABLE, Item=item)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_erased_thread_stays_unreadable_when_the_bucket_and_the_index_are_restored_from_history(
    endpoint, index_mode, driver
) -> None:
    """Object Lock (so a versioned bucket): a graph's thread with several turns, pending
    writes and a list stored as deltas; erase; then every old version of every object is
    made current again and every index item put back as it was before the erase. The
    thread reads as erased (named error, the destruction time), never as its content;
    the other thread reads as before."""
    from test_encryption import _graph, _run

    _s3().create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)
    encryption = _kms(endpoint) if driver == "sync" else LocalKey(os.urandom(32))
    saver = make_saver(endpoint, index_mode, encryption=encryption)
    saver.setup()
    secret = "erase-me-7f3a"
    _run(_graph(saver, secret), secret, "t", driver, 3)
    _run(_graph(saver, "kept"), "kept", "kept", driver, 1)
    kept = [(s.config, s.checkpoint, s.metadata) for s in saver.list(config("kept"))]
    # A version a lock keeps too: the erase cannot delete it.
    live = sorted(_live_objects("t"))
    until = datetime.now(UTC).replace(microsecond=0) + timedelta(days=30)
    _s3().put_object_retention(Bucket=BUCKET, Key=live[0], Retention={"Mode": "GOVERNANCE", "RetainUntilDate": until})
    backup = _backup(index_mode)
    assert any(key.startswith("live/t/") for key, _ in backup[0])

    report = saver.erase_thread("t")
    assert report.unreadable and [r.key for r in report.remaining] == [live[0]], report.remaining
    destroyed = _record("t")
    assert not destroyed.live and destroyed.settled
    _restore(*backup)

    # The erasing process, another process, and each read the thread allows.
    for reader in (saver, make_saver(endpoint, index_mode, encryption=encryption)):
        found = _erased_read(reader, "t", driver)
        assert (found.thread_id, found.bucket, found.erased_at) == ("t", BUCKET, destroyed.erased_at)
        with pytest.raises(ThreadErasedError):
            list(reader.list(config("t")))
        with pytest.raises(ThreadErasedError):
            list(reader.list(config("t"), filter={"source": "loop"}))
        assert [(s.config, s.checkpoint, s.metadata) for s in reader.list(config("kept"))] == kept
    # Every restored byte of the thread is encrypted under the destroyed key (or names no
    # content): nothing opens it.
    for key, body in _live_objects("t").items():
        assert is_sealed(body) and key_id_of(body) == destroyed.key_id, key
    saver.close()


def test_the_same_restore_brings_back_a_thread_erased_without_encryption(endpoint, index_mode) -> None:
    """The control: the restore above does bring a thread back (so the test above can
    fail): without encryption, the erased thread reads as it was."""
    from conftest import make_versioned

    make_versioned(endpoint)
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    _put(saver, "t", "comes-back")
    backup = _backup(index_mode)
    assert saver.erase_thread("t").complete
    _restore(*backup)
    assert _value(_get(make_saver(endpoint, index_mode), "t")) == ("comes-back", ["comes-back-write"])
    saver.close()
