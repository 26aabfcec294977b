"""rebuild_index: lose the index (table items or manifests), rebuild it from the bucket,
and every read equals what it was, in both index modes."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import boto3
import pytest
from langgraph.checkpoint.base import WRITES_IDX_MAP
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from conftest import BUCKET, TABLE, make_saver
from helpers import checkpoint, config, grow_thread
from s3_saver._ops import put_writes as put_writes_op
from s3_saver._transport.sync import SyncDriver

CHILD_NS = "child:" + "1" * 36
INTERRUPT = next(ch for ch, idx in WRITES_IDX_MAP.items() if idx == -3)
RESUME = next(ch for ch, idx in WRITES_IDX_MAP.items() if idx == -4)


class State(TypedDict):
    items: Annotated[list[str], operator.add]


def _inner(state: State) -> dict:
    answer = interrupt("inner?")
    return {"items": [f"inner:{answer}"]}


def _graph(saver):
    child = StateGraph(State).add_node("ask", _inner).add_edge(START, "ask").add_edge("ask", END).compile()
    return (
        StateGraph(State)
        .add_node("first", lambda s: {"items": ["first"]})
        .add_node("child", child)
        .add_edge(START, "first")
        .add_edge("first", "child")
        .add_edge("child", END)
        .compile(checkpointer=saver)
    )


def _fill(saver) -> list[dict[str, Any]]:
    """Threads with history, a fork, a subgraph namespace, pending writes, a large value,
    and a real graph stopped in a subgraph's interrupt."""
    last = grow_thread(saver, "plain", 12)
    big = "B" * 100_000  # over inline_threshold: a blob object
    top = saver.get_tuple(last)
    versions = {**top.checkpoint["channel_versions"], "big": "1"}
    last = saver.put(last, checkpoint({"counter": 99, "doc": "a document", "big": big}, versions), {"step": 99}, {"big": "1"})
    saver.put_writes(last, [("counter", 1), ("__interrupt__", "why")], "task-1", "path")
    saver.put_writes(last, [("__interrupt__", "again")], "task-1", "path")  # the last one counts
    saver.put_writes(last, [("counter", 2)], "task-1", "path")  # a retried task: the first counts
    old = list(saver.list(config("plain")))[6].config
    fork = saver.put(old, checkpoint({"counter": -1, "doc": "forked"}, {"counter": "f1", "doc": "f1"}), {"source": "fork"}, {"counter": "f1", "doc": "f1"})
    saver.put_writes(fork, [("counter", 3)], "task-f")
    grow_thread(saver, "plain", 4, ns=CHILD_NS)
    grow_thread(saver, "other", 3)
    graph = _graph(saver)
    cfg = {"configurable": {"thread_id": "graph"}}
    graph.invoke({"items": ["in"]}, cfg)
    return [config("plain"), config("plain", CHILD_NS), config("other"), cfg]


def _reads(saver, configs: list[dict[str, Any]]) -> list[Any]:
    out = []
    for cfg in configs:
        history = list(saver.list(cfg))
        out.append([(t.config, t.parent_config, t.checkpoint, t.metadata, t.pending_writes) for t in history])
        out.append([saver.get_tuple(t.config).checkpoint for t in history])
        latest = saver.get_tuple(cfg)
        out.append(latest.config if latest else None)
    graph = _graph(saver)
    state = graph.get_state(configs[-1], subgraphs=True)
    out.append((state.values, state.next, [t.state.values for t in state.tasks if t.state]))
    return out


def _lose_the_index(endpoint: str, index_mode: str) -> None:
    if index_mode == "dynamodb":
        ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
        for page in ddb.get_paginator("scan").paginate(TableName=TABLE):
            for item in page["Items"]:
                ddb.delete_item(TableName=TABLE, Key={"pk": item["pk"], "sk": item["sk"]})
    else:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="manifests/"):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=BUCKET, Key=obj["Key"])


def test_rebuilt_index_reads_as_before(endpoint, index_mode) -> None:
    writer = make_saver(endpoint, index_mode)
    writer.setup()
    configs = _fill(writer)
    before = _reads(make_saver(endpoint, index_mode), configs)
    _lose_the_index(endpoint, index_mode)
    blind = make_saver(endpoint, index_mode)
    assert blind.get_tuple(config("plain")) is None

    admin = make_saver(endpoint, index_mode)
    assert admin.rebuild_index() == sum(len(r) for r in before[1:-1:3])  # every checkpoint, once
    after = _reads(make_saver(endpoint, index_mode), configs)
    assert after == before

    # The graph goes on from the rebuilt index: resume the subgraph's interrupt.
    graph = _graph(make_saver(endpoint, index_mode))
    assert graph.invoke(Command(resume="yes"), configs[-1])["items"] == ["in", "first", "in", "first", "inner:yes"]
    writer.close()


