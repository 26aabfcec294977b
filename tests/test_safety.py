"""Data safety: prefixes isolate apps, deletes and copies cut short never half-break a
thread, a deleted thread stays deleted, pending writes follow commit order, a clone
keeps its own serializer, and ids are checked for room at a thread's first checkpoint."""

from __future__ import annotations

import copy as copy_module
import dataclasses
import time
import uuid
from typing import Any

import boto3
import pytest
from langgraph.checkpoint.base import WRITES_IDX_MAP
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.constants import TASKS
from langgraph.types import Interrupt

from conftest import BUCKET, TABLE, make_saver
from helpers import checkpoint, config, grow_thread, is_marker
from s3_saver import KeyTooLongError, ThreadDeletedError
from s3_saver._transport.sync import SyncDriver
from s3_saver._ops import copy as copy_op

RESUME = next(ch for ch, idx in WRITES_IDX_MAP.items() if idx == -4)
NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"


def _objects(endpoint: str, prefix: str = "") -> list[str]:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", []) if not is_marker(o["Key"])]


def _state(saver, thread_id: str, ns: str | None = "") -> list[Any]:
    """What a reader sees of a thread: its whole history, with values and writes."""
    cfg: dict[str, Any] = {"configurable": {"thread_id": thread_id}}
    if ns is not None:
        cfg["configurable"]["checkpoint_ns"] = ns
    return [(t.config, t.checkpoint["channel_values"], t.metadata, t.pending_writes) for t in saver.list(cfg)]


def _rich_thread(saver, thread_id: str) -> dict[str, Any]:
    """A thread with history, a large value, pending writes and a subgraph namespace."""
    last = grow_thread(saver, thread_id, 4)
    big = "B" * 100_000  # over inline_threshold: a blob object of its own
    latest = saver.get_tuple(last)
    versions = {**latest.checkpoint["channel_versions"], "big": "1"}
    last = saver.put(last, checkpoint({"counter": 9, "doc": "a document", "big": big}, versions), {"step": 9}, {"big": "1"})
    saver.put_writes(last, [("counter", 10), (RESUME, "yes")], "task-1", "path")
    sub = grow_thread(saver, thread_id, 3, ns="child:" + "1" * 36)
    saver.put_writes(sub, [("counter", 5)], "task-2")
    return last


# -- 1. prefixes -----------------------------------------------------------------------
def test_prefixes_isolate_apps_sharing_one_bucket_and_one_table(endpoint, index_mode) -> None:
    savers = {p: make_saver(endpoint, index_mode, prefix=p) for p in ("app-a/", "app-b/", "")}
    savers[""].setup()
    for n, saver in enumerate(savers.values()):
        cfg = saver.put(config("t"), checkpoint({"who": n}, {"who": "1"}), {"app": n}, {"who": "1"})
        saver.put_writes(cfg, [("who", n * 10)], "task")
    before = {p: _state(s, "t") for p, s in savers.items()}
    for n, (p, saver) in enumerate(savers.items()):
        assert [v for _, v, _, _ in before[p]] == [{"who": n}]
        assert [w for _, _, _, w in before[p]] == [[("task", "who", n * 10)]]
        assert [t.config["configurable"]["thread_id"] for t in saver.list(None)] == ["t"]

    savers["app-a/"].delete_thread("t")
    assert _state(savers["app-a/"], "t") == []
    assert _state(savers["app-b/"], "t") == before["app-b/"]
    assert _state(savers[""], "t") == before[""]
    assert _objects(endpoint, "app-a/live/") == []
    assert _objects(endpoint, "app-b/live/") and _objects(endpoint, "live/")

    savers["app-b/"].copy_thread("t", "u")
    assert _state(savers["app-b/"], "u")[0][1] == {"who": 1}
    assert _state(savers[""], "u") == [] and _state(savers["app-a/"], "u") == []
    for saver in savers.values():
        saver.close()


# -- 2. delete ----------------------------------------------------------------------------
class _CutAfter:
    """Makes the sync driver fail once it has sent ``waves`` round trips."""

    def __init__(self, monkeypatch, waves: int) -> None:
        self.left = waves
        real = SyncDriver._wave

        def wave(driver, calls):
            if self.left == 0:
                raise ConnectionError("the Lambda timed out")
            self.left -= 1
            return real(driver, calls)

        monkeypatch.setattr(SyncDriver, "_wave", wave)


