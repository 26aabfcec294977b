"""The deterministic agent workload (no LLM) and its phases, sync and async.

The graph: ``agent -> tools -> agent`` per turn, with ``messages``
(add_messages), a small dict channel ``scratch``, a ``counter`` (summed), a
``turn`` number, and ``doc``, a ~20 KB text that changes only every 5th turn.
One turn in five interrupts in ``tools`` and is resumed with
``Command(resume=...)``. Every message has a fixed id, so two savers running
the same workload must produce identical states.

Each phase returns a JSON-able *fingerprint* (values, metadata, shape; never
checkpoint ids or timestamps) that the runner compares with InMemorySaver's.
"""

from __future__ import annotations

import hashlib
import itertools
import operator
import random
import time
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt

INTERRUPT_EVERY = 5
DOC_EVERY = 5
DOC_BYTES = 20_000
# Message text of a plausible size, prose-like (see make_text), so the messages
# channel compresses about as real conversations do, not like a template.
QUESTION_CHARS = 120
TOOL_RESULT_CHARS = 600
ANSWER_CHARS = 400

# Pseudo-words with a Zipf-like frequency: the doc compresses about as well as
# English prose (zlib ~0.34 of its size), not like a repeated phrase would, so
# a saver that compresses is neither flattered nor penalised.
_SYLLABLES = ("ka", "lo", "mi", "ter", "sen", "pra", "dis", "con", "ex", "ing", "tion", "al", "re", "un", "ble",
              "ous", "ment", "ly", "er", "ed", "in", "at", "or", "an", "est", "ic", "ure", "ive", "po", "gra",
              "vel", "tum", "sho", "bri", "que", "nd")


def _vocabulary() -> tuple[list[str], list[float]]:
    rng = random.Random(1234)
    words = sorted({"".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(8000)})
    rng.shuffle(words)
    return words, list(itertools.accumulate(1 / (i + 1) ** 0.8 for i in range(len(words))))


_VOCAB, _CUM_WEIGHTS = _vocabulary()


def make_text(seed: int | str, size: int) -> str:
    """About ``size`` characters of deterministic prose-like text."""
    rng = random.Random(seed)
    words: list[str] = []
    total = 0
    while total < size:
        batch = rng.choices(_VOCAB, cum_weights=_CUM_WEIGHTS, k=64)
        words += batch
        total += sum(len(w) + 1 for w in batch)
    return " ".join(words)[:size]


def make_doc(version: int) -> str:
    return f"doc v{version}: " + make_text(version, DOC_BYTES)


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    scratch: dict
    counter: Annotated[int, operator.add]
    turn: int
    doc: str


def agent(state: State) -> dict[str, Any]:
    turn = state["turn"]
    last = state["messages"][-1]
    if isinstance(last, HumanMessage):
        call = {"name": "lookup", "args": {"turn": turn, "query": last.content[:80]}, "id": f"call-{turn}"}
        return {"messages": [AIMessage(id=f"t{turn}-ai-call", content="", tool_calls=[call])], "counter": 1}
    answer = f"Turn {turn}, from the lookup: " + make_text(f"answer-{turn}", ANSWER_CHARS)
    return {"messages": [AIMessage(id=f"t{turn}-ai-answer", content=answer)], "counter": 1}


def route(state: State) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


