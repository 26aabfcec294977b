"""Exports with encryption: the thread's record sealed under its data key, behind a header
naming the key store it lives in; imported (into the same saver, another prefix, another
bucket and index mode) by decrypting it there and encrypting anew under the target's key.
An export file holds no plaintext, and reads nowhere once its thread is erased. Both index
modes and both drivers, on moto (S3, DynamoDB, KMS).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import boto3
import ormsgpack
import pytest
from conftest import BUCKET, make_saver
from helpers import config
from test_encryption import _graph, _kms, _layers, _leaks, _run

from s3_saver import (
    ConfigurationError,
    EncryptedObjectError,
    EncryptionKeyError,
    ForeignCiphertextError,
    LocalKey,
    S3Saver,
    ThreadErasedError,
)
from s3_saver._crypto.envelope import is_sealed, key_id_of
from s3_saver._crypto.records import decode_record
from s3_saver._format.key_codec import encode

HEADER = b"s3_saver.export/1 sealed\n"
OTHER = "other-bucket"


def _s3(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _key_id(endpoint: str, thread: str, prefix: str = "", bucket: str = BUCKET) -> bytes:
    key = f"{prefix}t/{encode(thread)}"
    found = _s3(endpoint).get_object(Bucket=f"{bucket}-keys", Key=key)
    return decode_record(found["Body"].read(), found["ETag"], key).key_id


def _objects(endpoint: str, prefix: str, bucket: str = BUCKET) -> dict[str, bytes]:
    s3 = _s3(endpoint)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"]: s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for p in pages for o in p.get("Contents", [])}


def _view(saver: Any, thread: str) -> list[Any]:
    """The thread as its reads show it, its id left out (an import may have another)."""
    return [(t.checkpoint, t.metadata, t.pending_writes) for t in saver.list(config(thread))]


def _header(data: bytes) -> dict[str, Any]:
    assert data.startswith(HEADER)
    doc = ormsgpack.unpackb(data[len(HEADER) :])
    assert is_sealed(doc["record"])
    return doc


def _deep(data: bytes) -> list[bytes]:
    """Everything ``data`` decodes to, whole and after its first line (a header)."""
    return _layers(data) + _layers(data.partition(b"\n")[2])


def _call(saver: Any, name: str, driver: str, *args: Any, **kwargs: Any) -> Any:
    if driver == "async":
        return asyncio.run(getattr(saver, f"a{name}")(*args, **kwargs))
    return getattr(saver, name)(*args, **kwargs)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_encrypted_export_holds_no_plaintext_and_imports_wherever_its_key_can_be_read(
    endpoint, index_mode, driver
) -> None:
    encryption = _kms(endpoint) if driver == "sync" else LocalKey(os.urandom(32))
    source = make_saver(endpoint, index_mode, prefix="a/", encryption=encryption, inline_threshold=0)
    source.setup()
    secret = f"exported-secret-{driver}"
    _run(_graph(source, secret), secret, "t", driver, 2)
    before = _view(source, "t")

    data = _call(source, "export_thread", driver, "t")
    doc = _header(data)
    assert (doc["thread_id"], doc["bucket"], doc["prefix"], doc["key_bucket"]) == ("t", BUCKET, "a/", f"{BUCKET}-keys")
    assert key_id_of(doc["record"]) == _key_id(endpoint, "t", "a/")
    # Nothing of the thread in the clear, however deep the bytes are decoded; the same
    # scan finds it in the export of a saver without encryption.
    assert not any(secret.encode() in layer for layer in _deep(data))
    plain = make_saver(endpoint, index_mode, prefix="plain/", inline_threshold=0)
    plain.setup()
    _run(_graph(plain, secret), secret, "p", "sync", 2)
    assert any(secret.encode() in layer for layer in _deep(plain.export_thread("p")))

    # Into the same saver under another id, another prefix, another bucket and index mode
    # (manifest): each sealed under the target thread's own key.
    targets = [
        (source, "copy", "a/", BUCKET),
        (make_saver(endpoint, index_mode, prefix="b/", encryption=encryption), "t", "b/", BUCKET),
        (S3Saver(OTHER, endpoint_url=endpoint, region_name="us-east-1", encryption=encryption), "t", "", OTHER),
    ]
    for saver, thread, prefix, bucket in targets:
        saver.setup()
        assert _call(saver, "import_thread", driver, data, thread_id=None if thread == "t" else thread) == thread
        key = _key_id(endpoint, thread, prefix, bucket)
        assert key != _key_id(endpoint, "t", "a/")
        stored = _objects(endpoint, f"{prefix}live/{encode(thread)}/", bucket)
        assert stored and all(is_sealed(b) and key_id_of(b) == key for b in stored.values()), (bucket, prefix)
        assert _view(saver, thread) == before, (bucket, prefix)
    assert [w for w in _leaks(endpoint, secret) if "plain" not in w] == []  # the saver without encryption's hold it

    # An archived thread's export: its archive, sealed for the export the same way.
    source.archive_thread("t")
    again = _call(make_saver(endpoint, index_mode, prefix="a/", encryption=encryption), "export_thread", driver, "t")
    assert _header(again)["thread_id"] == "t" and not any(secret.encode() in layer for layer in _deep(again))
    target = make_saver(endpoint, index_mode, prefix="c/", encryption=encryption)
    target.import_thread(again)
    assert _view(target, "t") == before
    for s in (source, plain, target, *(t[0] for t in targets)):
        s.close()


def test_an_encrypted_export_reads_nowhere_else_and_never_after_its_thread_is_erased(endpoint, index_mode) -> None:
    encryption = LocalKey(os.urandom(32))
    source = make_saver(endpoint, index_mode, encryption=encryption)
    source.setup()
    _run(_graph(source, "a"), "a", "a", "sync", 1)
    _run(_graph(source, "b"), "b", "b", "sync", 1)
    data = source.export_thread("a")
    doc = _header(data)

    def relabeled(**changes: Any) -> bytes:
        return HEADER + ormsgpack.packb({**doc, **changes})

    importer = make_saver(endpoint, index_mode, prefix="in/", encryption=encryption)
    importer.setup()
    # Changed by one bit, or said to be thread b's (b's key, and b's place): refused.
    record = doc["record"]
    with pytest.raises(ForeignCiphertextError):
        importer.import_thread(relabeled(record=record[:-1] + bytes([record[-1] ^ 1])))
    with pytest.raises(ForeignCiphertextError):
        importer.import_thread(relabeled(thread_id="b"))
    # Another master key cannot unwrap the thread's key; a saver without encryption says
    # what it needs; the bytes of an encrypted archive object are not an export.
    stranger = make_saver(endpoint, index_mode, prefix="in/", encryption=LocalKey(os.urandom(32)))
    with pytest.raises(EncryptionKeyError):
        stranger.import_thread(data)
    with pytest.raises(EncryptedObjectError, match="encryption="):
        make_saver(endpoint, index_mode, prefix="in/").import_thread(data)
    archive_key = source.archive_thread("b").key
    with pytest.raises(ConfigurationError, match="export_thread"):
        importer.import_thread(_s3(endpoint).get_object(Bucket=BUCKET, Key=archive_key)["Body"].read())
    assert list(importer.list(config("a"))) == []  # nothing was written by any of these

    # Bound to the thread's key: once the thread is erased, the export reads nowhere.
    importer.import_thread(data, thread_id="kept")
    assert source.erase_thread("a").key_destroyed_at is not None
    with pytest.raises(ThreadErasedError) as found:
        make_saver(endpoint, index_mode, prefix="in/", encryption=encryption).import_thread(data)
    assert found.value.thread_id == "a"
    # What was imported before has a key of its own.
    assert len(_view(importer, "kept")) >= 3
    for s in (source, importer, stranger):
        s.close()


# -- requests -------------------------------------------------------------------------------------
def _counts(saver: Any, call: Any) -> tuple[int, dict[str, int]]:
    saver.stats.reset()
    call()
    stats = saver.stats.snapshot()
    return stats.round_trips, {f"{svc}:{op}": n for (svc, op), n in sorted(stats.requests.items())}


@pytest.mark.parametrize("kind", ["kms", "local"])
def test_export_and_import_requests_are_those_without_encryption_plus_a_cold_process_s_key(endpoint, index_mode, kind) -> None:
    encryption = _kms(endpoint) if kind == "kms" else LocalKey(os.urandom(32))
    kms = kind == "kms"
    key = {"s3:get_object": 1} | ({"kms:decrypt": 1} if kms else {})

    def plus(counts: tuple[int, dict[str, int]], trips: int) -> tuple[int, dict[str, int]]:
        return counts[0] + trips, {k: counts[1].get(k, 0) + key.get(k, 0) for k in {*counts[1], *key}}

    found: dict[str, dict[str, Any]] = {}
    for name, kwargs in (("plain", {}), ("sealed", {"encryption": encryption})):
        writer = make_saver(endpoint, index_mode, prefix=f"{name}/", **kwargs)
        writer.setup()
        _run(_graph(writer, "x"), "x", "t", "sync", 1)
        cold = make_saver(endpoint, index_mode, prefix=f"{name}/", **kwargs)
        out = found[name] = {
            "export warm": _counts(writer, lambda: writer.export_thread("t")),
            "export cold": _counts(cold, lambda: cold.export_thread("t")),
        }
        data = writer.export_thread("t")
        # Into a new thread by the process that exported it (its key held), and by
        # another (the exported thread's key read first).
        out["import warm"] = _counts(writer, lambda: writer.import_thread(data, thread_id="u"))
        other = make_saver(endpoint, index_mode, prefix=f"{name}/", **kwargs)
        other.get_tuple(config("w"))  # as LangGraph does: the target read first (its key's 404 seen)
        out["import cold"] = _counts(other, lambda: other.import_thread(data, thread_id="w"))
        for s in (writer, cold, other):
            s.close()
    plain, sealed = found["plain"], found["sealed"]
    assert sealed["export warm"] == plain["export warm"]
    assert sealed["export cold"] == plus(plain["export cold"], int(kms))
    # The target is a new thread: its key is made (GenerateDataKey with KMS, and its
    # record's PUT), read first (a 404) beside the target's index reads unless this process
    # saw it missing already. The exported thread's key is read (and, with KMS, unwrapped:
    # beside GenerateDataKey) by a process that does not hold it.
    made = {"s3:put_object": 1} | ({"kms:generate_data_key": 1} if kms else {})
    trips, requests = plain["import warm"]
    want = {"s3:get_object": 1, **made}
    assert sealed["import warm"] == (trips + 1 + int(kms), {k: requests.get(k, 0) + want.get(k, 0) for k in {*requests, *want}})
    trips, requests = plain["import cold"]
    want = made | key
    assert sealed["import cold"] == (trips + int(kms), {k: requests.get(k, 0) + want.get(k, 0) for k in {*requests, *want}})
