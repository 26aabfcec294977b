"""prune and delete_for_runs on real graphs: what stays reads exactly as before (DeltaChannel
included), what goes is gone from the index and the bucket, in both index modes."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import boto3
from datetime import timedelta

import pytest
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

from conftest import BUCKET, make_saver
from helpers import checkpoint, concat, config, cut_points, is_marker
from s3_saver import ConfigurationError, S3SaverError
from s3_saver._transport.sync import SyncDriver


class State(TypedDict):
    # A snapshot every 4 updates: a history of 9 turns crosses several.
    log: Annotated[list, DeltaChannel(concat, snapshot_frequency=4)]
    doc: str  # written once: every later checkpoint reads it from the first one's object
    turn: int


def _graph(saver):
    def step_a(state: State) -> dict:
        return {"log": [f"a{state.get('turn', 0)}"]}

    def step_b(state: State) -> dict:
        out: dict[str, Any] = {"log": [f"b{state.get('turn', 0)}"], "turn": state.get("turn", 0) + 1}
        if not state.get("doc"):
            out["doc"] = "D" * 2_000
        return out

    builder = StateGraph(State)
    builder.add_node("a", step_a)
    builder.add_node("b", step_b)
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    return builder.compile(checkpointer=saver)


def _run(graphs, thread_id: str, turns: range, run_id: str | None = None) -> None:
    for turn in turns:
        cfg: dict[str, Any] = {"configurable": {"thread_id": thread_id}}
        if run_id is not None:
            cfg["metadata"] = {"run_id": run_id}
        for graph in graphs:
            graph.invoke({"log": [f"in{turn}"]}, cfg)


def _values(graph, thread_id: str) -> list[dict]:
    return [s.values for s in graph.get_state_history({"configurable": {"thread_id": thread_id}})]


def _objects(endpoint: str, prefix: str) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", []) if not is_marker(o["Key"])]


def test_prune_keep_latest_keeps_delta_state_and_values(endpoint, index_mode) -> None:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    ours, ref = _graph(saver), _graph(InMemorySaver())
    cfg = {"configurable": {"thread_id": "t"}}
    _run((ours, ref), "t", range(9))
    before = _objects(endpoint, "live/t/")
    saver.prune(["t"])

    # One checkpoint left in the history, whose state (the delta channel rebuilt
    # from hidden ancestors' writes, "doc" from the first checkpoint's object) is
    # the reference's.
    assert [t.checkpoint["id"] for t in saver.list(cfg)] == [ours.get_state(cfg).config["configurable"]["checkpoint_id"]]
    assert ours.get_state(cfg).values == ref.get_state(cfg).values
    after = _objects(endpoint, "live/t/")
    assert len(after) < len(before) / 2, (len(after), len(before))
    # Another process (nothing cached) reads the same, and the thread goes on.
    other = make_saver(endpoint, index_mode)
    assert _graph(other).get_state(cfg).values == ref.get_state(cfg).values
    _run((_graph(other), ref), "t", range(9, 12))
    assert _values(_graph(other), "t")[:7] == _values(ref, "t")[:7]
    # A second prune finds what the first kept hidden and needs no more.
    other.prune(["t"])
    assert _graph(other).get_state(cfg).values == ref.get_state(cfg).values
    assert len(list(other.list(cfg))) == 1
    saver.close()
    other.close()


def test_prune_keep_last_then_fork_and_copy(endpoint, index_mode) -> None:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    ours, ref = _graph(saver), _graph(InMemorySaver())
    _run((ours, ref), "t", range(8))
    saver.prune(["t"], keep_last=3)
    assert _values(ours, "t") == _values(ref, "t")[:3]

    # Fork from the oldest checkpoint kept: its delta state comes from hidden ancestors.
    oldest = list(ours.get_state_history({"configurable": {"thread_id": "t"}}))[-1].config
    ref_oldest = list(ref.get_state_history({"configurable": {"thread_id": "t"}}))[2].config
    forked = ours.update_state(oldest, {"log": ["fork"]})
    ref_forked = ref.update_state(ref_oldest, {"log": ["fork"]})
    ours.invoke(None, forked)
    ref.invoke(None, ref_forked)
    cfg = {"configurable": {"thread_id": "t"}}
    assert ours.get_state(cfg).values == ref.get_state(cfg).values

    saver.copy_thread("t", "t-copy")
    copy_cfg = {"configurable": {"thread_id": "t-copy"}}
    assert ours.get_state(copy_cfg).values == ref.get_state(cfg).values
    assert _values(ours, "t-copy") == _values(ours, "t")
    saver.close()


async def test_aprune_and_adelete_for_runs(endpoint, index_mode) -> None:
    saver = make_saver(endpoint, index_mode)
    await saver.asetup()
    ours, ref = _graph(saver), _graph(InMemorySaver())
    for turn in range(6):
        cfg = {"configurable": {"thread_id": "t"}, "metadata": {"run_id": f"r{turn % 2}"}}
        await ours.ainvoke({"log": [f"in{turn}"]}, cfg)
        await ref.ainvoke({"log": [f"in{turn}"]}, cfg)
    # A turn writes 4 checkpoints: the newest 6 are turn 5's (run r1) and two of turn 4's (r0).
    await saver.aprune(["t"], keep_last=6)
    cfg = {"configurable": {"thread_id": "t"}}
    kept = [s async for s in ours.aget_state_history(cfg)]
    assert [s.values for s in kept] == _values(ref, "t")[:6]
    assert [s.metadata["run_id"] for s in kept] == ["r1"] * 4 + ["r0"] * 2
    await saver.adelete_for_runs(["r0"])
    assert [s.values async for s in ours.aget_state_history(cfg)] == _values(ref, "t")[:4]
    await saver.aclose()


async def test_aprune_delete_all_is_delete(endpoint, index_mode) -> None:
    """LangGraph Server (langgraph-api 0.16) calls ``aprune(ids, strategy="delete_all")``
    for what the base class calls "delete": it removes the threads named, nothing else."""
    saver = make_saver(endpoint, index_mode)
    await saver.asetup()
    graph = _graph(saver)
    for thread_id in ("gone", "kept"):
        await graph.ainvoke({"log": ["in"]}, {"configurable": {"thread_id": thread_id}})
    kept = [s.config async for s in graph.aget_state_history({"configurable": {"thread_id": "kept"}})]
    await saver.aprune(["gone"], strategy="delete_all")
    assert [t async for t in saver.alist({"configurable": {"thread_id": "gone"}})] == []
    assert [s.config async for s in graph.aget_state_history({"configurable": {"thread_id": "kept"}})] == kept
    await saver.aclose()


async def test_threads_of_runs_names_what_delete_for_runs_visits(endpoint, index_mode) -> None:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    ours = _graph(saver)
    _run((ours,), "t", range(2), run_id="r1")
    _run((ours,), "u", range(1), run_id="r1")
    _run((ours,), "u", range(1, 2), run_id="r2")
    assert saver.threads_of_runs(["r1", "r2", "unknown"]) == {"r1": ["t", "u"], "r2": ["u"]}
    saver.delete_for_runs(["r1"])
    assert await saver.athreads_of_runs(["r1", "r2"]) == {"r2": ["u"]}  # a finished delete forgets its hints
    assert saver.threads_of_runs([]) == {}
    with pytest.raises(ConfigurationError, match="run_ids"):
        saver.threads_of_runs("r2")
    await saver.aclose()


def test_delete_for_runs_removes_one_run_of_three_and_a_fork(endpoint, index_mode) -> None:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    ours, ref = _graph(saver), _graph(InMemorySaver())
    _run((ours, ref), "t", range(0, 3), run_id="r1")
    _run((ours, ref), "t", range(3, 6), run_id="r2")
    _run((ours, ref), "t", range(6, 8), run_id="r3")
    _run((ours, ref), "other", range(2), run_id="r2")  # r2 wrote to another thread too
    # A fork from r1's last checkpoint, by a fourth run.
    cfg = {"configurable": {"thread_id": "t"}}
    fork_run = {"metadata": {"run_id": "rf"}}
    for graph in (ours, ref):
        point = next(s for s in graph.get_state_history(cfg) if s.metadata.get("run_id") == "r1").config
        graph.invoke({"log": ["fork"]}, {**point, **fork_run})
    history = list(ours.get_state_history(cfg))
    assert [s.values for s in history] == _values(ref, "t")
    kept = [s for s in history if s.metadata.get("run_id") != "r2"]
    assert len(kept) < len(history)

    saver.delete_for_runs(["r2"])
    reader = make_saver(endpoint, index_mode)  # another process: nothing cached
    graph = _graph(reader)
    after = list(graph.get_state_history(cfg))
    assert [s.config for s in after] == [s.config for s in kept]
    assert [s.values for s in after] == [s.values for s in kept]
    # Each remaining checkpoint reads alone as it did (r3's delta state runs through r2's hidden writes).
    for state in kept:
        assert graph.get_state(state.config).values == state.values
    assert list(reader.list({"configurable": {"thread_id": "other"}})) == []
    # Running it again finds nothing more to do: the run hints are gone (one
    # wave: DynamoDB reads the run's shard and the single partition of earlier versions).
    reader.stats.reset()
    reader.delete_for_runs(["r2"])
    assert reader.stats.snapshot().round_trips == 1
    assert reader.stats.snapshot().total_requests == {"dynamodb": 2, "manifest": 1}[index_mode]
    for s in (saver, reader):
        s.close()


def test_prune_cut_short_at_any_round_trip_keeps_what_it_keeps(endpoint, index_mode, monkeypatch) -> None:
    writer = make_saver(endpoint, index_mode)
    writer.setup()
    ref = _graph(InMemorySaver())
    _run((_graph(writer), ref), "twin", range(6))
    writer.stats.reset()
    writer.prune(["twin"], keep_last=2)
    total = writer.stats.round_trips
    assert total >= 3
    expected = _values(ref, "twin")[:2]

    for cut in cut_points(total):
        thread_id = f"t{cut}"
        _run((_graph(writer),), thread_id, range(6))
        pruner = make_saver(endpoint, index_mode)
        with monkeypatch.context() as patch:
            _cut_after(patch, cut)
            with pytest.raises(ConnectionError):
                pruner.prune([thread_id], keep_last=2)
        reader = _graph(make_saver(endpoint, index_mode))
        seen = _values(reader, thread_id)
        assert seen[:2] == expected, cut  # the kept ones read whole, whatever else is left
        # Entries go before objects: no entry names a missing object, whatever is left over.
        left = pruner.audit([thread_id], older_than=timedelta(0))
        assert not left.missing and not left.broken and not left.unindexed, (cut, left.problems)
        pruner.prune([thread_id], keep_last=2)  # run again, it completes
        assert _values(reader, thread_id) == expected, cut
        # What a cut left unreferenced is garbage the collector takes; nothing else is.
        pruner.collect_garbage([thread_id], older_than=timedelta(0))
        assert pruner.audit([thread_id], older_than=timedelta(0)).problems == [], cut
        assert _values(_graph(make_saver(endpoint, index_mode)), thread_id) == expected, cut
    writer.close()


def _cut_after(monkeypatch, waves: int) -> None:
    left = [waves]
    real = SyncDriver._wave

    def wave(driver, calls):
        if left[0] == 0:
            raise ConnectionError("the Lambda timed out")
        left[0] -= 1
        return real(driver, calls)

    monkeypatch.setattr(SyncDriver, "_wave", wave)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: s.prune("thread-1"), "thread_ids must be a list"),
        (lambda s: s.prune(["t"], strategy="keep_oldest"), "unknown prune strategy 'keep_oldest'"),
        (lambda s: s.prune(["t"], keep_last=0), "keep_last must be an int >= 1"),
        (lambda s: s.prune(["t"], strategy="delete", keep_last=2), "keep_last goes with strategy='keep_latest'"),
        (lambda s: s.prune([""]), "non-empty"),
        (lambda s: s.delete_for_runs("run-1"), "run_ids must be a list"),
        (lambda s: s.delete_for_runs([None]), "non-empty"),
    ],
)
def test_wrong_arguments_are_refused_and_nothing_is_removed(endpoint, index_mode, call, message) -> None:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    _run((_graph(saver),), "t", range(2))
    before = _objects(endpoint, "live/")
    with pytest.raises(ConfigurationError, match=message):
        call(saver)
    assert _objects(endpoint, "live/") == before
    saver.close()


def _thread_of_runs(saver, thread_id: str, length: int = 100, runs: int = 5) -> None:
    """``length`` checkpoints in ``runs`` runs, each with a pending write; "doc" never changes."""
    stored = config(thread_id)
    version = None
    for step in range(length):
        version = saver.get_next_version(version, None)
        versions = {"counter": version, "doc": "1"}
        cp = checkpoint({"counter": step, "doc": "a document"}, versions)
        meta = {"source": "loop", "step": step, "run_id": f"{thread_id}-run-{step * runs // length}"}
        stored = saver.put(stored, cp, meta, {"counter": version} if step else versions)
        saver.put_writes(stored, [("counter", step + 1)], f"task-{step}")


def _costs(saver, suffix: str) -> dict[str, tuple[int, dict[str, int]]]:
    out = {}
    for name, prepare, call in (
        ("prune keep_latest", "p", lambda: saver.prune([f"p{suffix}"])),
        ("delete_for_runs (1 run of 5)", "d", lambda: saver.delete_for_runs([f"d{suffix}-run-2"])),
        ("copy_thread", "c", lambda: saver.copy_thread(f"c{suffix}", f"c-copy{suffix}")),
        ("list_threads(limit=3)", None, lambda: list(saver.list_threads(limit=3))),
    ):
        if prepare is not None:
            _thread_of_runs(saver, f"{prepare}{suffix}")
        saver.stats.reset()
        call()
        stats = saver.stats.snapshot()
        out[name] = (stats.round_trips, {f"{svc}:{op}": n for (svc, op), n in sorted(stats.requests.items())})
    return out


# (round trips, requests) on a 100-checkpoint thread with a pending write per checkpoint.
LIFECYCLE_COSTS = {
    "dynamodb": {
        # Query of the thread (1 page); its 99 checkpoint, link and writes items deleted in
        # transactions of 99, one after the other, each checked against the thread's record
        # (an archive under way loses its mark, an archived or deleted thread stops the
        # prune); the thread read again (what the dropped ones name that nothing left names
        # goes); their objects; the hints of the runs left with no checkpoint.
        "prune keep_latest": (7, {
            "dynamodb:batch_write_item": 1, "dynamodb:query": 2, "dynamodb:transact_write_items": 3,
            "s3:delete_objects": 1,
        }),
        # The run's hints, the run marked deleted on the thread's record (first: then the
        # thread is read), the thread, its 20 checkpoints with links and writes (one fenced
        # transaction), the thread again, their objects, the hints looked up again (a copy
        # made meanwhile is found), the hints. Each hint lookup reads the run's shard and
        # the unsharded partition of earlier versions (2 queries, one round trip).
        "delete_for_runs (1 run of 5)": (8, {
            "dynamodb:batch_write_item": 1, "dynamodb:query": 6, "dynamodb:transact_write_items": 1,
            "dynamodb:update_item": 1, "s3:delete_objects": 1,
        }),
        # The target, the source, the objects (a new tag), the target again beside what an
        # earlier copy left there, the items (writes and links, then checkpoints), the
        # listing and hints, the source's deleted runs (read after the hints).
        "copy_thread": (8, {
            "dynamodb:batch_write_item": 12, "dynamodb:get_item": 3, "dynamodb:query": 4,
            "dynamodb:transact_write_items": 2, "s3:copy_object": 200,
            # The hints of the copy's 5 runs; beside them its activity entry
            # (``_index/activity``), in a transaction that names it on the target's record.
            "dynamodb:put_item": 5,
        }),
        # The listing (its 16 shards and the unsharded partition: 17 queries, one round
        # trip), then each thread's latest beside its record.
        "list_threads(limit=3)": (2, {"dynamodb:get_item": 3, "dynamodb:query": 20}),
    },
    "manifest": {
        # The head, its segments, one swap (of that very head), the objects and retired
        # segments, the swap that clears the graveyard, the hints of runs left with no checkpoint.
        "prune keep_latest": (5, {"s3:delete_objects": 3, "s3:get_object": 2, "s3:put_object": 2}),
        "delete_for_runs (1 run of 5)": (
            10, {"s3:delete_objects": 3, "s3:get_object": 3, "s3:list_objects_v2": 2, "s3:put_object": 4}
        ),
        # ... and the listing object and the hints of the copy's 5 runs, and the source's head
        # again (its deleted runs, read after the hints); beside the objects, its activity
        # entry, which the head's swap records.
        "copy_thread": (9, {"s3:copy_object": 200, "s3:get_object": 5, "s3:put_object": 10}),
        "list_threads(limit=3)": (2, {"s3:get_object": 3, "s3:list_objects_v2": 1}),
    },
}


@pytest.mark.slow  # make test-all and CI (make test-slow): a cost invariant beside a large unrelated thread
def test_lifecycle_costs_grow_with_what_they_touch_not_with_the_store(endpoint, index_mode) -> None:
    """prune, delete_for_runs and copy_thread on a 100-checkpoint thread cost the same
    with a large unrelated thread (and other threads) beside it: they read the
    index of what they touch, never a table scan or a listing of ``live/``."""
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    alone = _costs(saver, "")
    _thread_of_runs(saver, "large-unrelated", length=200, runs=8)
    beside = _costs(saver, "-2")
    print(f"\n{index_mode}: " + "\n".join(f"{k}: {v}" for k, v in alone.items()))
    assert beside == alone
    assert alone == LIFECYCLE_COSTS[index_mode]
    for _, requests in alone.values():
        assert "dynamodb:scan" not in requests
    saver.close()


def test_lifecycle_on_seaweedfs(seaweedfs_bucket) -> None:
    """The listing (StartAfter/MaxKeys pages), prune and delete_for_runs on a real
    S3-compatible server, in manifest mode."""
    from conftest import seaweedfs_saver

    endpoint, bucket = seaweedfs_bucket
    saver = seaweedfs_saver(endpoint, bucket)
    saver.setup()
    clock = {"now": 1_800_000_000}
    saver._ctx.now = lambda: clock["now"]
    ref = _graph(InMemorySaver())
    for i in range(5):
        clock["now"] += 1
        _run((_graph(saver), ref), f"t{i}", range(3), run_id=f"run-{i}")
    listed = [t.thread_id for t in saver.list_threads()]
    assert listed == [f"t{i}" for i in reversed(range(5))]
    first = list(saver.list_threads(limit=2))
    assert [t.thread_id for t in saver.list_threads(before=first[-1], limit=2)] == ["t2", "t1"]
    saver.prune(["t4"], keep_last=2)
    assert _values(_graph(saver), "t4") == _values(ref, "t4")[:2]
    saver.delete_for_runs(["run-3"])
    assert [t.thread_id for t in saver.list_threads()] == ["t4", "t2", "t1", "t0"]
    saver.close()


def test_delete_for_runs_finds_copies_too(endpoint, index_mode) -> None:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    _run((_graph(saver),), "src", range(2), run_id="r1")
    _run((_graph(saver),), "src", range(2, 4), run_id="r2")
    saver.copy_thread("src", "dst")
    saver.delete_for_runs(["r2"])
    for thread_id in ("src", "dst"):
        runs = {t.metadata.get("run_id") for t in saver.list({"configurable": {"thread_id": thread_id}})}
        assert runs == {"r1"}, thread_id
    saver.close()


def test_a_thread_whose_listing_failed_is_listed_by_its_next_write(endpoint, index_mode, monkeypatch) -> None:
    """The listing record of a thread's first checkpoint fails (no permission, a
    timeout): the put fails, and the thread's next root checkpoint lists it."""
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    real = SyncDriver._wave
    failed = []

    def wave(driver, calls):
        # The listing request fails (every attempt); the rest of the wave, the
        # commit among them in DynamoDB mode, goes through.
        def is_listing(c):
            return c.operation == "transact_write_items" or "listing/threads/" in str(c.params.get("Key", ""))

        others = [c for c in calls if not is_listing(c)]
        answers = iter(real(driver, tuple(others)) if others else [])
        failed.extend(c.operation for c in calls if is_listing(c))
        return [ConnectionError("the listing request was lost") if is_listing(c) else next(answers) for c in calls]

    with monkeypatch.context() as patch:
        patch.setattr(SyncDriver, "_wave", wave)
        with pytest.raises((S3SaverError, ConnectionError)):
            _run((_graph(saver),), "t", range(1))
    assert failed
    _run((_graph(saver),), "t", range(1, 2))
    assert [t.thread_id for t in saver.list_threads()] == ["t"]
    assert len(list(saver.list_threads())) == 1
    saver.close()


