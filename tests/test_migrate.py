"""migrate() and open_saver(): real graphs copied between SqliteSaver, S3Saver (both index
modes) and PostgreSQL, on real servers (moto, a PostgreSQL cluster, SQLite files).

A copy is judged by what LangGraph shows: the same graph compiled on the target gives the
same ``get_state`` and ``get_state_history`` (ids, parents, values, next, tasks and
interrupts), and resuming the pending interrupt ends in the same state as on the source.
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

import boto3
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import ERROR, INTERRUPT, RESUME, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Interrupt, Send, interrupt
from pydantic import BaseModel

from conftest import BUCKET, TABLE, make_saver
from postgres_server import create_database
from s3_saver import ConfigurationError, S3Saver, ThreadArchivedError
from s3_saver._migrate.run import MigrationProgress, migrate
from s3_saver._migrate.verify import same
from s3_saver._migrate.urls import open_saver
from s3_saver.errors import MigrationError


# -- the graph ---------------------------------------------------------------------------------
class Items(TypedDict):
    items: Annotated[list[str], operator.add]
    turn: int


def _right(state: Items) -> dict:
    return {"items": [f"right:{interrupt({'question': 'approve?', 'turn': state['turn']})}"]}


def _ask(state: Items) -> dict:
    return {"items": [f"child:{interrupt('child?')}"]}


def build(saver: Any) -> Any:
    """plan -> (left | right, which interrupts) -> child (a subgraph that interrupts) -> after."""
    child = (
        StateGraph(Items)
        .add_node("c1", lambda s: {"items": ["c1"]})
        .add_node("ask", _ask)
        .add_edge(START, "c1")
        .add_edge("c1", "ask")
        .compile()
    )
    return (
        StateGraph(Items)
        .add_node("plan", lambda s: {"items": [f"plan{s['turn']}"]})
        .add_node("left", lambda s: {"items": ["left"]})
        .add_node("right", _right)
        .add_node("child", child)
        .add_node("after", lambda s: {"items": ["after"]})
        .add_edge(START, "plan")
        .add_edge("plan", "left")
        .add_edge("plan", "right")
        .add_edge(["left", "right"], "child")
        .add_edge("child", "after")
        .add_edge("after", END)
        .compile(checkpointer=saver)
    )


def thread(thread_id: str) -> dict:
    return {"configurable": {"thread_id": thread_id}}


def converse(saver: Any, thread_id: str, turns: int, **kwargs: Any) -> None:
    """``turns`` turns, each stopping at ``right`` and then at the subgraph's ``ask``; every
    interrupt is answered except the last turn's second: the thread waits in the subgraph."""
    graph, config = build(saver), thread(thread_id)
    for turn in range(1, turns + 1):
        out = graph.invoke({"items": [f"in{turn}"], "turn": turn}, config, **kwargs)
        answered = 0
        while out.get("__interrupt__") and (turn < turns or answered < 1):
            out = graph.invoke(Command(resume=f"r{turn}.{answered}"), config, **kwargs)
            answered += 1
    assert out["__interrupt__"][0].value == "child?"


def assert_same_graphs(source: Any, target: Any, thread_ids: list[str]) -> None:
    a, b = build(source), build(target)
    for thread_id in thread_ids:
        config = thread(thread_id)
        assert b.get_state(config, subgraphs=True) == a.get_state(config, subgraphs=True)
        history = list(a.get_state_history(config))
        assert len(history) > 3
        assert list(b.get_state_history(config)) == history


def assert_same_resume(source: Any, target: Any, thread_id: str) -> None:
    """Answering the pending interrupt on either saver ends in the same state (last: it writes)."""
    a, b = build(source), build(target)
    config = thread(thread_id)
    ends = [g.invoke(Command(resume="done"), config) for g in (a, b)]
    assert "__interrupt__" not in ends[0] and ends[0]["items"][-2:] == ["child:done", "after"]
    assert ends[1] == ends[0]
    assert b.get_state(config).values == a.get_state(config).values
    assert b.get_state(config).next == a.get_state(config).next == ()


def every_checkpoint(saver: Any, thread_ids: list[str]) -> list[Any]:
    return [t for thread_id in thread_ids for t in saver.list(thread(thread_id))]


def ids(saver: Any, thread_id: str) -> list[tuple[str, str]]:
    return [(t.config["configurable"]["checkpoint_ns"], t.config["configurable"]["checkpoint_id"])
            for t in saver.list(thread(thread_id))]


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as s:
        yield s


