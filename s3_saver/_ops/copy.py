"""copy_thread: server-side copies of every object, then the index items under the new thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from s3_saver._dynamodb import (
    COPIED_FROM,
    GEN,
    PARTITION_KEY,
    SORT_KEY,
    TTL_ATTRIBUTE,
    CheckpointEntry,
    Tombstone,
    WritesEntry,
)
from s3_saver._ops.context import Context, target
from s3_saver._ops.delete import object_keys, write_batches
from s3_saver._ops.put import _generation
from s3_saver._protocol import Op, request, request_one
from s3_saver._s3 import copy_immutable
from s3_saver.errors import ConfigurationError


def copy_thread(ctx: Context, source_thread_id: str, target_thread_id: str) -> Op[None]:
    source, _, _ = target({"configurable": {"thread_id": source_thread_id}})
    dest, _, _ = target({"configurable": {"thread_id": target_thread_id}})
    if source == dest:
        raise ConfigurationError("copy_thread needs two different thread ids")
    index = ctx.index
    source_pk, dest_pk = index.pk(source), index.pk(dest)
    # The target may hold only what an interrupted copy from this same source
    # wrote (copies are marked): copying again completes it. Anything else is
    # the target's own history, which a copy must not mix with. Tombstones of
    # a deleted target do not count; its delete generation goes on the copies.
    tomb_call = index.get_tombstone(dest)
    page, tomb = yield from request(index.query(dest, limit=1, not_copied_from=source_pk), tomb_call)
    while not page.get("Items") and "LastEvaluatedKey" in page:
        page = yield from request_one(
            index.query(dest, not_copied_from=source_pk, start_key=page["LastEvaluatedKey"])
        )
    if page.get("Items"):
        raise ConfigurationError(
            f"thread {dest!r} already has checkpoints of its own in table {index.table}; copy_thread "
            "copies into an empty thread (delete_thread it first)"
        )
    dest_gen = _generation(tomb_call, tomb)

    # Exactly the items whose objects the first pass copied get copied: an item
    # committed to the source meanwhile is left out, never copied without its
    # objects. Deleted and expired checkpoints (and their writes) are skipped.
    copied: set[str] = set()
    deleted: dict[str, int] = {}
    kept: set[tuple[str, str]] = set()

    def copy_objects(raws: list[dict[str, Any]]) -> Op[None]:
        chosen = []
        for raw in raws:
            entry = index.parse(raw)
            if isinstance(entry, Tombstone):
                if entry.ns is not None:
                    deleted[entry.ns] = entry.gen  # newest first: before its namespace's items
                continue
            if isinstance(entry, CheckpointEntry):
                if entry.gen < deleted.get(entry.ns, 0) or ctx.expired(entry):
                    continue
                kept.add((entry.ns, entry.checkpoint_id))
            elif not isinstance(entry, WritesEntry) or (entry.ns, entry.checkpoint_id) not in kept:
                continue  # newest first, a checkpoint's item comes before its writes
            copied.add(raw[SORT_KEY]["S"])
            chosen.append(entry)
        pairs = dict(zip(object_keys(ctx, chosen), object_keys(ctx, chosen, dest)))
        yield from copy_immutable(ctx.s3, pairs)

    def write_items(raws: list[dict[str, Any]]) -> Op[None]:
        copies = []
        for raw in raws:
            if raw[SORT_KEY]["S"] not in copied:
                continue
            item = {**raw, PARTITION_KEY: {"S": dest_pk}, COPIED_FROM: {"S": source_pk}}
            item.pop(GEN, None)
            if dest_gen:
                item[GEN] = {"N": str(dest_gen)}
            copies.append(item)
        yield from write_batches(ctx, [{"PutRequest": {"Item": i}} for i in copies], f"copies into thread {dest!r}")

    # Every object before the first index item, as for every write: the target
    # shows nothing until all its objects exist, so no index item of it can
    # point at a missing object.
    projection = (PARTITION_KEY, SORT_KEY, "loc", "token", GEN, TTL_ATTRIBUTE)
    yield from _each_page(ctx, source, copy_objects, projection=projection)
    # Newest first: a copy cut short here leaves the target's latest state
    # right (and its history short) until copy_thread is called again.
    yield from _each_page(ctx, source, write_items)


def _each_page(
    ctx: Context,
    thread_id: str,
    handle: Callable[[list[dict[str, Any]]], Op[None]],
    projection: tuple[str, ...] | None = None,
) -> Op[None]:
    start: dict[str, Any] | None = None
    while True:
        page = yield from request_one(ctx.index.query(thread_id, start_key=start, projection=projection))
        yield from handle(page.get("Items", []))
        start = page.get("LastEvaluatedKey")
        if start is None:
            return
