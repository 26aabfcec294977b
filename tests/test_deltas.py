"""Append-only lists stored as deltas (issue 24): linear storage, exact values.

A conversation's message list is stored as a keyframe and pieces; every read
must return exactly what the whole list would (InMemorySaver fed the same
graph is the reference), in both index modes, through edits, removals, forks
from old checkpoints, subgraphs, fresh processes and custom serializers, and
every operation that decides what a thread needs must follow the pieces.
"""

from __future__ import annotations

import base64
import math
import random
from typing import Annotated, Any, TypedDict

import boto3
import pytest
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from conftest import BUCKET, make_saver
from helpers import is_marker
from s3_saver._format.codec import CHECKPOINT_PIECES_FORMAT, PIECE_FORMAT, unpack
from s3_saver._format.pieces import MAX_PIECES, array_header, header, keep


class State(TypedDict):
    messages: Annotated[list, add_messages]


def text(seed: str, size: int = 1000) -> str:
    """Incompressible text of ``size`` characters."""
    return base64.b64encode(random.Random(seed).randbytes(size)).decode()[:size]


def _agent(state: State) -> dict[str, Any]:
    n = len(state["messages"])
    return {"messages": [AIMessage(id=f"ai-{n}", content=text(f"ai-{n}"))]}


def chat(checkpointer: Any) -> Any:
    builder = StateGraph(State)
    builder.add_node("agent", _agent)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder.compile(checkpointer=checkpointer)


def human(turn: int, size: int = 1000) -> dict[str, Any]:
    return {"messages": [HumanMessage(id=f"h-{turn}", content=text(f"h-{turn}", size))]}


def cfg(thread_id: str, **more: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, **more}}


def bucket_objects(endpoint: str) -> dict[str, int]:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    out: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        out.update((o["Key"], o["Size"]) for o in page.get("Contents", []) if not is_marker(o["Key"]))
    return out


def records(endpoint: str) -> list[dict[str, Any]]:
    """Every checkpoint and blob object's record in the bucket."""
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    out = []
    for key in bucket_objects(endpoint):
        if "/checkpoints/" in key or "/blobs/" in key:
            body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
            out.append(unpack(body, "s3_saver.checkpoint/1" if "/checkpoints/" in key else "s3_saver.blob/1", key))
    return out


def same_history(graph: Any, reference: Any, config: dict[str, Any]) -> None:
    got = [(s.values, s.next, s.metadata.get("step")) for s in graph.get_state_history(config)]
    want = [(s.values, s.next, s.metadata.get("step")) for s in reference.get_state_history(config)]
    assert got == want


def converse(endpoint: str, index_mode: str, thread_id: str, turns: int, size: int = 1000, **kw: Any) -> tuple[Any, Any, Any]:
    """A saver set up, and ``turns`` of a chat run on it and on InMemorySaver:
    (saver, its graph, the reference graph)."""
    saver = make_saver(endpoint, index_mode, **kw)
    saver.setup()
    graph, reference = chat(saver), chat(InMemorySaver())
    for turn in range(turns):
        graph.invoke(human(turn, size), cfg(thread_id))
        reference.invoke(human(turn, size), cfg(thread_id))
    return saver, graph, reference


# -- the pieces' arithmetic -------------------------------------------------------
def test_array_headers_are_rebuilt_byte_for_byte():
    import ormsgpack

    for n in (0, 1, 15, 16, 65535, 65536):
        data = ormsgpack.packb(list(range(n)))
        assert array_header(data) == (n, len(header(n)))
        assert data.startswith(header(n))
    assert array_header(b"\x81\xa1a\x01") is None  # a map, not a list
    assert array_header(b"\xdc\x00\x01\x01") is None  # a long header for a short list: not rebuilt


