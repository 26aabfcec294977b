"""Notes about a user that outlive the thread: long-term memory in the server's store.

``remember`` keeps the input's note in the namespace ``("notes", <user>)`` of the store
LangGraph Server gives the graph (the S3Store ``langgraph.json`` names); ``recall`` finds the
user's notes closest in meaning to it, from this thread and every earlier one. Each item
gets the ``default_ttl`` of ``langgraph.json``'s ``store.ttl``; ``store.index`` embeds its
``text`` field.
"""

from __future__ import annotations

import hashlib
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime


class Notes(TypedDict, total=False):
    user: str
    note: str
    recalled: list[str]


async def remember(state: Notes, runtime: Runtime) -> Notes:
    # The note's digest as its key: the same note twice is one item, rewritten.
    key = hashlib.sha256(state["note"].encode()).hexdigest()[:16]
    await runtime.store.aput(("notes", state["user"]), key, {"text": state["note"]})
    return {}


async def recall(state: Notes, runtime: Runtime) -> Notes:
    found = await runtime.store.asearch(("notes", state["user"]), query=state["note"], limit=3)
    return {"recalled": [item.value["text"] for item in found]}


builder = StateGraph(Notes)
builder.add_node("remember", remember)
builder.add_node("recall", recall)
builder.add_edge(START, "remember")
builder.add_edge("remember", "recall")
builder.add_edge("recall", END)

# No checkpointer and no store here: LangGraph Server gives the graph the ones
# langgraph.json names.
graph = builder.compile()
