"""delete_thread: gone for readers and writers first, then its objects, then its entries.

A delete can be cut short at any request (a Lambda timeout, throttling), and a
run of the thread can still be in flight in another process. The index makes
the thread gone at once (tombstones, see ``Index.delete_thread``); the objects
of each part of it go before the entries that point at them, so a delete run
again finds and finishes what is left. The thread id can be used again by a
run that starts afresh.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from s3_saver._index.base import IN_BLOB_OBJECT, ArchiveRef, CheckpointEntry, IndexEntry, WritesEntry
from s3_saver._ops.context import Context, target
from s3_saver._protocol import Op, request
from s3_saver._s3 import DELETE_BATCH
from s3_saver.errors import S3SaverError


def delete_thread(ctx: Context, thread_id: str) -> Op[None]:
    thread_id, _, _ = target({"configurable": {"thread_id": thread_id}})
    ctx.locs.forget_thread(thread_id)

    def delete_objects(entries: list[IndexEntry]) -> Op[None]:
        yield from delete_keys(ctx, sorted(set(object_keys(ctx, entries))), f"thread {thread_id!r}")

    yield from ctx.index.delete_thread(thread_id, ctx.now(), delete_objects)
    ctx.locs.forget_thread(thread_id)


def delete_keys(ctx: Context, keys: list[str], what: str) -> Op[None]:
    """DeleteObjects in chunks of 1,000, all in one round trip."""
    if not keys:
        return
    results = yield from request(
        *(ctx.s3.delete_many(keys[i : i + DELETE_BATCH]) for i in range(0, len(keys), DELETE_BATCH))
    )
    failed = [e for r in results for e in r.get("Errors", [])]
    if failed:
        raise S3SaverError(
            f"could not delete {len(failed)} objects of {what} in s3://{ctx.s3.bucket}, "
            f"first: {failed[0].get('Key')} ({failed[0].get('Code')}: {failed[0].get('Message')})"
        )


def object_keys(ctx: Context, entries: list[Any], thread_id: str | None = None) -> Iterator[str]:
    """Keys of the objects that index ``entries`` own (under ``thread_id`` if given)."""
    for entry in entries:
        if isinstance(entry, ArchiveRef):
            yield entry.key  # an archive object (a deleted thread's, or one a restore left)
            continue
        t = entry.thread_id if thread_id is None else thread_id
        if isinstance(entry, CheckpointEntry):
            ns, cid = entry.ns, entry.checkpoint_id
            yield ctx.layout.checkpoint_key(t, ns, cid)
            for ch, (version, src, kind, _) in entry.loc.items():
                if kind == IN_BLOB_OBJECT and src == cid:  # a blob this checkpoint wrote
                    yield ctx.layout.blob_key(t, ns, ch, version, cid)
        elif isinstance(entry, WritesEntry):
            yield ctx.layout.writes_key(t, entry.ns, entry.checkpoint_id, entry.task_id, entry.part, entry.token)
