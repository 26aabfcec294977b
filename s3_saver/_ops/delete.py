"""delete_thread: every object the index points at, then the index items."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from s3_saver._dynamodb import IN_BLOB_OBJECT, PARTITION_KEY, SORT_KEY, CheckpointEntry, parse_item
from s3_saver._ops.context import Context, target
from s3_saver._protocol import Op, Sleep, backoff, request, request_one
from s3_saver._s3 import DELETE_BATCH
from s3_saver.errors import S3SaverError

BATCH_WRITE_MAX = 25  # BatchWriteItem accepts at most 25 requests
_MAX_BATCH_ATTEMPTS = 10


def delete_thread(ctx: Context, thread_id: str) -> Op[None]:
    thread_id, _, _ = target({"configurable": {"thread_id": thread_id}})
    start: dict[str, Any] | None = None
    while True:
        page = yield from request_one(
            ctx.index.query(thread_id, newest_first=False, start_key=start, projection=(PARTITION_KEY, SORT_KEY, "loc"))
        )
        items = page.get("Items", [])
        objects = sorted(set(object_keys(ctx, items)))
        # Objects first, index items last: a delete cut short leaves index items
        # that a retry finds again, never objects no index can reach.
        results = yield from request(
            *(ctx.s3.delete_many(objects[i : i + DELETE_BATCH]) for i in range(0, len(objects), DELETE_BATCH))
        )
        failed = [e for r in results for e in r.get("Errors", [])]
        if failed:
            raise S3SaverError(
                f"could not delete {len(failed)} objects of thread {thread_id!r}, first: "
                f"{failed[0].get('Key')} ({failed[0].get('Code')}: {failed[0].get('Message')})"
            )
        yield from write_batches(
            ctx,
            [{"DeleteRequest": {"Key": {k: i[k] for k in (PARTITION_KEY, SORT_KEY)}}} for i in items],
            f"deletes of thread {thread_id!r}",
        )
        start = page.get("LastEvaluatedKey")
        if start is None:
            break
    ctx.locs.forget_thread(thread_id)


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
        raise S3SaverError(f"DynamoDB kept refusing {len(requests)} {what} (throttled)")


def object_keys(ctx: Context, items: list[dict[str, Any]], thread_id: str | None = None) -> Iterator[str]:
    """Keys of the objects that index ``items`` own (under ``thread_id`` if given)."""
    for raw in items:
        entry = parse_item(raw)
        t = entry.thread_id if thread_id is None else thread_id
        if isinstance(entry, CheckpointEntry):
            ns, cid = entry.ns, entry.checkpoint_id
            yield ctx.layout.checkpoint_key(t, ns, cid)
            for ch, (version, src, kind, _) in entry.loc.items():
                if kind == IN_BLOB_OBJECT and src == cid:
                    yield ctx.layout.blob_key(t, ns, ch, version, cid)
        else:
            yield ctx.layout.writes_key(t, entry.ns, entry.checkpoint_id, entry.seq, entry.task_id)