async def test_rebuild_one_thread_async(endpoint, index_mode) -> None:
    saver = make_saver(endpoint, index_mode)
    await saver.asetup()
    grow_thread(saver, "a", 5)
    grow_thread(saver, "b", 3)
    before = [t.checkpoint for t in saver.list(config("a"))]
    _lose_the_index(endpoint, index_mode)
    assert await saver.arebuild_index("a") == 5
    fresh = make_saver(endpoint, index_mode)
    assert [t.checkpoint for t in fresh.list(config("a"))] == before
    assert fresh.get_tuple(config("b")) is None  # only the thread asked for
    await saver.aclose()


@pytest.mark.parametrize("length", [130])
def test_rebuild_of_a_long_thread_seals_or_pages(endpoint, index_mode, length) -> None:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    grow_thread(saver, "long", length)
    before = [(t.config, t.checkpoint) for t in saver.list(config("long"))]
    _lose_the_index(endpoint, index_mode)
    assert saver.rebuild_index("long") == length
    assert [(t.config, t.checkpoint) for t in make_saver(endpoint, index_mode).list(config("long"))] == before


@pytest.mark.parametrize("storage_class", ["GLACIER_IR", "DEEP_ARCHIVE"])
def test_rebuild_brings_back_archived_threads(endpoint, index_mode, storage_class) -> None:
    """An archived thread has no live objects: its archive object alone gives the index
    back its marker (all namespaces, a subgraph's included), beside a live thread."""
    from s3_saver import ThreadArchivedError

    writer = make_saver(endpoint, index_mode)
    writer.setup()
    graph = _graph(writer)
    cfg = {"configurable": {"thread_id": "archived"}}
    graph.invoke({"items": ["in"]}, cfg)  # stops at the subgraph's interrupt
    grow_thread(writer, "live", 3)
    before = [(t.config, t.checkpoint, t.pending_writes) for t in writer.list(cfg)]
    # Without checkpoint_ns, list reads every namespace: the subgraph's too.
    child_ns = next(c["configurable"]["checkpoint_ns"] for c, _, _ in before if c["configurable"]["checkpoint_ns"])
    child_cfg = {"configurable": {"thread_id": "archived", "checkpoint_ns": child_ns}}
    child = [t.checkpoint for t in writer.list(child_cfg)]
    writer.archive_thread("archived", storage_class=storage_class)
    _lose_the_index(endpoint, index_mode)

    admin = make_saver(endpoint, index_mode)
    indexed = admin.rebuild_index()
    fresh = make_saver(endpoint, index_mode)
    assert [t.checkpoint for t in fresh.list(config("live"))] == [t.checkpoint for t in writer.list(config("live"))]
    if storage_class == "DEEP_ARCHIVE":
        assert indexed == 3  # the live thread's; the cold archive is not read
        with pytest.raises(ThreadArchivedError, match="restore_thread"):
            fresh.get_tuple(cfg)
        with pytest.raises(ThreadArchivedError, match="restore_thread"):
            fresh.get_tuple(child_cfg)
        assert fresh.restore_thread("archived").state == "restoring"
        assert fresh.restore_thread("archived").state == "live"
    else:
        assert indexed == 3 + len(before) and child
        listed = {t.thread_id: t.archived for t in fresh.list_threads()}
        assert listed == {"archived": "GLACIER_IR", "live": None}
    assert [(t.config, t.checkpoint, t.pending_writes) for t in fresh.list(cfg)] == before
    assert [t.checkpoint for t in fresh.list(child_cfg)] == child
    # The thread goes on: resume the subgraph's interrupt (the child's items add to the parent's).
    assert _graph(fresh).invoke(Command(resume="yes"), cfg)["items"] == ["in", "first", "in", "first", "inner:yes"]
    writer.close()


