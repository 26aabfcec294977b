"""migrate: copy every thread of one LangGraph checkpoint saver into another, resumably, and verify.

Only the public saver API is used (``list``, ``put``, ``put_writes``), so any
``BaseCheckpointSaver`` can be the source or the target: SqliteSaver, PostgresSaver,
InMemorySaver, S3Saver in either index mode. A thread is read whole (every
namespace), copied parents first, then compared with what the target reads back.

Resumable: whatever a run was doing when it stopped (a kill between a ``put`` and
its ``put_writes``, mid-thread, mid-namespace), running it again skips the
checkpoints the target holds, sends the pending writes the target lacks, and
copies the rest; nothing is stored twice.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    CheckpointTuple,
    PendingWrite,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from s3_saver._saver import S3Saver
from s3_saver._urls import refuse_same_store
from s3_saver.errors import ConfigurationError, MigrationError


@dataclass
class MigrationReport:
    """What :func:`migrate` did.

    Attributes:
        threads: Threads of which something was copied by this run.
        checkpoints: Checkpoints copied by this run.
        writes: Pending writes sent by this run (for a checkpoint the target
            already held, those of the tasks it held fewer writes of).
        skipped: Checkpoints the target already held (a resumed run).
        bytes: Serialized bytes copied: checkpoints, metadata and pending
            writes, as the source's serializer (``dumps_typed``) writes them.
        verified: Checkpoints compared equal afterwards (0 with ``verify=False``).
        seconds: Wall time of the whole call.
    """

    threads: int = 0
    checkpoints: int = 0
    writes: int = 0
    skipped: int = 0
    bytes: int = 0
    verified: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class MigrationProgress:
    """Passed to ``on_progress`` after each checkpoint (copied or skipped).

    Attributes:
        thread_id: The thread being copied.
        done: Checkpoints done so far in this call, copied and skipped.
        total: Checkpoints to do in all, when known (the source was listed
            whole to find its threads); None otherwise.
        bytes: Serialized bytes copied so far.
    """

    thread_id: str
    done: int
    total: int | None
    bytes: int


def migrate(
    source: BaseCheckpointSaver,
    target: BaseCheckpointSaver,
    *,
    thread_ids: Sequence[str] | None = None,
    verify: bool = True,
    on_progress: Callable[[MigrationProgress], None] | None = None,
) -> MigrationReport:
    """Copy threads from one checkpoint saver into another, keeping everything a graph reads.

    Every namespace, checkpoint and pending write of each thread is copied with
    its ids, parent, metadata, channel values and versions. Checkpoints go in
    parent before child; each ``put`` names its parent and, as ``new_versions``,
    the channels whose version differs from the parent's, so savers that store
    a (channel, version) once (S3Saver, PostgresSaver) do so here too.

    Threads: ``thread_ids``, or every thread of the source: from
    ``list_threads()`` for an S3Saver (a thread whose checkpoints are all in
    subgraph namespaces is not in its listing: name it in ``thread_ids``),
    from ``list(None)`` for other savers.

    Args:
        source: The saver read from.
        target: The saver written to (its tables, bucket or index must exist).
        thread_ids: Only these threads (each must have checkpoints in the source).
        verify: Afterwards, read each thread back from the target and compare it
            with the source: same checkpoint ids in the same order, parents,
            metadata, checkpoints (channel values compared with ``==``) and
            pending writes.
        on_progress: Called after each checkpoint; an exception it raises stops
            the migration (a later run resumes it).

    Returns:
        What was copied, skipped and verified.

    Raises:
        MigrationError: The target differs from the source (verification), or
            stored a checkpoint under another id.
        ConfigurationError: ``thread_ids`` is a string, or names a thread the source does not have.
        ThreadArchivedError: An S3Saver source's thread is archived in a cold
            storage class: ``restore_thread`` it first.
    """
    refuse_same_store(source, target)
    started = time.perf_counter()
    report = MigrationReport()
    threads, total = _threads(source, thread_ids)
    serde = source.serde
    done = 0
    for thread_id in threads:
        # One thread at a time in memory: its namespaces, in the source's listed order.
        source_ns = _by_namespace(source.list(_thread(thread_id)))
        present = {(_ns(t), _id(t)): _task_counts(t) for t in target.list(_thread(thread_id))}
        copied = report.checkpoints, report.writes
        for ns in sorted(source_ns, key=lambda n: (n != "", n)):  # the root first: it lists the thread
            by_id = {_id(t): t for t in source_ns[ns]}
            for tup in _parents_first(thread_id, ns, by_id):
                _copy(serde, target, thread_id, ns, tup, by_id.get(_parent_id(tup) or ""), present, report)
                done += 1
                if on_progress is not None:
                    on_progress(MigrationProgress(thread_id, done, total, report.bytes))
        if (report.checkpoints, report.writes) != copied:
            report.threads += 1
        if verify:
            report.verified += _verify(serde, thread_id, source_ns, _by_namespace(target.list(_thread(thread_id))))
    report.seconds = time.perf_counter() - started
    return report


# -- which threads -------------------------------------------------------------------------
def _threads(source: BaseCheckpointSaver, thread_ids: Sequence[str] | None) -> tuple[list[str], int | None]:
    """The threads to copy, and how many checkpoints they hold when that is known."""
    if thread_ids is not None:
        if isinstance(thread_ids, (str, bytes)):
            raise ConfigurationError(f"thread_ids must be a list of thread ids, not a string: {thread_ids!r}")
        wanted = list(dict.fromkeys(thread_ids))
        for thread_id in wanted:
            if next(iter(source.list(_thread(thread_id), limit=1)), None) is None:
                raise ConfigurationError(f"thread {thread_id!r} has no checkpoints in the source; nothing was copied")
        return wanted, None
    if isinstance(source, S3Saver):
        # The thread listing: never a scan of the bucket or the table.
        return [info.thread_id for info in source.list_threads()], None
    counts: Counter[str] = Counter(str(t.config["configurable"]["thread_id"]) for t in source.list(None))
    return list(counts), sum(counts.values())


# -- copying -------------------------------------------------------------------------------
def _copy(
    serde: SerializerProtocol,
    target: BaseCheckpointSaver,
    thread_id: str,
    ns: str,
    tup: CheckpointTuple,
    parent: CheckpointTuple | None,
    present: dict[tuple[str, str], Counter[str]],
    report: MigrationReport,
) -> None:
    checkpoint_id = _id(tup)
    writes = list(tup.pending_writes or [])
    config: RunnableConfig = {
        "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
    }
    held = present.get((ns, checkpoint_id))
    if held is not None:
        report.skipped += 1
        # Writes are first-wins (specials: the same value again), so a task sent
        # again changes nothing it already holds; only tasks short of writes go.
        wanted = _task_counts(tup)
        missing = {task for task, n in wanted.items() if held[task] < n}
        if missing:
            sent = _put_writes(target, config, writes, missing)
            report.writes += len(sent)
            report.bytes += sum(_size(serde, value) for _, _, value in sent)
        return
    parent_id = _parent_id(tup)
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
    report.checkpoints += 1
    report.writes += len(sent)
    report.bytes += _size(serde, tup.checkpoint) + _size(serde, tup.metadata) + sum(_size(serde, v) for *_, v in sent)


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
        or (ch in values and values[ch] is not parent_values[ch] and not _same(serde, values[ch], parent_values[ch]))
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


def _parents_first(thread_id: str, ns: str, by_id: dict[str, CheckpointTuple]) -> Iterable[CheckpointTuple]:
    """A namespace's checkpoints, each after its parent (a parent missing from the
    source does not hold its child back); otherwise oldest id first."""
    children: dict[str, list[str]] = {}
    ready: list[str] = []
    for checkpoint_id, tup in by_id.items():
        parent_id = _parent_id(tup)
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


# -- verification --------------------------------------------------------------------------
def _verify(
    serde: SerializerProtocol,
    thread_id: str,
    source_ns: dict[str, list[CheckpointTuple]],
    target_ns: dict[str, list[CheckpointTuple]],
) -> int:
    """Compare a thread's namespaces as both savers list them; returns the checkpoints compared."""
    compared = 0
    for ns in sorted(set(source_ns) | set(target_ns)):
        mine, theirs = source_ns.get(ns, []), target_ns.get(ns, [])
        ids, other_ids = [_id(t) for t in mine], [_id(t) for t in theirs]
        known, other_known = set(ids), set(other_ids)
        missing = [c for c in ids if c not in other_known]
        if missing:
            raise MigrationError(thread_id, ns, missing[0], f"missing from the target ({len(missing)} of {len(ids)})")
        extra = [c for c in other_ids if c not in known]
        if extra:
            raise MigrationError(thread_id, ns, extra[0], f"the target has it, the source does not ({len(extra)} such)")
        if ids != other_ids:
            at = next(i for i, (a, b) in enumerate(zip(ids, other_ids)) if a != b)
            raise MigrationError(
                thread_id, ns, ids[at], f"listed in another order: the target lists {other_ids[at]} at position {at}"
            )
        for a, b in zip(mine, theirs):
            difference = _difference(serde, a, b)
            if difference:
                raise MigrationError(thread_id, ns, _id(a), difference)
        compared += len(mine)
    return compared


