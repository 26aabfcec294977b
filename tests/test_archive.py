"""Archival (issue 12): archive_thread, restore_thread, archive_idle, export/import and the
storage class of live objects, in both index modes.

What it proves:

* A thread archived in an instant class (GLACIER_IR) reads exactly as before - every
  get_tuple, list (all namespaces, per namespace, limit/before/filter), get_state (with
  subgraphs), get_state_history and get_delta_channel_history - from another process
  (cold) and again (warm), sync and async; and those reads equal InMemorySaver's on the
  same graph (two interrupts, a subgraph, a fork, a 5 MB value). The bucket then holds
  one object for the thread (the manifest index keeps its head and listing record).
  restore_thread brings back the same reads, leaves no archive object, and the graph
  resumes as InMemorySaver's does.
* A cold class (DEEP_ARCHIVE) refuses reads and writes with ThreadArchivedError until
  restore_thread has sent RestoreObject ("restoring") and then made it live.
* A write to an archived GLACIER_IR thread restores it first: history = before + new.
* export_thread/import_thread move a thread between index modes and buckets, under
  its id or another; a non-empty destination and garbage bytes are refused.
* archive_idle archives idle live threads only (older_than, limit); list_threads says
  which are archived.
* S3Saver(storage_class=...) writes the live objects in that class, index records in
  STANDARD; unknown classes are refused before any request.
* delete_thread removes an archived thread wholly; prune, copy_thread and
  delete_for_runs refuse one and change nothing.
* The requests each archival call sends (deterministic counts, see ARCHIVE_COSTS).
"""

from __future__ import annotations

import asyncio
import functools
import operator
import re
import zlib
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any, TypedDict

import boto3
import pytest
from botocore.exceptions import ClientError
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Interrupt, StateSnapshot, interrupt

from conftest import BUCKET, make_saver
from helpers import checkpoint, concat, config, grow_thread, is_marker
from s3_saver import (
    ArchiveStatus,
    ConfigurationError,
    CorruptObjectError,
    S3Saver,
    ThreadArchivedError,
)

BIG = 5_000_000  # chars of the large state value (one blob object of several MB)
SMALL = 200_000  # a value above the inline threshold: its own blob object, quick to run
ARCHIVE_KEY = re.compile(r"archive/(?P<thread>[^/]+)/[0-9a-f]{40}")


# -- the graph: a subgraph with an interrupt, a second interrupt, a delta channel, a large value --
class State(TypedDict, total=False):
    items: Annotated[list[str], operator.add]
    log: Annotated[list, DeltaChannel(concat, snapshot_frequency=3)]
    big: str


class Child(TypedDict):
    items: Annotated[list[str], operator.add]


