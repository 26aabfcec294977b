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
    assert dict(rotator.stats.requests) == {
        **described, ("s3", "list_objects_v2"): 1, ("s3", "get_object"): 3, **wrap, ("s3", "put_object"): 2,
    }
    assert rotator.stats.round_trips == len(described) + 2 + bool(wrap) + 1
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
    if old_kind == "kms":
        boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1").disable_key(KeyId=_arn(endpoint, "alias/old"))
        assert {t: _history(make_saver(endpoint, index_mode, encryption=new), t) for t in histories} == histories

    # Run again: nothing left to do, nothing written.
    rotator.stats.reset()
    etags = {t: _record(endpoint, t).etag for t in THREADS}
    again = _rewrap(rotator, new, driver)
    assert (again.rewrapped, again.already, again.erased) == (0, 2, 1)
    assert {t: _record(endpoint, t).etag for t in THREADS} == etags
    assert dict(rotator.stats.requests) == {**described, ("s3", "list_objects_v2"): 1, ("s3", "get_object"): 3}
    assert rotator.stats.round_trips == len(described) + 2
    for s in (erased, rotator, reader):
        s.close()


def _arn(endpoint: str, alias: str) -> str:
    kms = boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1")
    return kms.describe_key(KeyId=alias)["KeyMetadata"]["KeyId"]