def _difference(serde: SerializerProtocol, a: CheckpointTuple, b: CheckpointTuple) -> str | None:
    """What differs between a source and a target checkpoint tuple, in words; None when equal."""
    if _parent_id(a) != _parent_id(b):
        return f"parent differs: source {_parent_id(a)!r}, target {_parent_id(b)!r}"
    if not _same(serde, a.metadata, b.metadata):
        keys = sorted(k for k in {*a.metadata, *b.metadata} if not _same(serde, a.metadata.get(k), b.metadata.get(k)))
        return f"metadata differs in {keys}: source {_short(a.metadata)}, target {_short(b.metadata)}"
    mine, theirs = dict[str, Any](a.checkpoint), dict[str, Any](b.checkpoint)
    for key in sorted({*mine, *theirs}):
        if key not in mine or key not in theirs:
            return f"checkpoint field {key!r} is only in the {'source' if key in mine else 'target'}"
        if key == "channel_values":
            values, other = mine[key], theirs[key]
            for ch in sorted({*values, *other}):
                if ch not in values or ch not in other:
                    return f"channel {ch!r} has a value only in the {'source' if ch in values else 'target'}"
                if not _same(serde, values[ch], other[ch]):
                    return f"channel {ch!r} differs: source {_short(values[ch])}, target {_short(other[ch])}"
        elif not _same(serde, mine[key], theirs[key]):
            return f"checkpoint field {key!r} differs: source {_short(mine[key])}, target {_short(theirs[key])}"
    writes, other_writes = list(a.pending_writes or []), list(b.pending_writes or [])
    if len(writes) != len(other_writes):
        return f"pending writes differ: {len(writes)} in the source, {len(other_writes)} in the target"
    for i, (x, y) in enumerate(zip(writes, other_writes)):
        if x[:2] != y[:2] or not _same(serde, x[2], y[2]):
            return f"pending write {i} differs: source {x[:2]} {_short(x[2])}, target {y[:2]} {_short(y[2])}"
    return None


