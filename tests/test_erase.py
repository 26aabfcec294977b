"""erase_thread: every version and delete marker of a thread's objects goes, in every
region, on a versioned bucket or not; one small record stays; Object Lock is reported,
not an error; cut short at any round trip, a call again finishes it."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import boto3
import pytest

from conftest import BUCKET, TABLE, make_saver
from helpers import checkpoint, cut_points
from s3_saver import EraseReport, ThreadDeletedError
from test_archive_cut import _Cut
from test_lifecycle import _graph, _run

DOOMED = "doomed-thread"
KEPT = "kept-thread"
RECORD_MAX_BYTES = 1024


def _cfg(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


def _write(saver, thread_id: str, turns: int = 3, archive: bool = True) -> None:
    """Turns of a graph, one run each (run hints), pending writes, and (``archive``)
    an archive and restore (an archive object, tagged live objects)."""
    graph = _graph(saver)
    for turn in range(turns):
        _run((graph,), thread_id, range(turn, turn + 1), run_id=f"{thread_id}-run{turn}")
    if archive:
        saver.archive_thread(thread_id)
        saver.restore_thread(thread_id)
        _run((graph,), thread_id, range(turns, turns + 1), run_id=f"{thread_id}-run{turns}")


def _view(saver, thread_id: str) -> list:
    return [(t.config, t.checkpoint, t.metadata, t.parent_config, t.pending_writes) for t in saver.list(_cfg(thread_id))]


def _versions(endpoint: str, bucket: str, token: str, region: str = "us-east-1") -> list[dict]:
    """Every version and delete marker in ``bucket`` whose key holds ``token``."""
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=region)
    found = []
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
        for v in page.get("Versions", []) + page.get("DeleteMarkers", []):
            if token in v["Key"]:
                found.append(v)
    return found


def _items(endpoint: str, table: str, token: str, region: str = "us-east-1") -> list[dict]:
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name=region)
    found = []
    for page in ddb.get_paginator("scan").paginate(TableName=table):
        found += [i for i in page["Items"] if any(token in v.get("S", "") for v in i.values() if isinstance(v, dict))]
    return found


def _size(item: dict) -> int:
    return len(json.dumps(item, default=lambda b: "x" * len(b)))


def _assert_erased(endpoint: str, mode: str, bucket: str = BUCKET, table: str = TABLE, region: str = "us-east-1") -> None:
    """The targets: no version and no delete marker whose key holds the thread id,
    at most one record naming it, under 1 KB (a table item, or the manifest's head)."""
    left = _versions(endpoint, bucket, DOOMED, region)
    if mode == "manifest":
        assert len(left) <= 1, [(v["Key"], v.get("Size")) for v in left]
        for v in left:
            assert v["Key"].endswith("/head") and v.get("IsLatest") and v["Size"] <= RECORD_MAX_BYTES, v
    else:
        assert left == [], [(v["Key"], v.get("VersionId")) for v in left]
        items = _items(endpoint, table, DOOMED, region)
        assert len(items) <= 1 and all(_size(i) <= RECORD_MAX_BYTES for i in items), items


def _cut_then_called_again(monkeypatch, cut: int, saver, method: str):
    """``method`` of DOOMED on a new saver, cut short after ``cut`` round trips; returns
    another new saver (another process) for the test to call it again on."""
    cut_short = saver()
    with monkeypatch.context() as patch:
        cutter = _Cut(patch, cut)
        with pytest.raises(ConnectionError):
            getattr(cut_short, method)(DOOMED)
        assert cutter.fired
    cut_short.close()
    return saver()


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "unversioned"])
def test_erase_leaves_no_version_of_the_thread_and_the_other_reads_the_same(
    endpoint: str, index_mode: str, versioned: bool
) -> None:
    from conftest import make_versioned

    if versioned:
        make_versioned(endpoint)
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    _write(saver, DOOMED)
    _write(saver, KEPT, turns=2, archive=False)
    before = _view(saver, KEPT)
    assert _versions(endpoint, BUCKET, DOOMED)

    report = saver.erase_thread(DOOMED)
    assert isinstance(report, EraseReport) and report.complete, report.remaining
    # Unversioned, the delete removed every object itself: the purge finds none left.
    assert report.thread_id == DOOMED and report.buckets == (BUCKET,) and (report.deleted > 0) == versioned
    _assert_erased(endpoint, index_mode)
    assert saver.get_tuple(_cfg(DOOMED)) is None and _view(saver, DOOMED) == []
    fresh = make_saver(endpoint, index_mode)
    assert _view(fresh, KEPT) == before and _view(fresh, DOOMED) == []
    assert [t.thread_id for t in fresh.list_threads()] == [KEPT]
    assert fresh.audit(older_than=timedelta(0)).problems == []
    # A second erase finds nothing more to remove.
    assert saver.erase_thread(DOOMED).remaining == ()
    _assert_erased(endpoint, index_mode)
    fresh.close()
    saver.close()