def test_a_delete_cut_short_at_any_request_leaves_each_namespace_whole_or_gone(
    endpoint, index_mode, monkeypatch
) -> None:
    writer = make_saver(endpoint, index_mode)
    writer.setup()
    sub_ns = "child:" + "1" * 36
    # Count the delete's round trips on a twin thread.
    _rich_thread(writer, "twin")
    writer.stats.reset()
    writer.delete_thread("twin")
    total = writer.stats.round_trips
    assert total >= 4

    for cut in range(total):
        thread_id = f"t{cut}"
        _rich_thread(writer, thread_id)
        whole = {ns: _state(writer, thread_id, ns) for ns in ("", sub_ns)}
        by_id = [c for c, *_ in whole[""]]
        deleter = make_saver(endpoint, index_mode)
        with monkeypatch.context() as patch:
            _CutAfter(patch, cut)
            with pytest.raises(ConnectionError):
                deleter.delete_thread(thread_id)
        reader = make_saver(endpoint, index_mode)  # another process: nothing cached
        for ns in ("", sub_ns):
            seen = _state(reader, thread_id, ns)
            assert seen in (whole[ns], []), (cut, ns)
            latest = reader.get_tuple(config(thread_id, ns))
            assert (latest is None) == (seen == []), (cut, ns)
        assert all(reader.get_tuple(c) is None for c in by_id) or _state(reader, thread_id) != []
        deleter.delete_thread(thread_id)  # run again, it completes
        assert _state(reader, thread_id, None) == []
        assert _objects(endpoint, f"live/{thread_id}/") == []
        for s in (deleter, reader):
            s.close()
    writer.close()


def test_a_deleted_thread_stays_deleted_and_its_id_can_start_again(endpoint, index_mode) -> None:
    in_flight = make_saver(endpoint, index_mode)
    in_flight.setup()
    last = _rich_thread(in_flight, "t")  # this process goes on with warm caches
    other = make_saver(endpoint, index_mode)
    other.delete_thread("t")
    assert _objects(endpoint, "live/t/") == []

    latest = in_flight.get_tuple(last)  # still None: the checkpoint is gone
    assert latest is None
    versions = {"counter": "9", "doc": "1"}
    with pytest.raises(ThreadDeletedError, match="'t' was deleted"):
        in_flight.put(last, checkpoint({"counter": 10, "doc": "a document"}, versions), {}, {"counter": "9"})
    with pytest.raises(ThreadDeletedError, match="'t' was deleted"):
        in_flight.put_writes(last, [("counter", 11)], "task-9")
    # A cold process continuing from the deleted checkpoint is refused too.
    cold = make_saver(endpoint, index_mode)
    with pytest.raises(ThreadDeletedError):
        cold.put(last, checkpoint({"counter": 10, "doc": "a document"}, versions), {}, {"counter": "9"})
    assert _state(other, "t", None) == []
    assert _objects(endpoint, "live/t/") == []  # the refused writes took their objects back

    # A run that starts afresh uses the id again, with none of the old history.
    fresh = in_flight.put(config("t"), checkpoint({"counter": 0, "doc": "new"}, {"counter": "1", "doc": "1"}), {}, {"counter": "1", "doc": "1"})
    in_flight.put_writes(fresh, [("counter", 1)], "task-new")
    seen = _state(other, "t")
    assert [v for _, v, _, _ in seen] == [{"counter": 0, "doc": "new"}]
    assert seen[0][3] == [("task-new", "counter", 1)]
    assert other.get_tuple(config("t")).config == fresh
    # Deleting again removes the new history and nothing else.
    other.delete_thread("t")
    assert other.get_tuple(config("t")) is None
    for s in (in_flight, other, cold):
        s.close()


