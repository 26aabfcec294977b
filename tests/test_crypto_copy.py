"""copy_thread and import_thread with encryption: what they write is encrypted under the
target thread's own key (decrypted under the source's first: no server-side copy), bound
to its new place. Both index modes, both drivers, on moto (S3, DynamoDB, KMS).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import boto3
import pytest
from conftest import BUCKET, TABLE, make_saver
from helpers import config
from test_encryption import _graph, _kms, _leaks, _run

from s3_saver import ForeignCiphertextError, LocalKey
from s3_saver._crypto.envelope import is_sealed, key_id_of
from s3_saver._crypto.records import decode_record
from s3_saver._format.key_codec import encode

KEY_BUCKET = f"{BUCKET}-keys"


def _s3(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _key_id(endpoint: str, thread: str, prefix: str = "") -> bytes:
    key = f"{prefix}t/{encode(thread)}"
    found = _s3(endpoint).get_object(Bucket=KEY_BUCKET, Key=key)
    record = decode_record(found["Body"].read(), found["ETag"], key)
    assert record.live
    return record.key_id


def _objects(endpoint: str, prefix: str) -> dict[str, bytes]:
    s3 = _s3(endpoint)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for p in pages for o in p.get("Contents", [])}


def _view(saver: Any, thread: str) -> list[Any]:
    """The thread as its reads show it, its id left out (a copy has another)."""
    return [
        (t.checkpoint, t.metadata, t.pending_writes, t.parent_config and t.parent_config["configurable"]["checkpoint_id"])
        for t in saver.list(config(thread))
    ]


def _table_bodies(endpoint: str, thread: str) -> list[bytes]:
    """The body and meta attributes of the thread's DynamoDB items."""
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    found = []
    for page in ddb.get_paginator("scan").paginate(TableName=TABLE):
        for item in page["Items"]:
            if item["pk"]["S"].endswith(encode(thread)):
                found += [item[a]["B"] for a in ("body", "meta") if a in item and "B" in item[a]]
    return found


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_copy_is_encrypted_under_the_target_s_key_and_bound_to_its_place(endpoint, index_mode, driver) -> None:
    encryption = _kms(endpoint) if driver == "sync" else LocalKey(os.urandom(32))
    # Values in objects of their own, lists stored as deltas: every kind of object.
    saver = make_saver(endpoint, index_mode, encryption=encryption, inline_threshold=0)
    saver.setup()
    secret = "copied-secret-5d1e"
    _run(_graph(saver, secret), secret, "src", driver, 2)
    saver.stats.reset()
    if driver == "async":
        asyncio.run(saver.acopy_thread("src", "dst"))
    else:
        saver.copy_thread("src", "dst")
    # No server-side copy: a byte-for-byte copy would not open in its new place.
    assert ("s3", "copy_object") not in saver.stats.requests
    source_key, target_key = _key_id(endpoint, "src"), _key_id(endpoint, "dst")
    assert source_key != target_key
    copied = _objects(endpoint, "live/dst/")
    assert copied and all(is_sealed(b) and key_id_of(b) == target_key for b in copied.values()), sorted(copied)
    if index_mode == "dynamodb":
        bodies = _table_bodies(endpoint, "dst")
        assert bodies and all(is_sealed(b) and key_id_of(b) == target_key for b in bodies)
    assert _leaks(endpoint, secret) == []

    # Another process reads the copy as the source.
    reader = make_saver(endpoint, index_mode, encryption=encryption)
    assert _view(reader, "dst") == _view(reader, "src") and len(_view(reader, "dst")) >= 5

    # An object of the copy put back where its source object was (or the other way)
    # does not open there.
    s3 = _s3(endpoint)
    sources = _objects(endpoint, "live/src/")
    src_blob = max(k for k in sources if "/blobs/notes/" in k)
    dst_blob = max(k for k in copied if "/blobs/notes/" in k)
    s3.put_object(Bucket=BUCKET, Key=src_blob, Body=copied[dst_blob])
    with pytest.raises(ForeignCiphertextError):
        list(make_saver(endpoint, index_mode, encryption=encryption).list(config("src")))
    s3.put_object(Bucket=BUCKET, Key=src_blob, Body=sources[src_blob])
    s3.put_object(Bucket=BUCKET, Key=dst_blob, Body=sources[src_blob])
    with pytest.raises(ForeignCiphertextError):
        list(make_saver(endpoint, index_mode, encryption=encryption).list(config("dst")))
    s3.put_object(Bucket=BUCKET, Key=dst_blob, Body=copied[dst_blob])

    # The copy has a key of its own: erasing the source leaves it readable.
    before = _view(reader, "dst")
    assert saver.erase_thread("src").key_destroyed_at is not None
    assert _view(make_saver(endpoint, index_mode, encryption=encryption), "dst") == before
    saver.close()
    reader.close()


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_import_into_an_encrypting_saver_is_encrypted_under_the_thread_s_key(endpoint, index_mode, driver) -> None:
    """An export (of a saver without encryption) imported into an encrypting saver:
    every object and index copy sealed under the imported thread's new key."""
    plain = make_saver(endpoint, index_mode, prefix="plain/", inline_threshold=0)
    plain.setup()
    secret = "imported-secret-9c2b"
    _run(_graph(plain, secret), secret, "t", "sync", 2)
    data = plain.export_thread("t")

    encryption = LocalKey(os.urandom(32)) if driver == "sync" else _kms(endpoint)
    sealed = make_saver(endpoint, index_mode, prefix="sealed/", encryption=encryption)
    sealed.setup()
    if driver == "async":
        dest = asyncio.run(sealed.aimport_thread(data, thread_id="u"))
    else:
        dest = sealed.import_thread(data, thread_id="u")
    assert dest == "u"
    key = _key_id(endpoint, "u", "sealed/")
    stored = _objects(endpoint, "sealed/live/u/")
    assert stored and all(is_sealed(b) and key_id_of(b) == key for b in stored.values())
    if index_mode == "dynamodb":
        bodies = _table_bodies(endpoint, "u")
        assert bodies and all(is_sealed(b) and key_id_of(b) == key for b in bodies)
    assert _view(make_saver(endpoint, index_mode, prefix="sealed/", encryption=encryption), "u") == _view(plain, "t")
    # Nothing of the secret under the encrypting saver's prefix (the plain one holds it).
    assert [w for w in _leaks(endpoint, secret) if "sealed/" in w or (index_mode == "dynamodb" and "/u" in w)] == []
    plain.close()
    sealed.close()


