"""What a checkpoint says without its graph: next nodes, interrupts, values, sizes.

LangGraph decides the next tasks of a checkpoint (``StateSnapshot.next``) in
``langgraph.pregel._algo.prepare_next_tasks``: first one PUSH task per ``Send``
in the ``__pregel_tasks`` channel, then every node with a trigger channel that
is available (present in ``channel_values``) and whose version is newer than
the version that node has seen (``versions_seen[node]``; a node that has seen
nothing runs on any available trigger). A ``StateGraph`` node's trigger is
``branch:to:<node>``; ``__start__``'s is ``__start__``. Nodes come here in name
order (LangGraph's order is the graph's, which a checkpoint does not record).

``get_state()`` (the latest checkpoint, "live") leaves out tasks that already
finished, i.e. have an output write among the pending writes; task ids are not
node names, so ``next_nodes`` lists the step's nodes as ``get_state_history``
does, and `interrupts()` tells the questions still waiting apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langgraph.checkpoint.serde.types import ERROR, INTERRUPT, RESUME, TASKS

START = "__start__"
BRANCH = "branch:to:"
ERROR_SOURCE_NODE = "__error_source_node__"
NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"  # writes of the step's input (update_state...)
CONTROL_WRITES = frozenset({ERROR, ERROR_SOURCE_NODE, INTERRUPT, RESUME})


def next_nodes(checkpoint: Mapping[str, Any]) -> list[str]:
    """The nodes the step after ``checkpoint`` runs (``get_state_history``'s ``next``):
    the ``Send`` targets in order, then the triggered nodes by name."""
    values: Mapping[str, Any] = checkpoint.get("channel_values") or {}
    versions: Mapping[str, Any] = checkpoint.get("channel_versions") or {}
    seen_by: Mapping[str, Mapping[str, Any]] = checkpoint.get("versions_seen") or {}
    if not versions:
        return []
    pushed = [getattr(send, "node", None) for send in values.get(TASKS) or ()]
    pulled = set()
    for channel in values:
        if channel.startswith(BRANCH):
            node = channel[len(BRANCH) :]
        elif channel == START:
            node = START
        else:
            continue
        version = versions.get(channel)
        if version is None:
            continue
        seen = seen_by.get(node)
        if seen is None or version > seen.get(channel, type(version)()):
            pulled.add(node)
    return [n for n in pushed if isinstance(n, str)] + sorted(pulled)


def user_values(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The state's channels (``get_state().values``), without LangGraph's own
    (``branch:to:*`` markers, ``__start__`` input, ``__pregel_tasks`` sends)."""
    values: Mapping[str, Any] = checkpoint.get("channel_values") or {}
    return {
        k: v
        for k, v in values.items()
        if not k.startswith(BRANCH) and not (k.startswith("__") and k.endswith("__")) and k != TASKS
    }


def internal_values(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """LangGraph's own channels that carry something: the input (``__start__``) and pending ``Send``s."""
    values: Mapping[str, Any] = checkpoint.get("channel_values") or {}
    out: dict[str, Any] = {}
    if START in values:
        out["input"] = values[START]
    if values.get(TASKS):
        out["sends"] = list(values[TASKS])
    return out


def values_size(serde: Any, checkpoint: Mapping[str, Any]) -> int:
    """Serialized bytes of the checkpoint's channel values (``serde.dumps_typed`` of each)."""
    total = 0
    for value in (checkpoint.get("channel_values") or {}).values():
        total += len(serde.dumps_typed(value)[1])
    return total


def finished_tasks(pending_writes: Iterable[Sequence[Any]]) -> set[str]:
    """Tasks with an output write: they ran to completion (LangGraph's ``TaskStatus.finished``)."""
    return {w[0] for w in pending_writes if w[0] != NULL_TASK_ID and w[1] not in CONTROL_WRITES}


def interrupts(pending_writes: Sequence[Sequence[Any]], *, live: bool) -> list[dict[str, Any]]:
    """The interrupts among the pending writes: with ``live`` (the latest checkpoint,
    as ``get_state().interrupts``) only those of unfinished tasks, still waiting for an
    answer; otherwise all that the step raised (as ``get_state_history``)."""
    done = finished_tasks(pending_writes) if live else set()
    out: list[dict[str, Any]] = []
    for task_id, channel, value in pending_writes:
        if channel != INTERRUPT or task_id == NULL_TASK_ID or task_id in done:
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            out.append({"task_id": task_id, "id": getattr(item, "id", None), "value": getattr(item, "value", item)})
    return out
