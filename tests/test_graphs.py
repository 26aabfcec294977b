"""Real LangGraph graphs on S3Saver, compared with InMemorySaver running the same steps.

Every scenario runs on ``invoke`` (sync, no event loop) and on ``ainvoke`` (its own event
loop, like a Lambda async handler), with durability ``sync``, ``async`` and ``exit``. A
scenario records what a user sees (invoke results, ``get_state``, ``get_state_history``,
``update_state`` configs) into a transcript; the S3Saver transcript must equal
InMemorySaver's. Checkpoint ids, task ids and timestamps legitimately differ between two
runs, so ids become labels in order of first appearance (that keeps parent links and
"which checkpoint is this" comparable) and namespaces lose their task-id suffix.
"""

from __future__ import annotations

import asyncio
import operator
import re
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, Interrupt, StateSnapshot, interrupt

from conftest import make_saver
from s3_saver import S3Saver

MODES = [pytest.param(m, d, id=f"{m}-{d}") for m in ("sync", "async") for d in ("sync", "async", "exit")]


# -- graphs --------------------------------------------------------------------------------
class Loop(TypedDict, total=False):
    items: Annotated[list[str], operator.add]
    messages: Annotated[list[BaseMessage], add_messages]
    count: int


def plan(state: Loop) -> dict:
    n = state.get("count", 0) + 1
    return {"count": n, "items": [f"plan{n}"]}


def act(state: Loop) -> dict:
    n = state["count"]
    return {"items": [f"act{n}"], "messages": [AIMessage(f"step {n}", id=f"ai-{n}")]}


def loop_builder() -> StateGraph:
    """plan -> act, back to plan until count is a multiple of 3: three rounds per turn."""
    return (
        StateGraph(Loop)
        .add_node(plan)
        .add_node(act)
        .add_edge(START, "plan")
        .add_edge("plan", "act")
        .add_conditional_edges("act", lambda s: END if s["count"] % 3 == 0 else "plan")
    )


class Items(TypedDict):
    items: Annotated[list[str], operator.add]


def draft(state: Items) -> dict:
    return {"items": ["draft"]}


def review(state: Items) -> dict:
    first = interrupt({"question": "approve?", "seen": list(state["items"])})
    second = interrupt("comment?")
    return {"items": [f"review:{first}:{second}"]}


def publish(state: Items) -> dict:
    return {"items": ["published"]}


def review_builder() -> StateGraph:
    """draft -> review (two interrupts in one node) -> publish."""
    return (
        StateGraph(Items)
        .add_node(draft)
        .add_node(review)
        .add_node(publish)
        .add_edge(START, "draft")
        .add_edge("draft", "review")
        .add_edge("review", "publish")
        .add_edge("publish", END)
    )


def child_ask(state: Items) -> dict:
    return {"items": [f"child:{interrupt('child?')}"]}


def nested_builder() -> StateGraph:
    """before -> child (a subgraph compiled without a checkpointer: it inherits) -> after."""
    child = (
        StateGraph(Items)
        .add_node("c1", lambda s: {"items": ["c1"]})
        .add_node("ask", child_ask)
        .add_edge(START, "c1")
        .add_edge("c1", "ask")
        .compile()
    )
    return (
        StateGraph(Items)
        .add_node("before", lambda s: {"items": ["before"]})
        .add_node("child", child)
        .add_node("after", lambda s: {"items": ["after"]})
        .add_edge(START, "before")
        .add_edge("before", "child")
        .add_edge("child", "after")
    )


