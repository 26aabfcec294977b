"""copy_thread: server-side copies of every object, then the index items under the new thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from s3_saver import _keys
from s3_saver._dynamodb import COPIED_FROM, PARTITION_KEY, SORT_KEY
from s3_saver._ops.context import Context, target
from s3_saver._ops.delete import object_keys, write_batches
from s3_saver._protocol import Op, request, request_one
from s3_saver.errors import ConfigurationError


def copy_thread(ctx: Context, source_thread_id: str, target_thread_id: str) -> Op[None]:
    source, _, _ = target({"configurable": {"thread_id": source_thread_id}})
    dest, _, _ = target({"configurable": {"thread_id": target_thread_id}})
    if source == dest:
        raise ConfigurationError("copy_thread needs two different thread ids")
    source_pk, dest_pk = _keys.partition_key(source), _keys.partition_key(dest)
    # The target may hold only what an interrupted copy from this same source
    # wrote (copies are marked): copying again completes it. Anything else is
    # the target's own history, which a copy must not mix with.
    page = yield from request_one(ctx.index.query(dest, limit=1, not_copied_from=source_pk))
    while not page.get("Items") and "LastEvaluatedKey" in page:
        page = yield from request_one(
            ctx.index.query(dest, not_copied_from=source_pk, start_key=page["LastEvaluatedKey"])
        )
    if page.get("Items"):
        raise ConfigurationError(
            f"thread {dest!r} already has checkpoints of its own; copy_thread copies into an "
            "empty thread (delete_thread it first)"
        )

    def copy_objects(items: list[dict[str, Any]]) -> Op[None]:
        pairs = dict(zip(object_keys(ctx, items), object_keys(ctx, items, dest)))
        yield from request(*(ctx.s3.copy(src, dst) for src, dst in pairs.items()))

    def write_items(items: list[dict[str, Any]]) -> Op[None]:
        copies = [{**i, PARTITION_KEY: {"S": dest_pk}, COPIED_FROM: {"S": source_pk}} for i in items]
        yield from write_batches(ctx, [{"PutRequest": {"Item": i}} for i in copies], f"copies into thread {dest!r}")

    # Every object before the first index item, as for every write: the target
    # shows nothing until all its objects exist, so no index item of it can
    # point at a missing object.
    yield from _each_page(ctx, source, copy_objects, projection=(PARTITION_KEY, SORT_KEY, "loc"))
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
