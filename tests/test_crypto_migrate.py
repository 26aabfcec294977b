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
import urllib.request
from dataclasses import replace
from typing import Any

import boto3
import pytest
from conftest import BUCKET, make_saver, make_versioned
from helpers import checkpoint, config, cut_points
from test_archive_cut import SUB_NS, _cut_short, _rich_thread
from test_crypto_archive import _view
from test_encryption import _graph, _kms, _leaks, _run

from s3_saver import (
    ConfigurationError,
    EncryptedObjectError,
    EncryptStatus,
    LocalKey,
    PlaintextObjectError,
)
from s3_saver._ops.encrypt import YOUNG_PLAINTEXT
from s3_saver._transport.sync import SyncDriver

SECRETS = ("alpha-secret", "beta-secret")
# encrypt_thread of _rich_thread on a versioned bucket, local key: (round trips, requests).
MIGRATION_COST = {"dynamodb": (27, 57), "manifest": (23, 80)}


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


def _live(endpoint: str) -> dict[str, bytes]:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="live/")
    return {o["Key"]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for p in pages for o in p.get("Contents", [])}


def test_a_plaintext_object_put_back_into_a_migrated_thread_is_refused(endpoint, index_mode) -> None:
    plain = make_saver(endpoint, index_mode)
    plain.setup()
    _rich_thread(plain, "rich")
    layout = plain._ctx.layout
    parsed = lambda k: replace(layout.parse_object_key(k), tag="", token="")
    old = {parsed(k): b for k, b in _live(endpoint).items() if layout.parse_object_key(k) is not None}
    encryption = LocalKey(os.urandom(32))
    saver = _encrypting(endpoint, index_mode, encryption)
    assert saver.encrypt_thread("rich").complete
    sub = {"configurable": {"thread_id": "rich", "checkpoint_ns": SUB_NS}}
    assert saver.get_tuple(sub).checkpoint["channel_values"]["big"] == "B" * 100_000
    # Every object of the migrated thread replaced by its plaintext before the migration.
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    for key in _live(endpoint):
        if layout.parse_object_key(key) is not None:
            s3.put_object(Bucket=BUCKET, Key=key, Body=old[parsed(key)])
    reader = _encrypting(endpoint, index_mode, encryption)  # another process: nothing cached
    with pytest.raises(PlaintextObjectError, match=f"s3://{BUCKET}/live/.*not encrypted"):
        reader.get_tuple(sub)
    plain.close()
    saver.close()
    reader.close()


def test_a_plaintext_write_added_to_a_migrated_checkpoint_is_migrated_on_the_next_run(endpoint, index_mode) -> None:
    """An old process without encryption adds a pending write (kept in its own object) to
    a checkpoint the migration sealed: the next run finds it, though the checkpoint's
    metadata and body are sealed, and encrypts the thread again (the simulation's seed
    208679 answered ``complete`` here, and the thread's reads were refused)."""
    plain = make_saver(endpoint, index_mode)
    plain.setup()
    _run(_graph(plain, SECRETS[0]), SECRETS[0], "a", "sync", 1)
    encryption = LocalKey(os.urandom(32))
    saver = _encrypting(endpoint, index_mode, encryption)
    assert saver.encrypt_thread("a").complete
    latest = saver.get_tuple(config("a"))
    assert latest is not None
    secret = "gamma-secret-" + os.urandom(500_000).hex()  # an object of its own: too large for any index
    plain.put_writes(latest.config, [("extra", secret)], "late-task")
    reader = _encrypting(endpoint, index_mode, encryption)  # another process: nothing cached
    with pytest.raises(PlaintextObjectError):
        reader.get_tuple(config("a"))
    status = reader.encrypt_thread("a")
    assert status.complete and status.migrated, status
    got = reader.get_tuple(config("a"))
    assert ("late-task", "extra", secret) in got.pending_writes
    assert _leaks(endpoint, "gamma-secret") == []
    for s in (plain, saver, reader):
        s.close()


def test_encrypt_thread_needs_encryption_and_refuses_before_sending(endpoint, index_mode) -> None:
    plain = make_saver(endpoint, index_mode)
    plain.setup()
    plain.stats.reset()
    with pytest.raises(ConfigurationError, match="encryption="):
        plain.encrypt_thread("a")
    assert plain.stats.total_requests == 0
    plain.close()


# -- cut short at any round trip ----------------------------------------------------------------
def _either(endpoint: str, mode: str, encryption: Any, thread: str) -> tuple:
    """The thread as read from where it is: plaintext (a saver without encryption), or
    encrypted (the encrypting saver): exactly one of them reads it."""
    found = []
    for kind in (None, encryption):
        reader = make_saver(endpoint, mode, encryption=kind)
        try:
            found.append(_views(reader, thread))
        except (PlaintextObjectError, EncryptedObjectError):  # the other kind's content, refused by name
            found.append(None)
        finally:
            reader.close()
    assert [v is None for v in found].count(True) == 1, found
    return next(v for v in found if v is not None)


def _fresh_store(endpoint: str, mode: str) -> tuple:
    request = urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")
    urllib.request.urlopen(request).close()
    make_versioned(endpoint)
    plain = make_saver(endpoint, mode)
    plain.setup()
    _rich_thread(plain, "rich")
    view = _views(plain, "rich")
    plain.close()
    return view