def _same(serde: SerializerProtocol, a: Any, b: Any) -> bool:
    """Equal with ``==``, or (for values without a useful ``==``) serialized alike."""
    try:
        if a == b:
            return True
    except Exception:  # e.g. an array's == is not a bool
        pass
    try:
        return serde.dumps_typed(a) == serde.dumps_typed(b)
    except Exception:
        return False


# -- small helpers -------------------------------------------------------------------------
def _thread(thread_id: str) -> RunnableConfig:
    # No checkpoint_ns: every namespace of the thread (SqliteSaver, PostgresSaver,
    # InMemorySaver and S3Saver all read it so).
    return {"configurable": {"thread_id": thread_id}}


def _by_namespace(tuples: Iterable[CheckpointTuple]) -> dict[str, list[CheckpointTuple]]:
    grouped: dict[str, list[CheckpointTuple]] = {}
    for tup in tuples:
        grouped.setdefault(_ns(tup), []).append(tup)
    return grouped


def _id(tup: CheckpointTuple) -> str:
    return tup.config["configurable"]["checkpoint_id"]


def _ns(tup: CheckpointTuple) -> str:
    return tup.config["configurable"].get("checkpoint_ns") or ""


def _parent_id(tup: CheckpointTuple) -> str | None:
    return ((tup.parent_config or {}).get("configurable") or {}).get("checkpoint_id") or None


def _task_counts(tup: CheckpointTuple) -> Counter[str]:
    return Counter(task_id for task_id, _, _ in tup.pending_writes or [])


def _size(serde: SerializerProtocol, value: Any) -> int:
    return len(serde.dumps_typed(value)[1])


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