def test_a_late_write_that_missed_the_tombstone_is_refused_or_invisible(endpoint, index_mode, monkeypatch) -> None:
    """A writer that read the index just before the delete commits after it: its
    commit is checked against the thread's record (the manifest's compare-and-swap,
    a DynamoDB transaction's condition), which names the new generation: refused."""
    in_flight = make_saver(endpoint, index_mode)
    in_flight.setup()
    last = grow_thread(in_flight, "t", 3)
    in_flight.delete_thread("t")
    index_type = type(in_flight._ctx.index)
    prepare = index_type.prepare

    def stale_prepare(index, thread_id, ns, parent_id, *args, **kwargs):  # the read that came just before the delete
        prepared = yield from prepare(index, thread_id, ns, parent_id, *args, **kwargs)
        return dataclasses.replace(prepared, gen=0)

    monkeypatch.setattr(index_type, "prepare", stale_prepare)
    late_cp = checkpoint({"counter": 7, "doc": "x"}, {"counter": "7", "doc": "1"})
    with pytest.raises(ThreadDeletedError):
        in_flight.put(last, late_cp, {}, {"counter": "7"})
    late = config("t", checkpoint_id=late_cp["id"])
    reader = make_saver(endpoint, index_mode)
    assert reader.get_tuple(config("t")) is None
    assert reader.get_tuple(late) is None
    assert _state(reader, "t") == [] and _state(reader, "t", None) == []
    assert list(reader.list(config("t"), before=late)) == []
    assert [t for t in reader.list(None) if t.config["configurable"]["thread_id"] == "t"] == []
    reader.delete_thread("t")  # a later delete clears what the late writer left
    assert _objects(endpoint, "live/t/") == []
    for s in (in_flight, reader):
        s.close()


def test_writes_sent_ahead_of_their_checkpoint_across_a_delete_leave_the_thread_deleted(endpoint, index_mode) -> None:
    """LangGraph sends a step's writes while its checkpoint's put is under way (or
    not begun); here another process deletes the thread between the two. The
    writes were made on a checkpoint of the deleted history: they are refused
    with ThreadDeletedError and take their objects back, as the put that follows
    is. A LangGraph user sees the run fail with the error the step's put raises
    anyway (the background task that sent the writes re-raises it): the run was
    deleted, and nothing of it may enter the thread's next life (issue 33). Taken
    into the new generation instead, the writes would name a checkpoint no read
    shows, and stay stored after the delete the user asked for."""
    writer = make_saver(endpoint, index_mode)
    writer.setup()
    last = grow_thread(writer, "t", 3)
    version = writer.get_next_version(writer.get_tuple(last).checkpoint["channel_versions"]["counter"], None)
    ahead = checkpoint({"counter": 9, "doc": "a document"}, {"counter": version, "doc": "1"})
    make_saver(endpoint, index_mode).delete_thread("t")
    with pytest.raises(ThreadDeletedError):
        writer.put_writes(config("t", checkpoint_id=ahead["id"]), [("counter", 1)], "task-1", "path")
    with pytest.raises(ThreadDeletedError):
        writer.put(last, ahead, {"source": "loop", "step": 3}, {"counter": version})
    # Nothing of the deleted run is stored or indexed, before any other delete.
    assert _objects(endpoint, "live/t/") == []
    reader = make_saver(endpoint, index_mode)
    held = reader._sync.run(reader._ctx.index.holdings("t"))
    assert [*held.live, *held.kept] == []
    assert reader.get_tuple(config("t")) is None and _state(reader, "t", None) == []
    assert "t" not in [t.thread_id for t in reader.list_threads()]
    # The id is free: a run started afresh in the same process writes as any.
    first = checkpoint({"counter": 0}, {"counter": writer.get_next_version(None, None)})
    fresh = writer.put(config("t"), first, {"source": "input", "step": -1}, dict(first["channel_versions"]))
    writer.put_writes(fresh, [("counter", 1)], "task-2", "path")
    assert [(w[1], w[2]) for w in reader.get_tuple(config("t")).pending_writes] == [("counter", 1)]
    for s in (writer, reader):
        s.close()


# -- 3. copy --------------------------------------------------------------------------------
def test_copy_takes_exactly_the_items_whose_objects_it_copied(endpoint, saver, index_mode, monkeypatch) -> None:
    _rich_thread(saver, "src")
    expected = _state(saver, "src")
    latecomer = make_saver(endpoint, index_mode)
    copy_immutable = copy_op.copy_immutable
    committed = []

    def copy_then_commit(s3, pairs):
        yield from copy_immutable(s3, pairs)
        if not committed:  # objects copied: another process commits to the source
            top = latecomer.get_tuple(config("src"))
            versions = {**top.checkpoint["channel_versions"], "counter": "99", "big": "2"}
            values = {"counter": 99, "doc": "a document", "big": "C" * 90_000}
            committed.append(latecomer.put(top.config, checkpoint(values, versions), {}, {"counter": "99", "big": "2"}))

    monkeypatch.setattr(copy_op, "copy_immutable", copy_then_commit)
    saver.copy_thread("src", "dst")
    assert committed
    copied = _state(saver, "dst")
    assert [(v, m, w) for _, v, m, w in copied] == [(v, m, w) for _, v, m, w in expected]
    # Every object the target's entries point at exists: a fresh reader resolves all of them.
    assert len(_state(make_saver(endpoint, index_mode), "dst")) == len(expected)


