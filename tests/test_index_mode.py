"""A bucket prefix belongs to one index mode: a saver of the other mode is refused
before it reads, writes or deletes (library, command line, LangGraph Server module).

Each test writes in one mode (``index_mode``) and comes back in the other, so both
directions run.
"""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import timedelta

import boto3
import pytest

from cli_support import error_line, ok, run_cli
from conftest import BUCKET, TABLE, make_saver, make_versioned
from helpers import checkpoint, config, grow_thread
from s3_saver import TABLE_ATTRIBUTE_DEFINITIONS, TABLE_KEY_SCHEMA, IndexModeMismatchError, S3SaverError
from s3_saver._transport import mode as _mode
from s3_saver._format.keys import KeyLayout
from s3_saver.langgraph_server import saver_from_env

MARKER = KeyLayout("").root + _mode.MARKER_NAME


def _other(mode: str) -> str:
    return "manifest" if mode == "dynamodb" else "dynamodb"


def _s3(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _ddb(endpoint: str):
    return boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")


def _make_table(endpoint: str, key_schema=TABLE_KEY_SCHEMA, attributes=TABLE_ATTRIBUTE_DEFINITIONS, name: str = TABLE) -> None:
    """The table as a stack makes it (no setup(), so no marker or owner record)."""
    _ddb(endpoint).create_table(
        TableName=name, KeySchema=list(key_schema), AttributeDefinitions=list(attributes), BillingMode="PAY_PER_REQUEST"
    )


def _objects(endpoint: str) -> dict[str, str]:
    return {o["Key"]: o["ETag"] for o in _s3(endpoint).list_objects_v2(Bucket=BUCKET).get("Contents", [])}


def _items(endpoint: str) -> list[dict]:
    try:
        return _ddb(endpoint).scan(TableName=TABLE)["Items"]
    except _ddb(endpoint).exceptions.ResourceNotFoundException:
        return []


def _thread_items(endpoint: str) -> list[dict]:
    """Items of threads (not the table's records: its owner, listing shards...)."""
    return [i for i in _items(endpoint) if "#" not in i["pk"]["S"]]


def _store(endpoint: str) -> tuple[dict[str, str], list]:
    """Every object (and ETag) and every table item: what a refused saver must not change."""
    return _objects(endpoint), sorted(repr(sorted(i.items())) for i in _items(endpoint))


def _written(endpoint: str, mode: str, length: int = 3):
    """A store set up and written in ``mode``; the table exists either way (the other
    mode's saver is refused by the marker, not by a missing table)."""
    saver = make_saver(endpoint, mode)
    saver.setup()
    grow_thread(saver, "chat", length)
    if mode == "manifest":
        _make_table(endpoint)
    return saver


def _refused(exc: pytest.ExceptionInfo, found: str) -> str:
    error = exc.value
    text = str(error)
    assert error.bucket == BUCKET and error.prefix == "" and error.found == found, text
    assert f"s3://{BUCKET}/" in text and "one index mode" in text, text
    if found == "dynamodb":
        assert error.table == TABLE and f"table={TABLE!r}" in text and f"--table {TABLE}" in text, text
        assert f"CHECKPOINT_TABLE={TABLE}" in text, text
    else:
        assert "manifest index mode" in text and "CHECKPOINT_TABLE unset" in text, text
    return text


def test_the_other_mode_is_refused_before_it_reads_writes_or_collects(endpoint, index_mode) -> None:
    written = _written(endpoint, index_mode)
    before = _store(endpoint)
    other = make_saver(endpoint, _other(index_mode))
    with pytest.raises(IndexModeMismatchError) as exc:
        other.get_tuple(config("chat"))  # never None: refused before a read answers
    _refused(exc, index_mode)
    with pytest.raises(IndexModeMismatchError):
        list(other.list(config("chat")))
    with pytest.raises(IndexModeMismatchError):
        list(other.list_threads())
    with pytest.raises(IndexModeMismatchError):
        grow_thread(other, "chat", 1)  # a second history under the same id
    with pytest.raises(IndexModeMismatchError):
        grow_thread(other, "new-thread", 1)
    with pytest.raises(IndexModeMismatchError):
        other.collect_garbage(older_than=timedelta(0), include_unindexed=True)
    with pytest.raises(IndexModeMismatchError):
        other.rebuild_index()
    with pytest.raises(IndexModeMismatchError):
        other.erase_thread("chat")

    async def asynchronous() -> None:
        with pytest.raises(IndexModeMismatchError):
            await other.aget_tuple(config("chat"))
        await other.aclose()

    asyncio.run(asynchronous())
    objects, items = _store(endpoint)
    # Nothing committed, swapped or deleted: the only objects a refused put may
    # leave are new ones no index names (under live/: orphans, collectable), and
    # the manifest's empty hints under listing/, which a table's saver never reads.
    assert items == before[1]
    assert {k: e for k, e in objects.items() if k in before[0]} == before[0]
    assert not [k for k in objects if k not in before[0] and not k.startswith(("live/", "listing/"))]
    assert written.get_tuple(config("chat")).checkpoint["channel_values"]["counter"] == 2
    assert [t.thread_id for t in written.list_threads()] == ["chat"]
    # Its own gc finds the refused puts' objects orphans of no thread of its index.
    report = written.audit(older_than=timedelta(0))
    assert not report.missing and not report.broken
    written.close()
    other.close()


def test_the_check_rides_on_the_first_wave_once(endpoint, index_mode) -> None:
    """Cold get_tuple and put: one more request in a round trip already sent, then
    nothing (a process that checked before sends what it always sent)."""
    written = _written(endpoint, index_mode)
    costs = {}
    for name, known in (("cold", False), ("checked before", True)):
        last = grow_thread(written, name, 3)  # a thread each: the same state to read and write
        fresh = make_saver(endpoint, index_mode)
        fresh._sites["primary"].mode.checked = known
        if fresh._sites["primary"].owner is not None:
            fresh._sites["primary"].owner.checked = True  # the table's owner check aside (test_ownership)
        fresh.get_tuple(config(name))
        read = fresh.stats.snapshot()
        fresh.stats.reset()
        version = fresh.get_next_version("00000000000000000000000000000009.1", None)
        fresh.put(last, checkpoint({"counter": 9, "doc": "a document"}, {"counter": version, "doc": "1"}), {}, {"counter": version})
        costs[name] = ((read.round_trips, read.total_requests), (fresh.stats.round_trips, fresh.stats.total_requests))
        fresh.close()
    (cold_read, cold_put), (read, put) = costs["cold"], costs["checked before"]
    assert cold_read == (read[0], read[1] + 1) and cold_put == put, costs
    written.close()


def test_gc_include_unindexed_from_the_other_mode_deletes_nothing(endpoint, index_mode) -> None:
    """Through the command line's entry point: gc --include-unindexed --older-than 0 --yes."""
    written = _written(endpoint, index_mode)
    before = _store(endpoint)
    result = run_cli(endpoint, "gc", "--include-unindexed", "--older-than", "0", "--force", "--yes", mode=_other(index_mode))
    line = error_line(result, 1)
    assert "one index mode" in line and (TABLE in line if index_mode == "dynamodb" else "manifest" in line), line
    assert _store(endpoint) == before
    assert written.get_tuple(config("chat")).checkpoint["channel_values"]["counter"] == 2
    written.close()


def test_cli_threads_without_the_table_names_it(endpoint, index_mode) -> None:
    """The command line's default (no --table, no CHECKPOINT_TABLE) is the manifest:
    on a DynamoDB-indexed bucket it is refused, naming the table to pass (and the
    other way round, naming the manifest)."""
    written = _written(endpoint, index_mode)
    for args in (["threads"], ["--json", "threads"], ["history", "chat"]):
        result = run_cli(endpoint, *args, mode=_other(index_mode))
        assert result.returncode == 1, result
        line = error_line(result, 1) if "--json" not in args else result.stderr.decode().strip()
        assert "one index mode" in line and "no threads" not in result.stdout.decode(), line
        if index_mode == "dynamodb":
            assert f"--table {TABLE}" in line and f"CHECKPOINT_TABLE={TABLE}" in line, line
        else:
            assert "CHECKPOINT_TABLE unset" in line, line
    assert "chat" in ok(run_cli(endpoint, "threads", mode=index_mode))
    written.close()


def test_server_module_without_the_table_is_refused(endpoint) -> None:
    written = _written(endpoint, "dynamodb")
    env = {"CHECKPOINT_BUCKET": BUCKET, "AWS_ENDPOINT_URL": endpoint, "AWS_REGION": "us-east-1"}
    server_saver = saver_from_env(env)

    async def first_request() -> None:
        try:
            with pytest.raises(IndexModeMismatchError, match=f"CHECKPOINT_TABLE={TABLE}"):
                await server_saver.aget_tuple(config("chat"))
        finally:
            await server_saver.aclose()

    asyncio.run(first_request())
    server_saver.close()
    written.close()


def test_a_fresh_process_after_setup_of_the_other_mode(endpoint, index_mode) -> None:
    """No thread at all: the marker setup() wrote decides, for reads as for writes."""
    first = make_saver(endpoint, index_mode)
    first.setup()
    first.close()
    if index_mode == "manifest":
        _make_table(endpoint)
    other = make_saver(endpoint, _other(index_mode))
    with pytest.raises(IndexModeMismatchError) as exc:
        other.get_tuple(config("t"))
    _refused(exc, index_mode)
    with pytest.raises(IndexModeMismatchError):
        other.setup()
    other.close()
    again = make_saver(endpoint, _other(index_mode))
    with pytest.raises(IndexModeMismatchError):
        grow_thread(again, "t", 1)  # a first write: refused before it commits
    assert not _thread_items(endpoint) and not [k for k in _objects(endpoint) if k.startswith("manifests/")]
    again.close()
    fresh = make_saver(endpoint, index_mode)
    grow_thread(fresh, "t", 2)
    assert fresh.get_tuple(config("t")).checkpoint["channel_values"]["counter"] == 1
    fresh.close()


def test_two_processes_racing_the_first_write_in_two_modes(endpoint, index_mode, monkeypatch) -> None:
    """Both read "no marker" before either writes it (each sends its claim only then,
    and the two claims go out together); exactly one wins, the other process is
    refused before its commit, and nothing of it reads."""
    _make_table(endpoint)
    _s3(endpoint).create_bucket(Bucket=BUCKET)
    savers = {mode: make_saver(endpoint, mode) for mode in (index_mode, _other(index_mode))}
    both = threading.Barrier(2, timeout=30)
    claim_call = _mode.ModeMark.claim_call

    def at_once(mark):
        both.wait()  # the two claims go out together
        return claim_call(mark)

    monkeypatch.setattr(_mode.ModeMark, "claim_call", at_once)
    outcome: dict[str, BaseException | None] = {}

    def write(mode: str) -> None:
        try:
            grow_thread(savers[mode], "t", 2)
            outcome[mode] = None
        except BaseException as exc:  # noqa: BLE001 (judged below)
            outcome[mode] = exc

    workers = [threading.Thread(target=write, args=(mode,)) for mode in savers]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    monkeypatch.undo()
    winners = [m for m, exc in outcome.items() if exc is None]
    losers = [m for m, exc in outcome.items() if isinstance(exc, IndexModeMismatchError)]
    assert len(winners) == 1 and len(losers) == 1, outcome
    (winner,), (loser,) = winners, losers
    assert outcome[loser].found == winner
    marker = json.loads(_s3(endpoint).get_object(Bucket=BUCKET, Key=MARKER)["Body"].read())
    assert marker["index"] == winner
    # Nothing of the loser's index: no manifest head, or no table item of the thread.
    if loser == "manifest":
        assert not [k for k in _objects(endpoint) if k.startswith("manifests/")]
    else:
        assert not _thread_items(endpoint)
    fresh = {mode: make_saver(endpoint, mode) for mode in savers}
    assert fresh[winner].get_tuple(config("t")).checkpoint["channel_values"]["counter"] == 1
    assert [t.thread_id for t in fresh[winner].list_threads()] == ["t"]
    assert len(list(fresh[winner].list(config("t")))) == 2  # its own two checkpoints, nothing of the loser's
    with pytest.raises(IndexModeMismatchError):
        fresh[loser].get_tuple(config("t"))
    for saver in [*savers.values(), *fresh.values()]:
        saver.close()


def test_a_store_written_before_markers_keeps_working(endpoint, index_mode) -> None:
    """A prefix without a marker (an earlier version's): its own mode reads it, and
    its first write records the mode; the other mode is refused from then on."""
    written = _written(endpoint, index_mode)
    written.close()
    _s3(endpoint).delete_object(Bucket=BUCKET, Key=MARKER)
    fresh = make_saver(endpoint, index_mode)
    assert fresh.get_tuple(config("chat")).checkpoint["channel_values"]["counter"] == 2
    assert MARKER not in _objects(endpoint)  # a read writes nothing
    grow_thread(fresh, "another", 1)
    assert json.loads(_s3(endpoint).get_object(Bucket=BUCKET, Key=MARKER)["Body"].read())["index"] == index_mode
    fresh.close()
    with pytest.raises(IndexModeMismatchError):
        make_saver(endpoint, _other(index_mode)).get_tuple(config("chat"))


def test_admin_calls_on_a_store_written_before_markers_survey_it(endpoint, index_mode, monkeypatch) -> None:
    """No marker: setup, the command line and gc of the other mode look at the prefix
    first (manifest heads; checkpoint objects and no manifest) and refuse."""
    written = _written(endpoint, index_mode)
    written.close()
    _s3(endpoint).delete_object(Bucket=BUCKET, Key=MARKER)
    monkeypatch.setattr(_mode, "_SETTLED_SECONDS", 0)  # the objects are seconds old
    before = _store(endpoint)
    other = make_saver(endpoint, _other(index_mode))
    with pytest.raises(IndexModeMismatchError, match="no marker yet") as exc:
        other.setup()
    assert exc.value.found == index_mode
    with pytest.raises(IndexModeMismatchError, match="no marker yet"):
        other.collect_garbage(older_than=timedelta(0), include_unindexed=True)
    other.close()
    line = error_line(run_cli(endpoint, "threads", mode=_other(index_mode)), 1)
    assert "no marker yet" in line, line
    assert _store(endpoint) == before
    own = make_saver(endpoint, index_mode)
    own.setup()  # finds its own mode's threads: records it
    assert json.loads(_s3(endpoint).get_object(Bucket=BUCKET, Key=MARKER)["Body"].read())["index"] == index_mode
    own.close()


def test_the_marker_is_written_once_on_a_versioned_bucket(endpoint, index_mode) -> None:
    make_versioned(endpoint)
    for _ in range(2):
        saver = make_saver(endpoint, index_mode)
        saver.setup()
        grow_thread(saver, f"t{_}", 2)
        saver.close()
    versions = _s3(endpoint).list_object_versions(Bucket=BUCKET, Prefix=MARKER)
    assert len(versions.get("Versions", [])) == 1 and not versions.get("DeleteMarkers")


def test_an_unreadable_marker_is_an_error(endpoint, index_mode) -> None:
    """Every answer is checked: a marker the saver cannot read is never taken for its mode."""
    _s3(endpoint).create_bucket(Bucket=BUCKET)
    _s3(endpoint).put_object(Bucket=BUCKET, Key=MARKER, Body=b"<html>captive portal</html>")
    saver = make_saver(endpoint, index_mode)
    with pytest.raises(S3SaverError, match="the marker of the prefix's index mode, cannot be read"):
        saver.get_tuple(config("t"))
    saver.close()


def test_a_promoted_replica_keeps_the_prefix_mode(regions, index_mode) -> None:
    """Replication copies the marker with the threads: after a failover the promoted
    region goes on in the saver's mode, and refuses a saver of the other one."""
    from regions import Replicator

    saver = regions.make_saver(index_mode, recheck_after=3600)
    replicator = regions.replicator
    if index_mode == "dynamodb":
        regions.create_replica_table()  # promote() rebuilds the index there from the bucket
        replicator = Replicator.between(regions.primary, regions.replica, tables=False)
    last = grow_thread(saver, "t", 3)
    replicator.run()
    regions.proxy.refuse()
    saver.promote()
    version = saver.get_next_version("00000000000000000000000000000009.1", None)
    saver.put(last, checkpoint({"counter": 9, "doc": "a document"}, {"counter": version, "doc": "1"}), {}, {"counter": version})
    assert saver.get_tuple(config("t")).checkpoint["channel_values"]["counter"] == 9
    marker = regions.replica.s3.get_object(Bucket=regions.replica.bucket, Key=MARKER)["Body"].read()
    assert json.loads(marker)["index"] == index_mode
    from s3_saver import S3Saver

    other = S3Saver(
        regions.replica.bucket,
        table=regions.replica.table if index_mode == "manifest" else None,
        region_name=regions.replica.region,
        endpoint_url=regions.moto,
    )
    with pytest.raises(IndexModeMismatchError):
        other.get_tuple(config("t"))
    other.close()


def test_a_dynamodb_read_does_not_wait_for_a_failing_s3_at_every_wave(endpoint) -> None:
    """The marker's GET rides on a read's first wave; failing (S3 unreachable), it is
    not sent again by reads that need nothing from S3: the next write settles it."""
    from s3_saver import RetryPolicy, S3Saver

    written = _written(endpoint, "dynamodb")
    reader = S3Saver(
        BUCKET, table=TABLE, region_name="us-east-1", s3_endpoint_url="http://127.0.0.1:9",
        dynamodb_endpoint_url=endpoint, retry=RetryPolicy(attempts=2, base=0),
    )
    for _ in range(2):
        assert reader.get_tuple(config("chat")).checkpoint["channel_values"]["counter"] == 2
    sent = reader.stats.snapshot().requests
    assert sent[("s3", "get_object")] == 2, sent  # the first wave's GET and its one retry, then none
    reader.close()
    written.close()


# -- one prefix, one table -----------------------------------------------------------------
OTHER_TABLE = "other-index"


def _table_saver(endpoint: str, table: str, **kw):
    from s3_saver import S3Saver

    return S3Saver(BUCKET, table=table, endpoint_url=endpoint, region_name="us-east-1", **kw)


def _tables_store(endpoint: str) -> tuple[dict[str, str], dict[str, list]]:
    """Every object (and ETag) and every item of both tables."""
    items = {}
    for name in (TABLE, OTHER_TABLE):
        try:
            items[name] = sorted(repr(sorted(i.items())) for i in _ddb(endpoint).scan(TableName=name)["Items"])
        except _ddb(endpoint).exceptions.ResourceNotFoundException:
            items[name] = []
    return _objects(endpoint), items


def _marker(endpoint: str, bucket: str = BUCKET, client=None) -> dict:
    return json.loads((client or _s3(endpoint)).get_object(Bucket=bucket, Key=MARKER)["Body"].read())


def _two_tables(endpoint: str, first: str):
    """The prefix written by a saver of table ``first``; the other table exists too
    (a second app's stack made it): its saver is refused by the marker alone."""
    written = _table_saver(endpoint, first)
    written.setup()
    grow_thread(written, "chat", 3)
    second = OTHER_TABLE if first == TABLE else TABLE
    _make_table(endpoint, name=second)
    return written, second


def _refused_table(exc: pytest.ExceptionInfo, theirs: str, mine: str) -> str:
    error = exc.value
    text = str(error)
    assert (error.bucket, error.prefix, error.found, error.table) == (BUCKET, "", "dynamodb", theirs), text
    assert f"s3://{BUCKET}/" in text and f"table {theirs!r}" in text and f"table {mine!r}" in text, text
    assert "one saver and one index" in text and f"table={theirs!r}" in text, text
    return text


@pytest.mark.parametrize("first", (TABLE, OTHER_TABLE))
def test_a_second_table_on_one_prefix_is_refused(endpoint, first) -> None:
    """Two DynamoDB savers of different tables on one bucket and prefix: each would read
    the other's threads as unindexed objects, and its gc would delete them. The marker
    names the first table: a saver of the other is refused before it reads, writes or
    deletes (either way round), in the read it already sends."""
    written, second = _two_tables(endpoint, first)
    before = _tables_store(endpoint)
    other = _table_saver(endpoint, second)
    with pytest.raises(IndexModeMismatchError) as exc:
        other.get_tuple(config("chat"))
    _refused_table(exc, first, second)
    with pytest.raises(IndexModeMismatchError):
        other.setup()
    with pytest.raises(IndexModeMismatchError):
        grow_thread(other, "chat", 1)
    with pytest.raises(IndexModeMismatchError):
        grow_thread(other, "new-thread", 1)
    with pytest.raises(IndexModeMismatchError):
        other.collect_garbage(older_than=timedelta(0), include_unindexed=True)
    with pytest.raises(IndexModeMismatchError):
        other.delete_thread("chat")
    with pytest.raises(IndexModeMismatchError):
        other.rebuild_index("chat")  # one thread: never moves the prefix
    with pytest.raises(IndexModeMismatchError) as exc:
        other.rebuild_index()  # every thread moves it, but only from a lost table: this one is there
    text = _refused_table(exc, first, second)
    assert "still exists (ACTIVE)" in text and f"delete table {first!r}" in text, text

    async def asynchronous() -> None:
        with pytest.raises(IndexModeMismatchError):
            await other.aget_tuple(config("chat"))
        await other.aclose()

    asyncio.run(asynchronous())
    objects, items = _tables_store(endpoint)
    assert items == before[1]
    assert {k: e for k, e in objects.items() if k in before[0]} == before[0]
    assert not [k for k in objects if k not in before[0] and not k.startswith("live/")]
    assert _marker(endpoint)["table"] == first
    assert written.get_tuple(config("chat")).checkpoint["channel_values"]["counter"] == 2
    report = written.audit(older_than=timedelta(0))
    assert not report.missing and not report.broken
    written.close()
    other.close()


@pytest.mark.parametrize("first", (TABLE, OTHER_TABLE))
def test_gc_include_unindexed_of_a_second_table_deletes_nothing(endpoint, first) -> None:
    """Through the command line: gc --include-unindexed --older-than 0 with the other table."""
    from cli_support import cli_env

    written, second = _two_tables(endpoint, first)
    before = _tables_store(endpoint)
    env = cli_env(endpoint, "dynamodb", CHECKPOINT_TABLE=second)
    result = run_cli(endpoint, "gc", "--include-unindexed", "--older-than", "0", "--force", "--yes", env=env)
    line = error_line(result, 1)
    assert f"table {first!r}" in line and f"table {second!r}" in line and f"--table {first}" in line, line
    assert "table=" not in line and "rebuild_index" not in line and "`rebuild-index`" in line, line
    assert "Replica" not in line, line  # no option configures one
    # rebuild-index with the other table: a move, refused while the prefix's table is there.
    line = error_line(run_cli(endpoint, "rebuild-index", env=env), 1)
    assert f"table {first!r}" in line and "still exists" in line and f"--table {first}" in line, line
    assert "then run `rebuild-index` with no thread id" in line and "table=" not in line, line
    assert _tables_store(endpoint) == before
    assert written.get_tuple(config("chat")).checkpoint["channel_values"]["counter"] == 2
    written.close()
    # Its table lost, the command moves the prefix to the other table.
    _ddb(endpoint).delete_table(TableName=first)
    assert "indexed 3 checkpoints of every thread" in ok(run_cli(endpoint, "rebuild-index", env=env))
    assert _marker(endpoint)["table"] == second
    assert '"counter": 2' in ok(run_cli(endpoint, "--json", "show", "chat", env=env))


def test_a_rebuild_of_every_thread_moves_the_prefix_to_another_table(endpoint) -> None:
    """The table is lost; a new one (another name), made by setup(), is filled by
    rebuild_index() of every thread, whose switch re-marks the prefix once the index is whole: cut before it, the
    prefix stays the old table's (the cut saver object too) and the call again finishes;
    its answer lost, the retry finds it landed. From then on the new table is the
    prefix's and the old one is refused."""
    from faults import FaultProxy

    from s3_saver import RetryPolicy

    old = _table_saver(endpoint, TABLE)
    old.setup()
    grow_thread(old, "chat", 3)
    grow_thread(old, "other", 2)
    old.close()
    _ddb(endpoint).delete_table(TableName=TABLE)  # the index lost
    made = _table_saver(endpoint, OTHER_TABLE)
    made.setup()  # makes the new table; the prefix stays the lost table's until the rebuild
    assert OTHER_TABLE in _ddb(endpoint).list_tables()["TableNames"] and _marker(endpoint)["table"] == TABLE
    with pytest.raises(IndexModeMismatchError) as exc:
        made.get_tuple(config("chat"))
    assert "(made by setup() first, if need be)" in _refused_table(exc, TABLE, OTHER_TABLE)
    made.close()
    marker_put = lambda req: req.method == "PUT" and "index-mode" in req.path  # noqa: E731
    with FaultProxy(endpoint, rate=1.0, kinds=("reset_before",), operations=marker_put, max_faults=1) as proxy:
        cut = _table_saver(proxy.url, OTHER_TABLE, retry=RetryPolicy(attempts=1, base=0))
        with pytest.raises(S3SaverError) as failed:
            cut.rebuild_index()
        assert proxy.total_faults == 1, failed.value
        assert _marker(endpoint)["table"] == TABLE
        with pytest.raises(IndexModeMismatchError):
            cut.get_tuple(config("chat"))  # judged again: still the old table's prefix
        cut.close()
    with FaultProxy(endpoint, rate=1.0, kinds=("reset_after",), operations=marker_put, max_faults=1) as proxy:
        mover = _table_saver(proxy.url, OTHER_TABLE)
        assert mover.rebuild_index() == 5
        assert proxy.total_faults == 1  # the switch applied, its answer lost, retried: 412, read, landed
        mover.close()
    marker = _marker(endpoint)
    assert (marker["index"], marker["table"], marker["moved_from"]) == ("dynamodb", OTHER_TABLE, TABLE)
    fresh = _table_saver(endpoint, OTHER_TABLE)
    assert fresh.get_tuple(config("chat")).checkpoint["channel_values"]["counter"] == 2
    grow_thread(fresh, "after", 1)
    fresh.close()
    _make_table(endpoint, name=TABLE)  # the old table's stack comes back
    stale = _table_saver(endpoint, TABLE)
    with pytest.raises(IndexModeMismatchError) as exc:
        stale.get_tuple(config("chat"))
    _refused_table(exc, OTHER_TABLE, TABLE)
    stale.close()


def test_a_promoted_replica_region_with_a_table_of_another_name(regions) -> None:
    """infra/replica.yaml may name the replica region's table otherwise: the replica
    bucket's marker (replicated) names the primary's table. The saver with its Replica
    goes on there after promote(), which makes the marker name that region's table: a
    process configured as the runbook says, and one without a Replica (the command
    line), find their table; a third table is refused. After the failback (the
    promoted region's marker replicated back), promote() makes the old region's
    marker name its table again."""
    from regions import Replicator

    from s3_saver import Replica, S3Saver

    primary, replica = regions.primary, regions.replica
    saver = regions.make_saver("dynamodb", recheck_after=3600, table="eu-index")
    replica.table = "eu-index"
    regions.create_replica_table()  # promote() rebuilds the index there from the bucket
    replicator = Replicator.between(primary, replica, tables=False)
    reverse = replicator.reversed()
    last = grow_thread(saver, "t", 3)
    replicator.run()
    assert _marker("", replica.bucket, replica.s3)["table"] == primary.table
    regions.proxy.refuse()
    saver.promote()
    version = saver.get_next_version("00000000000000000000000000000009.1", None)
    saver.put(last, checkpoint({"counter": 9, "doc": "a document"}, {"counter": version, "doc": "1"}), {}, {"counter": version})
    assert _marker("", replica.bucket, replica.s3)["table"] == "eu-index"

    def there(table: str, **kw) -> S3Saver:
        made = S3Saver(replica.bucket, table=table, region_name=replica.region, endpoint_url=regions.moto, **kw)
        regions.savers.append(made)
        return made

    back_to = Replica(primary.bucket, table=primary.table, region_name=primary.region, endpoint_url=regions.proxy.url)
    for reader in (there("eu-index", replica=back_to), there("eu-index")):
        assert reader.get_tuple(config("t")).checkpoint["channel_values"]["counter"] == 9
    with pytest.raises(IndexModeMismatchError) as exc:
        there("third-index").get_tuple(config("t"))
    assert "'eu-index'" in str(exc.value) and "'third-index'" in str(exc.value)

    # Failback: the promoted region's writes (and its marker) replicate back.
    regions.proxy.up()
    reverse.run()
    assert _marker("", primary.bucket, primary.s3)["table"] == "eu-index"
    assert there("eu-index", replica=back_to).promote().checked
    assert _marker("", primary.bucket, primary.s3)["table"] == primary.table
    final = S3Saver(primary.bucket, table=primary.table, region_name=primary.region, endpoint_url=regions.moto)
    regions.savers.append(final)
    assert final.get_tuple(config("t")).checkpoint["channel_values"]["counter"] == 9

