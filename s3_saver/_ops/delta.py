"""get_delta_channel_history: the ancestor walk for LangGraph's DeltaChannel.

The base class walks the parent chain with one get_tuple per ancestor. Here the
chain is read as one newest-first Query stream below the target (each
checkpoint item followed by its own writes), walked in memory, and the seeds
and large writes are fetched in one more wave: the number of round trips does
not depend on how many ancestors the walk visits, only on how many 1 MB index
pages they fill.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import DeltaChannelHistory, PendingWrite

from s3_saver import _keys
from s3_saver._dynamodb import CheckpointEntry, WritesEntry
from s3_saver._ops.context import Context, target
from s3_saver._ops.read import _latest
from s3_saver._ops.resolve import Resolver, load
from s3_saver._protocol import Op, request_one


def delta_channel_history(
    ctx: Context, config: RunnableConfig, channels: Sequence[str]
) -> Op[Mapping[str, DeltaChannelHistory]]:
    if not channels:
        return {}
    thread_id, ns, checkpoint_id = target(config)
    if not checkpoint_id:
        latest = yield from _latest(ctx, thread_id, ns)
        if latest is None:
            return {ch: {"writes": []} for ch in channels}
        checkpoint_id = latest.checkpoint_id

    chain = yield from _read_chain(ctx, thread_id, ns, checkpoint_id, set(channels))
    # The walk itself, as BaseCheckpointSaver defines it: each ancestor's writes
    # count for a channel until (and including) the ancestor that seeds it.
    remaining = set(channels)
    picked: list[tuple[CheckpointEntry, set[str]]] = []
    seeds: dict[str, CheckpointEntry] = {}
    for entry in chain:
        if not remaining:
            break
        picked.append((entry, set(remaining)))
        for ch in [c for c in remaining if c in entry.loc]:
            seeds[ch] = entry
            remaining.discard(ch)

    # Fetch only what the result needs: the seed values and the writes batches
    # too large for their index items.
    resolver = Resolver(ctx)
    needed = []
    for entry, _ in picked:
        resolver.add(entry)
        needed.append(replace(entry, loc={ch: v for ch, v in entry.loc.items() if seeds.get(ch) is entry}))
    yield from load(resolver, needed)

    collected: dict[str, list[PendingWrite]] = {ch: [] for ch in channels}
    for entry, wanted in picked:
        for write in reversed(resolver.pending_writes(entry)):
            if write[1] in wanted:
                collected[write[1]].append(write)
    result: dict[str, DeltaChannelHistory] = {}
    for ch in channels:
        history: DeltaChannelHistory = {"writes": list(reversed(collected[ch]))}
        if ch in seeds:
            history["seed"] = resolver.value(seeds[ch], ch)
        result[ch] = history
    return result


def _read_chain(
    ctx: Context, thread_id: str, ns: str, checkpoint_id: str, channels: set[str]
) -> Op[list[CheckpointEntry]]:
    """Ancestors of ``checkpoint_id`` (parent first) with their writes, read until
    every channel has a seed or the root is reached."""
    upper = _keys.checkpoint_sort_key(ns, checkpoint_id)
    prefix = _keys.ns_sort_prefix(ns)
    chain: list[CheckpointEntry] = []
    unseeded = set(channels)
    cursor: str | None = None  # the next ancestor id to find
    seen_target = False
    current: CheckpointEntry | None = None  # the chain entry whose writes follow
    start: dict[str, Any] | None = None
    while True:
        page = yield from request_one(ctx.index.query(thread_id, between=(prefix, upper), start_key=start))
        for raw in page.get("Items", []):
            item = ctx.index.parse(raw)
            if isinstance(item, WritesEntry):
                if current is not None and item.checkpoint_id == current.checkpoint_id:
                    current.writes.append(item)
                continue
            if not isinstance(item, CheckpointEntry):
                continue  # the range ends below the namespace's tombstone: none here
            if chain and not unseeded:
                return chain  # the seeding ancestor's writes are all read
            if not seen_target:
                # The range ends at the target's own item: it comes first, or it does not exist.
                if item.checkpoint_id != checkpoint_id or ctx.expired(item):
                    return []
                seen_target, cursor = True, item.parent_id
                continue
            current = item if item.checkpoint_id == cursor else None  # else: another fork
            if current is not None and ctx.expired(current):
                return chain  # as if DynamoDB had deleted it already: the chain ends here
            if current is not None:
                chain.append(current)
                unseeded -= set(current.loc)
                cursor = current.parent_id
        start = page.get("LastEvaluatedKey")
        if start is None or (cursor is None and current is None):
            return chain