def test_copy_skips_expired_and_deleted_checkpoints(endpoint, index_mode) -> None:
    from datetime import timedelta

    saver = make_saver(endpoint, index_mode, ttl=timedelta(days=30))
    saver.setup()
    start = int(time.time())
    clock = {"now": start}
    saver._ctx.now = lambda: clock["now"]
    old = grow_thread(saver, "src", 2)
    clock["now"] = start + 20 * 86_400
    saver.put(old, checkpoint({"counter": 5, "doc": "a document"}, {"counter": "5", "doc": "1"}), {"n": 5}, {"counter": "5"})
    clock["now"] = start + 31 * 86_400  # the first two expired, the third lives on
    saver.copy_thread("src", "dst")
    assert [m["n"] for _, _, m, _ in _state(saver, "dst")] == [5]
    # Not merely hidden: the expired entries (DynamoDB deletes items lazily) were not copied.
    if index_mode == "dynamodb":
        ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
        items = ddb.query(
            TableName=TABLE, KeyConditionExpression="pk = :pk", ExpressionAttributeValues={":pk": {"S": "dst"}}
        )["Items"]
        assert len([i for i in items if i.get("kind")]) == 1  # besides the thread's own item (its listing time)
    else:
        assert len(saver._ctx.index._cached("dst").entries) == 1
    saver.close()


def test_copy_into_a_deleted_thread_id_is_seen_by_readers(saver) -> None:
    grow_thread(saver, "src", 2)
    grow_thread(saver, "dst", 2)
    saver.delete_thread("dst")
    saver.copy_thread("src", "dst")
    assert [v for _, v, _, _ in _state(saver, "dst")] == [v for _, v, _, _ in _state(saver, "src")]


# -- 6. a clone's serializer ----------------------------------------------------------------
@dataclasses.dataclass
class Thing:
    name: str


def test_with_allowlist_clone_uses_its_own_serializer(endpoint) -> None:
    strict = make_saver(endpoint, serde=JsonPlusSerializer(allowed_msgpack_modules=None))
    strict.setup()
    cfg = strict.put(config("s"), checkpoint({"thing": Thing("x")}, {"thing": "1"}), {}, {"thing": "1"})
    assert not isinstance(strict.get_tuple(cfg).checkpoint["channel_values"]["thing"], Thing)
    clone = strict.with_allowlist([Thing])
    assert clone is not strict and clone.serde is not strict.serde
    assert clone.get_tuple(cfg).checkpoint["channel_values"]["thing"] == Thing("x")
    # The original keeps its own (strict) serializer.
    assert not isinstance(strict.get_tuple(cfg).checkpoint["channel_values"]["thing"], Thing)
    plain = copy_module.copy(strict)
    plain.serde = JsonPlusSerializer()
    assert plain.get_tuple(cfg).checkpoint["channel_values"]["thing"] == Thing("x")
    strict.close()


# -- 7. pending writes follow commit order ------------------------------------------------
def test_pending_writes_follow_commit_order_not_clocks(endpoint, index_mode, monkeypatch) -> None:
    first, second = make_saver(endpoint, index_mode), make_saver(endpoint, index_mode)
    first.setup()
    cfg = first.put(config("w"), checkpoint({"x": 0}, {"x": "1"}), {}, {"x": "1"})
    first.put_writes(cfg, [(RESUME, "first"), ("x", 1)], "task")
    # The second process's clock is an hour behind.
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() - 3_600 * 10**9)
    second.put_writes(cfg, [(RESUME, "second"), ("x", 2)], "task")
    monkeypatch.undo()
    writes = first.get_tuple(cfg).pending_writes
    # The special channel: the last committed wins. The regular write: the first.
    assert sorted(writes) == sorted([("task", RESUME, "second"), ("task", "x", 1)])
    for s in (first, second):
        s.close()