def sqlite_url(path: Any) -> str:
    return f"sqlite:///{path}"  # tmp paths are absolute: sqlite:////tmp/...


def s3(endpoint: str, mode: str, **kwargs: Any) -> S3Saver:
    saver = make_saver(endpoint, mode, **kwargs)
    saver.setup()
    return saver


# -- SQLite -> S3Saver -------------------------------------------------------------------------
def test_sqlite_to_s3_keeps_every_graph_state(endpoint, index_mode, tmp_path, stack) -> None:
    source = stack.enter_context(open_saver(sqlite_url(tmp_path / "source.db")))
    converse(source, "t-1", turns=3)
    converse(source, "t-2", turns=1)
    target = stack.enter_context(s3(endpoint, index_mode))
    stored = list(source.list(None))
    seen: list[MigrationProgress] = []

    report = migrate(source, target, on_progress=seen.append)

    assert {t.config["configurable"]["checkpoint_ns"] != "" for t in stored} == {True, False}
    assert (report.threads, report.checkpoints, report.skipped, report.verified) == (2, len(stored), 0, len(stored))
    assert report.writes == sum(len(t.pending_writes) for t in stored) > 0
    assert [p.done for p in seen] == list(range(1, len(stored) + 1))
    assert {p.total for p in seen} == {len(stored)}
    assert [p.bytes for p in seen] == sorted(p.bytes for p in seen) and seen[-1].bytes == report.bytes > 0
    assert_same_graphs(source, target, ["t-1", "t-2"])

    again = migrate(source, target)  # everything is there: nothing copied, all compared
    assert (again.threads, again.checkpoints, again.writes, again.bytes) == (0, 0, 0, 0)
    assert (again.skipped, again.verified) == (len(stored), len(stored))
    assert_same_resume(source, target, "t-1")


class Recording(InMemorySaver):
    """Remembers the ``new_versions`` of every put."""

    def __init__(self) -> None:
        super().__init__()
        self.new_versions: dict[tuple[str, str], dict] = {}

    def put(self, config, checkpoint, metadata, new_versions):
        self.new_versions[(config["configurable"]["checkpoint_ns"], checkpoint["id"])] = dict(new_versions)
        return super().put(config, checkpoint, metadata, new_versions)


def test_new_versions_are_the_channels_langgraph_wrote() -> None:
    """Each put names the channels LangGraph named when it wrote the checkpoint: a saver that
    stores a (channel, version) once stores it once here too."""
    source, target = Recording(), Recording()
    converse(source, "t", turns=2, durability="sync")
    report = migrate(source, target)
    assert report.checkpoints == len(source.new_versions) > 10
    assert target.new_versions == source.new_versions
    assert any(0 < len(v) < 3 for v in target.new_versions.values())  # not every channel every time
    assert_same_graphs(source, target, ["t"])


def test_pending_writes_keep_their_order_and_indexes(endpoint, index_mode, tmp_path, stack) -> None:
    """Savers return writes sorted by (task_path, task_id, idx) and keep no task_path in the
    tuple: the copy keeps the source's order across tasks, and idx (special channels
    negative, regular ones 0..n-1) round-trips through S3Saver into SQLite."""
    source = stack.enter_context(open_saver(sqlite_url(tmp_path / "a.db")))
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"], checkpoint["channel_versions"] = {"x": 1}, {"x": "1"}
    config = source.put({"configurable": {"thread_id": "w", "checkpoint_ns": ""}}, checkpoint, {"step": -1}, {"x": "1"})
    # Task "z" runs first (its path sorts first), though its id sorts last. As LangGraph
    # does, special channels come in calls of their own.
    source.put_writes(config, [("x", 2), ("y", 3)], "z", task_path="~a")
    source.put_writes(config, [(INTERRUPT, ["ask"])], "z", task_path="~a")
    source.put_writes(config, [(RESUME, "yes")], "z", task_path="~a")
    source.put_writes(config, [("x", 4)], "a", task_path="~b")
    source.put_writes(config, [(ERROR, ValueError("boom"))], "m", task_path="~c")
    writes = source.get_tuple(config).pending_writes
    assert [w[0] for w in writes] == ["z", "z", "z", "z", "a", "m"]
    middle = stack.enter_context(s3(endpoint, index_mode))
    back = stack.enter_context(open_saver(sqlite_url(tmp_path / "b.db")))

    migrate(source, middle)
    migrate(middle, back)

    for saver in (middle, back):
        copied = saver.get_tuple(config).pending_writes
        assert [(t, c) for t, c, _ in copied] == [(t, c) for t, c, _ in writes]
        assert copied[:4] == writes[:4] and repr(copied[5][2]) == repr(writes[5][2])
    slots = "SELECT task_id, idx, channel FROM writes ORDER BY task_id, idx"
    assert back.conn.execute(slots).fetchall() == source.conn.execute(slots).fetchall()


