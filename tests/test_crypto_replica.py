"""Encryption with a replica region: a key store in each region. A thread's key is made in
both (in one wave, by the region written to), the replica region's reads unwrap it from
its own, an erase destroys it in both before it deletes anything, and a key that never
reached the replica reads there as replication lag. On the regions harness
(tests/regions.py: the primary behind a proxy that a test takes down, replication by hand).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import boto3
import pytest
from helpers import checkpoint, config
from regions import PRIMARY_BUCKET, PRIMARY_REGION, REPLICA_BUCKET, REPLICA_REGION, Proxy, saver_client_config, saver_retry
from test_encryption import _steady
from test_replica import READ_MODES, _saver

from s3_saver import ConfigurationError, KmsKey, LocalKey, Replica, ReplicationLagError, S3Saver, ThreadErasedError
from s3_saver._crypto.envelope import is_sealed, key_id_of
from s3_saver._crypto.records import decode_record
from s3_saver._format.key_codec import encode
from s3_saver._transport.sync import SyncDriver

PRIMARY_KEYS, REPLICA_KEYS = f"{PRIMARY_BUCKET}-keys", f"{REPLICA_BUCKET}-keys"


def _multi_region_key(moto: str, multi: bool = True) -> KmsKey:
    """A KMS key in the primary's region, replicated to the replica's (multi-Region), with
    the alias ``alias/checkpoints`` in both."""
    primary = boto3.client("kms", endpoint_url=moto, region_name=PRIMARY_REGION)
    key = primary.create_key(Description="checkpoints", MultiRegion=multi)["KeyMetadata"]
    primary.create_alias(AliasName="alias/checkpoints", TargetKeyId=key["KeyId"])
    if multi:
        primary.replicate_key(KeyId=key["KeyId"], ReplicaRegion=REPLICA_REGION)
        replica = boto3.client("kms", endpoint_url=moto, region_name=REPLICA_REGION)
        try:
            replica.create_alias(AliasName="alias/checkpoints", TargetKeyId=key["KeyId"])
        except replica.exceptions.AlreadyExistsException:
            pass  # moto's replica key keeps the primary's aliases
    return KmsKey("alias/checkpoints")


def _encryption(regions: Any, kind: str) -> KmsKey | LocalKey:
    return _multi_region_key(regions.moto) if kind == "kms" else LocalKey(os.urandom(32))


def _record(site: Any, bucket: str, thread: str) -> Any:
    key = f"t/{encode(thread)}"
    try:
        found = site.s3.get_object(Bucket=bucket, Key=key)
    except site.s3.exceptions.NoSuchKey:
        return None
    return decode_record(found["Body"].read(), found["ETag"], key)


def _put(saver: Any, thread: str, value: str) -> dict[str, Any]:
    cp = checkpoint({"doc": value, "big": value * 40}, {"doc": "1", "big": "1"})
    stored = saver.put(config(thread), cp, {"source": "input", "step": -1}, {"doc": "1", "big": "1"})
    saver.put_writes(stored, [("doc", f"{value}-write")], "task-1")
    return stored


def _value(found: Any) -> tuple[str, list[Any]]:
    return found.checkpoint["channel_values"]["doc"], [w[2] for w in found.pending_writes]


def _encrypted_saver(regions: Any, mode: str, encryption: Any, **kw: Any) -> S3Saver:
    saver = _saver(regions, mode, encryption=encryption, **kw)
    saver.setup_replica()  # the replica region's bucket, table and key store
    saver.stats.reset()
    return saver


@pytest.mark.parametrize("kind", ["kms", "local"])
@pytest.mark.parametrize("mode", READ_MODES)
def test_a_key_is_made_in_both_regions_key_stores_and_the_replica_reads_with_its_own(regions, mode, kind) -> None:
    encryption = _encryption(regions, kind)
    saver = _encrypted_saver(regions, mode, encryption)
    plain = _saver(regions, mode, prefix="plain/")
    assert regions.replica.s3.get_bucket_versioning(Bucket=REPLICA_KEYS).get("Status") is None

    # A new thread's key: made in both stores, the copy in the same wave as the create.
    trips = []
    for s in (saver, plain):
        s.get_tuple(config("t"))  # as LangGraph reads a thread before its first put
        s.stats.reset()
        _put(s, "t", "secret-value")
        trips.append(s.stats.round_trips)
    assert trips[0] - trips[1] == (2 if kind == "kms" else 1)  # as without a replica
    here, there = _record(regions.primary, PRIMARY_KEYS, "t"), _record(regions.replica, REPLICA_KEYS, "t")
    assert here.live and there.live and here.key_id == there.key_id and here.wrapped == there.wrapped
    assert not here.pending_replica
    # The steady state sends what it sends without encryption (with a replica too).
    assert _steady(saver, "s") == _steady(plain, "s")

    # Replicated, then the primary region goes out: a process that never saw the thread
    # reads it from the replica, its key from the replica region's store (and KMS there).
    regions.replicator.run()
    reader = _saver(regions, mode, encryption=encryption, recheck_after=3600)
    regions.proxy.refuse()
    assert _value(reader.get_tuple(config("t"))) == ("secret-value", ["secret-value-write"])
    assert reader.last_read.site == "replica"
    on_replica = reader.replica_stats.requests
    assert on_replica.get(("s3", "get_object"), 0) >= 2
    if kind == "kms":
        assert on_replica.get(("kms", "decrypt")) == 1
    copies = regions.replica.keys(f"live/{encode('t')}/")
    assert copies and all(key_id_of(regions.replica.read(k)) == here.key_id for k in copies)


@pytest.mark.parametrize("mode", READ_MODES)
def test_a_replica_key_that_never_arrived_reads_as_replication_lag(regions, mode) -> None:
    encryption = LocalKey(os.urandom(32))
    saver = _encrypted_saver(regions, mode, encryption)
    _put(saver, "t", "written")
    regions.replicator.run()
    held = regions.replica.s3.get_object(Bucket=REPLICA_KEYS, Key=f"t/{encode('t')}")["Body"].read()
    regions.replica.s3.delete_object(Bucket=REPLICA_KEYS, Key=f"t/{encode('t')}")  # never arrived
    reader = _saver(regions, mode, encryption=encryption, recheck_after=3600)
    regions.proxy.refuse()
    with pytest.raises(ReplicationLagError, match="has not reached this region's key store"):
        reader.get_tuple(config("t"))
    with pytest.raises(ReplicationLagError):
        list(reader.list(config("t")))
    # Once it arrives, the replica serves the thread.
    regions.replica.s3.put_object(Bucket=REPLICA_KEYS, Key=f"t/{encode('t')}", Body=held)
    assert _value(reader.get_tuple(config("t"))) == ("written", ["written-write"])


def test_a_copy_the_replica_region_missed_is_pending_and_made_by_the_next_process(regions) -> None:
    """The replica region out as a thread's key is made: the write goes on, the record is
    marked pending; the next process that reads the key copies it and takes the mark off."""
    encryption = LocalKey(os.urandom(32))
    far = Proxy(regions.moto)  # in front of the replica region this time
    try:

        def make(**kw: Any) -> S3Saver:
            saver = S3Saver(
                PRIMARY_BUCKET,
                region_name=PRIMARY_REGION,
                endpoint_url=regions.moto,
                client_config=saver_client_config(),
                retry=saver_retry(),
                encryption=encryption,
                replica=Replica(REPLICA_BUCKET, region_name=REPLICA_REGION, endpoint_url=far.url, **kw),
            )
            regions.savers.append(saver)
            return saver

        writer = make()
        writer.setup()
        writer.setup_replica()
        far.refuse()
        _put(writer, "t", "while-out")
        here = _record(regions.primary, PRIMARY_KEYS, "t")
        assert here.live and here.pending_replica and _record(regions.replica, REPLICA_KEYS, "t") is None
        far.up()
        # The writer holds the key: its next writes send nothing more.
        latest = writer.get_tuple(config("t")).config
        writer.stats.reset()
        writer.put_writes(latest, [("doc", "again")], "task-2")
        assert writer.stats.total_requests == 2, writer.stats.requests
        # Another process reads the key: it copies it to the replica region and takes the mark off.
        make().get_tuple(config("t"))
        there, here = _record(regions.replica, REPLICA_KEYS, "t"), _record(regions.primary, PRIMARY_KEYS, "t")
        assert there.live and there.key_id == here.key_id and not here.pending_replica
    finally:
        far.close()


# -- erase ---------------------------------------------------------------------------------------
def _calls(monkeypatch) -> list[tuple[str, str, str]]:
    """(service, operation, bucket or table) of every call the sync driver sends, in order."""
    sent: list[tuple[str, str, str]] = []
    lock = threading.Lock()
    real = SyncDriver._wave

    def wave(driver, calls):
        with lock:
            sent.extend((c.service, c.operation, c.params.get("Bucket") or c.params.get("TableName") or "") for c in calls)
        return real(driver, calls)

    monkeypatch.setattr(SyncDriver, "_wave", wave)
    return sent


@pytest.mark.parametrize("mode", READ_MODES)
def test_an_erase_destroys_the_key_in_both_regions_before_it_deletes_anything(regions, mode, monkeypatch) -> None:
    encryption = _multi_region_key(regions.moto)
    saver = _encrypted_saver(regions, mode, encryption)
    _put(saver, "doomed", "doomed")
    _put(saver, "kept", "kept")
    regions.replicator.run()
    # The last of the doomed thread's writes have not reached the replica as the erase
    # runs; they arrive after it (replication lags): unreadable there all the same.
    _put(saver, "doomed", "late")
    late = regions.replicator.capture()
    key_id = _record(regions.primary, PRIMARY_KEYS, "doomed").key_id

    sent = _calls(monkeypatch)
    report = saver.erase_thread("doomed")
    monkeypatch.undo()
    assert report.key_destroyed_at is not None
    puts = [i for i, (svc, op, where) in enumerate(sent) if op == "put_object" and where in (PRIMARY_KEYS, REPLICA_KEYS)]
    deletes = [i for i, (svc, op, where) in enumerate(sent) if op.startswith("delete") or op == "transact_write_items"]
    assert {sent[i][2] for i in puts[:2]} == {PRIMARY_KEYS, REPLICA_KEYS} and deletes and puts[1] < deletes[0], sent
    for site, bucket in ((regions.primary, PRIMARY_KEYS), (regions.replica, REPLICA_KEYS)):
        record = _record(site, bucket, "doomed")
        assert not record.live and record.key_id == key_id and record.settled and record.wrapped is None
    assert sum("key's destruction" in r for r in report.records) == 2

    # What replication brings after the erase reads, in the replica region, as erased.
    regions.replicator.pending = list(late)
    regions.replicator.deliver()
    reader = _saver(regions, mode, encryption=encryption, recheck_after=3600)
    regions.proxy.refuse()
    try:
        found = reader.get_tuple(config("doomed"))
        assert found is None  # the replica's index says the thread is gone
    except ThreadErasedError as exc:
        assert exc.thread_id == "doomed"
    for key in regions.replica.keys(f"live/{encode('doomed')}/"):
        body = regions.replica.read(key)
        assert is_sealed(body) and key_id_of(body) == key_id  # nothing can open it: its key is gone
    assert _value(reader.get_tuple(config("kept"))) == ("kept", ["kept-write"])


def test_a_single_region_kms_key_is_refused_with_a_replica(regions) -> None:
    encryption = _multi_region_key(regions.moto, multi=False)
    with pytest.raises(ConfigurationError, match="multi-Region"):
        regions.make_saver("manifest", encryption=encryption)


def test_a_replica_region_s_saver_names_its_own_region_s_kms_key() -> None:
    """The replica of a multi-Region key has the primary's id in another region's ARN:
    the replica region's calls name that one (the region written to's would be refused)."""
    from s3_saver._crypto.keyrings import KmsKeyring, Sealed
    from s3_saver._crypto.records import KeyRecord
    from s3_saver.errors import Where

    arn = "arn:aws:kms:us-east-1:111122223333:key/mrk-1234abcd"
    ring = KmsKeyring(KmsKey(arn), Where("b", None), region="eu-west-1")
    assert ring.key_id == "arn:aws:kms:eu-west-1:111122223333:key/mrk-1234abcd"
    record = KeyRecord("live", b"k" * 16, 0, b"wrapped", f"kms:{arn}")
    op = ring.unwrap([Sealed(record, {}, "b", "t/x", "x")])
    (call,) = next(op)
    assert call.params["KeyId"] == "arn:aws:kms:eu-west-1:111122223333:key/mrk-1234abcd"
    assert KmsKeyring(KmsKey("alias/checkpoints"), Where("b", None), region="eu-west-1").key_id == "alias/checkpoints"
    # A single-Region key is only in its own region: named as it is.
    single = "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    assert KmsKeyring(KmsKey(single), Where("b", None), region="eu-west-1").key_id == single


def test_a_promoted_replica_writes_under_its_own_key_store_and_copies_to_the_region_left(regions) -> None:
    """Manifest mode, the primary region out: promote(); the replica region writes its
    threads under the keys its store holds, and makes new threads' keys there, their
    copies to the region left pending until it answers again."""
    encryption = LocalKey(os.urandom(32))
    saver = _encrypted_saver(regions, "manifest", encryption)
    _put(saver, "t", "before")
    regions.replicator.run()
    key_id = _record(regions.replica, REPLICA_KEYS, "t").key_id
    regions.proxy.refuse()
    saver.promote(force=True)
    _put(saver, "t", "after")  # a new run on the thread: its key from this region's store
    _put(saver, "new", "born-here")
    assert _value(saver.get_tuple(config("t"))) == ("after", ["after-write"])
    assert _value(saver.get_tuple(config("new"))) == ("born-here", ["born-here-write"])
    assert all(key_id_of(regions.replica.read(k)) == key_id for k in regions.replica.keys(f"live/{encode('t')}/"))
    made = _record(regions.replica, REPLICA_KEYS, "new")
    assert made.live and made.pending_replica and _record(regions.primary, PRIMARY_KEYS, "new") is None
    # The region left answers again: the next process that reads the key copies it there.
    regions.proxy.up()
    other = _saver(regions, "manifest", encryption=encryption)
    other.promote()  # this process's roles, as the operator's runbook has every process do
    assert _value(other.get_tuple(config("new"))) == ("born-here", ["born-here-write"])
    copied = _record(regions.primary, PRIMARY_KEYS, "new")
    assert copied.live and copied.key_id == made.key_id and not _record(regions.replica, REPLICA_KEYS, "new").pending_replica


@pytest.mark.parametrize("mode", READ_MODES)
def test_after_promote_a_key_missing_in_the_promoted_region_is_missing_not_lag(regions, mode) -> None:
    """promote() makes the replica region the one written to: a key its store lacks is no
    longer one that has not arrived (keys are made there now), so a read names the key
    missing (ThreadErasedError), never replication lag; the region left is the one whose
    keys may lag now (a key made after promote() is copied there later). The memory
    store's keys alike."""
    from s3_saver import NamespaceErasedError, S3Store
    from s3_saver._format.memory.names import node_id

    encryption = LocalKey(os.urandom(32))
    saver = _encrypted_saver(regions, mode, encryption)
    store = S3Store.from_saver(saver)
    _put(saver, "t", "before")
    store.put(("memories", "u1"), "k", {"text": "secret-memory"})
    regions.replicator.run()
    # The thread's and the namespace's keys lost from the replica region's store.
    regions.replica.s3.delete_object(Bucket=REPLICA_KEYS, Key=f"t/{encode('t')}")
    regions.replica.s3.delete_object(Bucket=REPLICA_KEYS, Key=f"m/{node_id(('memories', 'u1'))}")
    regions.proxy.refuse()
    saver.promote(force=True)
    with pytest.raises(ThreadErasedError, match="no key in the key store") as found:
        saver.get_tuple(config("t"))
    assert not isinstance(found.value, ReplicationLagError)
    with pytest.raises(NamespaceErasedError) as erased:
        store.get(("memories", "u1"), "k")
    assert not isinstance(erased.value, ReplicationLagError)
    # The roles, in the key stores too: the promoted region's keys are made, the other's lag.
    assert saver._ctx.crypt.lags is False and saver._other_ctx.crypt.lags is True
    assert saver._ctx.crypt.for_memory().lags is False and saver._other_ctx.crypt.for_memory().lags is True