def test_pending_writes_equal_in_memory_saver_for_langgraph_patterns(saver) -> None:
    """Retried tasks, the null task's accumulating writes, special channels."""
    memory = InMemorySaver()
    calls = [
        ("task-a", [("x", 1), ("y", 2)]),
        ("task-a", [("x", 100), ("y", 200)]),  # a retried task: the first stays
        (NULL_TASK_ID, [("x", 5)]),
        (NULL_TASK_ID, [("x", 5), ("z", 6), (RESUME, "r1")]),  # accumulated, special last
        (NULL_TASK_ID, [("x", 5), ("z", 6), (RESUME, "r2")]),
        ("task-b", [(TASKS, "push"), ("__interrupt__", [Interrupt("why")])]),
        ("task-b", [("__interrupt__", [Interrupt("again")])]),
    ]
    results = []
    for target_saver in (saver, memory):
        cfg = target_saver.put(config("p"), checkpoint({"x": 0}, {"x": "1"}), {}, {"x": "1"})
        for task_id, writes in calls:
            target_saver.put_writes(cfg, writes, task_id)
        results.append(target_saver.get_tuple(cfg).pending_writes)
    assert results[0] == results[1]


def test_a_retried_write_recognises_its_own_commit(endpoint, saver, index_mode) -> None:
    """A commit applied but answered with a failure is sent again by the client: its
    condition fails on its own write (the item, or the head it swapped), which must
    count as written, once."""
    cfg = saver.put(config("r"), checkpoint({"x": 0}, {"x": "1"}), {}, {"x": "1"})
    service, method = ("dynamodb", "transact_write_items") if index_mode == "dynamodb" else ("s3", "put_object")
    client = saver._sync._client(service)
    real = getattr(client, method)
    sent = {"n": 0}

    def applied_then_retried(**params):
        # (A retry within DynamoDB's idempotency window carries the same
        # ClientRequestToken and is answered as applied; moto applies it again:
        # the part's condition then meets the part's own token.)
        conditional = "TransactItems" in params or str(params.get("Key", "")).endswith("/head")
        if conditional and sent["n"] == 0:
            sent["n"] += 1
            real(**params)  # applied; the answer is lost and the request is retried
        return real(**params)

    setattr(client, method, applied_then_retried)
    try:
        saver.put_writes(cfg, [("x", 1)], "task")
    finally:
        setattr(client, method, real)
    assert sent["n"] == 1
    assert saver.get_tuple(cfg).pending_writes == [("task", "x", 1)]
    assert len([k for k in _objects(endpoint, "live/r/") if "/writes/" in k]) == 1


# -- 8. room for the keys a thread will need --------------------------------------------
def test_ids_without_room_for_later_keys_are_refused_at_the_first_checkpoint(endpoint, saver) -> None:
    too_long = "t" * 900  # fits a checkpoint key, not a subgraph's pending writes
    with pytest.raises(KeyTooLongError, match="1024 bytes"):
        saver.put(config(too_long), checkpoint({"c": 1}, {"c": "1"}), {}, {"c": "1"})
    assert _objects(endpoint) == []

    long = "t" * 750  # the longest kind of thread id that works all the way through
    cfg = saver.put(config(long), checkpoint({"c": 1}, {"c": "1"}), {}, {"c": "1"})
    saver.put_writes(cfg, [("c", 2)], str(uuid.uuid4()))
    sub = saver.put(config(long, f"node:{uuid.uuid4()}"), checkpoint({"c": 1}, {"c": "1"}), {}, {"c": "1"})
    saver.put_writes(sub, [("c", 3)], str(uuid.uuid4()))
    assert saver.get_tuple(sub).pending_writes[0][1:] == ("c", 3)