def test_a_value_changed_under_its_old_version_is_kept(endpoint, index_mode, tmp_path, stack) -> None:
    """SqliteSaver can hold a channel whose value changed without a new version (LangGraph
    changed it in place before the background put serialized it): the copy keeps it."""
    source = stack.enter_context(open_saver(sqlite_url(tmp_path / "source.db")))
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    for checkpoint_id, seen in (("1", set()), ("2", {"left"})):
        checkpoint = {**empty_checkpoint(), "id": checkpoint_id}
        checkpoint["channel_values"], checkpoint["channel_versions"] = {"join": seen}, {"join": "5"}
        config = source.put(config, checkpoint, {"step": int(checkpoint_id)}, {"join": "5"})
    target = stack.enter_context(s3(endpoint, index_mode))
    assert migrate(source, target).verified == 2
    assert target.get_tuple(thread("t")).checkpoint["channel_values"] == {"join": {"left"}}


def test_parents_go_before_their_children_whatever_their_ids() -> None:
    """Ids of checkpoints written on machines with skewed clocks need not follow the chain."""
    source, target = InMemorySaver(), Recording()
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    for checkpoint_id, value in (("c", 1), ("a", 2), ("b", 3)):
        checkpoint = {**empty_checkpoint(), "id": checkpoint_id}
        checkpoint["channel_values"] = {"x": value, "y": 0}
        checkpoint["channel_versions"] = {"x": str(value), "y": "0"}
        new_versions = {"x": str(value)} if checkpoint_id != "c" else checkpoint["channel_versions"]
        config = source.put(config, checkpoint, {"step": value}, new_versions)  # the next one's parent
    report = migrate(source, target)
    assert report.verified == 3
    assert list(target.new_versions.items()) == [
        (("", "c"), {"x": "1", "y": "0"}), (("", "a"), {"x": "2"}), (("", "b"), {"x": "3"})
    ]


# -- S3Saver -> SQLite, S3Saver -> S3Saver -----------------------------------------------------
def test_s3_to_sqlite(endpoint, index_mode, tmp_path, stack) -> None:
    source = stack.enter_context(s3(endpoint, index_mode))
    converse(source, "t", turns=2)
    target = stack.enter_context(open_saver(sqlite_url(tmp_path / "copy.db")))
    source.stats.reset()
    seen: list[MigrationProgress] = []
    report = migrate(source, target, on_progress=seen.append)
    assert report.checkpoints == report.verified == len(every_checkpoint(source, ["t"]))
    assert [(p.done, p.total) for p in seen] == [(n, None) for n in range(1, report.checkpoints + 1)]
    # Threads come from the thread listing: no table scan, no listing of the checkpoints' keys.
    sent = source.stats.requests
    assert ("dynamodb", "scan") not in sent and sent[("s3", "list_objects_v2")] <= 1
    assert_same_graphs(source, target, ["t"])
    assert_same_resume(source, target, "t")


def test_dynamodb_index_to_manifest_under_another_prefix_by_url(endpoint, stack) -> None:
    where = f"endpoint_url={endpoint}&region=us-east-1"
    source = stack.enter_context(open_saver(f"s3://{BUCKET}?table={TABLE}&{where}"))
    target = stack.enter_context(open_saver(f"s3://{BUCKET}/copy/?{where}"))
    assert (source.table, target.table) == (TABLE, None)
    source.setup()
    target.setup()
    converse(source, "t-1", turns=2)
    converse(source, "t-2", turns=1)
    s3_client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    before = {o["Key"] for o in s3_client.list_objects_v2(Bucket=BUCKET)["Contents"]}

    report = migrate(source, target)

    assert report.threads == 2 and report.verified == report.checkpoints > 0
    after = {o["Key"] for o in s3_client.list_objects_v2(Bucket=BUCKET)["Contents"]}
    assert after > before and all(k.startswith("copy/") for k in after - before)
    assert sorted(i.thread_id for i in target.list_threads()) == ["t-1", "t-2"]
    assert_same_graphs(source, target, ["t-1", "t-2"])
    assert_same_resume(source, target, "t-2")
    # The same bucket and prefix in the other index mode is the same store: the same keys.
    same_place = stack.enter_context(open_saver(f"s3://{BUCKET}?{where}"))
    for other in (same_place, source):
        with pytest.raises(ConfigurationError, match=f"the same store \\(s3://{BUCKET}/\\)"):
            migrate(source, other)


