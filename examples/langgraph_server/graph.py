"""A refund request that waits for a person's approval: ``interrupt()`` between two
deterministic nodes (no model, no network), served by LangGraph Server with its
checkpoints in S3 (``langgraph.json`` beside this file).

The run stops at ``review`` with the draft as the interrupt's value; resuming with
``Command(resume="approve")`` (or any other answer, which rejects) finishes it.
"""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt


class Refund(TypedDict, total=False):
    order: str
    amount: float
    draft: str
    decision: str
    status: str
    # Every node appends a line: an operator.add list, stored as deltas by S3Saver.
    log: Annotated[list[str], operator.add]


def draft(state: Refund) -> Refund:
    text = f"Refund {state['amount']:.2f} EUR for order {state['order']}"
    return {"draft": text, "log": [f"drafted: {text}"]}


def review(state: Refund) -> Refund:
    # The run stops here, checkpointed; the value given to Command(resume=...) is
    # what interrupt() returns when the thread is resumed.
    answer = interrupt({"question": "Approve this refund?", "draft": state["draft"]})
    return {"decision": str(answer), "log": [f"reviewed: {answer}"]}


def settle(state: Refund) -> Refund:
    status = "refunded" if state["decision"] == "approve" else "rejected"
    return {"status": status, "log": [f"settled: {status}"]}


builder = StateGraph(Refund)
builder.add_node("draft", draft)
builder.add_node("review", review)
builder.add_node("settle", settle)
builder.add_edge(START, "draft")
builder.add_edge("draft", "review")
builder.add_edge("review", "settle")
builder.add_edge("settle", END)

# No checkpointer here: LangGraph Server compiles the graph with its own, the
# S3Saver that langgraph.json names.
graph = builder.compile()
