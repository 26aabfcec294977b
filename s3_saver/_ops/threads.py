"""list_threads: the threads of a prefix, newest first, from the thread listing.

A thread is listed when its first checkpoint is written (one record, sent
beside that commit), so the listing is a range read of its own: a DynamoDB
partition, or keys under ``listing/threads/`` in manifest mode. Listing never
scans the table or lists ``live/``; each page reads the latest checkpoint of
the threads on it in one more round trip.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointMetadata

from s3_saver._format.codec import loads, typed
from s3_saver._index.terms import ThreadRef
from s3_saver._ops.context import Context, target
from s3_saver._ops.keyed import keyed
from s3_saver._ops.read import _matches
from s3_saver._ops.resolve import Resolver
from s3_saver._transport.protocol import Emit, Op
from s3_saver.errors import ConfigurationError

_PAGE = 100  # listing entries per request


@dataclass(frozen=True)
class ThreadInfo:
    """A thread as [S3Saver.list_threads()][s3_saver.S3Saver.list_threads] returns it.

    Attributes:
        thread_id: The thread's id.
        created_at: When its first checkpoint was written (UTC).
        checkpoint_id: Its latest checkpoint (root namespace).
        ts: That checkpoint's timestamp (``checkpoint["ts"]``, ISO 8601).
        metadata: That checkpoint's metadata.
        archived: The storage class of the thread's archive (``archive_thread``);
            None for a live thread.
    """

    thread_id: str
    created_at: datetime
    checkpoint_id: str
    ts: str
    metadata: CheckpointMetadata
    archived: str | None = None

    @property
    def config(self) -> RunnableConfig:
        """The config of the thread's latest checkpoint (for ``get_state``, ``invoke``...)."""
        return {"configurable": {"thread_id": self.thread_id, "checkpoint_ns": "", "checkpoint_id": self.checkpoint_id}}


def list_threads(ctx: Context, filter: dict[str, Any] | None, limit: int | None, before: Any) -> Op[None]:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ConfigurationError(f"limit must be an int >= 0 or None, got {limit!r}")
    if filter is not None and not isinstance(filter, dict):
        raise ConfigurationError(f"filter must be a dict of metadata values, got {type(filter).__name__}")
    if limit == 0:
        return
    start = yield from _start(ctx, before)
    remaining = limit
    # Pages as large as what is asked (a filter may need more of them).
    page_size = _PAGE if filter or limit is None else min(_PAGE, limit)
    cursor: Any = None
    seen: set[str] = set()
    while True:
        page, cursor = yield from ctx.index.threads(start, page_size, cursor)
        live = [(ref, e) for ref, e in page if e is not None and not ctx.expired(e) and ref.thread_id not in seen]
        # The keys of the page's threads (with encryption): one wave for all of them.
        ctx = yield from keyed(ctx, [ref.thread_id for ref, _ in live])
        resolver = Resolver(ctx)
        for _, entry in live:
            resolver.add(entry)
        # The checkpoint's time is in its object: read the ones whose index entry lacks it.
        unread = [e for _, e in live if resolver.record(e) is None]
        if unread:
            yield from resolver.fetch_records(unread)
        for ref, entry in live:
            metadata = resolver.metadata(entry)
            if not _matches(metadata, filter):
                continue
            seen.add(ref.thread_id)  # listed twice only after a race to list it: once here
            record = resolver.records[resolver.key(entry)]
            checkpoint = loads(ctx.serde, typed(record["checkpoint"]), f"checkpoint {entry.checkpoint_id}")
            yield Emit(
                ThreadInfo(
                    thread_id=ref.thread_id,
                    created_at=datetime.fromtimestamp(ref.created, timezone.utc),
                    checkpoint_id=entry.checkpoint_id,
                    ts=checkpoint.get("ts", ""),
                    metadata=metadata,
                    archived=ref.archived,
                )
            )
            if remaining is not None:
                remaining -= 1
                if remaining == 0:
                    return
        if cursor is None:
            return


def _start(ctx: Context, before: Any) -> Op[ThreadRef | None]:
    """The listing position of ``before``: a ThreadInfo, a thread id, or a config."""
    if before is None:
        return None
    if isinstance(before, ThreadInfo):
        return ThreadRef(before.thread_id, int(before.created_at.timestamp()))
    config = before if isinstance(before, dict) else {"configurable": {"thread_id": before}}
    thread_id, _, _ = target(config)
    created = yield from ctx.index.created(thread_id)
    if created is None:
        raise ConfigurationError(f"before={before!r}: thread is not in the thread listing ({ctx.index.describe()})")
    return ThreadRef(thread_id, created)