def test_a_run_in_flight_cannot_bring_an_erased_thread_back(versioned_saver, index_mode: str, endpoint: str) -> None:
    """The record that stays is the delete's generation: the next checkpoint of
    a run that was in flight in another process is refused."""
    _write(versioned_saver, DOOMED, archive=False)
    latest = versioned_saver.get_tuple(_cfg(DOOMED))
    eraser = make_saver(endpoint, index_mode)
    eraser.erase_thread(DOOMED)
    versions = {**latest.checkpoint["channel_versions"], "turn": versioned_saver.get_next_version(None)}
    with pytest.raises(ThreadDeletedError):
        versioned_saver.put(latest.config, checkpoint({"turn": 99}, versions), {"step": 99}, {"turn": versions["turn"]})
    assert versioned_saver.get_tuple(_cfg(DOOMED)) is None
    # What the refused write sent before its commit (and took back: a delete
    # marker in a versioned bucket) goes with an erase again.
    assert eraser.erase_thread(DOOMED).complete
    _assert_erased(endpoint, index_mode)
    eraser.close()


def test_aerase_thread(versioned_saver, index_mode: str, endpoint: str) -> None:
    _write(versioned_saver, DOOMED, archive=False)

    async def erase() -> EraseReport:
        try:
            return await versioned_saver.aerase_thread(DOOMED)
        finally:
            await versioned_saver.aclose()

    assert asyncio.run(erase()).complete
    _assert_erased(endpoint, index_mode)


def _locked_bucket(endpoint: str) -> Any:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)  # versioning comes with it
    return s3


def test_object_lock_is_reported_and_everything_else_goes(endpoint: str, index_mode: str) -> None:
    s3 = _locked_bucket(endpoint)
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    _write(saver, DOOMED, archive=False)
    live = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"live/{DOOMED}/")["Contents"])
    until = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=30)
    retained, held = live[0], live[-1]
    s3.put_object_retention(Bucket=BUCKET, Key=retained, Retention={"Mode": "GOVERNANCE", "RetainUntilDate": until})
    s3.put_object_legal_hold(Bucket=BUCKET, Key=held, LegalHold={"Status": "ON"})

    report = saver.erase_thread(DOOMED)
    assert not report.complete
    by_key = {r.key: r for r in report.remaining}
    assert set(by_key) == {retained, held}, report.remaining
    assert by_key[retained].reason == "object lock" and by_key[retained].mode == "GOVERNANCE"
    assert by_key[retained].retain_until == until and not by_key[retained].legal_hold
    assert by_key[held].legal_hold and by_key[held].mode is None
    left = _versions(endpoint, BUCKET, DOOMED)
    others = [v for v in left if v["Key"] not in by_key]
    if index_mode == "manifest":
        assert [v["Key"] for v in others] == [f"manifests/{DOOMED}/head"], others
    else:
        assert others == []
    # Each locked version stays behind its delete marker: no plain GET returns it.
    assert sorted(v["Key"] for v in left if v["Key"] in by_key) == sorted([*by_key, *by_key])
    for key in by_key:
        with pytest.raises(s3.exceptions.NoSuchKey):
            s3.get_object(Bucket=BUCKET, Key=key)
    assert saver.get_tuple(_cfg(DOOMED)) is None
    # Once the hold is lifted, an erase again removes the held version.
    s3.put_object_legal_hold(Bucket=BUCKET, Key=held, VersionId=by_key[held].version_id, LegalHold={"Status": "OFF"})
    again = saver.erase_thread(DOOMED)
    assert [r.key for r in again.remaining] == [retained], again.remaining
    saver.close()


