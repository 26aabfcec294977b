"""get_tuple and list: the index finds and orders, the resolver loads."""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple, get_checkpoint_id

from s3_saver import _keys
from s3_saver._dynamodb import CheckpointEntry, Tombstone, WritesEntry
from s3_saver._ops.context import Context, target
from s3_saver._ops.resolve import Resolver, fetch_and_build
from s3_saver._protocol import Emit, Op, request, request_one

# Resolve list results in chunks so a long history streams instead of loading at once.
_LIST_CHUNK = 100
_MAX_PAGE = 1000


def get_tuple(ctx: Context, config: RunnableConfig) -> Op[CheckpointTuple | None]:
    thread_id, ns, checkpoint_id = target(config)
    resolver = Resolver(ctx)
    if checkpoint_id:
        # The id is known: item, pending writes and the namespace's tombstone in one wave.
        get = ctx.index.get_checkpoint(thread_id, ns, checkpoint_id)
        writes = ctx.index.query(
            thread_id, begins_with=_keys.writes_sort_prefix(ns, checkpoint_id), newest_first=False
        )
        found, page, tomb = yield from request(get, writes, ctx.index.get_tombstone(thread_id, ns))
        if "Item" not in found:
            return None
        entry = ctx.index.parse(found["Item"])
        assert isinstance(entry, CheckpointEntry)
        if ctx.expired(entry) or entry.gen < _tombstone_gen(ctx, tomb):
            return None
        resolver.add(entry)
        resolver.take_writes_page(entry, page)
    else:
        latest = yield from _latest(ctx, thread_id, ns)
        if latest is None:
            return None
        entry = latest
        resolver.add(entry)
        resolver.load_writes(entry)
    (result,) = yield from fetch_and_build(resolver, [entry])
    return result


def _latest(ctx: Context, thread_id: str, ns: str) -> Op[CheckpointEntry | None]:
    """Newest checkpoint item of (thread, ns): one Query with Limit=1.

    Pending writes sort next to their checkpoint, so writes stored before their
    checkpoint (a newer id with no checkpoint item yet) can come first: they are
    skipped by narrowing the key range below that id. A namespace that was
    deleted has its tombstone on top: the search goes on below it, for items
    written since (a thread id used again), one more Query.
    """
    prefix = _keys.ns_sort_prefix(ns)
    upper: str | None = None
    start: dict[str, Any] | None = None
    min_gen = 0
    while True:
        if upper is None:
            call = ctx.index.query(thread_id, begins_with=prefix, limit=1, start_key=start, min_gen=min_gen)
        else:
            call = ctx.index.query(thread_id, between=(prefix, upper), limit=1, start_key=start, min_gen=min_gen)
        page = yield from request_one(call)
        items = page.get("Items", [])
        if not items:
            # With a generation filter, an evaluated item that did not pass
            # (left by a delete cut short) ends a page with nothing in it.
            start = page.get("LastEvaluatedKey")
            if start is None:
                return None
            continue
        entry = ctx.index.parse(items[0])
        if isinstance(entry, CheckpointEntry):
            # Items expire in the order they were written, so an expired newest
            # item means an expired thread.
            return None if ctx.expired(entry) else entry
        if isinstance(entry, Tombstone):
            min_gen, start = entry.gen, ctx.index.tombstone_key(thread_id, ns)
        else:
            assert isinstance(entry, WritesEntry)
            upper, start = _keys.checkpoint_sort_prefix(ns, entry.checkpoint_id), None


def _tombstone_gen(ctx: Context, result: dict[str, Any]) -> int:
    entry = ctx.index.parse(result["Item"]) if "Item" in result else None
    return entry.gen if isinstance(entry, Tombstone) else 0


def list_checkpoints(
    ctx: Context,
    config: RunnableConfig | None,
    filter: dict[str, Any] | None,
    before: RunnableConfig | None,
    limit: int | None,
) -> Op[None]:
    if limit is not None and limit <= 0:
        return
    before_id = get_checkpoint_id(before) if before else None
    if config is None:
        yield from _list_all(ctx, filter, before_id, limit)
        return
    thread_id, _, checkpoint_id = target(config)
    ns: str | None = config["configurable"].get("checkpoint_ns")
    if checkpoint_id:
        found = yield from get_tuple(ctx, config)
        if found and (before_id is None or checkpoint_id < before_id) and _matches(found.metadata, filter):
            yield Emit(found)
        return

    resolver = Resolver(ctx)
    remaining = limit
    start: dict[str, Any] | None = None
    held: CheckpointEntry | None = None
    # Per namespace, the generation below which items belong to a deleted thread.
    # Newest first, a namespace's tombstone comes before its items, except
    # where `before` cuts the range below it: then it is read beside the first page.
    deleted: dict[str, int] = {}
    tomb_call = ctx.index.get_tombstone(thread_id, ns) if ns is not None and before_id is not None else None
    # A checkpoint item is followed by a few write batches: `limit` bounds how
    # much of the thread the first page reads (a filter may need more pages).
    page_size = min(_MAX_PAGE, 4 * limit + 4) if limit is not None else None
    while True:
        call = _history_query(ctx, thread_id, ns, before_id, page_size, start)
        if page_size is not None:
            # Pages that did not finish the job (writes, other namespaces, `before`
            # across namespaces) double, so a call costs O(log n) queries at worst.
            page_size = min(_MAX_PAGE, page_size * 2)
        if tomb_call is not None:
            page, tomb = yield from request(call, tomb_call)
            deleted[ns] = _tombstone_gen(ctx, tomb)  # type: ignore[index]
            tomb_call = None
        else:
            page = yield from request_one(call)
        complete: list[CheckpointEntry] = []
        for raw in page.get("Items", []):
            item = ctx.index.parse(raw)
            if isinstance(item, Tombstone):
                if item.ns is not None:
                    deleted[item.ns] = item.gen
                continue
            if item is None or item.gen < deleted.get(item.ns, 0):
                continue
            if isinstance(item, CheckpointEntry):
                if held is not None:
                    complete.append(held)
                held = item
            elif held is not None and (item.ns, item.checkpoint_id) == (held.ns, held.checkpoint_id):
                # Newest first, a checkpoint's own writes follow its item.
                held.writes.append(item)
        start = page.get("LastEvaluatedKey")
        if start is None and held is not None:
            complete.append(held)
        candidates = [
            e for e in complete
            if not ctx.expired(e) and (before_id is None or e.checkpoint_id < before_id)
        ]
        for entry in candidates:
            resolver.add(entry)
        matched = yield from _filtered(resolver, candidates, filter)
        if remaining is not None:
            matched = matched[:remaining]
            remaining -= len(matched)
        for i in range(0, len(matched), _LIST_CHUNK):
            for tup in (yield from fetch_and_build(resolver, matched[i : i + _LIST_CHUNK])):
                yield Emit(tup)
        if start is None or remaining == 0:
            return


