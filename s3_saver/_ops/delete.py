"""delete_thread: gone for readers and writers first, then its objects, then its entries.

A delete can be cut short at any request (a Lambda timeout, throttling), and a
run of the thread can still be in flight in another process. The index makes
the thread gone at once (tombstones, see ``Index.delete_thread``); the objects
of each part of it go before the entries that point at them, so a delete run
again finds and finishes what is left. The thread id can be used again by a
run that starts afresh.
"""

from __future__ import annotations

from typing import Any

from s3_saver._format.closure import released
from s3_saver._index.terms import Release
from s3_saver._ops.context import Context, target
from s3_saver._transport.protocol import Op, request
from s3_saver._transport.s3 import DELETE_BATCH
from s3_saver.errors import S3SaverError


def delete_thread(ctx: Context, thread_id: str, gone: frozenset[str] = frozenset()) -> Op[None]:
    """``gone``: an erase's destroyed key ids, recorded by the switch (``Index.delete_thread``)."""
    thread_id, _, _ = target({"configurable": {"thread_id": thread_id}})
    ctx.locs.forget_thread(thread_id)
    yield from ctx.index.delete_thread(thread_id, ctx.now(), deleter(ctx, thread_id), gone)
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


def deleter(ctx: Context, thread_id: str) -> Release:
    """What an index calls once entries are out of it: delete every object they
    name (``closure.closure``, archive objects included) that no entry staying
    in the index names."""

    def release(gone: list[Any], staying: list[Any]) -> Op[None]:
        yield from delete_keys(ctx, released(ctx.layout, gone, staying), f"thread {thread_id!r}")

    return release