def test_chains_stay_short_and_bytes_linear():
    """The tiers: a version reads a few pieces, each element is written a few times."""
    for n in (50, 200, 800):
        sizes: list[int] = []
        written = longest = 0
        for _ in range(n):
            k = keep(sizes, 1000)
            piece = 1000 + sum(sizes[k:])
            sizes = [*sizes[:k], piece]
            written += piece
            longest = max(longest, len(sizes))
        assert longest <= 2 * math.log2(n)
        assert written <= 1000 * n * 0.8 * math.log2(n)
    # A chain at its limit that the tiers would not merge is stored whole.
    assert keep([1000] * (MAX_PIECES - 1) + [10**9], 1) == 0
    assert keep([1000] * 2, 1000) == 2  # too few to merge: the delta reads both


# -- a conversation on real servers ------------------------------------------------
def test_a_conversation_is_stored_linearly_and_read_back_exactly(endpoint, index_mode):
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    graph, reference = chat(saver), chat(InMemorySaver())
    config = cfg("conversation")
    sizes = {}
    for turn in range(40):
        graph.invoke(human(turn), config)
        reference.invoke(human(turn), config)
        if turn + 1 in (20, 40):
            sizes[turn + 1] = sum(bucket_objects(endpoint).values())
    # Whole lists would grow ~4x from 20 to 40 turns (quadratic); pieces ~2x.
    assert sizes[40] / sizes[20] < 2.6, sizes
    assert any(r["format"] == CHECKPOINT_PIECES_FORMAT for r in records(endpoint))
    fresh = chat(make_saver(endpoint, index_mode))
    assert fresh.get_state(config).values == reference.get_state(config).values
    same_history(fresh, reference, config)
    # The latest read: one wave for every piece (objects ≤ 2 log2(turns)).
    cold = make_saver(endpoint, index_mode)
    cold.get_tuple(config)
    fetched = sum(n for (_, op), n in cold.stats.requests.items() if op in ("GetObject", "BatchGetItem"))
    assert fetched <= 2 * math.log2(40)
    assert cold.stats.round_trips <= 2


def test_a_process_that_reads_then_writes_stores_deltas(endpoint, index_mode):
    """A Lambda: every turn a new process reads the thread, then writes to it."""
    config = cfg("lambda")
    reference = chat(InMemorySaver())
    for turn in range(24):
        saver = make_saver(endpoint, index_mode)
        if turn == 0:
            saver.setup()
        chat(saver).invoke(human(turn), config)
        reference.invoke(human(turn), config)
        saver.close()
    pieces = [r for r in records(endpoint) if r["format"] == CHECKPOINT_PIECES_FORMAT or r["format"] == PIECE_FORMAT]
    assert len(pieces) >= 20
    fresh = chat(make_saver(endpoint, index_mode))
    same_history(fresh, reference, config)


def test_edits_and_removals_store_the_list_whole_then_deltas_again(endpoint, index_mode):
    _, graph, reference = converse(endpoint, index_mode, "edits", 6)
    config = cfg("edits")
    for g in (graph, reference):
        # An edit of an early message (same id), then a removal, then appends.
        g.update_state(config, {"messages": [HumanMessage(id="h-1", content="edited " + text("edit"))]})
        g.update_state(config, {"messages": [RemoveMessage(id="ai-1")]})
    for turn in range(6, 10):
        graph.invoke(human(turn), config)
        reference.invoke(human(turn), config)
    same_history(chat(make_saver(endpoint, index_mode)), reference, config)
    assert graph.get_state(config).values["messages"][1].content.startswith("edited ")


def test_a_fork_from_an_old_checkpoint_reads_its_own_branch(endpoint, index_mode):
    """The delta's base is the parent, not the thread's newest checkpoint."""
    _, graph, reference = converse(endpoint, index_mode, "fork", 8)
    config = cfg("fork")
    ids = [s.config["configurable"]["checkpoint_id"] for s in graph.get_state_history(config)]
    ref_ids = [s.config["configurable"]["checkpoint_id"] for s in reference.get_state_history(config)]
    old, ref_old = ids[9], ref_ids[9]
    for turn in range(100, 104):
        # Each turn continues the fork (its newest checkpoint), not the main line.
        graph.invoke(human(turn), cfg("fork", checkpoint_id=old))
        reference.invoke(human(turn), cfg("fork", checkpoint_id=ref_old))
        old = graph.get_state(config).config["configurable"]["checkpoint_id"]
        ref_old = reference.get_state(config).config["configurable"]["checkpoint_id"]
    fresh = chat(make_saver(endpoint, index_mode))
    assert fresh.get_state(config).values == reference.get_state(config).values
    same_history(fresh, reference, config)