def _history_query(
    ctx: Context,
    thread_id: str,
    ns: str | None,
    before_id: str | None,
    page_size: int | None,
    start: dict[str, Any] | None,
) -> Any:
    if ns is None:
        return ctx.index.query(thread_id, limit=page_size, start_key=start)
    prefix = _keys.ns_sort_prefix(ns)
    if before_id is not None:
        # `before` is a key condition: everything below the before id's items.
        upper = _keys.checkpoint_sort_prefix(ns, before_id)
        return ctx.index.query(thread_id, between=(prefix, upper), limit=page_size, start_key=start)
    return ctx.index.query(thread_id, begins_with=prefix, limit=page_size, start_key=start)


def _list_all(
    ctx: Context, filter: dict[str, Any] | None, before_id: str | None, limit: int | None
) -> Op[None]:
    """list(None): every thread. The only operation that scans the table."""
    entries: dict[tuple[str, str, str], CheckpointEntry] = {}
    writes: list[WritesEntry] = []
    deleted: dict[tuple[str, str], int] = {}
    start: dict[str, Any] | None = None
    while True:
        page = yield from request_one(ctx.index.scan(start))
        for raw in page.get("Items", []):
            item = ctx.index.parse(raw)  # None: an item of another key prefix
            if isinstance(item, CheckpointEntry):
                entries[(item.thread_id, item.ns, item.checkpoint_id)] = item
            elif isinstance(item, WritesEntry):
                writes.append(item)
            elif isinstance(item, Tombstone) and item.ns is not None:
                deleted[(item.thread_id, item.ns)] = item.gen
        start = page.get("LastEvaluatedKey")
        if start is None:
            break
    entries = {k: e for k, e in entries.items() if e.gen >= deleted.get(k[:2], 0)}
    for w in writes:
        owner = entries.get((w.thread_id, w.ns, w.checkpoint_id))
        if owner is not None:
            owner.writes.append(w)
    ordered = sorted(
        (e for e in entries.values() if not ctx.expired(e)),
        key=lambda e: (e.thread_id, e.ns, e.checkpoint_id),
        reverse=True,
    )
    if before_id is not None:
        ordered = [e for e in ordered if e.checkpoint_id < before_id]
    resolver = Resolver(ctx)
    for entry in ordered:
        resolver.add(entry)
    matched = yield from _filtered(resolver, ordered, filter)
    if limit is not None:
        matched = matched[:limit]
    for i in range(0, len(matched), _LIST_CHUNK):
        for tup in (yield from fetch_and_build(resolver, matched[i : i + _LIST_CHUNK])):
            yield Emit(tup)


def _filtered(
    resolver: Resolver, entries: list[CheckpointEntry], filter: dict[str, Any] | None
) -> Op[list[CheckpointEntry]]:
    """Entries whose metadata matches ``filter``, judged from the index items.

    Only a checkpoint whose metadata is too large for its item needs its object
    read here; the objects of other checkpoints are never fetched to filter.
    """
    if not filter:
        return entries
    unknown = [e for e in entries if resolver.metadata(e) is None]
    if unknown:
        calls = resolver.object_calls(unknown)
        results = yield tuple(calls)
        resolver.absorb(calls, results)
    return [e for e in entries if _matches(resolver.metadata(e), filter)]


def _matches(metadata: Any, filter: dict[str, Any] | None) -> bool:
    """Each filter key is present in ``metadata`` with an equal JSON value.

    Python's ``==`` says ``True == 1`` and ``None == <missing>`` (via ``.get``);
    JSON does not: bools are not numbers, numbers compare as numbers
    (``1 == 1.0``), lists and dicts compare whole by the same rules, and
    ``{"k": None}`` matches only a present ``null``.
    """
    return not filter or all(k in metadata and _json_equal(metadata[k], v) for k, v in filter.items())


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) or isinstance(b, (int, float)):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == b
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and a.keys() == b.keys()
            and all(_json_equal(a[k], b[k]) for k in a)
        )
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (
            isinstance(a, (list, tuple))
            and isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(_json_equal(x, y) for x, y in zip(a, b))
        )
    if a is None or b is None:
        return a is None and b is None
    return bool(a == b)
