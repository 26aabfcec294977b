"""Archives with encryption: the whole archive object sealed under the thread's key, bound
to its own key; read from (get_tuple, list, the thread listing), restored and written to
as without encryption, in both index modes and both drivers, on moto (S3, DynamoDB, KMS).

Every version of every object and every table item is scanned for the strings a graph
wrote (``test_encryption._leaks``: zstd, zlib and msgpack decoded as deep as they go):
none is found, the archive and the index's reference to it included. An archive moved to
another key or thread does not open; what an erase cannot delete of a cold archive is
reported crypto-erased by the key its metadata names. Requests are those of a plaintext
archive, plus the key's read in a process that has not seen the thread.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from conftest import BUCKET, make_saver, make_versioned
from helpers import checkpoint, config, cut_points
from test_archive import _costs
from test_archive_cut import _cut_short
from test_encryption import _graph, _kms, _leaks, _run

from s3_saver import (
    EncryptedObjectError,
    ForeignCiphertextError,
    LocalKey,
    ThreadArchivedError,
    ThreadErasedError,
)
from s3_saver._crypto.envelope import is_sealed, key_id_of
from s3_saver._crypto.records import decode_record
from s3_saver._format.key_codec import encode

KEY_BUCKET = f"{BUCKET}-keys"


def _s3(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _key_id(endpoint: str, thread: str) -> bytes:
    key = f"t/{encode(thread)}"
    found = _s3(endpoint).get_object(Bucket=KEY_BUCKET, Key=key)
    return decode_record(found["Body"].read(), found["ETag"], key).key_id


def _objects(endpoint: str, prefix: str) -> dict[str, bytes]:
    s3 = _s3(endpoint)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for p in pages for o in p.get("Contents", [])}


def _view(saver: Any, thread: str) -> list[Any]:
    return [(t.config, t.checkpoint, t.metadata, t.pending_writes, t.parent_config) for t in saver.list(config(thread))]


def _call(saver: Any, name: str, driver: str, *args: Any, **kwargs: Any) -> Any:
    if driver == "async":
        return asyncio.run(getattr(saver, f"a{name}")(*args, **kwargs))
    return getattr(saver, name)(*args, **kwargs)


# -- archived, read, restored, written to ----------------------------------------------------
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_encrypted_thread_archived_reads_restores_and_takes_writes_as_before(endpoint, index_mode, driver) -> None:
    make_versioned(endpoint)  # every version an archive or a restore replaced is scanned too
    encryption = _kms(endpoint) if driver == "sync" else LocalKey(os.urandom(32))
    saver = make_saver(endpoint, index_mode, encryption=encryption)
    saver.setup()
    secret = f"archived-secret-{driver}"
    _run(_graph(saver, secret), secret, "t", driver, 3)
    _run(_graph(saver, "kept"), "kept", "kept", driver, 1)
    before = _view(saver, "t")
    key_id = _key_id(endpoint, "t")

    status = _call(saver, "archive_thread", driver, "t")
    assert status.state == "archived" and not _objects(endpoint, "live/t/")
    (archive_key, body), = _objects(endpoint, "archive/").items()
    assert archive_key == status.key and is_sealed(body) and key_id_of(body) == key_id
    head = _s3(endpoint).head_object(Bucket=BUCKET, Key=archive_key)
    assert head["Metadata"]["s3saver-key-id"] == key_id.hex()
    assert _leaks(endpoint, secret) == []

    # Another process reads it from its archive: the same checkpoints, and the thread
    # listing shows its latest checkpoint's metadata (sealed in the index's reference).
    reader = make_saver(endpoint, index_mode, encryption=encryption)
    assert _view(reader, "t") == before
    assert _call(reader, "get_tuple", driver, config("t")).checkpoint == before[0][1]
    listed = {i.thread_id: i for i in reader.list_threads()}
    assert listed["t"].archived == "GLACIER_IR" and listed["t"].metadata == before[0][2]
    assert listed["t"].metadata["user_note"] == f"{secret}-meta"

    # Restored by a third process: live objects sealed under the thread's key again.
    restorer = make_saver(endpoint, index_mode, encryption=encryption)
    restored = _call(restorer, "restore_thread", driver, "t")
    assert restored.state == "live" and not _objects(endpoint, "archive/")
    live = _objects(endpoint, "live/t/")
    assert live and all(is_sealed(b) and key_id_of(b) == key_id for b in live.values())
    assert _view(make_saver(endpoint, index_mode, encryption=encryption), "t") == before

    # Archived again, then written to by a graph in another process: restored first.
    saver.archive_thread("t")
    writer = make_saver(endpoint, index_mode, encryption=encryption)
    graph = _graph(writer, secret)
    graph.update_state(config("t"), {"notes": [f"{secret}-late"]})
    assert graph.get_state(config("t")).values["notes"][-1] == f"{secret}-late"
    # (The update wrote its value as a pending write of the checkpoint it updated too.)
    after = _view(writer, "t")
    assert after[2:] == before[1:] and after[1][:3] == before[0][:3] and not _objects(endpoint, "archive/")
    assert all(key_id_of(b) == key_id for b in _objects(endpoint, "live/t/").values())
    assert _leaks(endpoint, secret) == []
    for s in (saver, reader, restorer, writer):
        s.close()


def test_archive_idle_archives_encrypted_threads(endpoint, index_mode) -> None:
    encryption = LocalKey(os.urandom(32))
    saver = make_saver(endpoint, index_mode, encryption=encryption)
    saver.setup()
    old = (datetime.now(UTC) - timedelta(days=2)).isoformat()
    for tid in ("a", "b"):
        cp = checkpoint({"doc": f"idle-{tid}"}, {"doc": "1"})
        cp["ts"] = old
        saver.put(config(tid), cp, {"source": "input", "step": -1}, {"doc": "1"})
    # Another process, with no key cached: it reads them beside the latest checkpoints.
    runner = make_saver(endpoint, index_mode, encryption=encryption)
    report = runner.archive_idle(timedelta(days=1))
    assert sorted(s.thread_id for s in report) == ["a", "b"]
    assert all(is_sealed(b) for b in _objects(endpoint, "archive/").values())
    reader = make_saver(endpoint, index_mode, encryption=encryption)
    assert {t: reader.get_tuple(config(t)).checkpoint["channel_values"]["doc"] for t in "ab"} == {"a": "idle-a", "b": "idle-b"}
    for s in (saver, runner, reader):
        s.close()


# -- cut short --------------------------------------------------------------------------------
def _thread_of(saver: Any, thread: str) -> None:
    """Two checkpoints, a value in an object of its own, pending writes."""
    cp = checkpoint({"doc": f"{thread}-doc", "big": "B" * 5000}, {"doc": "1", "big": "1"})
    stored = saver.put(config(thread), cp, {"source": "input", "step": -1}, {"doc": "1", "big": "1"})
    cp = checkpoint({"doc": f"{thread}-next", "big": "B" * 5000}, {"doc": "2", "big": "1"})
    stored = saver.put(stored, cp, {"source": "loop", "step": 0}, {"doc": "2"})
    saver.put_writes(stored, [("doc", f"{thread}-write")], "task-1")


@pytest.mark.parametrize("step", ["archive", "restore"])
def test_an_encrypted_archive_or_restore_cut_after_any_round_trip_reads_whole_and_completes(
    endpoint, index_mode, monkeypatch, step
) -> None:
    encryption = LocalKey(os.urandom(32))
    writer = make_saver(endpoint, index_mode, encryption=encryption, inline_threshold=1000)
    writer.setup()

    def run(saver: Any, thread: str) -> Any:
        return saver.archive_thread(thread) if step == "archive" else saver.restore_thread(thread)

    def prepared(thread: str) -> list[Any]:
        _thread_of(writer, thread)
        before = _view(make_saver(endpoint, index_mode, encryption=encryption), thread)
        if step == "restore":
            writer.archive_thread(thread)
        return before

    prepared("count")
    counter = make_saver(endpoint, index_mode, encryption=encryption)  # as the cut cases': cold
    run(counter, "count")
    for cut in cut_points(counter.stats.round_trips, most=5):
        thread = f"t{cut}"
        before = prepared(thread)
        cut_short = make_saver(endpoint, index_mode, encryption=encryption)
        _cut_short(monkeypatch, cut, lambda: run(cut_short, thread))
        # Between the cut and the call again, the thread reads whole, from one place.
        assert _view(make_saver(endpoint, index_mode, encryption=encryption), thread) == before, cut
        status = run(cut_short, thread)
        assert status.state == ("archived" if step == "archive" else "live"), cut
        assert _view(make_saver(endpoint, index_mode, encryption=encryption), thread) == before, cut
        stored = _objects(endpoint, f"live/{thread}/") | _objects(endpoint, f"archive/{thread}/")
        assert stored and all(is_sealed(b) for b in stored.values()), cut
        assert len(_objects(endpoint, f"archive/{thread}/")) == (step == "archive"), cut
        cut_short.close()
    writer.close()


def test_a_copy_of_an_archived_encrypted_thread_is_sealed_under_the_target_s_key(endpoint, index_mode) -> None:
    encryption = LocalKey(os.urandom(32))
    saver = make_saver(endpoint, index_mode, encryption=encryption)
    saver.setup()
    _thread_of(saver, "src")
    before = _view(saver, "src")
    saver.archive_thread("src")
    make_saver(endpoint, index_mode, encryption=encryption).copy_thread("src", "dst")
    target = _key_id(endpoint, "dst")
    assert target != _key_id(endpoint, "src")
    copied = _objects(endpoint, "live/dst/")
    assert copied and all(key_id_of(b) == target for b in copied.values())
    reader = make_saver(endpoint, index_mode, encryption=encryption)
    strip = lambda view: [(c, m, w) for _, c, m, w, _ in view]  # noqa: E731 (ids differ)
    assert strip(_view(reader, "dst")) == strip(before) == strip(_view(reader, "src"))
    saver.close()
    reader.close()


# -- bound to its place ----------------------------------------------------------------------------
def _archived(saver: Any, thread: str, value: str) -> str:
    cp = checkpoint({"doc": value}, {"doc": "1"})
    saver.put(config(thread), cp, {"source": "input", "step": -1}, {"doc": "1"})
    return saver.archive_thread(thread).key


def test_an_archive_moved_to_another_key_or_thread_is_refused(endpoint, index_mode) -> None:
    encryption = LocalKey(os.urandom(32))
    saver = make_saver(endpoint, index_mode, encryption=encryption)
    saver.setup()
    s3 = _s3(endpoint)
    key_a, key_b = _archived(saver, "a", "alpha"), _archived(saver, "b", "bravo")
    bytes_a = s3.get_object(Bucket=BUCKET, Key=key_a)["Body"].read()
    bytes_b = s3.get_object(Bucket=BUCKET, Key=key_b)["Body"].read()

    # Thread a's archive where thread b's is: refused for b, by reads and by a restore.
    s3.put_object(Bucket=BUCKET, Key=key_b, Body=bytes_a)
    cold = make_saver(endpoint, index_mode, encryption=encryption)
    with pytest.raises(ForeignCiphertextError) as found:
        cold.get_tuple(config("b"))
    assert (found.value.thread_id, found.value.key, found.value.bucket) == ("b", key_b, BUCKET)
    with pytest.raises(ForeignCiphertextError):
        make_saver(endpoint, index_mode, encryption=encryption).restore_thread("b")
    s3.put_object(Bucket=BUCKET, Key=key_b, Body=bytes_b)
    assert make_saver(endpoint, index_mode, encryption=encryption).get_tuple(config("b")).checkpoint["channel_values"] == {
        "doc": "bravo"
    }

    # Thread a's own archive moved to the key of its next archive (same thread, same
    # data key, another place): refused too.
    saver.restore_thread("a")
    key_again = saver.archive_thread("a").key
    assert key_again != key_a
    s3.put_object(Bucket=BUCKET, Key=key_again, Body=bytes_a)
    with pytest.raises(ForeignCiphertextError, match="does not belong here"):
        make_saver(endpoint, index_mode, encryption=encryption).get_tuple(config("a"))

    # A saver without encryption meets an encrypted archive: it says so.
    with pytest.raises(EncryptedObjectError, match="encryption="):
        make_saver(endpoint, index_mode).get_tuple(config("b"))
    saver.close()
    cold.close()


# -- erase: what a lock keeps of a cold archive ---------------------------------------------------
@pytest.mark.parametrize("kind", ["kms", "local"])
def test_a_locked_cold_archive_is_reported_crypto_erased_by_the_key_it_names(endpoint, index_mode, kind) -> None:
    s3 = _s3(endpoint)
    s3.create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)
    saver = make_saver(endpoint, index_mode, encryption=_kms(endpoint) if kind == "kms" else LocalKey(os.urandom(32)))
    saver.setup()
    key = _archived_cold(saver, "t")
    until = datetime.now(UTC).replace(microsecond=0) + timedelta(days=30)
    s3.put_object_retention(Bucket=BUCKET, Key=key, Retention={"Mode": "GOVERNANCE", "RetainUntilDate": until})
    # A plaintext object put by hand in the thread's archive folder, cold and locked:
    # it names no key, and is not called crypto-erased.
    planted = key.rsplit("/", 1)[0] + "/planted"
    s3.put_object(Bucket=BUCKET, Key=planted, Body=b"s3_saver.archive/2 zstd\nplaintext", StorageClass="DEEP_ARCHIVE")
    s3.put_object_retention(Bucket=BUCKET, Key=planted, Retention={"Mode": "GOVERNANCE", "RetainUntilDate": until})
    with pytest.raises(ThreadArchivedError):
        make_saver(endpoint, index_mode, encryption=saver._ctx.crypt.config).get_tuple(config("t"))

    report = saver.erase_thread("t")
    by_key = {r.key: r for r in report.remaining}
    assert set(by_key) == {key, planted}, report.remaining
    assert by_key[key].reason == "object lock" and by_key[key].crypto_erased
    assert by_key[key].key_destroyed_at == report.key_destroyed_at is not None
    assert not by_key[planted].crypto_erased and not report.unreadable
    assert saver.get_tuple(config("t")) is None
    saver.close()


def _archived_cold(saver: Any, thread: str) -> str:
    cp = checkpoint({"doc": "cold"}, {"doc": "1"})
    saver.put(config(thread), cp, {"source": "input", "step": -1}, {"doc": "1"})
    return saver.archive_thread(thread, storage_class="GLACIER").key


# -- requests -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["kms", "local"])
def test_archival_requests_are_those_without_encryption_plus_a_cold_process_s_key(endpoint, index_mode, kind) -> None:
    plain = _costs(endpoint, index_mode, prefix="plain/")
    sealed = _costs(endpoint, index_mode, prefix="sealed/", encryption=_kms(endpoint) if kind == "kms" else LocalKey(os.urandom(32)))
    # The processes that have not seen the thread read its key: a GET beside the read
    # they make anyway (the index, the archive), then with KMS one Decrypt. A restore of
    # a cold archive asks for none while S3 restores it; it reads the key once it can read
    # the archive (after that GET: one round trip more, two with KMS).
    kms = kind == "kms"
    key = {"s3:get_object": 1} | ({"kms:decrypt": 1} if kms else {})
    first_of_process = {
        "get_tuple cold": int(kms),
        "restore_thread": int(kms),
        "get_tuple DEEP_ARCHIVE (refused)": int(kms),
        "restore_thread DEEP_ARCHIVE (done)": 1 + int(kms),
    }
    assert set(plain) == set(sealed)
    for name, (trips, requests) in plain.items():
        if name in first_of_process:
            more = {k: requests.get(k, 0) + key.get(k, 0) for k in {*requests, *key}}
            assert sealed[name] == (trips + first_of_process[name], more), name
        else:
            assert sealed[name] == (trips, requests), name


# -- an erase racing a restore ----------------------------------------------------------------
def test_an_erase_during_a_restore_never_indexes_objects_under_the_destroyed_key(endpoint, index_mode, monkeypatch) -> None:
    """Process A restores an archived thread (its key read, its objects written again
    under it); process B erases the thread just before A's final index write (the
    switch). A's switch checks the key on the thread's record, at no request of its
    own (as a copy's and an import's final write do): refused, A indexes nothing and
    deletes what it wrote, and restore_thread says the thread was erased (it does not
    answer "live"): the thread reads as erased, never as objects under a destroyed key."""
    from s3_saver._transport.sync import SyncDriver

    encryption = LocalKey(os.urandom(32))
    a = make_saver(endpoint, index_mode, encryption=encryption)
    a.setup()
    _run(_graph(a, "archived"), "archived", "t", "sync", 2)
    a.archive_thread("t")
    destroyed = _key_id(endpoint, "t")
    b = make_saver(endpoint, index_mode, encryption=encryption)
    real = SyncDriver._wave
    erased: list[Any] = []

    def wave(driver, calls):
        if driver is a._sync and not erased and any(_switch(c) for c in calls):
            erased.append(b.erase_thread("t"))  # B's erase, between A's key read and its switch
        return real(driver, calls)

    monkeypatch.setattr(SyncDriver, "_wave", wave)
    with pytest.raises(ThreadErasedError, match="erased while it was restored") as refused:
        a.restore_thread("t")
    monkeypatch.undo()
    assert erased and erased[0].key_destroyed_at is not None
    assert refused.value.thread_id == "t" and refused.value.key.startswith("archive/t/")
    # Nothing of A's restore is indexed or kept: the thread reads as erased (gone).
    reader = make_saver(endpoint, index_mode, encryption=encryption)
    assert reader.get_tuple(config("t")) is None and list(reader.list(config("t"))) == []
    assert "t" not in {i.thread_id for i in reader.list_threads()}
    assert not [b_ for b_ in _objects(endpoint, "live/t/").values() if key_id_of(b_) == destroyed]
    # A new life begins under a new key.
    _run(_graph(reader, "new-life"), "new-life", "t", "sync", 1)
    assert _key_id(endpoint, "t") != destroyed and reader.get_tuple(config("t")) is not None
    for s in (a, b, reader):
        s.close()


def _switch(call: Any) -> bool:
    """A restore's switch: the head's swap (manifest) or the record's update (DynamoDB)."""
    if call.operation == "put_object":
        return call.params["Key"].startswith("manifests/t")
    if call.operation in ("update_item", "transact_write_items"):
        return "REMOVE #a, #r" in repr(call.params)
    return False