class _Inner(TypedDict):
    messages: Annotated[list, add_messages]


def _subgraph() -> Any:
    builder = StateGraph(_Inner)

    def inner(state: _Inner) -> dict[str, Any]:
        n = len(state["messages"])
        return {"messages": [AIMessage(id=f"inner-{n}", content=text(f"inner-{n}"))]}

    builder.add_node("inner", inner)
    builder.add_edge(START, "inner")
    builder.add_edge("inner", END)
    return builder.compile()


def test_subgraph_messages_are_stored_as_deltas_in_their_namespace(endpoint, index_mode):
    def outer(checkpointer: Any) -> Any:
        builder = StateGraph(State)
        builder.add_node("sub", _subgraph())
        builder.add_node("agent", _agent)
        builder.add_edge(START, "sub")
        builder.add_edge("sub", "agent")
        builder.add_edge("agent", END)
        return builder.compile(checkpointer=checkpointer)

    saver = make_saver(endpoint, index_mode)
    saver.setup()
    graph, reference = outer(saver), outer(InMemorySaver())
    config = cfg("subgraphs")
    for turn in range(8):
        graph.invoke(human(turn), config)
        reference.invoke(human(turn), config)
    fresh = outer(make_saver(endpoint, index_mode))
    assert fresh.get_state(config, subgraphs=True).values == reference.get_state(config, subgraphs=True).values
    same_history(fresh, reference, config)


class _Counting(JsonPlusSerializer):
    """A user's serializer that keeps the msgpack tag (its lists are split)."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        self.loads += 1
        return super().loads_typed(data)


class _Tagged(JsonPlusSerializer):
    """A user's serializer with a tag of its own: its values are stored whole."""

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        type_, data = super().dumps_typed(obj)
        return f"mine+{type_}", data[::-1]

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_, raw = data
        assert type_.startswith("mine+")
        return super().loads_typed((type_[5:], raw[::-1]))


@pytest.mark.parametrize("serde", [_Counting, _Tagged])
def test_a_custom_serializer_reads_back_what_it_wrote(endpoint, index_mode, serde):
    _, _, reference = converse(endpoint, index_mode, "serde", 10, serde=serde())
    config = cfg("serde")
    fresh_serde = serde()
    same_history(chat(make_saver(endpoint, index_mode, serde=fresh_serde)), reference, config)
    split = any(r["format"] == CHECKPOINT_PIECES_FORMAT for r in records(endpoint))
    assert split == (serde is _Counting)


# -- every operation that decides what a thread needs follows the pieces -----------
def _clean(saver: Any) -> None:
    """Nothing missing and nothing left over: what a thread needs is exactly what is stored."""
    report = saver.audit(older_than=__import__("datetime").timedelta(0))
    assert report.problems == [] and report.garbage == [], (report.problems, report.garbage)


def test_prune_keeps_every_piece_the_kept_versions_read(endpoint, index_mode):
    saver, _, reference = converse(endpoint, index_mode, "pruned", 24, 300)
    latest = reference.get_state(cfg("pruned")).values
    saver.prune(["pruned"], strategy="keep_latest")
    fresh = make_saver(endpoint, index_mode)
    assert chat(fresh).get_state(cfg("pruned")).values == latest
    _clean(fresh)
    # The thread goes on after its history went: deltas of the kept version.
    chat(saver).invoke(human(99, 300), cfg("pruned"))
    reference.invoke(human(99, 300), cfg("pruned"))
    assert chat(make_saver(endpoint, index_mode)).get_state(cfg("pruned")).values == reference.get_state(cfg("pruned")).values
    _clean(fresh)