def test_archived_source_threads(endpoint, index_mode, tmp_path, stack) -> None:
    """An instant-class archive is read through; a cold one stops the run with its error."""
    source = stack.enter_context(s3(endpoint, index_mode))
    converse(source, "warm", turns=1)
    converse(source, "cold", turns=1)
    history = list(build(source).get_state_history(thread("warm")))
    source.archive_thread("warm", storage_class="GLACIER_IR")
    source.archive_thread("cold", storage_class="DEEP_ARCHIVE")
    target = stack.enter_context(open_saver(sqlite_url(tmp_path / "copy.db")))

    report = migrate(source, target, thread_ids=["warm"])
    assert report.checkpoints == report.verified == len(every_checkpoint(source, ["warm"]))
    assert list(build(target).get_state_history(thread("warm"))) == history
    with pytest.raises(ThreadArchivedError, match=r"restore_thread\('cold'\)"):
        migrate(source, target)
    assert ids(target, "cold") == []


def test_which_threads(endpoint, tmp_path, stack) -> None:
    source = stack.enter_context(s3(endpoint, "dynamodb"))
    converse(source, "a", turns=1)
    converse(source, "b", turns=1)
    # A thread whose only checkpoint is in a subgraph namespace is not in the thread listing.
    checkpoint = empty_checkpoint()
    source.put({"configurable": {"thread_id": "sub-only", "checkpoint_ns": "child:1"}}, checkpoint, {}, {})
    target = stack.enter_context(open_saver(sqlite_url(tmp_path / "copy.db")))

    with pytest.raises(ConfigurationError, match="not a string"):
        migrate(source, target, thread_ids="a")
    with pytest.raises(ConfigurationError, match="'nope' has no checkpoints"):
        migrate(source, target, thread_ids=["a", "nope"])
    assert list(target.list(None)) == []

    assert migrate(source, target, thread_ids=["b"]).threads == 1
    assert ids(target, "a") == [] and ids(target, "b") == ids(source, "b")
    report = migrate(source, target)  # the listing: a and b, b skipped
    assert (report.threads, report.skipped) == (1, len(ids(source, "b")))
    assert ids(target, "sub-only") == []
    assert migrate(source, target, thread_ids=["sub-only"]).checkpoints == 1
    assert ids(target, "sub-only") == [("child:1", checkpoint["id"])]


class Listing:
    """Wraps a saver's ``list`` (on the instance) to record the configs it is called with."""

    def __init__(self, saver: Any) -> None:
        self.configs: list[Any] = []
        self.original = saver.list
        saver.list = self

    def __call__(self, config, **kwargs):
        self.configs.append(config)
        return self.original(config, **kwargs)


def threads_found(source: Any, **kwargs: Any) -> tuple[list[str], set[int | None], Listing]:
    """The threads migrate copies from ``source`` in their order, the totals it reports, and its calls of ``list``."""
    listing = Listing(source)
    seen: list[MigrationProgress] = []
    migrate(source, InMemorySaver(), on_progress=seen.append, verify=False, **kwargs)
    return list(dict.fromkeys(p.thread_id for p in seen)), {p.total for p in seen}, listing


class ListingSqlite(SqliteSaver):
    def list(self, config, **kwargs):  # a subclass's list may differ from the table: it is used
        return super().list(config, **kwargs)


