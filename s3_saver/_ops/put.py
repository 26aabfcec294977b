"""put and put_writes: objects first, index item last (the commit point)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ormsgpack
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    get_checkpoint_metadata,
)

from s3_saver import _keys
from s3_saver._codec import BLOB_FORMAT, CHECKPOINT_FORMAT, WRITES_FORMAT, pack
from s3_saver._dynamodb import (
    IN_BLOB_OBJECT,
    IN_CHECKPOINT_OBJECT,
    ITEM_BUDGET,
    CheckpointEntry,
    WritesEntry,
    checkpoint_item,
    parse_item,
    writes_item,
)
from s3_saver._ops.context import Context, Loc, target
from s3_saver._protocol import Op, raise_failure, request
from s3_saver._s3 import put_immutable
from s3_saver.errors import CheckpointTooLargeError

# Room for keys, parent id and attribute names next to ``loc`` in the item.
_LOC_HEADROOM = 16 * 1024


def put(
    ctx: Context,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
) -> Op[RunnableConfig]:
    thread_id, ns, parent_id = target(config)
    checkpoint_id = checkpoint["id"]
    values = checkpoint["channel_values"]
    now = ctx.now()
    # Every key is built (and length-checked) before the first byte is written.
    checkpoint_key = ctx.layout.checkpoint_key(thread_id, ns, checkpoint_id)
    _keys.partition_key(thread_id)
    _keys.checkpoint_sort_key(ns, checkpoint_id)
    loc_estimate = len(ormsgpack.packb({ch: [v, checkpoint_id, 1, now] for ch, v in checkpoint["channel_versions"].items()}))
    if loc_estimate + _LOC_HEADROOM > ITEM_BUDGET:
        raise CheckpointTooLargeError(
            f"checkpoint {checkpoint_id} has {len(checkpoint['channel_versions'])} channels; "
            f"their index entry (~{loc_estimate} bytes) exceeds DynamoDB's 400 KB item limit"
        )

    # Channels whose value this checkpoint stores: new versions, plus unchanged
    # channels whose stored copy cannot be found or is about to expire.
    fresh: dict[str, Any] = {ch: new_versions[ch] for ch in new_versions if ch in values}
    carried = {ch: v for ch, v in checkpoint["channel_versions"].items() if ch not in new_versions}
    loc: Loc = {}
    parent_loc = ctx.locs.get((thread_id, ns, parent_id)) if parent_id and carried else {}
    if parent_loc is not None:
        _carry(ctx, carried, parent_loc, values, now, loc, fresh)

    serialized = {ch: ctx.serde.dumps_typed(values[ch]) for ch in fresh}
    inline, blobs = _split(ctx, serialized, loc_estimate)
    record = {
        # The thread and namespace are in the key, not the body, so copy_thread
        # can copy objects server-side.
        "format": CHECKPOINT_FORMAT,
        "checkpoint_id": checkpoint_id,
        "parent_checkpoint_id": parent_id,
        "checkpoint": list(ctx.serde.dumps_typed({k: v for k, v in checkpoint.items() if k != "channel_values"})),
        "metadata": list(ctx.serde.dumps_typed(get_checkpoint_metadata(config, metadata))),
        "values": {ch: [fresh[ch], *serialized[ch]] for ch in inline},
        "blobs": {ch: fresh[ch] for ch in blobs},
    }
    body = pack(record)
    objects = {checkpoint_key: body}
    objects.update(_blob_objects(ctx, thread_id, ns, checkpoint_id, {ch: (fresh[ch], serialized[ch]) for ch in blobs}))
    for ch in inline:
        loc[ch] = (fresh[ch], checkpoint_id, IN_CHECKPOINT_OBJECT, now)
    for ch in blobs:
        loc[ch] = (fresh[ch], checkpoint_id, IN_BLOB_OBJECT, now)

    # A process that has not seen the parent (cold start, another writer) reads
    # its item in the same round trip as the object writes: the common case, a
    # parent that accounts for every unchanged channel, costs no extra trip.
    fetch_parent = parent_loc is None
    extra = (ctx.index.get_checkpoint(thread_id, ns, parent_id),) if fetch_parent else ()  # type: ignore[arg-type]
    extra_results = yield from put_immutable(ctx.s3, objects, extra)
    if fetch_parent:
        parent_loc = _loc_of(extra[0], extra_results[0])
        late: dict[str, Any] = {}
        _carry(ctx, carried, parent_loc, values, now, loc, late)
        if late:
            # Unchanged channels the parent does not account for (parent gone or
            # unknown) or whose stored copy is past half the ttl: store them now,
            # still before the index item.
            late_blobs = {ch: (late[ch], ctx.serde.dumps_typed(values[ch])) for ch in late}
            yield from put_immutable(ctx.s3, _blob_objects(ctx, thread_id, ns, checkpoint_id, late_blobs))
            for ch in late:
                loc[ch] = (late[ch], checkpoint_id, IN_BLOB_OBJECT, now)

    entry = CheckpointEntry(
        thread_id=thread_id,
        ns=ns,
        checkpoint_id=checkpoint_id,
        parent_id=parent_id,
        loc=loc,
        body=body,
        metadata=tuple(record["metadata"]),  # type: ignore[arg-type]
        expires_at=_expiry(ctx, loc, now),
    )
    yield from request(ctx.index.put(checkpoint_item(entry)))
    ctx.locs.put((thread_id, ns, checkpoint_id), loc)
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}


def put_writes(
    ctx: Context,
    config: RunnableConfig,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
) -> Op[None]:
    thread_id, ns, checkpoint_id = target(config, need_checkpoint_id=True)
    assert checkpoint_id is not None
    seq = ctx.seq.next()
    key = ctx.layout.writes_key(thread_id, ns, checkpoint_id, seq, task_id)
    _keys.writes_sort_key(ns, checkpoint_id, seq, task_id)
    body = pack(
        {
            "format": WRITES_FORMAT,
            "checkpoint_id": checkpoint_id,
            "task_id": task_id,
            "task_path": task_path,
            "seq": seq,
            # Special channels get their fixed negative index: they are
            # last-write-wins, regular writes first-write-wins (see _read).
            "writes": [
                [WRITES_IDX_MAP.get(channel, idx), channel, *ctx.serde.dumps_typed(value)]
                for idx, (channel, value) in enumerate(writes)
            ],
        }
    )
    yield from put_immutable(ctx.s3, {key: body})
    entry = WritesEntry(thread_id, ns, checkpoint_id, seq, task_id, body)
    expires_at = ctx.now() + ctx.ttl_seconds if ctx.ttl_seconds else None
    yield from request(ctx.index.put(writes_item(entry, expires_at)))


# -- helpers ---------------------------------------------------------------------
def _carry(
    ctx: Context,
    carried: dict[str, Any],
    parent_loc: Loc,
    values: dict[str, Any],
    now: int,
    loc: Loc,
    fresh: dict[str, Any],
) -> None:
    """Point unchanged channels at their stored copy, or mark them to store again."""
    refresh_before = now - ctx.ttl_seconds // 2 if ctx.ttl_seconds else None
    for ch, version in carried.items():
        known = parent_loc.get(ch)
        if known is not None and known[0] == version and (refresh_before is None or known[3] >= refresh_before):
            loc[ch] = known
        elif ch in values:
            fresh[ch] = version


def _split(
    ctx: Context, serialized: dict[str, tuple[str, bytes]], loc_estimate: int
) -> tuple[list[str], list[str]]:
    """Which fresh values go inside the checkpoint object, which into blob objects.

    Small values ride in the checkpoint object (and so in its index item); the
    largest move out until the item fits DynamoDB's limit.
    """
    inline = sorted((ch for ch, (_, b) in serialized.items() if len(b) <= ctx.inline_threshold),
                    key=lambda ch: len(serialized[ch][1]))
    blobs = [ch for ch in serialized if ch not in inline]
    room = ITEM_BUDGET - loc_estimate - _LOC_HEADROOM
    total = sum(len(serialized[ch][1]) + len(ch) + 48 for ch in inline)
    while inline and total > room:
        ch = inline.pop()
        total -= len(serialized[ch][1]) + len(ch) + 48
        blobs.append(ch)
    return inline, blobs


def _blob_objects(
    ctx: Context, thread_id: str, ns: str, checkpoint_id: str, blobs: dict[str, tuple[Any, tuple[str, bytes]]]
) -> dict[str, bytes]:
    return {
        ctx.layout.blob_key(thread_id, ns, ch, version, checkpoint_id): pack(
            {"format": BLOB_FORMAT, "channel": ch, "version": version, "type": t, "data": data}
        )
        for ch, (version, (t, data)) in blobs.items()
    }


def _loc_of(call: Any, result: Any) -> Loc:
    if isinstance(result, BaseException):
        raise_failure(call, result)
    if "Item" not in result:
        return {}
    entry = parse_item(result["Item"])
    assert isinstance(entry, CheckpointEntry)
    return entry.loc


def _expiry(ctx: Context, loc: Loc, now: int) -> int | None:
    # An index item must expire no later than the oldest object it points at,
    # which a lifecycle rule of the same length deletes.
    if not ctx.ttl_seconds:
        return None
    return min((t for _, _, _, t in loc.values()), default=now) + ctx.ttl_seconds