# -- running and normalizing ---------------------------------------------------------------
class Runner:
    """One checkpointer driven through sync or async graph methods; records a transcript."""

    def __init__(self, checkpointer: Any, mode: str, durability: str) -> None:
        self.cp, self.mode, self.durability = checkpointer, mode, durability
        self.out: list[Any] = []
        self._labels: dict[str, int] = {}

    @property
    def aio(self) -> bool:
        return self.mode == "async"

    def compile(self, builder: StateGraph) -> Any:
        return builder.compile(checkpointer=self.cp)

    async def invoke(self, graph: Any, inp: Any, config: dict) -> Any:
        if self.aio:
            result = await graph.ainvoke(inp, config, durability=self.durability)
        else:
            result = graph.invoke(inp, config, durability=self.durability)
        self.out.append(("invoke", self.norm(result)))
        return result

    async def state(self, graph: Any, config: dict, subgraphs: bool = False) -> StateSnapshot:
        if self.aio:
            snap = await graph.aget_state(config, subgraphs=subgraphs)
        else:
            snap = graph.get_state(config, subgraphs=subgraphs)
        self.out.append(("state", self.norm(snap)))
        return snap

    async def history(self, graph: Any, config: dict, **kwargs: Any) -> list[StateSnapshot]:
        if self.aio:
            snaps = [s async for s in graph.aget_state_history(config, **kwargs)]
        else:
            snaps = list(graph.get_state_history(config, **kwargs))
        self.out.append(("history", [self.norm(s) for s in snaps]))
        return snaps

    async def update(self, graph: Any, config: dict, values: Any, as_node: str | None = None) -> dict:
        if self.aio:
            new = await graph.aupdate_state(config, values, as_node=as_node)
        else:
            new = graph.update_state(config, values, as_node=as_node)
        self.out.append(("update", self.cfg(new)))
        return new

    def label(self, checkpoint_id: str | None) -> int | None:
        return None if checkpoint_id is None else self._labels.setdefault(checkpoint_id, len(self._labels))

    def cfg(self, config: dict | None) -> Any:
        if not config:
            return None
        conf = config["configurable"]
        ns = re.sub(r":[^|]*", "", conf.get("checkpoint_ns", ""))  # "child:<task id>" -> "child"
        return (conf["thread_id"], ns, self.label(conf.get("checkpoint_id")))

    def norm(self, x: Any) -> Any:
        if isinstance(x, StateSnapshot):
            md = x.metadata or {}
            return {
                "values": self.norm(x.values),
                "next": x.next,
                "config": self.cfg(x.config),
                "parent": self.cfg(x.parent_config),
                "source": md.get("source"),
                "step": md.get("step"),
                "parents": {re.sub(r":[^|]*", "", k): self.label(v) for k, v in md.get("parents", {}).items()},
                "has_created_at": bool(x.created_at),
                "interrupts": self.norm(x.interrupts),
                "tasks": [
                    {
                        "name": t.name,
                        "path": t.path[:2],
                        "error": repr(t.error),
                        "interrupts": self.norm(t.interrupts),
                        "state": self.norm(t.state) if isinstance(t.state, StateSnapshot) else self.cfg(t.state),
                        "result": self.norm(t.result),
                    }
                    for t in x.tasks
                ],
            }
        if isinstance(x, Interrupt):  # its id hashes the task id: compare the value only
            return ("interrupt", self.norm(x.value))
        if isinstance(x, BaseMessage):
            return (x.type, x.content, x.id)
        if isinstance(x, dict):
            return {k: self.norm(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [self.norm(v) for v in x]
        return x


Scenario = Callable[[Runner], Coroutine[Any, Any, Any]]


def drive_sync(coro: Coroutine) -> Any:
    """Run a coroutine that never suspends (sync mode: every Runner call is a plain sync call)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise AssertionError("a sync-mode scenario awaited something asynchronous")


def execute(r: Runner, scenario: Scenario) -> list[Any]:
    """Run a scenario with the runner's driver; async runs get a fresh loop and close its clients."""
    if not r.aio:
        drive_sync(scenario(r))
        return r.out

    async def main() -> None:
        try:
            await scenario(r)
        finally:
            if isinstance(r.cp, S3Saver):
                await r.cp.aclose()

    asyncio.run(main())
    return r.out


def s3_saver(endpoint: str, index_mode: str) -> S3Saver:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    return saver


def thread(tid: str, **extra: Any) -> dict:
    return {"configurable": {"thread_id": tid, **extra}}


# -- scenarios -------------------------------------------------------------------------------
async def reducers(r: Runner) -> None:
    g, cfg = r.compile(loop_builder()), thread("reducers")
    await r.invoke(g, {"items": ["in"], "messages": [HumanMessage("hi", id="h1")]}, cfg)
    # Same message id again: add_messages replaces it instead of appending.
    await r.invoke(g, {"items": ["in2"], "messages": [HumanMessage("hi, edited", id="h1")]}, cfg)
    final = await r.state(g, cfg)
    assert final.values["count"] == 6 and final.values["items"][-1] == "act6"
    assert [m.id for m in final.values["messages"]] == ["h1", *(f"ai-{n}" for n in range(1, 7))]
    await r.history(g, cfg)


async def interrupt_resume(r: Runner) -> None:
    g, cfg = r.compile(review_builder()), thread("review")
    first = await r.invoke(g, {"items": ["in"]}, cfg)
    assert first["__interrupt__"][0].value["question"] == "approve?"
    await r.state(g, cfg)
    await r.invoke(g, Command(resume="yes"), cfg)
    await r.state(g, cfg)
    done = await r.invoke(g, Command(resume="lgtm"), cfg)
    assert done == {"items": ["in", "draft", "review:yes:lgtm", "published"]}
    await r.state(g, cfg)
    await r.history(g, cfg)


async def subgraph(r: Runner) -> None:
    g, cfg = r.compile(nested_builder()), thread("nested")
    await r.invoke(g, {"items": ["in"]}, cfg)
    snap = await r.state(g, cfg, subgraphs=True)
    child = snap.tasks[0].state
    assert isinstance(child, StateSnapshot) and child.next == ("ask",)
    ns = child.config["configurable"]["checkpoint_ns"]
    assert ns.startswith("child:")
    await r.history(g, thread("nested", checkpoint_ns=ns))
    await r.invoke(g, Command(resume="ok"), cfg)
    final = await r.state(g, cfg, subgraphs=True)
    assert final.values["items"] == ["in", "before", "in", "before", "c1", "child:ok", "after"]
    await r.history(g, cfg)


async def fork(r: Runner) -> None:
    g, cfg = r.compile(loop_builder()), thread("fork")
    await r.invoke(g, {"items": ["in"]}, cfg)
    history = await r.history(g, cfg)
    # The first "plan done, act next" checkpoint (under "exit" only the final one exists).
    old = next((s for s in reversed(history) if s.next == ("act",)), history[-1])
    await r.invoke(g, None, old.config)  # replay from there: a second branch
    forked = await r.update(g, old.config, {"items": ["patched"], "count": 10}, as_node="plan")
    await r.state(g, forked)
    await r.invoke(g, None, forked)  # act10 -> plan11 -> act11 -> plan12 -> act12
    final = await r.state(g, cfg)
    assert final.values["count"] == 12 and "patched" in final.values["items"]
    await r.history(g, cfg)


async def history(r: Runner) -> None:
    g, cfg = r.compile(review_builder()), thread("history")
    await r.invoke(g, {"items": ["in"]}, cfg)
    await r.invoke(g, Command(resume="yes"), cfg)
    full = await r.history(g, cfg)
    assert full[0].tasks[0].interrupts and full[0].interrupts
    await r.history(g, cfg, limit=2)
    await r.history(g, cfg, before=full[0].config)
    await r.history(g, cfg, before=full[-1].config)
    await r.history(g, cfg, filter={"source": "loop"})
    await r.history(g, cfg, filter={"step": 1}, limit=1)
    await r.history(g, cfg, filter={"source": "nope"})
    await r.state(g, full[-1].config)  # an old checkpoint by id
    await r.invoke(g, Command(resume="lgtm"), cfg)
    await r.history(g, cfg, limit=3)


@pytest.mark.parametrize("mode,durability", MODES)
@pytest.mark.parametrize("scenario", [reducers, interrupt_resume, subgraph, fork, history], ids=lambda f: f.__name__)
def test_graph_matches_in_memory(
    endpoint: str, index_mode: str, scenario: Scenario, mode: str, durability: str
) -> None:
    expected = execute(Runner(InMemorySaver(), mode, durability), scenario)
    saver = s3_saver(endpoint, index_mode)
    try:
        got = execute(Runner(saver, mode, durability), scenario)
    finally:
        saver.close()
    assert got == expected


# -- one saver, two drivers; and a cold start -------------------------------------------------
@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_one_saver_serves_invoke_then_ainvoke(endpoint: str, index_mode: str, durability: str) -> None:
    """invoke, then ainvoke, then invoke again on the same threads with the same saver object."""

    async def turn1(r: Runner) -> None:
        await r.invoke(r.loop, {"items": ["t1"], "messages": [HumanMessage("one", id="h1")]}, thread("loop"))
        await r.invoke(r.review, {"items": ["in"]}, thread("review"))

    async def turn2(r: Runner) -> None:
        await r.invoke(r.loop, {"items": ["t2"], "messages": [HumanMessage("two", id="h2")]}, thread("loop"))
        await r.invoke(r.review, Command(resume="yes"), thread("review"))
        await r.history(r.loop, thread("loop"))

    async def turn3(r: Runner) -> None:
        await r.invoke(r.loop, {"items": ["t3"]}, thread("loop"))
        await r.invoke(r.review, Command(resume="lgtm"), thread("review"))
        await r.history(r.loop, thread("loop"))
        await r.history(r.review, thread("review"))

    def run(cp: Any) -> list[Any]:
        r = Runner(cp, "sync", durability)
        r.loop, r.review = r.compile(loop_builder()), r.compile(review_builder())
        execute(r, turn1)
        r.mode = "async"
        execute(r, turn2)
        r.mode = "sync"
        execute(r, turn3)
        r.mode = "async"  # a second event loop: the saver opens fresh async clients
        return execute(r, lambda r: r.state(r.review, thread("review")))

    saver = s3_saver(endpoint, index_mode)
    try:
        got = run(saver)
    finally:
        saver.close()
    assert got == run(InMemorySaver())
    assert got[-1][1]["values"]["items"][-1] == "published"


@pytest.mark.parametrize("mode,durability", MODES)
def test_fresh_instance_continues_thread(endpoint: str, index_mode: str, mode: str, durability: str) -> None:
    """Lambda-style: each step is a new S3Saver (empty caches, new clients) on the same thread."""

    async def start(r: Runner) -> None:
        await r.invoke(r.compile(nested_builder()), {"items": ["in"]}, thread("cold"))
        await r.invoke(r.compile(review_builder()), {"items": ["in"]}, thread("cold-review"))

    async def resume_child(r: Runner) -> None:
        g = r.compile(nested_builder())
        await r.state(g, thread("cold"), subgraphs=True)
        await r.invoke(g, Command(resume="ok"), thread("cold"))
        await r.history(g, thread("cold"))

    async def resume_review(r: Runner) -> None:
        g = r.compile(review_builder())
        await r.invoke(g, Command(resume="yes"), thread("cold-review"))
        await r.invoke(g, Command(resume="lgtm"), thread("cold-review"))
        await r.history(g, thread("cold-review"))

    def run(new_checkpointer: Callable[[], Any]) -> list[Any]:
        r = Runner(None, mode, durability)
        for step in (start, resume_child, resume_review):
            r.cp = new_checkpointer()
            try:
                execute(r, step)
            finally:
                if isinstance(r.cp, S3Saver):
                    r.cp.close()
        return r.out

    s3_saver(endpoint, index_mode).close()  # setup once, as a deploy step would; the "Lambdas" never call it
    got = run(lambda: make_saver(endpoint, index_mode))
    memory = InMemorySaver()
    assert got == run(lambda: memory)
    assert got[-2][1]["items"][-1] == "published"