def _big(size: int) -> str:
    return ("0123456789abcdef" * (size // 16 + 1))[:size]


def _builder(big: int = BIG) -> StateGraph:
    """load -> child (subgraph c1 -> ask, which interrupts) -> review (interrupts) -> END."""

    def load(state: State) -> dict:
        out: dict[str, Any] = {"items": ["load"], "log": [f"load{len(state.get('items', []))}"]}
        if big and not state.get("big"):
            out["big"] = _big(big)
        return out

    def ask(state: Child) -> dict:
        return {"items": [f"child:{interrupt('child?')}"]}

    def review(state: State) -> dict:
        answer = interrupt({"question": "approve?", "seen": len(state["items"])})
        return {"items": [f"review:{answer}"], "log": [f"review:{answer}"]}

    child = (
        StateGraph(Child)
        .add_node("c1", lambda s: {"items": ["c1"]})
        .add_node("ask", ask)
        .add_edge(START, "c1")
        .add_edge("c1", "ask")
        .compile()
    )
    return (
        StateGraph(State)
        .add_node("load", load)
        .add_node("child", child)
        .add_node("review", review)
        .add_edge(START, "load")
        .add_edge("load", "child")
        .add_edge("child", "review")
        .add_edge("review", END)
    )


def thread(thread_id: str, **extra: Any) -> dict:
    return {"configurable": {"thread_id": thread_id, **extra}}


class Api:
    """A checkpointer (and its graphs) through sync or async methods, as coroutines:
    in sync mode they never suspend and ``_drive`` runs them without an event loop."""

    def __init__(self, cp: Any, aio: bool) -> None:
        self.cp, self.aio = cp, aio

    def graph(self, big: int = BIG) -> Any:
        return _builder(big).compile(checkpointer=self.cp)

    async def call(self, obj: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.aio:
            return await getattr(obj, "a" + name)(*args, **kwargs)
        return getattr(obj, name)(*args, **kwargs)

    async def each(self, obj: Any, name: str, *args: Any, **kwargs: Any) -> list:
        if self.aio:
            return [x async for x in getattr(obj, "a" + name)(*args, **kwargs)]
        return list(getattr(obj, name)(*args, **kwargs))


class Savers:
    """The S3Savers ("processes") of one run, each behind an Api; ``close`` closes them all."""

    def __init__(self, endpoint: str, index_mode: str, aio: bool) -> None:
        self.endpoint, self.index_mode, self.aio = endpoint, index_mode, aio
        self.opened: list[S3Saver] = []

    def new(self) -> Api:
        saver = make_saver(self.endpoint, self.index_mode)
        self.opened.append(saver)
        return Api(saver, self.aio)

    async def close(self) -> None:
        for saver in self.opened:
            await saver.aclose() if self.aio else saver.close()

    def run(self, scenario: Callable[[], Coroutine]) -> None:
        """Run ``scenario`` (under asyncio, or driven synchronously), then close every saver."""

        async def main() -> None:
            try:
                await scenario()
            finally:
                await self.close()

        _drive(self.aio, main)


def _drive(aio: bool, main: Callable[[], Coroutine]) -> Any:
    return asyncio.run(main()) if aio else _sync(main())


def _arun(saver: S3Saver, make: Callable[[], Coroutine]) -> Any:
    """One async call of a sync test's saver, in a loop of its own (whose clients it closes)."""

    async def main() -> Any:
        try:
            return await make()
        finally:
            await saver.aclose()

    return asyncio.run(main())


def _sync(coro: Coroutine) -> Any:
    """Run a coroutine of sync calls (an ``Api(..., aio=False)`` one) to its end."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise AssertionError("a sync run awaited something asynchronous")


async def _start(api: Api, graph: Any, tid: str) -> None:
    """Two interrupts, then a fork: the thread ends in the fork's child interrupt."""
    cfg = thread(tid)
    await api.call(graph, "invoke", {"items": ["in"], "log": ["in"]}, cfg)  # stops in the child's ask
    await api.call(graph, "invoke", Command(resume="ok"), cfg)  # the child ends; stops in review
    history = await api.each(graph, "get_state_history", cfg)
    old = next(s for s in reversed(history) if s.next == ("child",))
    forked = await api.call(graph, "update_state", old.config, {"items": ["patched"], "log": ["patched"]})
    await api.call(graph, "invoke", None, forked)  # the child again, in a new namespace


async def _finish(api: Api, graph: Any, tid: str) -> Any:
    await api.call(graph, "invoke", Command(resume="ok2"), thread(tid))
    return await api.call(graph, "invoke", Command(resume="yes"), thread(tid))


# -- what a thread reads as --------------------------------------------------------------------
def _slim(x: Any) -> Any:
    """Large strings become their digest (keeps a few hundred MB of copies out of memory)."""
    if isinstance(x, str) and len(x) > 100_000:
        return ("<large str>", len(x), zlib.crc32(x.encode()))
    if isinstance(x, dict):
        return {k: _slim(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # CheckpointTuple, StateSnapshot, PregelTask
        return type(x)._make(_slim(v) for v in x)
    if isinstance(x, (list, tuple)):
        return type(x)(_slim(v) for v in x)
    return x


def _result(x: Any) -> Any:
    """An invoke result, comparable between runs: interrupts by value (their id hashes the task id)."""
    if isinstance(x, Interrupt):
        return ("interrupt", _result(x.value))
    if isinstance(x, dict):
        return {k: _result(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_result(v) for v in x]
    return _slim(x)


def _ns(t: CheckpointTuple) -> str:
    return t.config["configurable"]["checkpoint_ns"]


async def _reads(api: Api, tid: str, big: int = BIG) -> dict[str, Any]:
    """Every read of the thread: saver methods and graph methods, every namespace."""
    saver, graph = api.cp, api.graph(big)
    out: dict[str, Any] = {}
    everything = _slim(await api.each(saver, "list", thread(tid)))
    out["list"] = everything
    out["get_tuple"] = [_slim(await api.call(saver, "get_tuple", t.config)) for t in everything]
    first: dict[str, str] = {}
    for t in everything:
        first[_ns(t)] = min(first.get(_ns(t), t.checkpoint["id"]), t.checkpoint["id"])
    out["namespaces"] = []
    for ns in sorted(first, key=first.__getitem__):  # oldest first (ids, not names, are ordered alike)
        cfg = thread(tid, checkpoint_ns=ns)
        listed = await api.each(saver, "list", cfg)
        middle = listed[len(listed) // 2].config
        out["namespaces"].append(
            {
                "latest": _slim(await api.call(saver, "get_tuple", cfg)),
                "limit": _slim(await api.each(saver, "list", cfg, limit=2)),
                "before": _slim(await api.each(saver, "list", cfg, before=middle)),
                "before+limit": _slim(await api.each(saver, "list", cfg, before=middle, limit=1)),
                "filter source": _slim(await api.each(saver, "list", cfg, filter={"source": "loop"})),
                "filter step": _slim(await api.each(saver, "list", cfg, filter={"step": 1})),
                "history": _slim(await api.each(graph, "get_state_history", cfg)),
                "history limit": _slim(await api.each(graph, "get_state_history", cfg, limit=3)),
            }
        )
    out["state"] = _slim(await api.call(graph, "get_state", thread(tid), subgraphs=True))
    root = [t for t in everything if _ns(t) == ""]
    out["delta"] = [
        await api.call(saver, "get_delta_channel_history", config=t.config, channels=["log"]) for t in root[::3]
    ]
    return out


async def _glance(api: Api, tid: str, big: int = SMALL) -> dict[str, Any]:
    """A cheaper view than ``_reads`` (for tests about something else): the thread's
    checkpoints in every namespace, its state with subgraphs, its root history."""
    graph = api.graph(big)
    return {
        "list": _slim(await api.each(api.cp, "list", thread(tid))),
        "state": _slim(await api.call(graph, "get_state", thread(tid), subgraphs=True)),
        "history": _slim(await api.each(graph, "get_state_history", thread(tid))),
    }


def _glanced(reads: dict[str, Any]) -> dict[str, Any]:
    """The part of ``_reads`` that ``_glance`` reads (the root namespace is the oldest)."""
    return {"list": reads["list"], "state": reads["state"], "history": reads["namespaces"][0]["history"]}


def _normalized(reads: dict[str, Any]) -> Any:
    """Reads with checkpoint ids as their rank in the thread, namespaces as their name and
    first checkpoint, task ids dropped: comparable between two checkpointers' runs."""
    ids = sorted(t.checkpoint["id"] for t in reads["list"])
    rank = {cid: f"#{i}" for i, cid in enumerate(ids)}
    first: dict[str, str] = {}
    for t in reads["list"]:
        first[_ns(t)] = min(first.get(_ns(t), t.checkpoint["id"]), t.checkpoint["id"])
    names = {ns: f"{ns.split(':')[0]}@{rank[cid]}" for ns, cid in first.items() if ns}

    def norm(x: Any) -> Any:
        if isinstance(x, str):
            return rank.get(x) or names.get(x) or x
        if isinstance(x, CheckpointTuple):
            return {
                "config": norm(x.config),
                "values": norm(x.checkpoint["channel_values"]),
                "metadata": norm(x.metadata),
                "parent": norm(x.parent_config),
                "pending": [norm(w[1:]) for w in x.pending_writes or ()],
            }
        if isinstance(x, StateSnapshot):
            return {
                "values": norm(x.values),
                "next": x.next,
                "config": norm(x.config),
                "parent": norm(x.parent_config),
                "metadata": norm(x.metadata),
                "created_at": bool(x.created_at),
                "interrupts": norm(x.interrupts),
                "tasks": [
                    [t.name, t.path[:2], repr(t.error), norm(t.interrupts), norm(t.state), norm(t.result)]
                    for t in x.tasks
                ],
            }
        if isinstance(x, Interrupt):  # its id hashes the task id
            return ("interrupt", norm(x.value))
        if isinstance(x, dict):
            if set(x) == {"writes", "seed"} or set(x) == {"writes"}:  # DeltaChannelHistory: no task ids
                return {**{k: norm(v) for k, v in x.items()}, "writes": [norm(w[1:]) for w in x["writes"]]}
            return {norm(k): norm(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [norm(v) for v in x]
        return x

    out = {k: norm(v) for k, v in reads.items()}
    out["list"] = sorted(out["list"], key=lambda t: t["config"]["configurable"]["checkpoint_id"])
    if "get_tuple" in out:
        out["get_tuple"] = sorted(out["get_tuple"], key=lambda t: t["config"]["configurable"]["checkpoint_id"])
    return out


@functools.lru_cache(maxsize=None)
def _s3(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _objects(endpoint: str, prefix: str = "", bucket: str = BUCKET) -> list[str]:
    return sorted(_classes(endpoint, prefix, bucket))


def _logical(keys: list[str]) -> list[str]:
    """What live objects hold, whatever their tag or token: a restore writes every
    object again under keys no earlier write used."""
    from dataclasses import replace

    from s3_saver._format.keys import KeyLayout

    layout = KeyLayout()
    return sorted(repr(replace(layout.parse_object_key(k), tag="", token="")) for k in keys)


def _classes(endpoint: str, prefix: str = "", bucket: str = BUCKET) -> dict[str, str]:
    pages = _s3(endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"]: o.get("StorageClass", "STANDARD") for page in pages for o in page.get("Contents", []) if not is_marker(o["Key"])}


def _head(endpoint: str, key: str) -> dict:
    return _s3(endpoint).head_object(Bucket=BUCKET, Key=key)


def _assert_only_archive(endpoint: str, index_mode: str, tid: str, status: ArchiveStatus) -> None:
    """The thread's one object is its archive; the manifest index keeps its own records."""
    keys = _objects(endpoint)
    assert ARCHIVE_KEY.fullmatch(status.key) and ARCHIVE_KEY.fullmatch(status.key)["thread"] == tid
    assert not _objects(endpoint, "live/")
    if index_mode == "dynamodb":
        assert keys == [status.key]
    else:
        # Its listing record; two when a put in the background (durability "async")
        # raced the first one across a second boundary: only the one whose time the
        # head records counts (ManifestIndex.threads), the thread is listed once.
        listing = [k for k in keys if k.startswith("listing/")]
        assert 1 <= len(listing) <= 2 and all(re.fullmatch(rf"listing/threads/\d+\.{tid}", k) for k in listing), keys
        assert keys == sorted([status.key, f"manifests/{tid}/head", *listing])


def _archived_classes(saver: S3Saver) -> dict[str, str | None]:
    listed = list(saver.list_threads())
    assert len({t.thread_id for t in listed}) == len(listed), listed  # each thread once
    return {t.thread_id: t.archived for t in listed}


# -- 1. archive, read, restore: sync and async ----------------------------------------------------
@pytest.mark.parametrize("aio", [False, True], ids=["sync", "async"])
def test_archive_read_restore_matches_in_memory(endpoint, index_mode, aio) -> None:
    savers = Savers(endpoint, index_mode, aio)

    async def scenario() -> None:
        ours, ref = savers.new(), Api(InMemorySaver(), aio)
        await ours.call(ours.cp, "setup")
        graphs = {"ours": ours.graph(), "ref": ref.graph()}
        await _start(ours, graphs["ours"], "t")
        await _start(ref, graphs["ref"], "t")
        before = await _reads(ours, "t")
        expected = _normalized(await _reads(ref, "t"))
        assert _normalized(before) == expected
        assert len(before["namespaces"]) == 3  # the root and two runs of the child
        live = _objects(endpoint, "live/t/")

        status = await ours.call(ours.cp, "archive_thread", "t")
        assert (status.thread_id, status.state, status.storage_class) == ("t", "archived", "GLACIER_IR")
        assert status.checkpoints == len(before["list"])
        assert status.live_bytes > BIG // 100 and status.live_bytes > status.size  # compressed
        head = _head(endpoint, status.key)
        assert (head["ContentLength"], head["StorageClass"]) == (status.size, "GLACIER_IR")
        _assert_only_archive(endpoint, index_mode, "t", status)
        assert _archived_classes(ours.cp) == {"t": "GLACIER_IR"}

        # Another process reads it from the archive (cold), then from its cache (warm); so does the archiver.
        reader = savers.new()
        assert await _reads(reader, "t") == before
        assert await _reads(reader, "t") == before
        assert await _reads(ours, "t") == before

        restored = await ours.call(ours.cp, "restore_thread", "t")
        assert (restored.state, restored.key, restored.checkpoints) == ("live", status.key, status.checkpoints)
        assert not _objects(endpoint, "archive/")
        # The same objects, written again under a new tag (see s3_saver._format.keys).
        assert _logical(_objects(endpoint, "live/t/")) == _logical(live)
        assert _archived_classes(ours.cp) == {"t": None}
        after = savers.new()
        assert await _reads(after, "t") == before
        assert await _glance(reader, "t", BIG) == _glanced(before)  # its cached archive is not read any more
        again = await ours.call(ours.cp, "restore_thread", "t")
        assert again == ArchiveStatus("t", "live")

        done = await _finish(after, after.graph(), "t")
        assert _result(done) == _result(await _finish(ref, graphs["ref"], "t"))
        assert done["items"][-1] == "review:yes"
        assert _normalized(await _glance(after, "t", BIG)) == _normalized(await _glance(ref, "t", BIG))

    savers.run(scenario)


def test_archive_again_returns_the_same_status(endpoint, index_mode) -> None:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    grow_thread(saver, "t", 3)
    status = saver.archive_thread("t")
    keys = _objects(endpoint)
    assert saver.archive_thread("t") == status
    assert make_saver(endpoint, index_mode).archive_thread("t") == status
    assert _objects(endpoint) == keys
    saver.close()


# -- 2. a cold class: refused until restored ---------------------------------------------------


def _refused(call: Callable[[], Any], status: ArchiveStatus) -> None:
    with pytest.raises(ThreadArchivedError, match=r"restore_thread\('t'\)") as info:
        call()
    error = info.value
    assert (error.thread_id, error.storage_class, error.key) == ("t", status.storage_class, status.key)


def test_deep_archive_refuses_reads_and_writes_until_restored(endpoint, index_mode) -> None:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    ours, ref = Api(saver, False), Api(InMemorySaver(), False)
    _sync(_start(ours, ours.graph(SMALL), "t"))
    _sync(_start(ref, ref.graph(SMALL), "t"))
    before = _sync(_reads(ours, "t", SMALL))
    status = saver.archive_thread("t", storage_class="DEEP_ARCHIVE")
    assert (status.state, status.storage_class) == ("archived", "DEEP_ARCHIVE")
    assert _head(endpoint, status.key)["StorageClass"] == "DEEP_ARCHIVE"
    _assert_only_archive(endpoint, index_mode, "t", status)
    objects = _classes(endpoint)

    reader = make_saver(endpoint, index_mode)
    graph = _builder(SMALL).compile(checkpointer=reader)
    old = before["list"][-1].config
    for read in (
        lambda: reader.get_tuple(thread("t")),
        lambda: list(reader.list(thread("t"))),
        lambda: list(reader.list(thread("t", checkpoint_ns=""), limit=1)),
        lambda: graph.get_state(thread("t"), subgraphs=True),
        lambda: list(graph.get_state_history(thread("t"))),
        lambda: reader.get_delta_channel_history(config=thread("t"), channels=["log"]),
        lambda: reader.export_thread("t"),
        lambda: reader.get_tuple(old),  # by checkpoint id
        # Writes: a resume, and a new input, leave nothing behind.
        lambda: graph.invoke(Command(resume="ok2"), thread("t")),
        lambda: graph.invoke({"items": ["more"]}, thread("t")),
    ):
        _refused(read, status)
        assert _classes(endpoint) == objects
    with pytest.raises(ThreadArchivedError, match=r"restore_thread"):
        _arun(reader, lambda: reader.aget_tuple(thread("t")))
    assert _archived_classes(reader) == {"t": "DEEP_ARCHIVE"}

    for bad in ({"days": 0}, {"tier": "Fast"}):
        with pytest.raises(ConfigurationError):
            reader.restore_thread("t", **bad)
    reader.stats.reset()
    restoring = reader.restore_thread("t")
    assert (restoring.state, restoring.storage_class, restoring.key) == ("restoring", "DEEP_ARCHIVE", status.key)
    assert reader.stats.requests[("s3", "restore_object")] == 1
    assert "Restore" in _head(endpoint, status.key)
    live = make_saver(endpoint, index_mode).restore_thread("t")
    assert (live.state, live.key, live.checkpoints) == ("live", status.key, len(before["list"]))
    assert not _objects(endpoint, "archive/")
    assert _sync(_reads(Api(make_saver(endpoint, index_mode), False), "t", SMALL)) == before
    assert _sync(_glance(Api(reader, False), "t")) == _sync(_glance(ours, "t"))
    done = _sync(_finish(Api(reader, False), graph, "t"))
    assert _result(done) == _result(_sync(_finish(ref, ref.graph(SMALL), "t")))
    saver.close()
    reader.close()


def _archive_tier(monkeypatch, saver: S3Saver, key: str, tier: str | None) -> list[dict]:
    """The RestoreRequests ``saver`` sends for ``key``. With ``tier``, S3's answers for an
    INTELLIGENT_TIERING object its Archive Access or Deep Archive Access tier holds (moto has
    no tiers): GetObject is refused, HeadObject carries ArchiveStatus, a RestoreObject with
    Days is refused ("not allowed for objects in Intelligent-Tiering archive tiers")."""
    sent: list[dict] = []
    send = saver._sync._send
    restoring = []

    def answer(call: Any) -> Any:
        if call.params.get("Key") != key:
            return send(call)
        if call.operation == "restore_object":
            sent.append(call.params["RestoreRequest"])
            if tier is None:
                return send(call)
            if "Days" in call.params["RestoreRequest"]:
                return ClientError({"Error": {"Code": "InvalidArgument"}, "ResponseMetadata": {"HTTPStatusCode": 400}}, "RestoreObject")
            restoring.append(True)
            return {}
        if tier is not None and call.operation == "get_object":
            return ClientError({"Error": {"Code": "InvalidObjectState"}, "ResponseMetadata": {"HTTPStatusCode": 403}}, "GetObject")
        if tier is not None and call.operation == "head_object":
            head = dict(send(call), ArchiveStatus=tier)
            return dict(head, Restore='ongoing-request="true"') if restoring else head
        return send(call)

    monkeypatch.setattr(saver._sync, "_send", answer)
    return sent


@pytest.mark.parametrize(
    ("storage_class", "tier"),
    [("GLACIER", None), ("INTELLIGENT_TIERING", "ARCHIVE_ACCESS"), ("INTELLIGENT_TIERING", "DEEP_ARCHIVE_ACCESS")],
)
def test_restore_sends_days_only_where_s3_takes_them(endpoint, index_mode, monkeypatch, storage_class, tier) -> None:
    """GLACIER and DEEP_ARCHIVE restore a copy for ``days``; an Intelligent-Tiering archive
    tier moves the object back to its Frequent Access tier, and S3 refuses Days there."""
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    grow_thread(saver, "t", 3)
    before = list(saver.list(config("t")))
    status = saver.archive_thread("t", storage_class=storage_class)
    assert _head(endpoint, status.key)["StorageClass"] == storage_class

    reader = make_saver(endpoint, index_mode)
    sent = _archive_tier(monkeypatch, reader, status.key, tier)
    if tier is not None:
        with pytest.raises(ThreadArchivedError, match=rf"\(INTELLIGENT_TIERING, {tier} tier\).*restore_thread\('t'\)"):
            reader.get_tuple(config("t"))
    # moto finishes a GLACIER restore at once; a tier's restore is under way until undone below.
    for _ in range(2 if tier else 1):  # a restore under way is asked for once
        restoring = reader.restore_thread("t", days=7, tier="Bulk")
        assert (restoring.state, restoring.storage_class) == ("restoring", storage_class)
    expected = {"GlacierJobParameters": {"Tier": "Bulk"}}
    assert sent == [expected if tier else dict(expected, Days=7)]

    monkeypatch.undo()  # S3 finished: the object is readable (in its Frequent Access tier)
    live = reader.restore_thread("t")
    assert (live.state, live.key) == ("live", status.key)
    assert not _objects(endpoint, "archive/")
    assert list(make_saver(endpoint, index_mode).list(config("t"))) == before
    saver.close()
    reader.close()


def test_delete_whose_read_an_archive_switch_follows_removes_the_archive(endpoint, monkeypatch) -> None:
    """DynamoDB: another process archives the thread between delete_thread's read of
    the thread's record (live) and its switch. The switch holds only on the record
    as read: refused, the delete reads it again and deletes the archive object too,
    which no record would name after it. (The manifest's switch is a swap of the
    very head it read: a head changed since fails it, and it reads again.)"""
    from s3_saver._index.dynamodb.items import DynamoCalls

    saver = make_saver(endpoint, "dynamodb")
    saver.setup()
    grow_thread(saver, "t", 3)
    archiver = make_saver(endpoint, "dynamodb")
    real = DynamoCalls.bury_thread

    def archived_first(self, *args, **kwargs):
        monkeypatch.setattr(DynamoCalls, "bury_thread", real)
        archiver.archive_thread("t")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DynamoCalls, "bury_thread", archived_first)
    saver.delete_thread("t")
    assert not _objects(endpoint, "archive/") and not _objects(endpoint, "live/t/")
    for reader in (saver, make_saver(endpoint, "dynamodb")):
        assert reader.get_tuple(config("t")) is None
        assert [t.thread_id for t in reader.list_threads()] == []
    for s in (saver, archiver):
        s.close()


@pytest.mark.parametrize("meanwhile", ["deleted", "restored"])
def test_restore_whose_archive_goes_under_it_answers_live(endpoint, index_mode, monkeypatch, meanwhile) -> None:
    """Between restore_thread's read of the thread's record and its GET of the archive,
    another process deletes the thread or restores it (each deletes the archive
    object): the restore reads the record again and answers "live", as a call
    begun after the other one does, never MissingObjectError (the archive is not lost)."""
    from s3_saver._ops import install as archive_op

    saver = make_saver(endpoint, index_mode)
    saver.setup()
    grow_thread(saver, "t", 3)
    before = list(saver.list(config("t")))
    saver.archive_thread("t")
    other = make_saver(endpoint, index_mode)
    real = archive_op.archive_body

    def after_the_other(ctx, ref):
        monkeypatch.setattr(archive_op, "archive_body", real)
        getattr(other, f"{meanwhile[:-1]}_thread")("t")  # delete_thread / restore_thread
        return (yield from real(ctx, ref))

    monkeypatch.setattr(archive_op, "archive_body", after_the_other)
    status = make_saver(endpoint, index_mode).restore_thread("t")
    assert status.state == "live" and status.key is None
    assert not _objects(endpoint, "archive/")
    after = list(make_saver(endpoint, index_mode).list(config("t")))
    assert after == ([] if meanwhile == "deleted" else before)
    for s in (saver, other):
        s.close()


# -- 3. a write to a thread archived in an instant class restores it ---------------------------
def _checkpoints(history: list[StateSnapshot]) -> list[tuple]:
    """What a write leaves as it was (the tasks of the latest checkpoint change: the
    resume's pending writes answer its interrupts)."""
    return [_slim((s.config, s.values, s.next, s.metadata, s.created_at, s.parent_config)) for s in history]


@pytest.mark.parametrize("aio", [False, True], ids=["sync", "async"])
def test_write_to_an_archived_thread_restores_it_first(endpoint, index_mode, aio) -> None:
    savers = Savers(endpoint, index_mode, aio)

    async def scenario() -> None:
        ours, ref = savers.new(), Api(InMemorySaver(), aio)
        await ours.call(ours.cp, "setup")
        for api in (ours, ref):
            await api.call(api.graph(SMALL), "invoke", {"items": ["in"], "log": ["in"]}, thread("t"))
        before = _checkpoints(await ours.each(ours.graph(SMALL), "get_state_history", thread("t")))
        await ours.call(ours.cp, "archive_thread", "t")

        writer = savers.new()  # another process
        got = await writer.call(writer.graph(SMALL), "invoke", Command(resume="ok"), thread("t"))
        assert _result(got) == _result(await ref.call(ref.graph(SMALL), "invoke", Command(resume="ok"), thread("t")))
        after = _checkpoints(await writer.each(writer.graph(SMALL), "get_state_history", thread("t")))
        assert len(after) > len(before) and after[len(after) - len(before) :] == before
        assert not _objects(endpoint, "archive/")
        assert _archived_classes(writer.cp) == {"t": None}
        # The archiver's process (its archive cached) reads the new history too, and writes on.
        assert _checkpoints(await ours.each(ours.graph(SMALL), "get_state_history", thread("t"))) == after
        for api in (ours, ref):
            await api.call(api.graph(SMALL), "invoke", Command(resume="yes"), thread("t"))
        assert _normalized(await _glance(writer, "t")) == _normalized(await _glance(ref, "t"))

    savers.run(scenario)


# -- 4. export from one index mode and bucket, import into another -----------------------------
def _renamed(x: Any, old: str, new: str) -> Any:
    if isinstance(x, dict):
        return {k: (new if k == "thread_id" and v == old else _renamed(v, old, new)) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)._make(_renamed(v, old, new) for v in x)
    if isinstance(x, (list, tuple)):
        return type(x)(_renamed(v, old, new) for v in x)
    return x


def test_export_from_dynamodb_import_into_manifest_on_another_bucket(endpoint) -> None:
    source = make_saver(endpoint, "dynamodb")
    source.setup()
    ours, ref = Api(source, False), Api(InMemorySaver(), False)
    _sync(_start(ours, ours.graph(SMALL), "t"))
    _sync(_start(ref, ref.graph(SMALL), "t"))
    before = _sync(_reads(ours, "t", SMALL))
    source_objects = _classes(endpoint)
    data = source.export_thread("t")
    assert data.startswith(b"s3_saver.archive/2 zstd\n")
    assert _classes(endpoint) == source_objects

    other = S3Saver("other-bucket", endpoint_url=endpoint, region_name="us-east-1")
    other.setup()
    assert other.import_thread(data) == "t"
    target = Api(other, False)
    assert _sync(_reads(target, "t", SMALL)) == before
    assert other.import_thread(data, thread_id="t2") == "t2"
    assert _sync(_reads(target, "t2", SMALL)) == _renamed(before, "t", "t2")
    assert {t.thread_id: t.archived for t in other.list_threads()} == {"t": None, "t2": None}

    imported = _classes(endpoint, bucket="other-bucket")
    assert [k for k in imported if k.startswith("live/t/")] and [k for k in imported if k.startswith("live/t2/")]
    for tid in ("t", "t2"):
        with pytest.raises(ConfigurationError, match="already has checkpoints"):
            other.import_thread(data, thread_id=tid)
    header = b"s3_saver.archive/2 zstd\n"
    zstd_magic = b"\x28\xb5\x2f\xfd"
    for garbage in (b"", b"garbage", data[: len(data) // 2], header + zstd_magic + b"\x00" * 32, b"PK\x03\x04" + data):
        with pytest.raises(CorruptObjectError):
            other.import_thread(garbage, thread_id="t3")
    assert _classes(endpoint, bucket="other-bucket") == imported
    assert other.get_tuple(thread("t3")) is None

    # Each copy goes on by itself, as InMemorySaver's thread does.
    done = _sync(_finish(target, target.graph(SMALL), "t"))
    assert _result(done) == _result(_sync(_finish(ref, ref.graph(SMALL), "t")))
    assert _sync(_glance(ours, "t")) == _sync(_glance(Api(make_saver(endpoint, "dynamodb"), False), "t"))
    assert _sync(_glance(target, "t2")) == _renamed(_sync(_glance(ours, "t")), "t", "t2")
    # An archived thread's export is its archive object.
    status = other.archive_thread("t2")
    assert other.export_thread("t2") == _s3(endpoint).get_object(Bucket="other-bucket", Key=status.key)["Body"].read()
    source.close()
    other.close()


# -- 5. archive_idle ------------------------------------------------------------------------------
def _thread_aged(saver: S3Saver, tid: str, age: timedelta) -> None:
    """Two checkpoints, the latest ``age`` old (graphs stamp the current time)."""
    stored = config(tid)
    for step in range(2):
        cp = checkpoint({"n": step}, {"n": str(step + 1)})
        cp["ts"] = (datetime.now(timezone.utc) - age - timedelta(seconds=1 - step)).isoformat()
        stored = saver.put(stored, cp, {"source": "loop", "step": step}, {"n": str(step + 1)})


def test_archive_idle_archives_idle_live_threads(endpoint, index_mode) -> None:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    for tid, age in (("a", timedelta(hours=2)), ("b", timedelta(hours=1)), ("c", timedelta(minutes=1))):
        _thread_aged(saver, tid, age)
    assert saver.archive_idle(timedelta(days=3650)) == []
    for bad in ({"older_than": timedelta(seconds=-1)}, {"older_than": 30}, {"limit": 0}, {"storage_class": "NOPE"}):
        with pytest.raises(ConfigurationError):
            saver.archive_idle(**{"older_than": timedelta(0), **bad})
    assert not _objects(endpoint, "archive/")

    first = saver.archive_idle(timedelta(minutes=30), limit=1)
    assert len(first) == 1 and first[0].thread_id in {"a", "b"}
    assert (first[0].state, first[0].storage_class) == ("archived", "GLACIER_IR")
    second = saver.archive_idle(timedelta(minutes=30))  # "c" is 1 minute old: not idle
    assert [s.thread_id for s in second] == sorted({"a", "b"} - {first[0].thread_id})
    rest = saver.archive_idle(timedelta(0), storage_class="STANDARD_IA")
    assert [(s.thread_id, s.state, s.storage_class) for s in rest] == [("c", "archived", "STANDARD_IA")]
    assert saver.archive_idle(timedelta(0)) == []
    assert _arun(saver, lambda: saver.aarchive_idle(timedelta(0))) == []
    assert _archived_classes(saver) == {"a": "GLACIER_IR", "b": "GLACIER_IR", "c": "STANDARD_IA"}
    assert not _objects(endpoint, "live/")
    archives = {k: c for k, c in _classes(endpoint, "archive/").items()}
    assert archives == {s.key: s.storage_class for s in first + second + rest}
    assert [t.checkpoint["channel_values"] for t in saver.list(config("c"))] == [{"n": 1}, {"n": 0}]
    saver.close()


def test_archive_idle_with_no_idle_time_takes_a_thread_written_this_second(endpoint, index_mode, monkeypatch) -> None:
    """older_than=timedelta(0): a thread whose latest checkpoint is half a second old is idle
    (the clock is pinned: the checkpoint at .25 of a second, archive_idle at .75)."""
    import types

    from s3_saver._ops import context

    saver = make_saver(endpoint, index_mode)
    saver.setup()
    second = int(datetime.now(timezone.utc).timestamp()) - 60
    cp = checkpoint({"n": 0}, {"n": "1"})
    cp["ts"] = datetime.fromtimestamp(second + 0.25, timezone.utc).isoformat()
    saver.put(config("t"), cp, {"source": "input", "step": -1}, {"n": "1"})
    monkeypatch.setattr(context, "time", types.SimpleNamespace(time=lambda: second + 0.75))
    assert [s.thread_id for s in saver.archive_idle(timedelta(0))] == ["t"]
    saver.close()


# -- 6. the storage class of live objects ------------------------------------------------------------
def test_live_objects_are_written_in_the_saver_storage_class(endpoint, index_mode) -> None:
    saver = make_saver(endpoint, index_mode, storage_class="INTELLIGENT_TIERING")
    saver.setup()
    ours, ref = Api(saver, False), Api(InMemorySaver(), False)
    _sync(_start(ours, ours.graph(SMALL), "t"))
    _sync(_start(ref, ref.graph(SMALL), "t"))
    before = _sync(_glance(ours, "t"))
    assert _normalized(before) == _normalized(_sync(_glance(ref, "t")))

    def check() -> None:
        classes = _classes(endpoint)
        live = {k: c for k, c in classes.items() if k.startswith("live/")}
        index = {k: c for k, c in classes.items() if not k.startswith("live/")}
        assert len(live) > 10 and set(live.values()) == {"INTELLIGENT_TIERING"}, live
        assert _head(endpoint, min(live))["StorageClass"] == "INTELLIGENT_TIERING"
        if index_mode == "dynamodb":
            assert index == {}
        else:
            assert {k.split("/")[0] for k in index} == {"manifests", "listing"}
            assert set(index.values()) == {"STANDARD"}, index

    check()
    status = saver.archive_thread("t")
    assert _classes(endpoint, "archive/") == {status.key: "GLACIER_IR"}
    saver.restore_thread("t")  # the objects written back take the saver's class too
    check()
    assert _sync(_glance(Api(make_saver(endpoint, index_mode), False), "t")) == before
    saver.close()


@pytest.mark.parametrize("bad", ["NOPE", "GLACIER", "DEEP_ARCHIVE", "REDUCED_REDUNDANCY", "intelligent_tiering", 5])
def test_an_unknown_live_storage_class_is_refused(endpoint, index_mode, bad) -> None:
    with pytest.raises(ConfigurationError, match="use STANDARD or INTELLIGENT_TIERING for live objects") as refused:
        make_saver(endpoint, index_mode, storage_class=bad)
    assert f"storage_class {bad!r} for the live objects of bucket 'checkpoints'" in str(refused.value)


@pytest.mark.parametrize(
    ("costly", "days"), [("STANDARD_IA", 30), ("ONEZONE_IA", 30), ("GLACIER_IR", 90)]
)
def test_a_live_class_that_bills_small_objects_as_128_kb_is_refused(endpoint, costly, days) -> None:
    """Live objects are a few KB and replaced within days: a class with a minimum billable
    size and duration would bill the benchmark's 20-turn thread (168 KB) as 12.8 MB."""
    with pytest.raises(ConfigurationError) as refused:
        make_saver(endpoint, storage_class=costly)
    message = str(refused.value)
    assert f"storage_class {costly!r}" in message and "bucket 'checkpoints'" in message
    assert f"at least 128 KB and for at least {days} days" in message
    assert "12.8 MB" in message and "archive_thread()" in message and "INTELLIGENT_TIERING" in message
    for fine in ("STANDARD", "INTELLIGENT_TIERING"):
        make_saver(endpoint, storage_class=fine).close()


def test_archive_to_an_unknown_class_is_refused_and_changes_nothing(endpoint, index_mode) -> None:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    grow_thread(saver, "t", 3)
    objects, listed = _classes(endpoint), list(saver.list(config("t")))
    saver.stats.reset()
    for call in (
        lambda: saver.archive_thread("t", storage_class="NOPE"),
        lambda: saver.archive_thread("t", storage_class="glacier_ir"),
        lambda: saver.archive_thread("t", storage_class=None),
        lambda: saver.archive_idle(timedelta(0), storage_class="NOPE"),
    ):
        with pytest.raises(ConfigurationError, match="storage_class must be one of"):
            call()
    with pytest.raises(ConfigurationError, match="storage_class must be one of"):
        _arun(saver, lambda: saver.aarchive_thread("t", storage_class="NOPE"))
    assert saver.stats.total_requests == 0
    assert _classes(endpoint) == objects
    assert list(make_saver(endpoint, index_mode).list(config("t"))) == listed
    assert _archived_classes(saver) == {"t": None}
    saver.close()


# -- 7. delete_thread of an archived thread ------------------------------------------------------------
@pytest.mark.parametrize("storage_class", ["GLACIER_IR", "DEEP_ARCHIVE"])
def test_delete_thread_removes_an_archived_thread(endpoint, index_mode, storage_class) -> None:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    ours = Api(saver, False)
    _sync(_start(ours, ours.graph(0), "t"))
    grow_thread(saver, "keep", 3)
    kept = list(saver.list(thread("keep")))
    kept_objects = _objects(endpoint, "live/keep/")
    saver.archive_thread("t", storage_class=storage_class)
    if storage_class == "GLACIER_IR":
        saver.get_tuple(thread("t"))  # its archive cached in this process

    make_saver(endpoint, index_mode).delete_thread("t")
    assert not _objects(endpoint, "archive/")
    assert not _objects(endpoint, "live/t/")
    assert _objects(endpoint, "live/keep/") == kept_objects
    for reader in (saver, make_saver(endpoint, index_mode)):
        assert reader.get_tuple(thread("t")) is None
        assert list(reader.list(thread("t"))) == []
        assert _builder(0).compile(checkpointer=reader).get_state(thread("t")).values == {}
        assert [t.thread_id for t in reader.list_threads()] == ["keep"]
    assert saver.restore_thread("t") == ArchiveStatus("t", "live")
    assert list(make_saver(endpoint, index_mode).list(thread("keep"))) == kept

    # The id is free for a new run, which reads like InMemorySaver's.
    ref = Api(InMemorySaver(), False)
    _sync(_start(ours, ours.graph(0), "t"))
    _sync(_start(ref, ref.graph(0), "t"))
    assert _normalized(_sync(_glance(Api(make_saver(endpoint, index_mode), False), "t", 0))) == _normalized(
        _sync(_glance(ref, "t", 0))
    )
    saver.close()


# -- 8. requests per call (deterministic: a fixed thread put directly) --------------------------------
def _costs(endpoint: str, index_mode: str, **kwargs: Any) -> dict[str, tuple[int, dict[str, int]]]:
    """Each call's (round trips, requests); ``kwargs``: the savers' (a prefix, encryption=)."""
    out: dict[str, tuple[int, dict[str, int]]] = {}

    def measure(name: str, saver: S3Saver, call: Callable[[], Any], raises: type | None = None) -> Any:
        saver.stats.reset()
        if raises is None:
            result = call()
        else:
            with pytest.raises(raises):
                call()
            result = None
        stats = saver.stats.snapshot()
        out[name] = (stats.round_trips, {f"{svc}:{op}": n for (svc, op), n in sorted(stats.requests.items())})
        return result

    saver = make_saver(endpoint, index_mode, **kwargs)
    saver.setup()
    for tid in ("t", "d"):
        last = grow_thread(saver, tid, 3)
        saver.put_writes(last, [("counter", 9), ("__interrupt__", "why")], "task-1")
    measure("archive_thread", saver, lambda: saver.archive_thread("t"))
    measure("archive_thread again", saver, lambda: saver.archive_thread("t"))
    cold = make_saver(endpoint, index_mode, **kwargs)  # another process: nothing cached
    found = measure("get_tuple cold", cold, lambda: cold.get_tuple(config("t")))
    assert found is not None and found.pending_writes
    measure("get_tuple warm", cold, lambda: cold.get_tuple(config("t")))
    measure("list warm", cold, lambda: list(cold.list(config("t"))))
    restorer = make_saver(endpoint, index_mode, **kwargs)
    measure("restore_thread", restorer, lambda: restorer.restore_thread("t"))
    measure("restore_thread of a live thread", restorer, lambda: restorer.restore_thread("t"))
    measure("archive_thread DEEP_ARCHIVE", saver, lambda: saver.archive_thread("d", storage_class="DEEP_ARCHIVE"))
    measure("get_tuple DEEP_ARCHIVE (refused)", cold, lambda: cold.get_tuple(config("d")), ThreadArchivedError)
    measure("restore_thread DEEP_ARCHIVE (requested)", restorer, lambda: restorer.restore_thread("d"))
    measure("restore_thread DEEP_ARCHIVE (done)", restorer, lambda: restorer.restore_thread("d"))
    for s in (saver, cold, restorer):
        s.close()
    return out


# (round trips, requests) on a thread of 3 checkpoints, the last with 2 pending writes.
ARCHIVE_COSTS = {
    "dynamodb": {
        # The thread's record; the archive's mark on it (before anything is read); its
        # items; the archive object; the switch (the mark must still be there); its
        # items again (by key, to delete) and then the record (a restore under way
        # keeps them); the live objects; the items (a transaction conditioned on the
        # record: a restore's mark stops it); beside the cleanup, the thread's activity
        # entry (``_index/activity``: archive_idle would find it stale), a delete
        # on the token the record names.
        "archive_thread": (9, {
            "dynamodb:delete_item": 1, "dynamodb:get_item": 2, "dynamodb:query": 2,
            "dynamodb:transact_write_items": 1, "dynamodb:update_item": 2, "s3:delete_objects": 1, "s3:put_object": 1,
        }),
        # Archived already: the record, and what is left of the live thread (nothing).
        "archive_thread again": (2, {"dynamodb:get_item": 1, "dynamodb:query": 1}),
        # The index read (the thread's record beside it says "archived"), the archive.
        # A new saver object: its first round trip also reads the table's owner (``_owner``)
        # and the prefix's index-mode marker (``_mode``).
        "get_tuple cold": (2, {"dynamodb:get_item": 2, "dynamodb:query": 1, "s3:get_object": 2}),
        "get_tuple warm": (1, {"dynamodb:get_item": 1, "dynamodb:query": 1}),
        "list warm": (1, {"dynamodb:get_item": 1, "dynamodb:query": 1}),
        # The record, the archive, what is left of the archive's cleanup, the restore's
        # mark, the objects (a new tag), the items (a transaction that needs the mark to
        # be this restore's), the switch, the record's note of the archive, its object;
        # the owner's record and the index-mode marker, in the first round trip of a new
        # saver object. The switch is a transaction with the thread's activity entry of
        # the day (archive_idle's clock starts anew), which the record names then: a
        # delete removes it.
        "restore_thread": (9, {
            "dynamodb:transact_write_items": 2, "dynamodb:get_item": 2, "dynamodb:query": 1,
            "dynamodb:update_item": 2, "s3:delete_objects": 1, "s3:get_object": 2, "s3:put_object": 5,
        }),
        "restore_thread of a live thread": (1, {"dynamodb:get_item": 1}),
        "archive_thread DEEP_ARCHIVE": (9, {
            "dynamodb:delete_item": 1, "dynamodb:get_item": 2, "dynamodb:query": 2,
            "dynamodb:transact_write_items": 1, "dynamodb:update_item": 2, "s3:delete_objects": 1, "s3:put_object": 1,
        }),
        "get_tuple DEEP_ARCHIVE (refused)": (2, {"dynamodb:get_item": 1, "dynamodb:query": 1, "s3:head_object": 1}),
        "restore_thread DEEP_ARCHIVE (requested)": (3, {
            "dynamodb:get_item": 1, "s3:head_object": 1, "s3:restore_object": 1,
        }),
        "restore_thread DEEP_ARCHIVE (done)": (10, {
            "dynamodb:transact_write_items": 2, "dynamodb:get_item": 1, "dynamodb:query": 1,
            "dynamodb:update_item": 2, "s3:delete_objects": 1, "s3:get_object": 1, "s3:head_object": 1, "s3:put_object": 5,
        }),
    },
    "manifest": {
        # The head (it carries every body: no object is read); the mark swap; the
        # archive; the switch swap (of exactly the head read); the live objects; the
        # graveyard cleared, and beside it the thread's activity entry.
        "archive_thread": (6, {"s3:delete_objects": 2, "s3:get_object": 1, "s3:put_object": 4}),
        "archive_thread again": (1, {"s3:get_object": 1}),
        # (A new saver object: its first round trip also reads the index-mode marker.)
        "get_tuple cold": (2, {"s3:get_object": 3}),
        "get_tuple warm": (1, {"s3:get_object": 1}),
        "list warm": (1, {"s3:get_object": 1}),
        # (The activity entry of the day: one more PUT, beside the last objects, which
        # the switch records in the head; the index-mode marker, in the first round
        # trip of a new saver object.)
        "restore_thread": (8, {"s3:delete_objects": 1, "s3:get_object": 5, "s3:put_object": 8}),
        "restore_thread of a live thread": (1, {"s3:get_object": 1}),
        "archive_thread DEEP_ARCHIVE": (6, {"s3:delete_objects": 2, "s3:get_object": 1, "s3:put_object": 4}),
        "get_tuple DEEP_ARCHIVE (refused)": (2, {"s3:get_object": 1, "s3:head_object": 1}),
        "restore_thread DEEP_ARCHIVE (requested)": (3, {"s3:get_object": 1, "s3:head_object": 1, "s3:restore_object": 1}),
        "restore_thread DEEP_ARCHIVE (done)": (9, {
            "s3:delete_objects": 1, "s3:get_object": 4, "s3:head_object": 1, "s3:put_object": 8,
        }),
    },
}


def test_archival_request_counts(endpoint, index_mode) -> None:
    costs = _costs(endpoint, index_mode)
    print(f"\n{index_mode}:\n" + "\n".join(f"  {k}: {v}" for k, v in costs.items()))
    assert costs["get_tuple cold"][0] == 2
    assert costs["get_tuple warm"][0] == 1
    assert costs["list warm"][0] == 1
    assert costs == ARCHIVE_COSTS[index_mode]
    for _, requests in costs.values():
        assert not [op for op in requests if "list_objects" in op or "scan" in op], requests


# -- 9. lifecycle calls refuse an archived thread ------------------------------------------------------
def test_prune_copy_and_delete_for_runs_refuse_an_archived_thread(endpoint, index_mode) -> None:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    stored = config("t")
    for step, run_id in enumerate(["r1", "r1", "r2", "r2"]):
        versions = {"n": str(step + 1)}
        stored = saver.put(stored, checkpoint({"n": step}, versions), {"run_id": run_id, "step": step}, versions)
        saver.put_writes(stored, [("n", step + 10)], f"task-{step}")
    before = list(saver.list(config("t")))
    status = saver.archive_thread("t")
    objects = _classes(endpoint)
    for call in (
        lambda: saver.prune(["t"]),
        lambda: saver.prune(["t"], keep_last=1),
        lambda: saver.delete_for_runs(["r2"]),
        lambda: _arun(saver, lambda: saver.aprune(["t"])),
    ):
        with pytest.raises(ThreadArchivedError) as info:
            call()
        assert (info.value.thread_id, info.value.key) == ("t", status.key)
        assert _classes(endpoint) == objects
    reader = make_saver(endpoint, index_mode)
    assert list(reader.list(config("t"))) == before
    assert _archived_classes(reader) == {"t": "GLACIER_IR"}
    # A copy is written from the archive: the source stays archived, the copy reads as it.
    saver.copy_thread("t", "t-copy")
    assert [_plain_tuple(t) for t in reader.list(config("t-copy"))] == [_plain_tuple(t) for t in before]
    assert _archived_classes(reader) == {"t": "GLACIER_IR", "t-copy": None}
    assert list(make_saver(endpoint, index_mode).list(config("t"))) == before
    # Restored, the thread takes them again.
    reader.restore_thread("t")
    reader.delete_for_runs(["r2"])
    assert [t.metadata["run_id"] for t in reader.list(config("t"))] == ["r1", "r1"]
    saver.close()
    reader.close()


def _plain_tuple(t) -> tuple:
    """A listed checkpoint without its thread id (a copy has the same of all else)."""
    return (t.checkpoint, t.metadata, t.pending_writes, t.config["configurable"]["checkpoint_id"])
