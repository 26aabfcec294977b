"""get_delta_channel_history: same answers as the base class's walk, in a bounded number of round trips."""

from __future__ import annotations

from typing import Annotated, TypedDict

from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph


def _concat(state: list, writes: list) -> list:
    out = list(state)
    for w in writes:
        out.extend(w)
    return out


class State(TypedDict):
    log: Annotated[list, DeltaChannel(_concat, snapshot_frequency=4)]
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
        # One index read (a Query range, or the manifest's head) and one wave,
        # whatever the depth of the walk. The manifest's head carries only the
        # newest checkpoint's writes whole: the others are GETs in that wave.
        assert fast_cost.round_trips <= 2, fast_cost
        if index_mode == "dynamodb":
            assert fast_cost.total_requests <= 2, fast_cost
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

    from conftest import make_saver

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
