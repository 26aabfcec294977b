"""migrate's copying: one checkpoint and its pending writes into the target, parents first.

Used by `run`, which runs it for each thread (one thread's
checkpoints in order, on one worker) and adds what `copy_checkpoint()`
returns to its report.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from typing import Any, NamedTuple

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    CheckpointTuple,
    PendingWrite,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from s3_saver._migrate.verify import checkpoint_id_of, namespace_of, parent_id_of, same
from s3_saver.errors import MigrationError


class Step(NamedTuple):
    """What copying one checkpoint did (added to the report under its lock)."""

    checkpoints: int = 0
    skipped: int = 0
    writes: int = 0
    bytes: int = 0


def copy_checkpoint(
    serde: SerializerProtocol,
    target: BaseCheckpointSaver,
    thread_id: str,
    ns: str,
    tup: CheckpointTuple,
    parent: CheckpointTuple | None,
    present: dict[tuple[str, str], Counter[str]],
) -> Step:
    """Put one checkpoint and its writes into the target, or the writes the target lacks when it holds it."""
    checkpoint_id = checkpoint_id_of(tup)
    writes = list(tup.pending_writes or [])
    config: RunnableConfig = {
        "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
    }
    held = present.get((ns, checkpoint_id))
    if held is not None:
        # Writes are first-wins (specials: the same value again), so a task sent
        # again changes nothing it already holds; only tasks short of writes go.
        wanted = task_counts(tup)
        missing = {task for task, n in wanted.items() if held[task] < n}
        sent = _put_writes(target, config, writes, missing) if missing else []
        return Step(skipped=1, writes=len(sent), bytes=sum(_size(serde, value) for _, _, value in sent))
    parent_id = parent_id_of(tup)
    put_config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}
    if parent_id is not None:
        put_config["configurable"]["checkpoint_id"] = parent_id
    checkpoint = {**tup.checkpoint, "channel_values": dict(tup.checkpoint["channel_values"])}
    new_versions = _new_versions(serde, tup, parent)
    stored = target.put(put_config, checkpoint, tup.metadata, new_versions)  # type: ignore[arg-type]
    stored_id = ((stored or {}).get("configurable") or {}).get("checkpoint_id")
    if stored_id != checkpoint_id:
        raise MigrationError(thread_id, ns, checkpoint_id, f"the target stored it as checkpoint {stored_id!r}")
    sent = _put_writes(target, config, writes, None)
    size = _size(serde, tup.checkpoint) + _size(serde, tup.metadata) + sum(_size(serde, v) for *_, v in sent)
    return Step(checkpoints=1, writes=len(sent), bytes=size)


def _new_versions(serde: SerializerProtocol, tup: CheckpointTuple, parent: CheckpointTuple | None) -> ChannelVersions:
    """The channels this checkpoint must store: those whose version differs from
    the parent's (all of them without a parent), and those whose value differs
    under the same version.

    The second kind is LangGraph's doing: with the default ``durability="async"``
    a saver that serializes the whole checkpoint in the background (SqliteSaver)
    can catch a channel's value (a join's set) after the next step changed it in
    place, without a new version. Naming it keeps that value in a saver that
    stores only ``new_versions`` (S3Saver); one that keys values by version
    alone (PostgresSaver) keeps the first and verification reports the other.
    """
    versions = tup.checkpoint["channel_versions"]
    if parent is None:
        return dict(versions)
    before = parent.checkpoint["channel_versions"]
    values, parent_values = tup.checkpoint["channel_values"], parent.checkpoint["channel_values"]
    return {
        ch: v
        for ch, v in versions.items()
        if ch not in before
        or before[ch] != v
        or (ch in values) != (ch in parent_values)
        or (ch in values and values[ch] is not parent_values[ch] and not same(serde, values[ch], parent_values[ch]))
    }


def _put_writes(
    target: BaseCheckpointSaver, config: RunnableConfig, writes: list[PendingWrite], only: set[str] | None
) -> list[PendingWrite]:
    """Send a checkpoint's pending writes task by task, each task's in their order; returns what was sent.

    A saver numbers a call's writes by position and gives the special channels
    (errors, interrupts, resumes...) their WRITES_IDX_MAP index: a task's
    special writes and its regular writes go in separate calls, so the regular
    ones get back the indexes 0..n-1 they had. Savers return the writes sorted
    by (task_path, task_id, idx); ``task_path`` is not returned, so each task
    gets ``migrated:<its rank in the source's order>``, which keeps that order.
    """
    tasks: dict[str, list[PendingWrite]] = {}
    for write in writes:
        tasks.setdefault(write[0], []).append(write)
    sent: list[PendingWrite] = []
    for rank, (task_id, task_writes) in enumerate(tasks.items()):
        if only is not None and task_id not in only:
            continue
        special = [(channel, value) for _, channel, value in task_writes if channel in WRITES_IDX_MAP]
        regular = [(channel, value) for _, channel, value in task_writes if channel not in WRITES_IDX_MAP]
        for group in (special, regular):
            if group:
                target.put_writes(config, group, task_id, f"migrated:{rank:06d}")
        sent += task_writes
    return sent


def parents_first(thread_id: str, ns: str, by_id: dict[str, CheckpointTuple]) -> Iterable[CheckpointTuple]:
    """A namespace's checkpoints, each after its parent (a parent missing from the
    source does not hold its child back); otherwise oldest id first."""
    children: dict[str, list[str]] = {}
    ready: list[str] = []
    for checkpoint_id, tup in by_id.items():
        parent_id = parent_id_of(tup)
        if parent_id is not None and parent_id in by_id and parent_id != checkpoint_id:
            children.setdefault(parent_id, []).append(checkpoint_id)
        else:
            ready.append(checkpoint_id)
    heapq.heapify(ready)
    emitted: set[str] = set()
    while ready:
        checkpoint_id = heapq.heappop(ready)
        emitted.add(checkpoint_id)
        yield by_id[checkpoint_id]
        for child in children.get(checkpoint_id, ()):
            heapq.heappush(ready, child)
    if len(emitted) != len(by_id):
        stuck = sorted(set(by_id) - emitted)[:3]
        raise MigrationError(thread_id, ns, None, f"the source's parent links form a cycle (through {stuck})")


# -- small helpers -------------------------------------------------------------------------
def whole_thread(thread_id: str) -> RunnableConfig:
    # No checkpoint_ns: every namespace of the thread (SqliteSaver, PostgresSaver,
    # InMemorySaver and S3Saver all read it so).
    return {"configurable": {"thread_id": thread_id}}


def by_namespace(tuples: Iterable[CheckpointTuple]) -> dict[str, list[CheckpointTuple]]:
    """The tuples grouped by namespace, in their order. Reads ``tuples`` to the end:
    SqliteSaver and PostgresSaver hold their connection's lock until a listing ends."""
    grouped: dict[str, list[CheckpointTuple]] = {}
    for tup in tuples:
        grouped.setdefault(namespace_of(tup), []).append(tup)
    return grouped


def task_counts(tup: CheckpointTuple) -> Counter[str]:
    return Counter(task_id for task_id, _, _ in tup.pending_writes or [])


def _size(serde: SerializerProtocol, value: Any) -> int:
    return len(serde.dumps_typed(value)[1])
