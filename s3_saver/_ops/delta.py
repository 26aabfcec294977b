"""get_delta_channel_history: the ancestor walk for LangGraph's DeltaChannel.

The base class walks the parent chain with one get_tuple per ancestor. Here the
index hands over the chain with its writes in as few reads as it can (see
``Index.ancestors``; the target's metadata tells it how deep the walk will go),
the walk happens in memory, and the seeds and large writes are fetched in one
more wave.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import DeltaChannelHistory, PendingWrite

from s3_saver._format.codec import loads
from s3_saver._format.entries import CheckpointEntry
from s3_saver._index.terms import DepthHint
from s3_saver._ops.archived import or_archive
from s3_saver._ops.context import Context, target
from s3_saver._ops.keyed import keyed, keyed_beside
from s3_saver._ops.lagged import check_delta_chain, proves_items
from s3_saver._ops.resolve import Resolver, entry_metadata, load
from s3_saver._transport.protocol import Op


def delta_channel_history(
    ctx: Context, config: RunnableConfig, channels: Sequence[str]
) -> Op[Mapping[str, DeltaChannelHistory]]:
    if not channels:
        return {}
    return (yield from or_archive(ctx, lambda c: _history(c, config, channels)))


def _history(ctx: Context, config: RunnableConfig, channels: Sequence[str]) -> Op[Mapping[str, DeltaChannelHistory]]:
    thread_id, ns, checkpoint_id = target(config)
    # The thread's key (with encryption) before the walk: its depth hint reads the
    # target's metadata. Beside the lookup of the latest checkpoint when there is one.
    if not checkpoint_id:
        ctx, latest = yield from keyed_beside(ctx, [thread_id], ctx.index.latest(thread_id, ns))
        if latest is None or ctx.expired(latest):
            return {ch: {"writes": []} for ch in channels}
        checkpoint_id = latest.checkpoint_id
    else:
        ctx = yield from keyed(ctx, [thread_id])

    target_entry, chain = yield from ctx.index.ancestors(
        thread_id, ns, checkpoint_id, set(channels), _depth_hint(ctx, channels)
    )
    if target_entry is None or ctx.expired(target_entry):
        chain = []
    # An expired ancestor ends the chain, as if its entry were deleted already.
    cut = False
    for i, entry in enumerate(chain):
        if ctx.expired(entry):
            chain, cut = chain[:i], True
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
    if target_entry is not None and not ctx.expired(target_entry) and proves_items(ctx):
        # A replicated index's items arrive one by one: never a replay short of one.
        check_delta_chain(ctx, target_entry, [e for e, _ in picked], bool(remaining), cut)

    resolver = Resolver(ctx)
    for entry, _ in picked:
        resolver.add(entry)
    yield from load(resolver, _targets(picked, seeds))

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


def _targets(picked: list[tuple[CheckpointEntry, set[str]]], seeds: dict[str, CheckpointEntry]) -> list[CheckpointEntry]:
    """Resolver targets that fetch what the result needs: the seed values and
    the writes kept outside the index, nothing else.

    The resolver also fetches a target's own checkpoint object (unless its entry
    carried it), which the walk reads only where a seed value lives. So the
    targets are the seeding ancestors, each with its seeded channels only, and
    the picked writes ride on the first of them (on the oldest ancestor when
    nothing is seeded): at most one object per target more than needed, where
    the base walk's get_tuple reads every ancestor's.
    """
    if not picked:
        return []
    seeding = [e for e, _ in picked if any(s is e for s in seeds.values())]
    targets = [replace(e, loc={ch: v for ch, v in e.loc.items() if seeds.get(ch) is e}) for e in seeding]
    if not targets:
        targets = [replace(picked[-1][0], loc={})]
    targets[0].writes = [w for entry, _ in picked for w in entry.writes or ()]
    return targets


def _depth_hint(ctx: Context, channels: Sequence[str]) -> DepthHint:
    """How many ancestors the walk from a checkpoint reads, as LangGraph's
    metadata tells: ``counters_since_delta_snapshot`` holds, for each DeltaChannel
    that has not snapshotted at that checkpoint, (updates, supersteps) since its
    last snapshot, and each superstep is a checkpoint (with durability "exit"
    fewer are: then the hint is high, which costs segments, not round trips).
    None when the metadata is not in the entry or names none of ``channels``
    (other channels are seeded nearby, or the walk goes to the root)."""

    def estimate(entry: CheckpointEntry) -> int | None:
        pair = entry_metadata(ctx, entry)
        if pair is None:
            return None
        metadata = loads(ctx.serde, pair, f"metadata of checkpoint {entry.checkpoint_id}")
        counters = metadata.get("counters_since_delta_snapshot") if isinstance(metadata, dict) else None
        if not isinstance(counters, dict):
            return None
        steps = [c[1] for ch, c in counters.items() if ch in channels and isinstance(c, (list, tuple)) and len(c) == 2]
        return max((s for s in steps if isinstance(s, int)), default=None)

    return estimate