def test_sqlite_threads_come_from_one_query(tmp_path, stack) -> None:
    source = stack.enter_context(open_saver(sqlite_url(tmp_path / "source.db")))
    for name in ("b", "a", "c"):
        converse(source, name, turns=1)
    everything = list(source.list(None))
    newest_first = list(dict.fromkeys(t.config["configurable"]["thread_id"] for t in everything))
    assert newest_first == ["c", "a", "b"]

    found, totals, listing = threads_found(source)
    assert None not in listing.configs and len(listing.configs) == 3  # one listing per thread, none of all
    assert (found, totals) == (newest_first, {len(everything)})
    again, totals, _ = threads_found(source, workers=2)
    assert sorted(again) == sorted(newest_first) and totals == {len(everything)}

    other = ListingSqlite(source.conn)
    found, totals, listing = threads_found(other)
    assert listing.configs.count(None) == 1 and (found, totals) == (newest_first, {len(everything)})


# -- resuming --------------------------------------------------------------------------------------
class Stop(Exception):
    pass


@pytest.mark.parametrize("workers", [1, 3])
def test_a_migration_stopped_anywhere_completes_when_run_again(endpoint, index_mode, tmp_path, stack, workers) -> None:
    source = stack.enter_context(open_saver(sqlite_url(tmp_path / "source.db")))
    converse(source, "t-1", turns=2)
    converse(source, "t-2", turns=1)
    total = len(list(source.list(None)))
    target = stack.enter_context(s3(endpoint, index_mode))

    def stop_at(n: int):
        def progress(p: MigrationProgress) -> None:
            if p.done == n:
                raise Stop(n)

        return progress

    done = 0
    for stop in (4, total - 3):  # in t-1's root namespace; then in t-2 (one worker)
        with pytest.raises(Stop):
            migrate(source, target, on_progress=stop_at(stop), workers=workers)
        held = sum(len(ids(target, t)) for t in ("t-1", "t-2"))
        if workers == 1:
            assert held == stop
        else:  # the other thread's worker ends the checkpoint it was copying
            assert stop <= held <= stop + 1 < total
        done = held
    report = migrate(source, target, workers=workers)
    assert (report.skipped, report.checkpoints, report.verified) == (done, total - done, total)
    for thread_id in ("t-1", "t-2"):
        copied = ids(target, thread_id)
        assert len(copied) == len(set(copied)) == len(ids(source, thread_id))
    assert_same_graphs(source, target, ["t-1", "t-2"])


def test_threads_in_parallel(endpoint, index_mode, tmp_path, stack) -> None:
    """Several workers: progress still counts up by one, one call at a time; the copy is whole."""
    source = stack.enter_context(open_saver(sqlite_url(tmp_path / "source.db")))
    names = [f"t-{n}" for n in range(5)]
    for name in names:
        converse(source, name, turns=1)
    stored = list(source.list(None))
    target = stack.enter_context(s3(endpoint, index_mode))
    seen: list[MigrationProgress] = []
    callers: set[str] = set()
    inside = threading.Lock()

    def progress(p: MigrationProgress) -> None:
        assert inside.acquire(blocking=False), "on_progress called while another call runs"
        try:
            callers.add(threading.current_thread().name)
            seen.append(p)
            time.sleep(0.001)
        finally:
            inside.release()

    report = migrate(source, target, on_progress=progress, workers=4)

    assert (report.threads, report.checkpoints, report.verified) == (5, len(stored), len(stored))
    assert report.writes == sum(len(t.pending_writes) for t in stored)
    assert [p.done for p in seen] == list(range(1, len(stored) + 1)) and {p.total for p in seen} == {len(stored)}
    assert [p.bytes for p in seen] == sorted(p.bytes for p in seen) and seen[-1].bytes == report.bytes
    assert len(callers) > 1 and all(name.startswith("s3-saver-migrate") for name in callers)
    assert_same_graphs(source, target, names)
    with pytest.raises(ConfigurationError, match="workers must be a positive integer"):
        migrate(source, target, workers=0)