def _multi_region_new_key(moto: str) -> KmsKey:
    primary = boto3.client("kms", endpoint_url=moto, region_name=PRIMARY_REGION)
    key = primary.create_key(Description="rotated", MultiRegion=True)["KeyMetadata"]
    primary.create_alias(AliasName="alias/rotated", TargetKeyId=key["KeyId"])
    primary.replicate_key(KeyId=key["KeyId"], ReplicaRegion=REPLICA_REGION)
    replica = boto3.client("kms", endpoint_url=moto, region_name=REPLICA_REGION)
    try:
        replica.create_alias(AliasName="alias/rotated", TargetKeyId=key["KeyId"])
    except replica.exceptions.AlreadyExistsException:
        pass
    return KmsKey("alias/rotated")


@pytest.mark.parametrize("kind", ["kms", "local"])
def test_rewrap_wraps_the_keys_of_both_regions_key_stores(regions, kind) -> None:
    """Each region's store is walked with that region's keyring (KMS ReEncrypt in its
    region); the replica then reads with the new key only. A single-Region new key is
    refused with a replica, before anything is written."""
    encryption = _encryption(regions, kind)
    saver = _encrypted_saver(regions, "manifest", encryption)
    for t in ("t", "u"):
        _put(saver, t, f"secret-{t}")
    regions.replicator.run()
    before = {t: (_record(regions.primary, PRIMARY_KEYS, t), _record(regions.replica, REPLICA_KEYS, t)) for t in ("t", "u")}
    if kind == "kms":
        single = boto3.client("kms", endpoint_url=regions.moto, region_name=PRIMARY_REGION)
        single.create_alias(AliasName="alias/single", TargetKeyId=single.create_key()["KeyMetadata"]["KeyId"])
        with pytest.raises(ConfigurationError, match="multi-Region"):
            saver.rewrap(KmsKey("alias/single"))
        assert _record(regions.primary, PRIMARY_KEYS, "t") == before["t"][0]
    new = _multi_region_new_key(regions.moto) if kind == "kms" else LocalKey(os.urandom(32))
    saver.stats.reset()
    report = saver.rewrap(new)
    assert (report.rewrapped, report.already, report.erased) == (4, 0, 0)
    assert report.key_stores == [f"s3://{PRIMARY_KEYS}/", f"s3://{REPLICA_KEYS}/"]
    if kind == "kms":
        assert saver.replica_stats.requests[("kms", "re_encrypt")] == 2  # the replica region's own
    for t, (here, there) in before.items():
        now_here, now_there = _record(regions.primary, PRIMARY_KEYS, t), _record(regions.replica, REPLICA_KEYS, t)
        assert now_here.key_id == here.key_id == there.key_id == now_there.key_id
        assert now_here.wrapped != here.wrapped and now_there.wrapped != there.wrapped
    # The replica region reads with the new key only (the primary out).
    reader = _saver(regions, "manifest", encryption=new, recheck_after=3600)
    regions.proxy.refuse()
    assert _value(reader.get_tuple(config("u"))) == ("secret-u", ["secret-u-write"])
    assert reader.last_read.site == "replica"