def test_copy_export_archive_and_rebuild_carry_the_pieces(endpoint, index_mode):
    saver, _, reference = converse(endpoint, index_mode, "source", 16, 300)
    saver.copy_thread("source", "copy")
    imported = saver.import_thread(saver.export_thread("source"), thread_id="imported")
    saver.delete_thread("source")
    for thread_id in ("copy", "imported"):
        graph = chat(make_saver(endpoint, index_mode))
        got = [s.values for s in graph.get_state_history(cfg(thread_id))]
        assert got == [s.values for s in reference.get_state_history(cfg("source"))]
    assert imported == "imported"
    # A thread goes cold as one object and comes back whole.
    saver.archive_thread("copy")
    assert chat(make_saver(endpoint, index_mode)).get_state(cfg("copy")).values == reference.get_state(cfg("source")).values
    saver.restore_thread("copy")
    same = chat(make_saver(endpoint, index_mode))
    assert [s.values for s in same.get_state_history(cfg("copy"))] == [
        s.values for s in reference.get_state_history(cfg("source"))
    ]
    _clean(make_saver(endpoint, index_mode))
    # From the bucket alone: the index's chains rebuilt from the records.
    from test_rebuild import _lose_the_index

    _lose_the_index(endpoint, index_mode)
    admin = make_saver(endpoint, index_mode)
    admin.rebuild_index()
    rebuilt = chat(make_saver(endpoint, index_mode))
    assert [s.values for s in rebuilt.get_state_history(cfg("imported"))] == [
        s.values for s in reference.get_state_history(cfg("source"))
    ]
    saver.delete_thread("imported")
    saver.delete_thread("copy")
    assert not [k for k in bucket_objects(endpoint) if k.startswith("live/")]


def test_a_commit_whose_parent_was_pruned_meanwhile_is_written_again_whole(endpoint, index_mode):
    """The writer holds its parent (c2) and stores a delta reading c1's and c2's
    pieces; another process prunes c2 before the commit. The commit is refused
    (its parent left), and the checkpoint is written again whole under a tag of
    its own: it reads back exactly, and the first objects are taken back."""
    from helpers import checkpoint, config

    writer, other = make_saver(endpoint, index_mode), make_saver(endpoint, index_mode)
    writer.setup()
    messages = [text(f"m{i}", 2000) for i in range(3)]
    version = writer.get_next_version(None, None)
    c1 = writer.put(config("gone"), checkpoint({"messages": messages[:1]}, {"messages": version}), {"step": 1}, {"messages": version})
    v2 = writer.get_next_version(version, None)
    c2 = writer.put(c1, checkpoint({"messages": messages[:2]}, {"messages": v2}), {"step": 2}, {"messages": v2})
    # A newer branch from c1: the latest, so keep_latest keeps c1 and drops c2.
    other.get_tuple(c1)
    branch = other.put(c1, checkpoint({"messages": messages[:1] + ["other"]}, {"messages": v2}), {"step": 2}, {"messages": v2})
    other.prune(["gone"], strategy="keep_latest")
    assert other.get_tuple(c2) is None
    v3 = writer.get_next_version(v2, None)
    c3 = writer.put(c2, checkpoint({"messages": messages}, {"messages": v3}), {"step": 3}, {"messages": v3})
    fresh = make_saver(endpoint, index_mode)
    assert fresh.get_tuple(c3).checkpoint["channel_values"]["messages"] == messages
    assert fresh.get_tuple(branch).checkpoint["channel_values"]["messages"] == messages[:1] + ["other"]
    # One object of c3 is left: the one written again (a random tag), not the delta's.
    c3_id = c3["configurable"]["checkpoint_id"]
    (only,) = [k for k in bucket_objects(endpoint) if f"/checkpoints/{c3_id}" in k]
    assert len(only.rpartition("@")[2]) == 32, only
    _clean(fresh)