class FailingThread(InMemorySaver):
    """put fails for thread ``bad`` once the other worker has stored a checkpoint (and
    holds that worker until the failure is raised)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed, self.other_put, self.failed = True, threading.Event(), threading.Event()

    def put(self, config, checkpoint, metadata, new_versions):
        if self.armed and config["configurable"]["thread_id"] == "bad":
            assert self.other_put.wait(10)
            self.failed.set()
            raise Stop("bad")
        stored = super().put(config, checkpoint, metadata, new_versions)
        if self.armed and not self.other_put.is_set():
            self.other_put.set()
            assert self.failed.wait(10)
            time.sleep(0.2)  # the failing worker sets the stop flag
        return stored


def test_an_error_on_one_worker_stops_the_others() -> None:
    source = InMemorySaver()
    names = ["bad", "slow", "t-3", "t-4", "t-5"]
    for name in names:
        converse(source, name, turns=1, durability="sync")
    target = FailingThread()

    with pytest.raises(Stop, match="bad"):
        migrate(source, target, thread_ids=names, workers=2)
    # The other worker ended the checkpoint it was copying, then stopped; no thread was started.
    assert len(ids(target, "slow")) == 1 < len(ids(source, "slow"))
    assert all(ids(target, name) == [] for name in ("bad", "t-3", "t-4", "t-5"))

    target.armed = False
    report = migrate(source, target, thread_ids=names, workers=2)
    total = sum(len(ids(source, name)) for name in names)
    assert (report.skipped, report.checkpoints, report.verified) == (1, total - 1, total)
    assert_same_graphs(source, target, names)


class FlakyWrites(S3Saver):
    """put_writes fails once: on the first call after a put (``whole``: the checkpoint is
    stored, none of its writes), or on a task's second call (``half``: its special
    writes are stored, its regular ones are not)."""

    def __init__(self, *args: Any, fail: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fail, self.armed, self.last = fail, True, None
        self.failed_at: str | None = None

    def put(self, config, checkpoint, metadata, new_versions):
        self.last = None
        return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config, writes, task_id, task_path=""):
        now = (config["configurable"]["checkpoint_id"], task_id)
        trigger = self.last is None if self.fail == "whole" else self.last == now
        if self.armed and trigger:
            self.armed, self.failed_at = False, now[0]
            raise Stop("put_writes")
        self.last = now
        return super().put_writes(config, writes, task_id, task_path)


@pytest.mark.parametrize("fail", ["whole", "half"])
def test_writes_lost_after_their_put_are_sent_again(endpoint, index_mode, tmp_path, stack, fail) -> None:
    source = stack.enter_context(open_saver(sqlite_url(tmp_path / "source.db")))
    converse(source, "t", turns=2)
    stored = list(source.list(None))
    table = TABLE if index_mode == "dynamodb" else None
    flaky = FlakyWrites(BUCKET, table=table, endpoint_url=endpoint, region_name="us-east-1", fail=fail)
    stack.enter_context(flaky).setup()

    with pytest.raises(Stop):
        migrate(source, flaky)
    lacking = next(t for t in flaky.list(thread("t")) if t.config["configurable"]["checkpoint_id"] == flaky.failed_at)
    held = len(lacking.pending_writes)
    expected = next(t for t in stored if t.config["configurable"]["checkpoint_id"] == flaky.failed_at)
    assert held < len(expected.pending_writes)
    assert (held > 0) == (fail == "half")

    target = stack.enter_context(s3(endpoint, index_mode))
    report = migrate(source, target)
    present = len(ids(target, "t"))
    assert report.skipped == len(ids(source, "t")) - report.checkpoints > 0
    assert report.writes >= len(expected.pending_writes) - held
    assert report.verified == present == len(stored)
    assert_same_graphs(source, target, ["t"])
    assert_same_resume(source, target, "t")


# -- verification ----------------------------------------------------------------------------------
def test_verify_names_the_checkpoint_that_differs(tmp_path, stack) -> None:
    source = stack.enter_context(open_saver(sqlite_url(tmp_path / "a.db")))
    converse(source, "t", turns=1)
    target = stack.enter_context(open_saver(sqlite_url(tmp_path / "b.db")))
    migrate(source, target)
    root = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    victim = list(target.list(root))[2].config["configurable"]["checkpoint_id"]
    target.conn.execute(
        "UPDATE checkpoints SET metadata = json_set(metadata, '$.step', 99) WHERE checkpoint_id = ?", (victim,)
    )
    target.conn.commit()

    expected = rf"thread 't', namespace '', checkpoint {victim}: metadata differs in \['step'\]"
    with pytest.raises(MigrationError, match=expected) as info:
        migrate(source, target)
    assert (info.value.thread_id, info.value.checkpoint_ns, info.value.checkpoint_id) == ("t", "", victim)
    quiet = migrate(source, target, verify=False)
    assert (quiet.verified, quiet.skipped) == (0, len(ids(source, "t")))


def test_verify_sees_writes_and_values_the_source_does_not_have(endpoint, tmp_path, stack) -> None:
    source = stack.enter_context(open_saver(sqlite_url(tmp_path / "a.db")))
    converse(source, "t", turns=1)
    target = stack.enter_context(s3(endpoint, "dynamodb"))
    migrate(source, target)
    latest = target.get_tuple(thread("t"))
    target.put_writes(latest.config, [("items", ["intruder"])], "another-task")
    with pytest.raises(MigrationError, match=r"pending writes differ: \d+ in the source, \d+ in the target") as info:
        migrate(source, target)
    assert info.value.checkpoint_id == latest.config["configurable"]["checkpoint_id"]

    # A checkpoint of the target's own, continuing the thread.
    checkpoint = {**latest.checkpoint, "id": "2" + latest.checkpoint["id"][1:], "channel_values": {"items": ["x"]}}
    target.put(latest.config, checkpoint, latest.metadata, {"items": "99"})
    with pytest.raises(MigrationError, match="the target has it, the source does not") as info:
        migrate(source, target, thread_ids=["t"])
    assert info.value.checkpoint_id == checkpoint["id"]


class Retyping(InMemorySaver):
    """Stores channel ``turn`` as a float: equal with ==, but not the value the graph wrote."""

    def put(self, config, checkpoint, metadata, new_versions):
        values = checkpoint["channel_values"]
        if isinstance(values.get("turn"), int):
            checkpoint = {**checkpoint, "channel_values": {**values, "turn": float(values["turn"])}}
        return super().put(config, checkpoint, metadata, new_versions)


def test_verify_sees_a_value_whose_type_changed() -> None:
    source = InMemorySaver()
    converse(source, "t", turns=1, durability="sync")
    with pytest.raises(MigrationError, match=r"channel 'turn' differs: source 1 \(int\), target 1\.0 \(float\)") as info:
        migrate(source, Retyping())
    assert info.value.thread_id == "t" and info.value.checkpoint_id is not None


@dataclass
class Point:
    x: Any
    label: str = "p"


class Model(BaseModel):
    value: Any
    tags: list[Any] = []


def test_values_compare_with_their_types() -> None:
    serde = InMemorySaver().serde
    differ = [
        (1, 1.0), (True, 1), ((1, 2), [1, 2]), ({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2.0}]}), ({1: "x"}, {1.0: "x"}),
        ({1, 2}, {1.0, 2}), (Point(1), Point(1.0)), (Model(value=1), Model(value=True)),
        (AIMessage(content="hi", additional_kwargs={"n": 1}), AIMessage(content="hi", additional_kwargs={"n": 1.0})),
        (HumanMessage(content="hi"), AIMessage(content="hi")), (Send("node", {"n": 1}), Send("node", {"n": 1.0})),
        (Interrupt(value=1, id="i"), Interrupt(value=1.0, id="i")), ("1", 1),
    ]
    for a, b in differ:
        assert not same(serde, a, b), (a, b)
        assert a == b or type(a) is not type(b)  # == alone misses those of one type
    alike = [
        (1, 1), ({"a": [1, (2, 3)], "b": {4}}, {"b": {4}, "a": [1, (2, 3)]}), (Point([1]), Point([1])),
        (Model(value={"x": 1}, tags=["a"]), Model(value={"x": 1}, tags=["a"])),
        (AIMessage(content=[{"type": "text", "text": "hi"}], id="m"), AIMessage([{"type": "text", "text": "hi"}], id="m")),
        (Send("node", {"n": [1]}), Send("node", {"n": [1]})),
        (Interrupt(value={"q": 1}, id="i"), Interrupt(value={"q": 1}, id="i")),
        (float("nan"), float("nan")), (ValueError("boom"), ValueError("boom")),  # no useful ==: serialized alike
    ]
    assert len(alike) == 9
    for a, b in alike:
        assert same(serde, a, b), (a, b)
    # What a saver gives back of them is still the same (tuples come back as lists: not here).
    for a, b in alike[2:8]:
        back = serde.loads_typed(serde.dumps_typed(a))
        assert same(serde, back, serde.loads_typed(serde.dumps_typed(b))) and same(serde, back, b), (back, b)


# -- open_saver --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://host/x", "unknown saver URL .scheme 'ftp'"),
        ("checkpoints.db", "unknown saver URL .no scheme"),
        ("sqlite://host/x.db", "three slashes, no host"),
        ("sqlite:///", "no database file"),
        ("s3://", "s3://bucket"),
        ("s3://user:secret@bucket", "no user, port"),
        ("s3://bucket?tabel=x", "unknown parameter 'tabel'"),
        ("s3://bucket?table=a&table=b", "'table' is given twice"),
        ("s3://bucket?table=", "'table' has no value"),
        ("s3://bucket?endpoint_url=localhost:9000", "endpoint_url must be an http:// or https:// URL"),
        ("postgresql://u:secret@host/db?sslmode=nonsense&=x", "not a PostgreSQL URL"),
    ],
)
def test_open_saver_refuses(url, message) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        open_saver(url)
    assert "secret" not in str(info.value)


def test_open_saver_sqlite_paths(tmp_path, monkeypatch) -> None:
    missing = tmp_path / "missing" / "x.db"
    with pytest.raises(ConfigurationError, match=rf"the directory {tmp_path / 'missing'} .*does not exist"):
        open_saver(sqlite_url(missing))
    assert not missing.parent.exists()
    (tmp_path / "garbage.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(ConfigurationError, match="cannot use the SQLite database"):
        with open_saver(sqlite_url(tmp_path / "garbage.db")):
            pass
    monkeypatch.chdir(tmp_path)
    # A store read from is never made up: a mistyped source is an error, not an empty database.
    with pytest.raises(ConfigurationError, match="no SQLite database file at .*relative.db"):
        open_saver("sqlite:///relative.db", create=False)
    assert not (tmp_path / "relative.db").exists()
    with open_saver("sqlite:///relative.db") as saver:
        converse(saver, "t", turns=1)
    assert (tmp_path / "relative.db").stat().st_size > 0
    with open_saver("sqlite:///relative.db", create=False) as saver:
        assert saver.get_tuple({"configurable": {"thread_id": "t"}}) is not None


def test_open_saver_names_the_missing_extra(monkeypatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "langgraph.checkpoint.sqlite", None)
    monkeypatch.setitem(__import__("sys").modules, "langgraph.checkpoint.postgres", None)
    with pytest.raises(ConfigurationError, match=r"pip install '\.\[sqlite\]'"):
        open_saver("sqlite:///x.db")
    with pytest.raises(ConfigurationError, match=r"pip install '\.\[postgres\]'") as info:
        open_saver("postgres://me:secret@db.example/app")
    assert "me:***@db.example" in str(info.value) and "secret" not in str(info.value)


def test_open_saver_masks_the_password_of_a_server_it_cannot_reach() -> None:
    url = "postgresql://me:s3cr3t@127.0.0.1:1/app?connect_timeout=2"
    manager = open_saver(url)
    with pytest.raises(ConfigurationError, match=r"postgresql://me:\*\*\*@127.0.0.1:1/app.*cannot connect") as info:
        with manager:
            pass
    assert "s3cr3t" not in str(info.value)


# -- PostgreSQL ---------------------------------------------------------------------------------------
def test_sqlite_postgres_s3_postgres_round_trip(postgres_url, endpoint, tmp_path, stack) -> None:
    sqlite = stack.enter_context(open_saver(sqlite_url(tmp_path / "source.db")))
    # Synchronous puts: with "async" SqliteSaver may catch a value changed in place after
    # its step, under an unchanged version, which PostgreSQL (values by version) cannot hold.
    converse(sqlite, "t-1", turns=2, durability="sync")
    converse(sqlite, "t-2", turns=1, durability="sync")
    first = stack.enter_context(open_saver(create_database(postgres_url)))
    middle = stack.enter_context(s3(endpoint, "manifest"))
    last = stack.enter_context(open_saver(create_database(postgres_url).replace("postgresql://", "postgres://")))
    total = len(list(sqlite.list(None)))

    for source, target in ((sqlite, first), (first, middle), (middle, last)):
        report = migrate(source, target)
        assert (report.threads, report.checkpoints, report.verified) == (2, total, total)
    # PostgreSQL's threads come from one query too, newest first as list(None) meets them.
    newest_first = list(dict.fromkeys(t.config["configurable"]["thread_id"] for t in first.list(None)))
    found, totals, listing = threads_found(first, workers=2)
    assert None not in listing.configs and sorted(found) == sorted(newest_first) and totals == {total}
    assert_same_graphs(sqlite, last, ["t-1", "t-2"])
    assert_same_graphs(sqlite, middle, ["t-1", "t-2"])
    assert_same_resume(sqlite, last, "t-1")