# -- promote with a DynamoDB index that is not a global table: the index rebuilt --------------
@pytest.mark.parametrize("kind", ["kms", "local"])
def test_promote_rebuilds_an_encrypted_index_with_the_replica_region_s_keys(regions, kind) -> None:
    """DynamoDB without a global table, the primary region out: promote() rebuilds the
    replica region's table from its bucket, each thread's key read from that region's
    key store (KMS there). What it writes is sealed; a thread erased before the outage
    (its last objects replicated after the erase) stays out; a thread whose key never
    reached that store is named incomplete, never indexed."""
    from test_replica import _replicator

    encryption = _encryption(regions, kind)
    saver = _encrypted_saver(regions, "dynamodb", encryption, recheck_after=3600)
    replicator = _replicator(regions, "dynamodb")
    first = _put(saver, "t", "before")
    _put(saver, "t", "second")
    _put(saver, "lag", "no-key-there")
    _put(saver, "gone", "doomed")
    replicator.run()
    # The erased thread's last objects reach the replica after the erase.
    _put(saver, "gone", "late")
    late = replicator.capture()
    assert saver.erase_thread("gone").key_destroyed_at is not None
    replicator.pending = list(late)
    replicator.deliver()
    # "lag"'s key never reached the replica region's store.
    regions.replica.s3.delete_object(Bucket=REPLICA_KEYS, Key=f"t/{encode('lag')}")
    lag_id = saver.get_tuple(config("lag")).config["configurable"]["checkpoint_id"]
    before = [(c.checkpoint, c.metadata, c.pending_writes) for c in saver.list(config("t"))]
    assert len(before) == 2

    regions.proxy.refuse()
    saver.stats.reset()
    promotion = saver.promote()
    assert not promotion.checked and promotion.rebuilt == 2
    assert {(u.thread_id, u.reason) for u in promotion.unindexed} == {("gone", "erased"), ("lag", "key_not_arrived")}
    assert promotion.incomplete == (f"lag//{lag_id}",)
    if kind == "kms":
        # Keys unwrapped in the replica region, by its replica of the key (one Decrypt a live thread).
        assert saver.replica_stats.requests.get(("kms", "decrypt")) == 1

    # The promoted region serves the thread, and goes on writing it.
    assert [(c.checkpoint, c.metadata, c.pending_writes) for c in saver.list(config("t"))] == before
    assert saver.get_tuple(config("gone")) is None and saver.get_tuple(config("lag")) is None
    after = saver.put(first, checkpoint({"doc": "after"}, {"doc": "2"}), {"source": "loop", "step": 0}, {"doc": "2"})
    assert saver.get_tuple(after).checkpoint["channel_values"]["doc"] == "after"
    # Every body and metadata the rebuild wrote to the replica region's table is sealed.
    items = [i for p in regions.replica.dynamodb.get_paginator("scan").paginate(TableName=regions.replica.table) for i in p["Items"]]
    sealed = [i[a]["B"] for i in items for a in ("body", "meta") if a in i and "B" in i[a]]
    assert sealed and all(is_sealed(bytes(b)) for b in sealed)