def test_erase_cut_after_any_round_trip_finishes_when_called_again(endpoint: str, index_mode: str, monkeypatch) -> None:
    from conftest import make_versioned

    def fresh_bucket() -> Any:
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")).close()
        make_versioned(endpoint)
        writer = make_saver(endpoint, index_mode)
        writer.setup()
        _write(writer, DOOMED)
        _write(writer, KEPT, turns=1, archive=False)
        return writer

    writer = fresh_bucket()
    counter = make_saver(endpoint, index_mode)
    counter.erase_thread(DOOMED)
    total = counter.stats.round_trips
    print(f"\n{index_mode}: erase_thread takes {total} round trips, {counter.stats.total_requests} requests")
    assert total >= 6

    for cut in cut_points(total, most=8):
        writer = fresh_bucket()
        before = _view(writer, KEPT)
        again = _cut_then_called_again(monkeypatch, cut, lambda: make_saver(endpoint, index_mode), "erase_thread")
        assert again.erase_thread(DOOMED).complete, cut
        _assert_erased(endpoint, index_mode)
        assert _view(again, KEPT) == before and _view(again, DOOMED) == [], cut
        assert again.audit(older_than=timedelta(0)).problems == [], cut
        for s in (again, writer):
            s.close()


@pytest.mark.parametrize("mode", ("manifest", "dynamodb", "dynamodb-global"))
def test_erase_with_a_replica_erases_the_replica_bucket_and_index(regions, mode: str) -> None:
    from regions import PRIMARY_BUCKET, PRIMARY_REGION, REPLICA_BUCKET, REPLICA_REGION, TABLE_NAME
    from test_replica import _saver

    index_mode = "manifest" if mode == "manifest" else "dynamodb"
    saver = _saver(regions, mode)
    _write(saver, DOOMED, archive=False)
    _write(saver, KEPT, turns=1, archive=False)
    regions.replicator.sync()
    assert _versions(regions.moto, REPLICA_BUCKET, DOOMED, REPLICA_REGION)
    kept = sorted((v["Key"], v["VersionId"]) for v in _versions(regions.moto, REPLICA_BUCKET, KEPT, REPLICA_REGION))

    report = saver.erase_thread(DOOMED)
    assert report.buckets == (PRIMARY_BUCKET, REPLICA_BUCKET) and report.complete, report.remaining
    if mode == "dynamodb-global":
        regions.replicator.sync()  # the global table carries the item deletes over
    for bucket, region in ((PRIMARY_BUCKET, PRIMARY_REGION), (REPLICA_BUCKET, REPLICA_REGION)):
        _assert_erased(regions.moto, index_mode, bucket=bucket, table=TABLE_NAME, region=region)
    assert sorted((v["Key"], v["VersionId"]) for v in _versions(regions.moto, REPLICA_BUCKET, KEPT, REPLICA_REGION)) == kept
    assert saver.get_tuple(_cfg(KEPT)) is not None and saver.get_tuple(_cfg(DOOMED)) is None


def test_erase_finds_the_hints_of_a_thread_s_earlier_lives(endpoint: str, index_mode: str) -> None:
    """A thread deleted, then started afresh by a new run: its earlier life's run
    hints and listing object (deleted by key, so on a versioned bucket a noncurrent
    version and a delete marker each) are no longer named by the head; the delete
    recorded them for an erase to find."""
    from conftest import make_versioned

    make_versioned(endpoint)
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    _write(saver, DOOMED, turns=2, archive=False)
    saver.delete_thread(DOOMED)
    _run((_graph(saver),), DOOMED, range(5, 6), run_id="second-life-run")
    report = saver.erase_thread(DOOMED)
    assert report.complete, report.remaining
    _assert_erased(endpoint, index_mode)
    assert saver.get_tuple(_cfg(DOOMED)) is None
    saver.close()


@pytest.mark.parametrize("mode", ("manifest", "dynamodb"))
def test_erase_with_a_replica_finds_the_earlier_life_there_too(regions, mode: str) -> None:
    """The replica received the earlier life's run hints and listing object and
    then their delete markers; the erase in the replica finds them through the
    delete's record, which replicated with the thread's folder."""
    from regions import PRIMARY_BUCKET, PRIMARY_REGION, REPLICA_BUCKET, REPLICA_REGION, TABLE_NAME
    from test_replica import _saver

    saver = _saver(regions, mode)
    _write(saver, DOOMED, turns=2, archive=False)
    regions.replicator.sync()
    saver.delete_thread(DOOMED)
    _run((_graph(saver),), DOOMED, range(5, 6), run_id="second-life-run")
    regions.replicator.sync()
    if mode == "manifest":  # the earlier life's run hint, in the replica too
        assert any("/runs/doomed-thread-run0/" in v["Key"] for v in _versions(regions.moto, REPLICA_BUCKET, DOOMED, REPLICA_REGION))

    report = saver.erase_thread(DOOMED)
    assert report.buckets == (PRIMARY_BUCKET, REPLICA_BUCKET) and report.complete, report.remaining
    for bucket, region in ((PRIMARY_BUCKET, PRIMARY_REGION), (REPLICA_BUCKET, REPLICA_REGION)):
        _assert_erased(regions.moto, mode, bucket=bucket, table=TABLE_NAME, region=region)


