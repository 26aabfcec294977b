"""get_delta_channel_history: same answers as the base class's walk, in a bounded number of round trips."""

from __future__ import annotations

import os
from typing import Annotated, TypedDict

import pytest
from conftest import make_saver
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

from helpers import concat


class State(TypedDict):
    log: Annotated[list, DeltaChannel(concat, snapshot_frequency=4)]
    turn: int


def _graph(saver):
    def step_a(state: State) -> dict:
        return {"log": [f"a{state.get('turn', 0)}"]}

    def step_b(state: State) -> dict:
        return {"log": [f"b{state.get('turn', 0)}"], "turn": state.get("turn", 0) + 1}

    builder = StateGraph(State)
    builder.add_node("a", step_a)
    builder.add_node("b", step_b)
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    return builder.compile(checkpointer=saver)


def test_delta_channel_state_matches_in_memory_and_base_walk(saver, index_mode) -> None:
    config = {"configurable": {"thread_id": "delta"}}
    ours, reference = _graph(saver), _graph(InMemorySaver())
    for turn in range(9):
        ours.invoke({"log": [f"in{turn}"]}, config)
        reference.invoke({"log": [f"in{turn}"]}, config)
    assert ours.get_state(config).values == reference.get_state(config).values
    history = list(ours.get_state_history(config))
    assert [s.values for s in history] == [s.values for s in reference.get_state_history(config)]

    for snap in history[::3]:
        saver.stats.reset()
        fast = saver.get_delta_channel_history(config=snap.config, channels=["log", "turn"])
        fast_cost = saver.stats.snapshot()
        saver.stats.reset()
        walked = BaseCheckpointSaver.get_delta_channel_history(saver, config=snap.config, channels=["log", "turn"])
        walk_cost = saver.stats.snapshot()
        assert fast == walked
        # Manifest: one index read (the head) and one wave, whatever the depth of
        # the walk; its head carries only the newest checkpoint's writes whole,
        # the others are GETs in that wave. DynamoDB: the chain's link items, one
        # wave of its checkpoints' writes, one of the seeds.
        assert fast_cost.round_trips <= (2 if index_mode == "manifest" else 3), fast_cost
        assert walk_cost.round_trips >= fast_cost.round_trips


async def test_delta_history_async_and_empty_cases(saver) -> None:
    config = {"configurable": {"thread_id": "delta-async"}}
    graph = _graph(saver)
    for turn in range(3):
        await graph.ainvoke({"log": [f"in{turn}"]}, config)
    latest = await saver.aget_delta_channel_history(config=config, channels=["log"])
    walked = await BaseCheckpointSaver.aget_delta_channel_history(saver, config=config, channels=["log"])
    assert latest == walked
    assert await saver.aget_delta_channel_history(config=config, channels=[]) == {}
    missing = {"configurable": {"thread_id": "nobody"}}
    assert await saver.aget_delta_channel_history(config=missing, channels=["log"]) == {"log": {"writes": []}}
    await saver.aclose()


def test_expired_ancestors_end_the_walk_as_in_the_base_walk(endpoint, index_mode) -> None:
    """With ttl, an ancestor past its expiry is not served, even before DynamoDB deletes it."""
    import time
    from datetime import timedelta

    saver = make_saver(endpoint, index_mode, ttl=timedelta(days=30))
    saver.setup()
    clock = {"now": int(time.time())}
    saver._ctx.now = lambda: clock["now"]
    graph, config = _graph(saver), {"configurable": {"thread_id": "delta-ttl"}}
    for turn in range(8):
        if turn == 7:
            clock["now"] += 20 * 86_400  # later checkpoints store every value again
        graph.invoke({"log": [f"in{turn}"]}, config)
    latest = graph.get_state(config).config
    whole = saver.get_delta_channel_history(config=latest, channels=["log", "turn"])
    clock["now"] += 15 * 86_400  # the first turns' items are now past their expiry
    fast = saver.get_delta_channel_history(config=latest, channels=["log", "turn"])
    walked = BaseCheckpointSaver.get_delta_channel_history(saver, config=latest, channels=["log", "turn"])
    assert fast == walked != whole
    clock["now"] += 40 * 86_400  # now the target itself
    assert saver.get_delta_channel_history(config=latest, channels=["log"]) == {"log": {"writes": []}}
    saver.close()


def _chain(saver, thread_id: str, depth: int, size: int, counters: bool = True) -> list[dict]:
    """``depth + 1`` checkpoints as LangGraph writes a DeltaChannel ("log") that
    snapshots only in the first: every later one stores just "turn", counts the
    supersteps since that snapshot in its metadata (``counters``), and has a
    task's write of ``size`` random (incompressible) bytes on "log". Returns
    their configs, oldest first."""
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    configs = []
    for i in range(depth + 1):
        checkpoint = empty_checkpoint()
        checkpoint["id"] = str(uuid6(clock_seq=i))
        checkpoint["channel_values"] = {"turn": i, **({"log": ["seed"]} if i == 0 else {})}
        checkpoint["channel_versions"] = {"log": i + 1, "turn": i + 1}
        metadata = {"source": "loop", "step": i, "parents": {}}
        if i and counters:
            metadata["counters_since_delta_snapshot"] = {"log": (i, i)}
        config = saver.put(config, checkpoint, metadata, {"turn": i + 1, **({"log": 1} if i == 0 else {})})
        configs.append(config)
        if i < depth:
            saver.put_writes(config, [("log", os.urandom(size))], task_id=f"task-{i}", task_path="~")
    return configs