@pytest.mark.parametrize("mode", READ_MODES)
def test_a_memory_namespace_key_is_made_in_both_regions_and_the_replica_reads_with_its_own(regions, mode) -> None:
    """S3Store.from_saver of an encrypting saver with a replica: a namespace's key is
    made in both regions' key stores (m/<namespace id>), and during an outage the
    replica region reads the item with its own store's copy."""
    from s3_saver import S3Store
    from s3_saver._format.memory.names import node_id

    encryption = LocalKey(os.urandom(32))
    saver = _encrypted_saver(regions, mode, encryption)
    store = S3Store.from_saver(saver)
    store.put(("memories", "u1"), "k", {"text": "secret-memory"})
    key = f"m/{node_id(('memories', 'u1'))}"
    here = decode_record(regions.primary.s3.get_object(Bucket=PRIMARY_KEYS, Key=key)["Body"].read(), None, key)
    there = decode_record(regions.replica.s3.get_object(Bucket=REPLICA_KEYS, Key=key)["Body"].read(), None, key)
    assert here.live and there.live and here.key_id == there.key_id

    regions.replicator.run()
    reader = _saver(regions, mode, encryption=encryption, recheck_after=3600)
    regions.proxy.refuse()
    assert S3Store.from_saver(reader).get(("memories", "u1"), "k").value == {"text": "secret-memory"}
    assert reader.last_read.site == "replica"
    regions.proxy.up()

    # The erase destroys the key in both regions' stores first.
    store.erase_namespace(("memories", "u1"))
    for site, bucket in ((regions.primary, PRIMARY_KEYS), (regions.replica, REPLICA_KEYS)):
        record = decode_record(site.s3.get_object(Bucket=bucket, Key=key)["Body"].read(), None, key)
        assert not record.live and record.key_id == here.key_id


