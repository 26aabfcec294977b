"""delete_thread: tombstones first, then every object of the thread, then its index items.

A delete can be cut short at any request (a Lambda timeout, throttling), and a
run of the thread can still be in flight in another process. So:

1. The thread's tombstone goes in first, with the next delete generation.
   Writers read it beside their object writes and refuse to continue a
   history older than it (``ThreadDeletedError``).
2. Each namespace gets its own tombstone, on top of its items, before any of
   its objects or items are touched. Readers meet it first (it sorts above every
   checkpoint of the namespace) and ignore every item of an older generation:
   from then on the namespace is gone for readers, however far the delete got.
3. Objects, then the items that point at them. Every object a namespace's items
   reference is in the same namespace, so deleting a page cannot break a
   namespace that is still readable. An item whose objects are gone is still
   found (and finished) by the next ``delete_thread``.

Tombstones stay: they are a few bytes each, and they keep a late write of the
old run (one that read the tombstone before it existed) invisible. Items
written since the delete (generation >= its own) are never touched, so the
thread id can be used again at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from s3_saver._dynamodb import (
    GEN,
    IN_BLOB_OBJECT,
    PARTITION_KEY,
    SORT_KEY,
    CheckpointEntry,
    IndexEntry,
    Tombstone,
    WritesEntry,
)
from s3_saver._ops.context import Context, target
from s3_saver._protocol import Op, Sleep, backoff, request, request_one
from s3_saver._s3 import DELETE_BATCH
from s3_saver.errors import S3SaverError

BATCH_WRITE_MAX = 25  # BatchWriteItem accepts at most 25 requests
_MAX_BATCH_ATTEMPTS = 10
# Passes over the thread: the second finds items that writers which read no
# tombstone yet committed during the first; a third is for good measure.
_MAX_PASSES = 3


def delete_thread(ctx: Context, thread_id: str) -> Op[None]:
    thread_id, _, _ = target({"configurable": {"thread_id": thread_id}})
    index = ctx.index
    found, first = yield from request(
        index.get_tombstone(thread_id), index.query(thread_id, limit=1, projection=(PARTITION_KEY, SORT_KEY))
    )
    if "Item" not in found and not first.get("Items"):
        return  # nothing was ever stored: leave no trace
    previous = index.parse(found["Item"]) if "Item" in found else None
    gen = (previous.gen if isinstance(previous, Tombstone) else 0) + 1
    yield from request(index.put(index.tombstone_item(_tombstone(ctx, thread_id, None, gen))))
    ctx.locs.forget_thread(thread_id)

    buried: set[str] = set()
    for _ in range(_MAX_PASSES):
        deleted_any = False
        start: dict[str, Any] | None = None
        while True:
            page = yield from request_one(
                index.query(
                    thread_id,
                    newest_first=False,
                    start_key=start,
                    projection=(PARTITION_KEY, SORT_KEY, "loc", "token", GEN),
                )
            )
            raws = [r for r in page.get("Items", []) if _is_older(index.parse(r), gen)]
            entries = [index.parse(r) for r in raws]
            if raws:
                deleted_any = True
                namespaces = sorted({e.ns for e in entries} - buried)  # type: ignore[union-attr]
                if namespaces:
                    # Readers see these namespaces as gone before anything of them is.
                    tombs = [_tombstone(ctx, thread_id, ns, gen) for ns in namespaces]
                    yield from write_batches(
                        ctx,
                        [{"PutRequest": {"Item": index.tombstone_item(t)}} for t in tombs],
                        f"tombstones of thread {thread_id!r}",
                    )
                    buried.update(namespaces)
                yield from _delete_objects(ctx, sorted(set(object_keys(ctx, entries))), thread_id)
                yield from write_batches(
                    ctx,
                    [{"DeleteRequest": {"Key": {k: r[k] for k in (PARTITION_KEY, SORT_KEY)}}} for r in raws],
                    f"deletes of thread {thread_id!r}",
                )
            start = page.get("LastEvaluatedKey")
            if start is None:
                break
        if not deleted_any:
            break
    ctx.locs.forget_thread(thread_id)


def _tombstone(ctx: Context, thread_id: str, ns: str | None, gen: int) -> Tombstone:
    # Never given an expires_at, even with a ttl: the thread's tombstone holds
    # the generation counter, which must only grow, or a later delete would
    # miss items of a newer generation.
    return Tombstone(thread_id, ns, gen, ctx.now())


def _is_older(entry: IndexEntry | None, gen: int) -> bool:
    """A checkpoint or writes item of a generation this delete removes."""
    return isinstance(entry, (CheckpointEntry, WritesEntry)) and entry.gen < gen


def _delete_objects(ctx: Context, keys: list[str], thread_id: str) -> Op[None]:
    results = yield from request(
        *(ctx.s3.delete_many(keys[i : i + DELETE_BATCH]) for i in range(0, len(keys), DELETE_BATCH))
    )
    failed = [e for r in results for e in r.get("Errors", [])]
    if failed:
        raise S3SaverError(
            f"could not delete {len(failed)} objects of thread {thread_id!r} in s3://{ctx.s3.bucket}, "
            f"first: {failed[0].get('Key')} ({failed[0].get('Code')}: {failed[0].get('Message')})"
        )


def write_batches(ctx: Context, requests: list[dict[str, Any]], what: str) -> Op[None]:
    """BatchWriteItem in chunks of 25, re-sending what DynamoDB leaves unprocessed."""
    for attempt in range(_MAX_BATCH_ATTEMPTS):
        if not requests:
            return
        if attempt:
            yield Sleep(backoff(attempt))  # unprocessed items mean throttling
        results = yield from request(
            *(ctx.index.batch_write(requests[i : i + BATCH_WRITE_MAX]) for i in range(0, len(requests), BATCH_WRITE_MAX))
        )
        requests = [req for r in results for req in r.get("UnprocessedItems", {}).get(ctx.index.table, [])]
    if requests:
        raise S3SaverError(f"DynamoDB table {ctx.index.table} kept refusing {len(requests)} {what} (throttled)")


def object_keys(ctx: Context, entries: list[Any], thread_id: str | None = None) -> Iterator[str]:
    """Keys of the objects that index ``entries`` own (under ``thread_id`` if given)."""
    for entry in entries:
        t = entry.thread_id if thread_id is None else thread_id
        if isinstance(entry, CheckpointEntry):
            ns, cid = entry.ns, entry.checkpoint_id
            yield ctx.layout.checkpoint_key(t, ns, cid)
            for ch, (version, src, kind, _) in entry.loc.items():
                if kind == IN_BLOB_OBJECT and src == cid:
                    yield ctx.layout.blob_key(t, ns, ch, version, cid)
        elif isinstance(entry, WritesEntry):
            yield ctx.layout.writes_key(t, entry.ns, entry.checkpoint_id, entry.task_id, entry.part, entry.token)