@pytest.mark.slow  # make test-all and CI (make test-slow): a cost invariant over deep histories
def test_delta_history_round_trips_do_not_grow_with_depth_or_bytes(saver, endpoint, index_mode) -> None:
    """Chains of 300 KB ancestors, read by a cold process each (no cached segments)."""
    deep = _chain(saver, "deep", 100, 300_000)
    short = _chain(saver, "short", 10, 300_000)
    walks = {"sealed 10": deep[10], "sealed 40": deep[40], "newest 100": deep[100], "newest 10": short[10]}
    costs = {}
    for name, config in walks.items():
        reader = make_saver(endpoint, index_mode)
        fast = reader.get_delta_channel_history(config=config, channels=["log", "turn"])
        cost = reader.stats.snapshot()
        costs[name] = cost.round_trips
        assert fast == BaseCheckpointSaver.get_delta_channel_history(reader, config=config, channels=["log", "turn"])
        depth = int(name.split()[1])
        assert len(fast["log"]["writes"]) == depth and fast["log"]["seed"] == ["seed"]
        if index_mode == "manifest":
            # The head, at most two segments, each ancestor's writes object and the
            # checkpoint objects of the two seeds ("turn" in the parent, "log" in
            # the first): none of the other ancestors' checkpoint objects.
            assert cost.total_requests <= 1 + 2 + depth + 2, (name, cost)
        reader.close()
    if index_mode == "manifest":
        # The head, one wave of segments (the target's own and the one before
        # it, or as many as the metadata's superstep count says the walk needs),
        # one wave of writes objects. A chain inside the head needs no segments.
        assert costs == {**dict.fromkeys(walks, 3), "newest 10": 2}
    else:
        # The chain's link items (no bodies: a 1 MB Query page holds ~500), one
        # wave of Queries for its checkpoints' writes, one for the seeds. Before
        # the links, a Query over the items themselves took 4, 14, 34 and 4.
        assert costs == dict.fromkeys(walks, 3)


def test_delta_history_without_a_depth_hint(saver, endpoint, index_mode) -> None:
    """No counters in the metadata: still the base walk's answer."""
    newest = _chain(saver, "unhinted", 100, 1_000, counters=False)[-1]
    reader = make_saver(endpoint, index_mode)
    fast = reader.get_delta_channel_history(config=newest, channels=["log", "nowhere"])
    cost = reader.stats.snapshot()
    assert fast == BaseCheckpointSaver.get_delta_channel_history(reader, config=newest, channels=["log", "nowhere"])
    assert fast["nowhere"] == {"writes": []} and len(fast["log"]["writes"]) == 100
    if index_mode == "manifest":
        # The head, its two segments in waves of one and (asking for two) one, which
        # carry the sealed checkpoints' bodies; then one wave of the objects of the
        # checkpoints still in the head, whose bodies it no longer carries (issue 33:
        # every write re-uploaded them, 40 KB a write): 34 of them. The first wave also
        # carries the prefix's index-mode marker (a new process reads it once).
        assert cost.round_trips == 4, cost
        assert cost.requests == {("s3", "get_object"): 38}, cost
    reader.close()


class LongState(TypedDict):
    log: Annotated[list, DeltaChannel(concat, snapshot_frequency=1000)]  # never snapshots here
    turn: int


def test_threads_written_before_link_items_keep_their_delta_history(dynamo_saver, endpoint) -> None:
    """A thread of an older version (no link items) that goes on under this one: the
    walk follows the new checkpoints' links, then the old items."""
    import boto3

    from conftest import TABLE

    def graph(saver):
        builder = StateGraph(LongState)
        builder.add_node("a", lambda state: {"log": [f"a{state.get('turn', 0)}"], "turn": state.get("turn", 0) + 1})
        builder.add_edge(START, "a")
        return builder.compile(checkpointer=saver)

    config = {"configurable": {"thread_id": "upgraded"}}
    ref = graph(InMemorySaver())
    for turn in range(3):
        graph(dynamo_saver).invoke({"log": [f"in{turn}"]}, config)
        ref.invoke({"log": [f"in{turn}"]}, config)
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    links = [i for i in ddb.scan(TableName=TABLE)["Items"] if i["sk"]["S"].startswith(" link!")]
    for item in links:  # as an older version left the thread
        ddb.delete_item(TableName=TABLE, Key={"pk": item["pk"], "sk": item["sk"]})
    assert links
    upgraded = make_saver(endpoint, "dynamodb")
    graph(upgraded).invoke({"log": ["in3"]}, config)
    ref.invoke({"log": ["in3"]}, config)
    reader = make_saver(endpoint, "dynamodb")
    assert graph(reader).get_state(config).values == ref.get_state(config).values
    assert len(ref.get_state(config).values["log"]) == 8
    upgraded.close()
    reader.close()