@pytest.mark.parametrize("how", ["copy", "import"])
def test_a_copy_or_import_into_a_thread_erased_by_another_process_is_sealed_under_a_new_key(
    endpoint, index_mode, how
) -> None:
    """Process A wrote thread "dst" (its key cached); process B erased it. A's copy (or
    import) into "dst" is sealed under the new life's key, not the cached one, and reads
    in another process."""
    encryption = LocalKey(os.urandom(32))
    a = make_saver(endpoint, index_mode, encryption=encryption)
    a.setup()
    _run(_graph(a, "first-life"), "first-life", "dst", "sync", 1)
    old = _key_id(endpoint, "dst")
    assert make_saver(endpoint, index_mode, encryption=encryption).erase_thread("dst").key_destroyed_at is not None
    _run(_graph(a, "source"), "source", "src", "sync", 1)
    if how == "copy":
        a.copy_thread("src", "dst")
    else:
        a.import_thread(_export(endpoint, index_mode), thread_id="dst")
    new = _key_id(endpoint, "dst")
    assert new != old
    assert all(key_id_of(b) == new for b in _objects(endpoint, "live/dst/").values())
    reader = make_saver(endpoint, index_mode, encryption=encryption)
    assert len(_view(reader, "dst")) >= 4
    a.close()
    reader.close()


def _export(endpoint: str, index_mode: str) -> bytes:
    """An export of a thread written by a saver without encryption (another prefix)."""
    plain = make_saver(endpoint, index_mode, prefix="plain/")
    plain.setup()
    _run(_graph(plain, "source"), "source", "t", "sync", 1)
    data = plain.export_thread("t")
    plain.close()
    return data


@pytest.mark.parametrize("how", ["copy", "import"])
def test_an_erase_of_the_target_between_a_copy_s_start_and_its_index_write_never_indexes_the_destroyed_key(
    endpoint, index_mode, monkeypatch, how
) -> None:
    """Process A holds thread "dst"'s key and starts a copy (or import) into it; process B
    erases "dst" after A checked the key and before A's index write (paused at A's first
    object write). A's index write is refused by the erase's record (the destroyed key
    id), and A copies again under the new life's key: another process reads the copy,
    never a thread sealed under a destroyed key."""
    from s3_saver._transport.sync import SyncDriver

    encryption = LocalKey(os.urandom(32))
    a = make_saver(endpoint, index_mode, encryption=encryption)
    a.setup()
    _run(_graph(a, "first-life"), "first-life", "dst", "sync", 1)
    old = _key_id(endpoint, "dst")
    # "dst" emptied (its checkpoints deleted, its key kept): a target a copy accepts,
    # whose key A holds in its cache.
    a.delete_thread("dst")
    _run(_graph(a, "source"), "source", "src", "sync", 1)
    data = _export(endpoint, index_mode) if how == "import" else b""
    b = make_saver(endpoint, index_mode, encryption=encryption)
    real = SyncDriver._wave
    erased: list[Any] = []

    def wave(driver, calls):
        if driver is a._sync and not erased and any(
            c.operation == "put_object" and c.params.get("Bucket") == BUCKET and c.params["Key"].startswith("live/dst/")
            for c in calls
        ):
            erased.append(b.erase_thread("dst"))  # B's erase, between A's key check and its index write
        return real(driver, calls)

    monkeypatch.setattr(SyncDriver, "_wave", wave)
    if how == "copy":
        a.copy_thread("src", "dst")
    else:
        a.import_thread(data, thread_id="dst")
    monkeypatch.undo()
    assert erased and erased[0].key_destroyed_at is not None
    new = _key_id(endpoint, "dst")
    assert new != old
    reader = make_saver(endpoint, index_mode, encryption=encryption)
    view = _view(reader, "dst")
    assert len(view) >= 4
    if how == "copy":
        assert view == _view(reader, "src")
    if index_mode == "dynamodb":
        assert all(key_id_of(b_) == new for b_ in _table_bodies(endpoint, "dst"))
    a.close()
    b.close()
    reader.close()