def tools(state: State) -> dict[str, Any]:
    turn = state["turn"]
    approval = "auto"
    if turn % INTERRUPT_EVERY == 3:
        approval = interrupt({"turn": turn, "ask": "approve the lookup?"})
    update: dict[str, Any] = {
        "messages": [ToolMessage(id=f"t{turn}-tool",
                                 content=f"lookup result for turn {turn} ({approval}): "
                                 + make_text(f"tool-{turn}", TOOL_RESULT_CHARS),
                                 tool_call_id=f"call-{turn}")],
        "scratch": {"last_tool": "lookup", "turn": turn, "approval": approval},
        "counter": 1,
    }
    if turn % DOC_EVERY == 0:
        update["doc"] = make_doc(turn // DOC_EVERY)
    return update


def build_graph(checkpointer: Any) -> Any:
    builder = StateGraph(State)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def turn_input(turn: int) -> dict[str, Any]:
    data: dict[str, Any] = {
        "messages": [HumanMessage(id=f"t{turn}-human",
                                  content=f"question {turn}: " + make_text(f"question-{turn}", QUESTION_CHARS))],
        "turn": turn,
    }
    if turn == 1:
        data["doc"] = make_doc(0)
        data["scratch"] = {}
    return data


# -- fingerprints -------------------------------------------------------------------
def _digest(value: Any) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def _message_fp(m: BaseMessage) -> list[Any]:
    calls = [[c["name"], c["id"], sorted(c["args"].items())] for c in getattr(m, "tool_calls", []) or []]
    return [m.type, m.id, m.content, calls, getattr(m, "tool_call_id", None)]


def values_fp(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in sorted(values.items()):
        if k == "messages":
            out[k] = [_message_fp(m) for m in v]
        elif k == "doc":
            out[k] = [len(v), _digest(v)]
        else:
            out[k] = v
    return out


def snapshot_fp(s: Any) -> dict[str, Any]:
    md = s.metadata or {}
    return {
        "source": md.get("source"),
        "step": md.get("step"),
        "next": list(s.next),
        "values": _digest(values_fp(s.values)),
        "interrupts": len(s.interrupts),
        "has_parent": s.parent_config is not None,
    }


def tuple_fp(t: Any) -> dict[str, Any]:
    md = t.metadata or {}
    cv = t.checkpoint["channel_values"]
    return {
        "source": md.get("source"),
        "step": md.get("step"),
        "channels": sorted(cv),
        "values": _digest(values_fp({k: v for k, v in cv.items() if not k.startswith("branch:")})),
        "pending_writes": len(t.pending_writes or []),
        "has_parent": t.parent_config is not None,
    }


# -- the phases -------------------------------------------------------------------------
PHASES = ("write", "read_latest", "history", "list_filtered", "fork", "delete")


class Workload:
    """Runs the phases on one thread; ``timings`` gets each phase's wall time (s)."""

    def __init__(self, graph: Any, saver: Any, recorder: Any, thread_id: str, turns: int) -> None:
        self.graph = graph
        self.saver = saver
        self.recorder = recorder
        self.config = {"configurable": {"thread_id": thread_id}}
        self.thread_id = thread_id
        self.turns = turns
        self.timings: dict[str, float] = {}
        self.results: dict[str, Any] = {}
        self._middle: Any = None
        self._fork_from: Any = None
        # Called (outside any phase) after the fork phase, before delete: the
        # runner measures what is stored then.
        self.before_delete: Callable[[], None] = lambda: None

    def _phase(self, name: str) -> Callable[[], None]:
        self.recorder.phase = name
        t0 = time.perf_counter()

        def done() -> None:
            self.timings[name] = time.perf_counter() - t0
            self.recorder.phase = "idle"

        return done

    def _warm_up_args(self) -> tuple[dict[str, Any], Any, dict[str, Any], dict[str, Any]]:
        from langgraph.checkpoint.base import empty_checkpoint

        ckpt = empty_checkpoint()
        version = self.saver.get_next_version(None, None)
        ckpt["channel_values"] = {"warm": "up"}
        ckpt["channel_versions"] = {"warm": version}
        cfg = {"configurable": {"thread_id": f"{self.thread_id}-warm-up", "checkpoint_ns": ""}}
        return cfg, ckpt, {"source": "input", "step": -1, "parents": {}}, {"warm": version}

    # sync -------------------------------------------------------------------------
    def warm_up(self) -> None:
        """Unmeasured first calls: savers that create clients lazily pay for it here, as
        others do in their constructor (cold start is measured on its own)."""
        self.recorder.phase = "setup"
        cfg, ckpt, md, versions = self._warm_up_args()
        self.saver.put(cfg, ckpt, md, versions)
        self.saver.get_tuple(cfg)
        try:
            self.saver.delete_thread(cfg["configurable"]["thread_id"])
        except NotImplementedError:  # a saver without delete_thread: the delete phase reports it
            pass
        self.recorder.phase = "idle"

    async def awarm_up(self) -> None:
        self.recorder.phase = "setup"
        cfg, ckpt, md, versions = self._warm_up_args()
        await self.saver.aput(cfg, ckpt, md, versions)
        await self.saver.aget_tuple(cfg)
        try:
            await self.saver.adelete_thread(cfg["configurable"]["thread_id"])
        except NotImplementedError:
            pass
        self.recorder.phase = "idle"

    def run_sync(self) -> dict[str, Any]:
        g, cfg = self.graph, self.config
        self.warm_up()
        done = self._phase("write")
        interrupts = 0
        for turn in range(1, self.turns + 1):
            out = g.invoke(turn_input(turn), cfg)
            while out.get("__interrupt__"):
                interrupts += 1
                out = g.invoke(Command(resume=f"approved-{turn}"), cfg)
        done()
        self.results["write"] = {"interrupts": interrupts, "final": values_fp(out)}

        done = self._phase("read_latest")
        state = g.get_state(cfg)
        done()
        self.results["read_latest"] = {"values": values_fp(state.values), "next": list(state.next),
                                       "step": state.metadata.get("step")}

        done = self._phase("history")
        history = list(g.get_state_history(cfg))
        done()
        self.results["history"] = {"length": len(history), "snapshots": [snapshot_fp(s) for s in history]}
        self._pick(history)

        done = self._phase("list_filtered")
        by_filter = list(self.saver.list(cfg, filter={"source": "loop"}, limit=5))
        before = list(self.saver.list(cfg, before=self._middle, limit=3))
        done()
        self.results["list_filtered"] = {"filter": [tuple_fp(t) for t in by_filter],
                                         "before": [tuple_fp(t) for t in before]}

        done = self._phase("fork")
        fork_cfg = g.update_state(self._fork_from, {"scratch": {"forked": True}}, as_node="agent")
        out = g.invoke(turn_input(self.turns + 1), fork_cfg)
        done()
        self.results["fork"] = {"final": values_fp(out)}

        self.recorder.phase = "verify"
        self.results["fork"]["history_length"] = len(list(g.get_state_history(cfg)))
        self.before_delete()

        done = self._phase("delete")
        try:
            self.saver.delete_thread(self.thread_id)
        except NotImplementedError as exc:  # BaseCheckpointSaver's default: the saver has none
            done()
            self.results["delete"] = {"error": f"NotImplementedError: {exc}"}
            self.recorder.phase = "idle"
            return self.results
        done()
        self.recorder.phase = "verify"
        self.results["delete"] = {"gone": self.saver.get_tuple(cfg) is None}
        self.recorder.phase = "idle"
        return self.results

    # async --------------------------------------------------------------------------
    async def run_async(self) -> dict[str, Any]:
        g, cfg = self.graph, self.config
        await self.awarm_up()
        done = self._phase("write")
        interrupts = 0
        for turn in range(1, self.turns + 1):
            out = await g.ainvoke(turn_input(turn), cfg)
            while out.get("__interrupt__"):
                interrupts += 1
                out = await g.ainvoke(Command(resume=f"approved-{turn}"), cfg)
        done()
        self.results["write"] = {"interrupts": interrupts, "final": values_fp(out)}

        done = self._phase("read_latest")
        state = await g.aget_state(cfg)
        done()
        self.results["read_latest"] = {"values": values_fp(state.values), "next": list(state.next),
                                       "step": state.metadata.get("step")}

        done = self._phase("history")
        history = [s async for s in g.aget_state_history(cfg)]
        done()
        self.results["history"] = {"length": len(history), "snapshots": [snapshot_fp(s) for s in history]}
        self._pick(history)

        done = self._phase("list_filtered")
        by_filter = [t async for t in self.saver.alist(cfg, filter={"source": "loop"}, limit=5)]
        before = [t async for t in self.saver.alist(cfg, before=self._middle, limit=3)]
        done()
        self.results["list_filtered"] = {"filter": [tuple_fp(t) for t in by_filter],
                                         "before": [tuple_fp(t) for t in before]}

        done = self._phase("fork")
        fork_cfg = await g.aupdate_state(self._fork_from, {"scratch": {"forked": True}}, as_node="agent")
        out = await g.ainvoke(turn_input(self.turns + 1), fork_cfg)
        done()
        self.results["fork"] = {"final": values_fp(out)}

        self.recorder.phase = "verify"
        self.results["fork"]["history_length"] = len([s async for s in g.aget_state_history(cfg)])
        self.before_delete()

        done = self._phase("delete")
        try:
            await self.saver.adelete_thread(self.thread_id)
        except NotImplementedError as exc:
            done()
            self.results["delete"] = {"error": f"NotImplementedError: {exc}"}
            self.recorder.phase = "idle"
            return self.results
        done()
        self.recorder.phase = "verify"
        self.results["delete"] = {"gone": (await self.saver.aget_tuple(cfg)) is None}
        self.recorder.phase = "idle"
        return self.results

    def _pick(self, history: list[Any]) -> None:
        """The middle checkpoint (for ``before=``) and the end of the middle turn (to fork from)."""
        self._middle = history[len(history) // 2].config
        turn_ends = [s for s in history if not s.next and s.metadata.get("source") == "loop"]
        self._fork_from = turn_ends[len(turn_ends) // 2].config
