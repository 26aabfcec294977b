"""get_delta_channel_history: the ancestor walk for LangGraph's DeltaChannel.

The base class walks the parent chain with one get_tuple per ancestor. Here the
index hands over the chain with its writes in as few reads as it can (see
``Index.ancestors``), the walk happens in memory, and the seeds and large writes
are fetched in one more wave.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import DeltaChannelHistory, PendingWrite

from s3_saver._index.base import CheckpointEntry
from s3_saver._ops.context import Context, target
from s3_saver._ops.resolve import Resolver, load
from s3_saver._protocol import Op


def delta_channel_history(
    ctx: Context, config: RunnableConfig, channels: Sequence[str]
) -> Op[Mapping[str, DeltaChannelHistory]]:
    if not channels:
        return {}
    thread_id, ns, checkpoint_id = target(config)
    if not checkpoint_id:
        latest = yield from ctx.index.latest(thread_id, ns)
        if latest is None or ctx.expired(latest):
            return {ch: {"writes": []} for ch in channels}
        checkpoint_id = latest.checkpoint_id

    target_entry, chain = yield from ctx.index.ancestors(thread_id, ns, checkpoint_id, set(channels))
    if target_entry is None or ctx.expired(target_entry):
        chain = []
    # An expired ancestor ends the chain, as if its entry were deleted already.
    for i, entry in enumerate(chain):
        if ctx.expired(entry):
            chain = chain[:i]
            break
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
