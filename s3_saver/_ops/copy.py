"""copy_thread: a server-side copy of every object, then the index items under the new thread."""

from __future__ import annotations

from typing import Any

from s3_saver import _keys
from s3_saver._dynamodb import PARTITION_KEY
from s3_saver._ops.context import Context, target
from s3_saver._ops.delete import object_keys, write_batches
from s3_saver._protocol import Op, request, request_one
from s3_saver.errors import ConfigurationError


def copy_thread(ctx: Context, source_thread_id: str, target_thread_id: str) -> Op[None]:
    source, _, _ = target({"configurable": {"thread_id": source_thread_id}})
    dest, _, _ = target({"configurable": {"thread_id": target_thread_id}})
    if source == dest:
        raise ConfigurationError("copy_thread needs two different thread ids")
    dest_pk = _keys.partition_key(dest)
    occupied = yield from request_one(ctx.index.query(dest, limit=1))
    if occupied.get("Items"):
        # Objects are immutable: copying over a thread that has data could only
        # fail half-way or overwrite.
        raise ConfigurationError(
            f"thread {dest!r} already has checkpoints; copy_thread copies into an empty thread "
            "(delete_thread it first)"
        )
    start: dict[str, Any] | None = None
    while True:
        page = yield from request_one(ctx.index.query(source, newest_first=False, start_key=start))
        items = page.get("Items", [])
        pairs = list(zip(object_keys(ctx, items), object_keys(ctx, items, dest)))
        # Objects first, index items last, as for every write.
        yield from request(*(ctx.s3.copy(src, dst) for src, dst in dict(pairs).items()))
        copies = [{**item, PARTITION_KEY: {"S": dest_pk}} for item in items]
        yield from write_batches(
            ctx, [{"PutRequest": {"Item": i}} for i in copies], f"copies into thread {dest!r}"
        )
        start = page.get("LastEvaluatedKey")
        if start is None:
            return