@pytest.mark.parametrize("length", [60, 24])
@pytest.mark.parametrize("operation", ["prune", "delete_for_runs"])
def test_a_history_rewrite_whose_index_writes_answers_are_lost_leaves_the_kept_history_whole(
    endpoint, saver, index_mode, operation, length
) -> None:
    """Every index write of a prune or delete_for_runs lands and its answer is lost
    (a read timeout: the call is sent again and meets its own write). Found by the
    simulation (delete_runs+long, manifest): the swap installing the rewritten
    history's new segments was taken for a lost race, its segments were deleted,
    and the head that had landed named them: the kept history was unreadable.
    60 checkpoints: the rewrite writes segments; 24: it does not, and what it
    dropped is deleted all the same. Either way the thread ends as a twin thread
    given the same call without faults: the same history, the same objects left."""
    from botocore.exceptions import ReadTimeoutError

    def grow(t: str) -> None:
        stored, version = config(t), None
        for step in range(length):
            version = saver.get_next_version(version, None)
            versions = {"counter": version, "doc": "1"}
            cp = checkpoint({"counter": step, "doc": "a document"}, versions)
            meta = {"source": "loop", "step": step, "run_id": f"{t}-{'old' if step < length // 3 else 'new'}"}
            stored = saver.put(stored, cp, meta, {"counter": version} if step else versions)

    def rewrite(t: str) -> None:
        if operation == "prune":
            saver.prune([t], keep_last=length // 2)
        else:
            saver.delete_for_runs([f"{t}-old"])

    def objects(t: str) -> int:
        return len(_objects(endpoint, f"live/{t}/"))

    grow("t")
    grow("twin")
    before = [t.checkpoint["channel_values"]["counter"] for t in saver.list(config("t"))]
    rewrite("twin")
    real, lost = SyncDriver._wave, set()

    def wave(driver, calls):
        results = real(driver, calls)
        out = []
        for call, result in zip(calls, results):
            index_write = (call.service == "dynamodb" and "write" in call.operation or call.operation == "update_item") or (
                call.operation == "put_object" and call.params["Key"].endswith("/head")
            )
            if index_write and id(call) not in lost and not isinstance(result, BaseException):
                lost.add(id(call))
                result = ReadTimeoutError(endpoint_url=f"{call.describe()}: its answer was lost")
            out.append(result)
        return out

    SyncDriver._wave = wave
    try:
        rewrite("t")
    finally:
        SyncDriver._wave = real
    assert lost
    reader = make_saver(endpoint, index_mode)
    after = [t.checkpoint["channel_values"]["counter"] for t in reader.list(config("t"))]
    kept = length // 2 if operation == "prune" else length - length // 3
    assert after == before[:kept], after
    assert after == [t.checkpoint["channel_values"]["counter"] for t in reader.list(config("twin"))]
    assert reader.get_tuple(config("t")).checkpoint["channel_values"] == {"counter": length - 1, "doc": "a document"}
    assert objects("t") == objects("twin") > 0
    reader.close()


@pytest.mark.parametrize("call", ["put", "put_writes"])
def test_a_segment_written_ahead_whose_answer_is_lost_is_the_one_the_head_names(endpoint, call):
    """A writer that holds a head due for sealing writes the segment beside its
    first round trip (``prepare``). When that PUT's answer is lost, the call is
    sent again and meets its own write (412: a segment's key has a random token,
    no other writer takes it). Before, the 412 was taken for a failed seal: the
    segment was left out of the commit and out of every head, an orphan no call
    deletes (found after a prune under load in ``make test-slow``)."""
    from datetime import timedelta

    from botocore.exceptions import ReadTimeoutError

    from s3_saver._index.manifest.seal import SEAL_AT

    saver = make_saver(endpoint, "manifest")
    saver.setup()
    last = grow_thread(saver, f"seal-{call}", SEAL_AT + 1)  # this process holds the head: due
    real, lost = SyncDriver._wave, []

    def wave(driver, calls):
        results = real(driver, calls)
        out = []
        for c, result in zip(calls, results):
            if not lost and c.operation == "put_object" and "/segments/" in c.params["Key"] and not isinstance(result, BaseException):
                lost.append(c.params["Key"])
                result = ReadTimeoutError(endpoint_url=f"{c.describe()}: its answer was lost")
            out.append(result)
        return out

    SyncDriver._wave = wave
    try:
        if call == "put":
            version = saver.get_next_version(saver.get_tuple(last).checkpoint["channel_versions"]["counter"], None)
            cp = checkpoint({"counter": SEAL_AT + 1, "doc": "a document"}, {"counter": version, "doc": "1"})
            saver.put(last, cp, {"source": "loop", "step": SEAL_AT + 1}, {"counter": version})
        else:
            saver.put_writes(last, [("counter", 7)], "task")
    finally:
        SyncDriver._wave = real
    assert lost
    report = saver.audit(older_than=timedelta(0))
    assert report.problems == [] and report.garbage == [], (report.problems, report.garbage)
    assert lost[0] in _objects(endpoint, "manifests/")
    reader = make_saver(endpoint, "manifest")
    assert len(list(reader.list(config(f"seal-{call}")))) == SEAL_AT + 1 + (call == "put")
    saver.close()
    reader.close()
