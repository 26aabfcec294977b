"""The graph the fault scenarios run, and the child process that the kill -9 scenario kills.

A turn is one ``invoke`` of new input; every second turn stops at an ``interrupt``
and takes one more invoke, ``Command(resume=...)``. Values are plain lists and ints,
so a stored state compares with ``==`` to InMemorySaver's.

As a script (``python tests/fault_graph.py MODE ENDPOINT THREAD_ID TURNS``) it runs the
steps of ``TURNS`` turns on one thread with a saver on ENDPOINT and prints one JSON line
per invoke that returned (``{"step": i, "values": ...}``), flushed, until it is killed.
"""

from __future__ import annotations

import json
import operator
import sys
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

INTERRUPT = "__interrupt__"


class State(TypedDict, total=False):
    items: Annotated[list[str], operator.add]
    count: int


def plan(state: State) -> dict:
    n = state.get("count", 0) + 1
    return {"count": n, "items": [f"plan{n}"]}


def act(state: State) -> dict:
    return {"items": [f"act{state['count']}"]}


def ask(state: State) -> dict:
    answer = interrupt(f"q{state['count']}")
    return {"items": [f"ans:{answer}"]}


def build(checkpointer: Any, *, interrupts: bool = True):
    builder = StateGraph(State).add_node(plan).add_node(act).add_edge(START, "plan").add_edge("plan", "act")
    if interrupts:
        builder.add_node(ask).add_edge("ask", END)
        builder.add_conditional_edges("act", lambda s: "ask" if s["count"] % 2 == 0 else END)
    else:
        builder.add_edge("act", END)
    return builder.compile(checkpointer=checkpointer)


def step_input(turn: int) -> dict:
    return {"items": [f"in{turn}"]}


def resume_input(turn: int) -> Command:
    return Command(resume=f"r{turn}")


def plain(result: Any) -> dict:
    """An invoke's result without its interrupts (their ids differ between runs) + their values."""
    out = {k: v for k, v in result.items() if k != INTERRUPT}
    if result.get(INTERRUPT):
        out[INTERRUPT] = [i.value for i in result[INTERRUPT]]
    return out


def run_steps(graph: Any, thread_id: str, turns: int, on_result=None):
    """Sync: the steps of ``turns`` turns; yields nothing, calls ``on_result(step, result)``."""
    cfg = {"configurable": {"thread_id": thread_id}}
    step = 0
    for turn in range(turns):
        result = graph.invoke(step_input(turn), cfg)
        on_result(step, result)
        step += 1
        if result.get(INTERRUPT):
            result = graph.invoke(resume_input(turn), cfg)
            on_result(step, result)
            step += 1


def _main(mode: str, endpoint: str, thread_id: str, turns: int) -> None:
    from botocore.config import Config

    from s3_saver import S3Saver

    saver = S3Saver(
        "checkpoints",
        table="checkpoints-index" if mode == "dynamodb" else None,
        endpoint_url=endpoint,
        region_name="us-east-1",
        client_config=Config(read_timeout=1, connect_timeout=1),
    )
    graph = build(saver)

    def report(step: int, result: Any) -> None:
        print(json.dumps({"step": step, "values": plain(result)}), flush=True)

    run_steps(graph, thread_id, turns, report)
    print(json.dumps({"done": True}), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