def test_the_migration_cut_after_any_round_trip_finishes_when_run_again(endpoint, index_mode, monkeypatch) -> None:
    encryption = LocalKey(os.urandom(32))
    _fresh_store(endpoint, index_mode)
    counter = _encrypting(endpoint, index_mode, encryption)
    counter.stats.reset()
    status = counter.encrypt_thread("rich")
    total, requests = counter.stats.round_trips, counter.stats.total_requests
    assert status.complete and status.migrated
    counter.close()
    # Against what archive_thread and restore_thread of the same thread cost without
    # encryption: the migration adds the key's create, its look at the thread, the sweep.
    _fresh_store(endpoint, index_mode)
    plain = make_saver(endpoint, index_mode)
    plain.stats.reset()
    plain.archive_thread("rich", storage_class="STANDARD")
    plain.restore_thread("rich")
    base, base_requests = plain.stats.round_trips, plain.stats.total_requests
    plain.close()
    print(f"\n{index_mode}: encrypt_thread of the rich thread: {total} round trips, {requests} requests; "
          f"archive + restore without encryption: {base}, {base_requests}")
    assert (total, requests) == MIGRATION_COST[index_mode]

    for cut in cut_points(total):
        before = _fresh_store(endpoint, index_mode)
        saver = _encrypting(endpoint, index_mode, encryption)
        _cut_short(monkeypatch, cut, lambda s=saver: s.encrypt_thread("rich"))
        assert _either(endpoint, index_mode, encryption, "rich") == before, cut
        again = _encrypting(endpoint, index_mode, encryption)  # another process runs it again
        status = again.encrypt_thread("rich")
        assert status.complete, (cut, status)
        assert _views(again, "rich") == before, cut
        assert _leaks(endpoint, "a document") == [], cut
        assert again.encrypt_thread("rich").migrated is False, cut
        saver.close()
        again.close()


def test_a_cold_plaintext_archive_is_reported_and_the_run_goes_on(endpoint, index_mode) -> None:
    plain = make_saver(endpoint, index_mode)
    plain.setup()
    _run(_graph(plain, SECRETS[0]), SECRETS[0], "cold", "sync", 1)
    _run(_graph(plain, SECRETS[1]), SECRETS[1], "live", "sync", 1)
    plain.archive_thread("cold", storage_class="GLACIER")
    saver = _encrypting(endpoint, index_mode, LocalKey(os.urandom(32)))
    statuses = {s.thread_id: s for s in saver.encrypt_existing()}
    assert statuses["cold"].state == "cold" and not statuses["cold"].complete
    assert statuses["cold"].storage_class == "GLACIER"
    assert statuses["live"].complete and saver.get_tuple(config("live")) is not None
    with pytest.raises(EncryptedObjectError):
        plain.get_tuple(config("live"))
    # Untouched (S3 must restore it first): read as plaintext once restored.
    assert saver.encrypt_thread("cold").state == "cold"
    plain.close()
    saver.close()


def test_a_write_landing_at_any_round_trip_of_the_migration_is_kept(endpoint, index_mode, monkeypatch) -> None:
    """A writer without encryption commits to the thread while it is migrated: before the
    migration's switch, the switch is refused and the thread read again; after it, the
    write is refused by name (the thread is encrypted) or lands in plaintext, and the
    migration run again encrypts it. Either way nothing committed is lost."""
    encryption = LocalKey(os.urandom(32))
    _fresh_store(endpoint, index_mode)
    counter = _encrypting(endpoint, index_mode, encryption)
    counter.stats.reset()
    counter.encrypt_thread("rich")
    total = counter.stats.round_trips
    counter.close()
    for at in cut_points(total):
        _fresh_store(endpoint, index_mode)
        writer = make_saver(endpoint, index_mode)
        saver = _encrypting(endpoint, index_mode, encryption)
        latest = writer.get_tuple(config("rich"))
        written: list[str] = []
        real = SyncDriver._wave

        def wave(driver, calls, at=at, writer=writer, latest=latest, written=written, saver=saver, real=real):
            if driver is saver._sync:
                if wave.sent == at and not written:
                    written.append("tried")
                    try:
                        values = {**latest.checkpoint["channel_values"], "late": "late-plaintext"}
                        versions = {**latest.checkpoint["channel_versions"], "late": "9"}
                        cfg = writer.put(latest.config, checkpoint(values, versions), {"step": 99}, {"late": "9"})
                        written.append(cfg["configurable"]["checkpoint_id"])
                    except EncryptedObjectError:  # the thread is encrypted (archived or live): refused by name
                        pass
                wave.sent += 1
            return real(driver, calls)

        wave.sent = 0
        with monkeypatch.context() as patch:
            patch.setattr(SyncDriver, "_wave", wave)
            saver.encrypt_thread("rich")
        status = saver.encrypt_thread("rich")  # run again: encrypts a write that landed after
        if not status.complete:
            # A write refused (the thread encrypted under it) left its plaintext object:
            # young, it may be a write about to commit, so it stays until the grace ends.
            assert {r.reason for r in status.remaining} == {YOUNG_PLAINTEXT}, (at, status)
            patch_grace = monkeypatch.context()
            with patch_grace as patch:
                patch.setattr("s3_saver._ops.encrypt.GRACE", 0.0)  # an hour later
                status = saver.encrypt_thread("rich")
        assert status.complete, (at, status)
        head = saver.get_tuple(config("rich"))
        if len(written) == 2:
            assert head.checkpoint["channel_values"].get("late") == "late-plaintext", at
        assert _leaks(endpoint, "late-plaintext") == [], at
        assert _leaks(endpoint, "a document") == [], at
        writer.close()
        saver.close()