def test_list_deltas_false_stores_every_version_whole(endpoint, index_mode):
    _, _, reference = converse(endpoint, index_mode, "whole", 8, 300, list_deltas=False)
    assert not any(r["format"] in (CHECKPOINT_PIECES_FORMAT, PIECE_FORMAT) for r in records(endpoint))
    same_history(chat(make_saver(endpoint, index_mode)), reference, cfg("whole"))
    with pytest.raises(Exception, match="list_deltas"):
        make_saver(endpoint, index_mode, list_deltas="yes")


async def test_an_async_conversation_stores_deltas_and_reads_back(endpoint, index_mode):
    saver = make_saver(endpoint, index_mode)
    await saver.asetup()
    graph, reference = chat(saver), chat(InMemorySaver())
    for turn in range(10):
        await graph.ainvoke(human(turn, 500), cfg("async"))
        reference.invoke(human(turn, 500), cfg("async"))
    assert any(r["format"] == CHECKPOINT_PIECES_FORMAT for r in records(endpoint))
    fresh = chat(make_saver(endpoint, index_mode))
    got = [s.values async for s in fresh.aget_state_history(cfg("async"))]
    assert got == [s.values for s in reference.get_state_history(cfg("async"))]
    await saver.aclose()


def test_a_put_retried_by_a_fresh_process_keeps_the_form_committed_first(endpoint, index_mode):
    """c2 is committed as a delta and c3 is built on its pieces; the same put of
    c2 retried by a process that holds nothing (it would store the list whole)
    keeps the form committed first: c3, its copies and its rebuild read right."""
    from helpers import checkpoint, config
    from test_rebuild import _lose_the_index

    writer = make_saver(endpoint, index_mode)
    writer.setup()
    m = [text(f"m{i}", 1500) for i in range(3)]
    v1 = writer.get_next_version(None, None)
    c1 = writer.put(config("forms"), checkpoint({"messages": m[:1]}, {"messages": v1}), {"step": 1}, {"messages": v1})
    v2 = writer.get_next_version(v1, None)
    cp2 = checkpoint({"messages": m[:2]}, {"messages": v2})
    c2 = writer.put(c1, cp2, {"step": 2}, {"messages": v2})
    v3 = writer.get_next_version(v2, None)
    c3 = writer.put(c2, checkpoint({"messages": m}, {"messages": v3}), {"step": 3}, {"messages": v3})
    make_saver(endpoint, index_mode).put(c1, cp2, {"step": 2}, {"messages": v2})
    fresh = make_saver(endpoint, index_mode)
    assert fresh.get_tuple(c3).checkpoint["channel_values"]["messages"] == m
    assert [t.checkpoint["channel_values"]["messages"] for t in fresh.list(config("forms"))] == [m, m[:2], m[:1]]
    fresh.copy_thread("forms", "copied")
    assert fresh.get_tuple(config("copied")).checkpoint["channel_values"]["messages"] == m
    _clean(fresh)
    _lose_the_index(endpoint, index_mode)
    make_saver(endpoint, index_mode).rebuild_index()
    rebuilt = make_saver(endpoint, index_mode)
    assert [t.checkpoint["channel_values"]["messages"] for t in rebuilt.list(config("forms"))] == [m, m[:2], m[:1]]


def test_the_latest_read_keeps_its_round_trips(endpoint, index_mode):
    """Pieces held by checkpoints sealed out of the manifest's head are read in
    the second round trip, beside the newest checkpoint's own: the head no
    longer carries them (every write re-uploaded them; it did to make this read
    one GET), as the DynamoDB index reads them beside its values."""
    # 120 checkpoints: the manifest seals all but the newest.
    _, _, reference = converse(endpoint, index_mode, "rt", 40, 200)
    cold = make_saver(endpoint, index_mode)
    state = chat(cold).get_state(cfg("rt"))
    assert state.values == reference.get_state(cfg("rt")).values
    assert cold.stats.round_trips == 2