def test_a_run_still_in_flight_after_delete_for_runs_is_refused(endpoint, index_mode) -> None:
    """A run goes on writing after delete_for_runs deleted it (a cancel or a
    rollback elsewhere): its next checkpoint is refused and leaves nothing, and
    the thread reads as after the delete."""
    from s3_saver import RunDeletedError

    writer = make_saver(endpoint, index_mode)
    writer.setup()
    stored = config("t")
    for step, run_id in enumerate(["r1", "r1", "r2"]):
        versions = {"n": str(step + 1)}
        stored = writer.put(stored, checkpoint({"n": step}, versions), {"run_id": run_id, "step": step}, versions)
    deleter = make_saver(endpoint, index_mode)
    deleter.delete_for_runs(["r2"])
    late = checkpoint({"n": 9}, {"n": "9"})
    with pytest.raises(RunDeletedError, match="r2"):
        writer.put(stored, late, {"run_id": "r2", "step": 3}, {"n": "9"})
    reader = make_saver(endpoint, index_mode)
    latest = reader.get_tuple(config("t"))
    assert (latest.metadata["run_id"], latest.checkpoint["channel_values"]) == ("r1", {"n": 1})
    assert [t.metadata["step"] for t in reader.list(config("t"))] == [1, 0]
    assert not [k for k in _objects(endpoint, "live/t/") if late["id"] in k]
    # Another run goes on from what is left.
    writer.put(latest.config, checkpoint({"n": 5}, {"n": "5"}), {"run_id": "r3", "step": 2}, {"n": "5"})
    assert reader.get_tuple(config("t")).checkpoint["channel_values"] == {"n": 5}
    for s in (writer, deleter, reader):
        s.close()
