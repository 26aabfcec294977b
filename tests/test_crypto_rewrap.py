"""Key rotation (``rewrap``): every thread's data key wrapped under a new key-encryption key,
in both index modes and both drivers, on moto (S3, DynamoDB, KMS).

No object is rewritten (the bucket's bytes are the same before and after), every thread
reads whole with a saver configured with the new key only, a process still on an old
local key is refused by name, a run cut after any round trip and run again finishes, an
erase that lands during a run is never undone, and requests are counted.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Generator
from typing import Any

import boto3
import pytest
from conftest import BUCKET, make_saver
from helpers import config, cut_points
from test_archive_cut import _cut_short
from test_encryption import _graph, _run

from s3_saver import EncryptionKeyError, KmsKey, LocalKey, RewrapReport, ThreadErasedError
from s3_saver._crypto import rotate
from s3_saver._crypto.records import decode_record
from s3_saver._format.key_codec import encode
from s3_saver._transport.protocol import Call

KEY_BUCKET = f"{BUCKET}-keys"
THREADS = ("a", "b/c", "d")


def _s3(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _kms_key(endpoint: str, alias: str) -> KmsKey:
    kms = boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1")
    key_id = kms.create_key(Description=alias)["KeyMetadata"]["KeyId"]
    kms.create_alias(AliasName=alias, TargetKeyId=key_id)
    return KmsKey(alias)


def _keys(endpoint: str, kind: str, alias: str) -> KmsKey | LocalKey:
    return _kms_key(endpoint, alias) if kind == "kms" else LocalKey(os.urandom(32))


def _record(endpoint: str, thread: str) -> Any:
    key = f"t/{encode(thread)}"
    found = _s3(endpoint).get_object(Bucket=KEY_BUCKET, Key=key)
    return decode_record(found["Body"].read(), found["ETag"], key)


def _bucket(endpoint: str) -> dict[str, bytes]:
    s3 = _s3(endpoint)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
    return {o["Key"]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for p in pages for o in p.get("Contents", [])}


def _history(saver: Any, thread: str) -> list[Any]:
    return [(t.config, t.checkpoint, t.metadata, t.pending_writes, t.parent_config) for t in saver.list(config(thread))]


def _rewrap(saver: Any, target: Any, driver: str) -> RewrapReport:
    if driver == "async":
        return asyncio.run(saver.arewrap(target))
    return saver.rewrap(target)


def _threads(endpoint: str, mode: str, old: Any, driver: str) -> dict[str, list[Any]]:
    writer = make_saver(endpoint, mode, encryption=old)
    writer.setup()
    for thread in THREADS:
        _run(_graph(writer, f"secret-{thread}"), f"secret-{thread}", thread, driver)
    reader = make_saver(endpoint, mode, encryption=old)
    histories = {t: _history(reader, t) for t in THREADS}
    assert all(len(h) >= 3 for h in histories.values())
    writer.close()
    reader.close()
    return histories


# -- rewrap, then read with the new key only ---------------------------------------------------
@pytest.mark.parametrize(
    ("old_kind", "new_kind", "driver"),
    [("kms", "kms", "sync"), ("kms", "kms", "async"), ("local", "local", "sync"), ("local", "kms", "async"), ("kms", "local", "sync")],
)
def test_rewrap_wraps_every_key_anew_and_every_thread_reads_with_the_new_key_only(
    endpoint, index_mode, old_kind, new_kind, driver
) -> None:
    old = _keys(endpoint, old_kind, "alias/old")
    histories = _threads(endpoint, index_mode, old, driver)
    erased = make_saver(endpoint, index_mode, encryption=old)
    erased.erase_thread("d")
    del histories["d"]
    before = {t: _record(endpoint, t) for t in THREADS}
    objects = _bucket(endpoint)

    rotator = make_saver(endpoint, index_mode, encryption=old)
    rotator.check()  # the first wave's checks (the table's owner, the prefix's mode) made
    rotator.stats.reset()
    new = _keys(endpoint, new_kind, "alias/new")
    report = _rewrap(rotator, new, driver)
    # One page: the new key's ARN (KMS), the listing, the records' GETs, the wrap (KMS to
    # KMS: ReEncrypt; else Decrypt, then Encrypt for a KMS key), the PUTs.
    wrap = {("kms", "kms"): {("kms", "re_encrypt"): 2}, ("kms", "local"): {("kms", "decrypt"): 2},
            ("local", "kms"): {("kms", "encrypt"): 2}, ("local", "local"): {}}[old_kind, new_kind]
    described = {("kms", "describe_key"): 1} if new_kind == "kms" else {}
    # Then the memory store's records: a listing of m/ and the store-wide key's GET (none here).
    assert dict(rotator.stats.requests) == {
        **described, ("s3", "list_objects_v2"): 2, ("s3", "get_object"): 4, **wrap, ("s3", "put_object"): 2,
    }
    assert rotator.stats.round_trips == len(described) + 2 + bool(wrap) + 1 + 2
    assert (report.rewrapped, report.already, report.erased) == (2, 0, 1)
    assert report.key_stores == [f"s3://{KEY_BUCKET}/"]
    assert report.kek.startswith("kms:arn:aws:kms:us-east-1:" if new_kind == "kms" else "local:")
    for thread in THREADS:
        after = _record(endpoint, thread)
        # The same data key (its id), wrapped anew under the new key; the erasure left alone.
        assert after.key_id == before[thread].key_id and after.created == before[thread].created
        if thread == "d":
            assert not after.live and after.etag == before[thread].etag
        else:
            assert after.live and after.kek == report.kek != before[thread].kek and after.wrapped != before[thread].wrapped
    # No object rewritten: the bucket holds the same bytes.
    assert _bucket(endpoint) == objects

    # A process configured with the new key only reads every thread whole.
    reader = make_saver(endpoint, index_mode, encryption=new)
    assert {t: _history(reader, t) for t in histories} == histories
    assert reader.get_tuple(config("d")) is None
    if (old_kind, new_kind) == ("kms", "kms"):
        # A process still configured with the old KMS key reads on: a record names its key.
        assert {t: _history(make_saver(endpoint, index_mode, encryption=old), t) for t in histories} == histories
    kms = boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1")
    if old_kind == "kms":
        kms.disable_key(KeyId=_arn(endpoint, "alias/old"))
        assert {t: _history(make_saver(endpoint, index_mode, encryption=new), t) for t in histories} == histories
    if (old_kind, new_kind) == ("kms", "kms"):
        # A process on the old key that may not use the new one (here: disabled) is
        # refused by name: the record, the thread, the key it names and its own.
        kms.disable_key(KeyId=_arn(endpoint, "alias/new"))
        with pytest.raises(EncryptionKeyError) as refused:
            make_saver(endpoint, index_mode, encryption=old).get_tuple(config("a"))
        text = str(refused.value)
        assert f"s3://{KEY_BUCKET}/t/a of thread 'a' is wrapped by {report.kek}" in text and "'alias/old'" in text
        kms.enable_key(KeyId=_arn(endpoint, "alias/new"))

    # Run again: nothing left to do, nothing written.
    rotator.stats.reset()
    etags = {t: _record(endpoint, t).etag for t in THREADS}
    again = _rewrap(rotator, new, driver)
    assert (again.rewrapped, again.already, again.erased) == (0, 2, 1)
    assert {t: _record(endpoint, t).etag for t in THREADS} == etags
    assert dict(rotator.stats.requests) == {**described, ("s3", "list_objects_v2"): 2, ("s3", "get_object"): 4}
    assert rotator.stats.round_trips == len(described) + 2 + 2
    for s in (erased, rotator, reader):
        s.close()


def _arn(endpoint: str, alias: str) -> str:
    kms = boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1")
    return kms.describe_key(KeyId=alias)["KeyMetadata"]["KeyId"]


def _small_threads(endpoint: str, mode: str, old: Any) -> dict[str, Any]:
    """THREADS with one checkpoint and a pending write each (no graph: cheaper)."""
    from helpers import checkpoint

    writer = make_saver(endpoint, mode, encryption=old)
    writer.setup()
    for thread in THREADS:
        cp = checkpoint({"doc": f"secret-{thread}"}, {"doc": "1"})
        stored = writer.put(config(thread), cp, {"source": "input", "step": -1}, {"doc": "1"})
        writer.put_writes(stored, [("doc", f"secret-{thread}-write")], "task-1")
    writer.close()
    reader = make_saver(endpoint, mode, encryption=old)
    seen = {t: _history(reader, t) for t in THREADS}
    reader.close()
    return seen


def _key_objects(endpoint: str) -> dict[str, bytes]:
    s3 = _s3(endpoint)
    listed = s3.list_objects_v2(Bucket=KEY_BUCKET).get("Contents", [])
    return {o["Key"]: s3.get_object(Bucket=KEY_BUCKET, Key=o["Key"])["Body"].read() for o in listed}


# -- cut short --------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["kms", "local"])
def test_rewrap_cut_after_any_round_trip_and_run_again_finishes(endpoint, index_mode, monkeypatch, kind) -> None:
    """Two pages of records (the page size made 2): a run cut after each round trip leaves
    every record whole (old key or new, the same data key), and a run again wraps the
    rest; every thread then reads with the new key only. With KMS a process configured
    with either key reads every thread between the cut and the run again (a record
    names the key that wrapped it)."""
    monkeypatch.setattr(rotate, "PAGE", 2)
    old = _keys(endpoint, kind, "alias/old")
    histories = _small_threads(endpoint, index_mode, old)
    new = _keys(endpoint, kind, "alias/new")
    ids = {t: _record(endpoint, t).key_id for t in THREADS}
    records = _key_objects(endpoint)

    def reset() -> None:
        for key, body in records.items():
            _s3(endpoint).put_object(Bucket=KEY_BUCKET, Key=key, Body=body)

    counter = make_saver(endpoint, index_mode, encryption=old)
    counter.check()
    counter.stats.reset()
    assert counter.rewrap(new).rewrapped == len(THREADS)
    total = counter.stats.round_trips
    # KMS: the new key's ARN, then per page: listing, GETs, ReEncrypt, PUTs; then the
    # memory store's records (a listing, the store-wide key's GET: none here).
    assert total == (kind == "kms") + (4 if kind == "kms" else 3) * 2 + 2, total
    for cut in range(total):
        reset()
        rotator = make_saver(endpoint, index_mode, encryption=old)
        rotator.check()
        _cut_short(monkeypatch, cut, lambda: rotator.rewrap(new))
        found = {t: _record(endpoint, t) for t in THREADS}
        assert all(r.live and r.key_id == ids[t] for t, r in found.items()), cut
        if kind == "kms":
            for key in (old, new):
                assert {t: _history(make_saver(endpoint, index_mode, encryption=key), t) for t in THREADS} == histories, cut
        report = rotator.rewrap(new)
        assert report.rewrapped + report.already == len(THREADS) and report.erased == 0, cut
        assert report.rewrapped == sum(r.kek != report.kek for r in found.values()), cut
        assert all(_record(endpoint, t).kek == report.kek for t in THREADS), cut
        assert {t: _history(make_saver(endpoint, index_mode, encryption=new), t) for t in THREADS} == histories, cut
        rotator.close()
    counter.close()


# -- an erase meanwhile -----------------------------------------------------------------------
def _before_puts(op: Generator[Any, Any, Any], act: Any) -> Generator[Any, Any, Any]:
    """``op``, with ``act()`` run once just before its first wave of key store PUTs is sent
    (another process's call lands between the records' read and their rewrite)."""
    reply: Any = None
    done = False
    while True:
        try:
            instruction = op.send(reply)
        except StopIteration as stop:
            return stop.value
        if not done and isinstance(instruction, tuple) and any(
            isinstance(c, Call) and c.operation == "put_object" and c.params["Bucket"] == KEY_BUCKET for c in instruction
        ):
            done = True
            act()
        reply = yield instruction


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_erase_during_a_rewrap_is_never_undone(endpoint, index_mode, driver) -> None:
    old = _keys(endpoint, "kms" if driver == "sync" else "local", "alias/old")
    histories = _small_threads(endpoint, index_mode, old)
    new = _keys(endpoint, "kms" if driver == "sync" else "local", "alias/new")
    eraser = make_saver(endpoint, index_mode, encryption=old)
    rotator = make_saver(endpoint, index_mode, encryption=old)
    rotator.check()
    rotator.stats.reset()
    op = _before_puts(rotator._rewrapping(new), lambda: eraser.erase_thread("b/c"))
    report = rotator._sync.run(op) if driver == "sync" else asyncio.run(rotator._async.run(op))
    # The erase's record stays: its PUT was refused (IfMatch), the record read again.
    assert (report.rewrapped, report.already, report.erased) == (2, 0, 1)
    erased = _record(endpoint, "b/c")
    assert not erased.live and erased.wrapped is None and erased.settled
    # (the memory store's pass: the store-wide key's GET)
    assert rotator.stats.requests[("s3", "put_object")] == 3 and rotator.stats.requests[("s3", "get_object")] == 5
    reader = make_saver(endpoint, index_mode, encryption=new)
    assert reader.get_tuple(config("b/c")) is None
    assert {t: _history(reader, t) for t in ("a", "d")} == {t: histories[t] for t in ("a", "d")}
    # A new life of the erased thread, made by a process still on the old key, is
    # wrapped by the next run.
    eraser.put(config("b/c"), __import__("helpers").checkpoint({"doc": "again"}, {"doc": "1"}), {}, {"doc": "1"})
    again = rotator.rewrap(new)
    assert (again.rewrapped, again.already, again.erased) == (1, 2, 0)
    assert _history(make_saver(endpoint, index_mode, encryption=new), "b/c")[0][1]["channel_values"]["doc"] == "again"
    for s in (eraser, rotator, reader):
        s.close()


# -- a process still on the old key ----------------------------------------------------------
def test_a_process_on_the_old_key_after_a_rewrap(endpoint, index_mode) -> None:
    """A local key: a process configured with the old one is refused by name (the key
    store's record, the thread, both keys), unless it holds the thread's key in its
    cache already (the data key is the same). (KMS: a record names the key that wrapped
    it, so a process configured with the old key reads on; see the first test.)"""
    old, new = LocalKey(os.urandom(32)), LocalKey(os.urandom(32))
    histories = _small_threads(endpoint, index_mode, old)
    warm = make_saver(endpoint, index_mode, encryption=old)
    assert _history(warm, "a") == histories["a"]
    make_saver(endpoint, index_mode, encryption=old).rewrap(new)
    assert _history(warm, "a") == histories["a"]  # cached: the same data key
    with pytest.raises(EncryptionKeyError) as refused:
        make_saver(endpoint, index_mode, encryption=old).get_tuple(config("b/c"))
    text = str(refused.value)
    assert f"s3://{KEY_BUCKET}/t/{encode('b/c')}" in text and "'b/c'" in text
    assert f"local:{new.fingerprint}" in text and old.fingerprint in text and "rewrap" in text

    warm.close()


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_local_key_rotates_with_the_old_key_as_previous_for_reads(endpoint, index_mode, monkeypatch, driver) -> None:
    """``LocalKey(new, previous=[old])``: every process reads records of either key, before,
    during (a run cut short) and after the rewrap, and makes new threads' keys under the
    new one; a key move between kinds (local to KMS) works the same."""
    old, new = LocalKey(os.urandom(32)), LocalKey(os.urandom(32))
    histories = _small_threads(endpoint, index_mode, old)
    both = LocalKey(new._secret, previous=[old])
    assert {t: _history(make_saver(endpoint, index_mode, encryption=both), t) for t in THREADS} == histories
    monkeypatch.setattr(rotate, "PAGE", 2)
    _cut_short(monkeypatch, 4, lambda: make_saver(endpoint, index_mode, encryption=both).rewrap(new))
    keks = {_record(endpoint, t).kek for t in THREADS}
    assert keks == {f"local:{old.fingerprint}", f"local:{new.fingerprint}"}
    assert {t: _history(make_saver(endpoint, index_mode, encryption=both), t) for t in THREADS} == histories
    writer = make_saver(endpoint, index_mode, encryption=both)
    writer.put(config("fresh"), __import__("helpers").checkpoint({"doc": "x"}, {"doc": "1"}), {}, {"doc": "1"})
    assert _record(endpoint, "fresh").kek == f"local:{new.fingerprint}"
    report = _rewrap(make_saver(endpoint, index_mode, encryption=both), new, driver)
    assert (report.rewrapped, report.already) == (1, 3)
    assert {t: _history(make_saver(endpoint, index_mode, encryption=new), t) for t in THREADS} == histories

    # Local to KMS: a KMS saver with the local key as previous reads both kinds meanwhile.
    kms = _kms_key(endpoint, "alias/new")
    moving = KmsKey("alias/new", previous=[new])
    _cut_short(monkeypatch, 4, lambda: make_saver(endpoint, index_mode, encryption=moving).rewrap(kms))
    assert {t: _history(make_saver(endpoint, index_mode, encryption=moving), t) for t in THREADS} == histories
    assert _rewrap(make_saver(endpoint, index_mode, encryption=moving), kms, driver).rewrapped >= 1
    assert {t: _history(make_saver(endpoint, index_mode, encryption=kms), t) for t in THREADS} == histories
    writer.close()


def test_rewrap_refuses_what_it_cannot_do_before_sending_anything(endpoint, index_mode) -> None:
    from s3_saver import ConfigurationError

    plain = make_saver(endpoint, index_mode)
    with pytest.raises(ConfigurationError, match="no encryption="):
        plain.rewrap(LocalKey(os.urandom(32)))
    saver = make_saver(endpoint, index_mode, encryption=LocalKey(os.urandom(32)))
    with pytest.raises(ConfigurationError, match="KmsKey or s3_saver.LocalKey"):
        saver.rewrap("alias/new")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="leave key_bucket out"):
        saver.rewrap(LocalKey(os.urandom(32), key_bucket="elsewhere-keys"))
    kms = make_saver(endpoint, index_mode, encryption=KmsKey("alias/old", region_name="us-east-1"))
    with pytest.raises(ConfigurationError, match="region eu-west-1"):
        kms.rewrap(KmsKey("arn:aws:kms:eu-west-1:123456789012:key/0f0f0f0f-1111-2222-3333-444444444444"))
    assert plain.stats.total_requests == saver.stats.total_requests == kms.stats.total_requests == 0
    with pytest.raises(ConfigurationError, match="previous keys of its own"):
        LocalKey(os.urandom(32), previous=[LocalKey(os.urandom(32), previous=[LocalKey(os.urandom(32))])])
    with pytest.raises(ConfigurationError, match="takes s3_saver.KmsKey"):
        KmsKey("alias/x", previous=["alias/y"])