# -- erase with a replica, then both regions restored from history --------------------------------
def _history(site: Any) -> tuple[list[tuple[str, bytes]], list[dict[str, Any]]]:
    """What a backup of one region holds: every version of every object of its bucket
    (oldest first per key) and every item of its table. Not its key store."""
    versions: dict[str, list[bytes]] = {}
    for page in site.s3.get_paginator("list_object_versions").paginate(Bucket=site.bucket):
        for v in page.get("Versions", []):  # newest first, per key
            body = site.s3.get_object(Bucket=site.bucket, Key=v["Key"], VersionId=v["VersionId"])["Body"].read()
            versions.setdefault(v["Key"], []).append(body)
    return [(k, b) for k, bodies in versions.items() for b in reversed(bodies)], site.items()


def _put_back(site: Any, objects: list[tuple[str, bytes]], items: list[dict[str, Any]]) -> None:
    """Every old version made current again, every item as it was: a restore of the
    region's bucket and a point-in-time restore of its table to before the erase."""
    for key, body in objects:
        site.s3.put_object(Bucket=site.bucket, Key=key, Body=body)
    for item in items:
        site.dynamodb.put_item(TableName=site.table, Item=item)


@pytest.mark.parametrize("mode", READ_MODES)
def test_an_erased_thread_stays_unreadable_in_both_regions_restored_from_history(regions, mode) -> None:
    """A thread replicated to the replica region, then erased. Both regions are then put
    back as a backup holds them from before the erase: every object version of each bucket
    current again, every index item as it was. Read in the region written to, and in the
    replica region (the primary out), the thread is erased or gone, never its content;
    every restored byte of it is sealed under the destroyed key. Another thread reads on."""
    encryption = LocalKey(os.urandom(32))
    saver = _encrypted_saver(regions, mode, encryption)
    _put(saver, "doomed", "doomed-secret-1")
    _put(saver, "doomed", "doomed-secret-2")
    _put(saver, "kept", "kept")
    regions.replicator.run()
    backups = [(site, _history(site)) for site in (regions.primary, regions.replica)]
    assert all(any(k.startswith(f"live/{encode('doomed')}/") for k, _ in objects) for _, (objects, _) in backups)
    key_id = _record(regions.primary, PRIMARY_KEYS, "doomed").key_id

    assert saver.erase_thread("doomed").key_destroyed_at is not None
    regions.replicator.run()
    for site, (objects, items) in backups:
        _put_back(site, objects, items)

    for region in ("primary", "replica"):
        reader = _saver(regions, mode, encryption=encryption, recheck_after=3600)
        if region == "replica":
            regions.proxy.refuse()
        try:
            try:
                found = reader.get_tuple(config("doomed"))
                assert found is None, (region, found)
            except ThreadErasedError as exc:
                assert exc.thread_id == "doomed"
            assert _value(reader.get_tuple(config("kept"))) == ("kept", ["kept-write"])
            assert reader.last_read.site == region
        finally:
            regions.proxy.up()
            reader.close()
    for site in (regions.primary, regions.replica):
        restored = site.keys(f"live/{encode('doomed')}/")
        assert restored
        for key in restored:
            body = site.read(key)
            assert is_sealed(body) and key_id_of(body) == key_id, key  # its key is gone in both stores
    saver.close()