def test_a_run_that_lands_before_the_erase_s_delete_leaves_no_hint(endpoint: str, index_mode: str, monkeypatch) -> None:
    """A run writes the thread after the erase recorded its hints and before the
    erase's delete: the delete records the new run's hint, and the erase reads
    that record before it lists the versions."""
    from conftest import make_versioned
    from s3_saver._ops import erase

    make_versioned(endpoint)
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    _write(saver, DOOMED, turns=1, archive=False)
    writer = make_saver(endpoint, index_mode)
    delete = erase.delete.delete_thread

    def raced(ctx, thread_id, *rest):
        _run((_graph(writer),), DOOMED, range(7, 8), run_id="raced-run")
        return (yield from delete(ctx, thread_id, *rest))

    monkeypatch.setattr(erase.delete, "delete_thread", raced)
    report = saver.erase_thread(DOOMED)
    assert report.complete, report.remaining
    _assert_erased(endpoint, index_mode)
    writer.close()
    saver.close()


def test_a_refused_write_of_a_new_run_leaves_no_hint_after_an_erase(versioned_saver, index_mode: str, endpoint: str) -> None:
    """A process that holds the thread starts a new run on it after another process
    deleted it: its put sends the run's hint with its objects, the commit is
    refused and the hint is taken back (on a versioned bucket, a version and a
    delete marker no head names). The erase after finds it."""
    _write(versioned_saver, DOOMED, turns=1, archive=False)
    latest = versioned_saver.get_tuple(_cfg(DOOMED))
    other = make_saver(endpoint, index_mode)
    other.delete_thread(DOOMED)
    versions = {**latest.checkpoint["channel_versions"], "turn": versioned_saver.get_next_version(None)}
    with pytest.raises(ThreadDeletedError):
        versioned_saver.put(
            latest.config, checkpoint({"turn": 99}, versions), {"step": 99, "run_id": "late-run"}, {"turn": versions["turn"]}
        )
    assert other.erase_thread(DOOMED).complete
    _assert_erased(endpoint, index_mode)
    other.close()


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "unversioned"])
def test_an_archived_thread_s_delete_cut_after_any_round_trip_forgets_its_runs(
    endpoint: str, index_mode: str, versioned: bool, monkeypatch
) -> None:
    """An archived thread's runs are named only by its archive reference, which the
    delete's switch takes out: a delete cut short after the switch and called again
    still removes their hints (and, versioned, records them for an erase)."""
    import urllib.request

    from conftest import make_versioned

    runs = [f"{DOOMED}-run{turn}" for turn in range(2)]

    def archived() -> Any:
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")).close()
        if versioned:
            make_versioned(endpoint)
        writer = make_saver(endpoint, index_mode)
        writer.setup()
        _write(writer, DOOMED, turns=len(runs), archive=False)
        writer.archive_thread(DOOMED)
        assert writer.threads_of_runs(runs) == {r: [DOOMED] for r in runs}
        return writer

    archived().close()
    counter = make_saver(endpoint, index_mode)
    counter.delete_thread(DOOMED)
    total = counter.stats.round_trips
    print(f"\n{index_mode}: delete_thread of an archived thread takes {total} round trips, {counter.stats.total_requests} requests")
    counter.close()

    for cut in [c for c in cut_points(total, most=8) if c >= 1]:
        writer = archived()
        again = _cut_then_called_again(monkeypatch, cut, lambda: make_saver(endpoint, index_mode), "delete_thread")
        again.delete_thread(DOOMED)
        assert again.threads_of_runs(runs) == {}, cut
        if index_mode == "manifest":
            s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
            hints = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []) if "/runs/" in o["Key"]]
            assert [k for k in hints if DOOMED in k] == [], cut
        if versioned:
            assert again.erase_thread(DOOMED).complete, cut
            _assert_erased(endpoint, index_mode)
        for s in (again, writer):
            s.close()
