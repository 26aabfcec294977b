"""copy_thread: server-side copies of every object, then the index entries under the new thread."""

from __future__ import annotations

from s3_saver._index.base import IndexEntry
from s3_saver._ops.context import Context, target
from s3_saver._ops.delete import object_keys
from s3_saver._protocol import Op
from s3_saver._s3 import copy_immutable
from s3_saver.errors import ConfigurationError


def copy_thread(ctx: Context, source_thread_id: str, target_thread_id: str) -> Op[None]:
    source, _, _ = target({"configurable": {"thread_id": source_thread_id}})
    dest, _, _ = target({"configurable": {"thread_id": target_thread_id}})
    if source == dest:
        raise ConfigurationError("copy_thread needs two different thread ids")

    def copy_objects(entries: list[IndexEntry]) -> Op[None]:
        # Objects hold no thread id (the key does): copied server-side, never
        # over an existing key (see copy_immutable).
        pairs = dict(zip(object_keys(ctx, entries), object_keys(ctx, entries, dest)))
        yield from copy_immutable(ctx.s3, pairs)

    yield from ctx.index.copy_thread(source, dest, copy_objects, ctx.expired, ctx.now())