@pytest.mark.parametrize("storage_class", ["GLACIER_IR", "DEEP_ARCHIVE"])
def test_a_rebuild_run_again_leaves_archived_threads_archived(endpoint, index_mode, storage_class) -> None:
    """A rebuild over an index that holds an archived thread (run again after a cut,
    or as a check) indexes the live threads and leaves the archived one as it is."""
    writer = make_saver(endpoint, index_mode)
    writer.setup()
    grow_thread(writer, "cold", 2)
    grow_thread(writer, "live", 3)
    writer.archive_thread("cold", storage_class=storage_class)
    listed = {t.thread_id: t.archived for t in writer.list_threads()}

    admin = make_saver(endpoint, index_mode)
    first = admin.rebuild_index()
    assert admin.rebuild_index() == first
    assert admin.rebuild_index("cold") == first - 3
    fresh = make_saver(endpoint, index_mode)
    assert {t.thread_id: t.archived for t in fresh.list_threads()} == listed == {"cold": storage_class, "live": None}
    assert [t.checkpoint for t in fresh.list(config("live"))] == [t.checkpoint for t in writer.list(config("live"))]
    while fresh.restore_thread("cold").state != "live":
        pass  # moto restores at once: the second call finds it restored
    assert len(list(fresh.list(config("cold")))) == 2
    writer.close()


def _cut_between_writes_objects(monkeypatch, left: str) -> list[str]:
    """The next round trip that writes several pending-write objects sends only the
    one of the ``left`` kind ("special" or "regular") and then the process dies:
    the call's other objects and its commit are never sent. Returns what was sent."""
    real = SyncDriver._wave
    sent: list[str] = []

    def wave(driver, calls):
        writes = [c for c in calls if c.operation == "put_object" and "/writes/" in c.params["Key"]]
        if len(writes) < 2 or sent:
            return real(driver, calls)
        prefix = "s" if left == "special" else "r"
        first = next(c for c in writes if c.params["Key"].rsplit("/", 1)[1].startswith(prefix))
        real(driver, (first,))
        sent.append(first.params["Key"])
        raise ConnectionError("the Lambda timed out")

    monkeypatch.setattr(SyncDriver, "_wave", wave)
    return sent


@pytest.mark.parametrize("left", ["special", "regular"])
def test_a_put_writes_cut_between_its_objects_is_not_rebuilt(endpoint, index_mode, monkeypatch, left) -> None:
    """A put_writes writes its parts' objects in one wave, then commits. Cut after one
    part's object, nothing was committed: a rebuild from the bucket leaves the whole
    call out (never a resume without the writes it came with). Calls whose part lost
    its slot to another call's (a replaced interrupt, regular writes that lost
    first-wins: their objects released) come back whole. The call made again completes."""
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    last = grow_thread(saver, "t", 2)
    # Two committed calls, each left with one object: the second's interrupt replaced
    # the first's, the first's regular writes won over the second's.
    saver.put_writes(last, [("counter", 1), (INTERRUPT, "why")], "task-1", "path")
    saver.put_writes(last, [("counter", 9), (INTERRUPT, "again")], "task-1", "path")
    # Objects written before a call's parts were named in them: each stands alone.
    real_pack = put_writes_op.pack
    monkeypatch.setattr(put_writes_op, "pack", lambda record: real_pack({k: v for k, v in record.items() if k != "parts"}))
    saver.put_writes(last, [("counter", 2), (RESUME, "old")], "task-0", "path")
    monkeypatch.undo()
    committed = sorted(make_saver(endpoint, index_mode).get_tuple(last).pending_writes)
    assert committed == [
        ("task-0", RESUME, "old"), ("task-0", "counter", 2), ("task-1", INTERRUPT, "again"), ("task-1", "counter", 1)
    ]

    sent = _cut_between_writes_objects(monkeypatch, left)
    cut = make_saver(endpoint, index_mode)
    with pytest.raises(ConnectionError):
        cut.put_writes(last, [("counter", 5), (RESUME, "yes")], "task-2", "path")
    assert len(sent) == 1 and f"/task-2/{left[0]}" in sent[0]
    monkeypatch.undo()
    assert sorted(make_saver(endpoint, index_mode).get_tuple(last).pending_writes) == committed

    _lose_the_index(endpoint, index_mode)
    assert make_saver(endpoint, index_mode).rebuild_index() == 2
    assert sorted(make_saver(endpoint, index_mode).get_tuple(last).pending_writes) == committed

    # The task's writes sent again (a new process) complete, and a rebuild keeps them.
    make_saver(endpoint, index_mode).put_writes(last, [("counter", 5), (RESUME, "yes")], "task-2", "path")
    whole = sorted([*committed, ("task-2", RESUME, "yes"), ("task-2", "counter", 5)])
    assert sorted(make_saver(endpoint, index_mode).get_tuple(last).pending_writes) == whole
    _lose_the_index(endpoint, index_mode)
    assert make_saver(endpoint, index_mode).rebuild_index() == 2
    assert sorted(make_saver(endpoint, index_mode).get_tuple(last).pending_writes) == whole
    saver.close()
