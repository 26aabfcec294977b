"""get_tuple and list: the index finds and orders, the resolver loads."""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple, get_checkpoint_id

from s3_saver._format.entries import CheckpointEntry
from s3_saver._ops.archived import or_archive
from s3_saver._ops.context import Context, target
from s3_saver._ops.keyed import keyed, keyed_beside
from s3_saver._ops.lagged import (
    Parents,
    Tail,
    build_listed,
    newest_complete,
    nothing_yet,
    proves_items,
)
from s3_saver._ops.resolve import Resolver, fetch_and_build
from s3_saver._transport.protocol import Emit, Op
from s3_saver.errors import MissingObjectError

# Resolve list results in chunks so a long history streams instead of loading at once.
_LIST_CHUNK = 100
_MAX_PAGE = 1000


# Reads that meet an object the index named a moment before and that is gone
# (an archive's or a prune's cleanup, a delete, finished between the two round
# trips) read the index again: it says where the thread is now.
_READ_ATTEMPTS = 3


def get_tuple(ctx: Context, config: RunnableConfig) -> Op[CheckpointTuple | None]:
    for attempt in range(_READ_ATTEMPTS):
        try:
            return (yield from or_archive(ctx, lambda c: _get_tuple(c, config)))
        except MissingObjectError:
            if attempt == _READ_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _get_tuple(ctx: Context, config: RunnableConfig) -> Op[CheckpointTuple | None]:
    thread_id, ns, checkpoint_id = target(config)
    lookup = ctx.index.get(thread_id, ns, checkpoint_id) if checkpoint_id else ctx.index.latest(thread_id, ns)
    # The thread's key (with encryption) in the same waves as the index's answer.
    ctx, entry = yield from keyed_beside(ctx, [thread_id], lookup)
    # Entries expire in the order they were written, so an expired newest entry
    # means an expired thread.
    if entry is None or ctx.expired(entry):
        if ctx.replica is not None and not checkpoint_id:
            nothing_yet(ctx, thread_id, ns)
        return None
    if ctx.replica is not None:
        return (yield from newest_complete(ctx, entry, by_id=bool(checkpoint_id)))
    resolver = Resolver(ctx)
    resolver.add(entry)
    (result,) = yield from fetch_and_build(resolver, [entry])
    return result


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
    # Read again from the index when an object it named went meanwhile (see
    # _READ_ATTEMPTS): from the start if nothing was returned yet, else, within
    # one namespace (newest first), after the last checkpoint returned.
    one_ns = config["configurable"].get("checkpoint_ns") is not None
    emitted = 0
    for attempt in range(_READ_ATTEMPTS):
        left = None if limit is None else limit - emitted
        op = or_archive(ctx, lambda c: _list_thread(c, config, filter, before_id, left))
        reply: Any = None
        try:
            while True:
                try:
                    step = op.send(reply)
                except StopIteration:
                    return
                if isinstance(step, Emit):
                    emitted += 1
                    before_id = step.value.config["configurable"]["checkpoint_id"]
                reply = yield step
        except MissingObjectError:
            if attempt == _READ_ATTEMPTS - 1 or (emitted and not one_ns):
                raise


def _list_thread(
    ctx: Context, config: RunnableConfig, filter: dict[str, Any] | None, before_id: str | None, limit: int | None
) -> Op[None]:
    thread_id, _, checkpoint_id = target(config)
    ns: str | None = config["configurable"].get("checkpoint_ns")
    if checkpoint_id:
        found = yield from _get_tuple(ctx, config)
        if found and (before_id is None or checkpoint_id < before_id) and _matches(found.metadata, filter):
            yield Emit(found)
        return

    remaining = limit
    cursor: Any = None
    # A replica's newest checkpoints may be passed over (lag): count what is built.
    tail = Tail() if ctx.replica is not None else None
    # A replica's index may miss items: what is served has no hole (see lagged).
    parents = Parents() if proves_items(ctx) else None
    # A checkpoint is followed by a few write parts: `limit` bounds how much of
    # the thread the first page reads (a filter may need more pages).
    page_size = min(_MAX_PAGE, 4 * limit + 4) if limit is not None else None
    # The thread's key (with encryption) in the same waves as the first page.
    first = ctx.index.history(thread_id, ns, before_id, page_size, cursor)
    ctx, (complete, cursor) = yield from keyed_beside(ctx, [thread_id], first)
    resolver = Resolver(ctx)
    while True:
        if page_size is not None:
            # Pages that did not finish the job (writes, other namespaces, `before`
            # across namespaces) double, so a call costs O(log n) pages at worst.
            page_size = min(_MAX_PAGE, page_size * 2)
        candidates = [
            e for e in complete
            if not ctx.expired(e) and (before_id is None or e.checkpoint_id < before_id)
        ]
        if parents is not None:
            parents.listed(complete)
        for entry in candidates:
            resolver.add(entry)
        matched = yield from _filtered(resolver, candidates, filter)
        if remaining is not None:
            matched = matched[:remaining]
        for i in range(0, len(matched), _LIST_CHUNK):
            chunk = matched[i : i + _LIST_CHUNK]
            if tail is None:
                built = yield from fetch_and_build(resolver, chunk)
            else:
                # A replica's newest checkpoints may be passed over: what is built counts.
                built = yield from build_listed(ctx, resolver, chunk, tail)
            if remaining is not None:
                built = built[:remaining]
                remaining -= len(built)
            if parents is not None:
                parents.serve(ctx, _served(chunk, built))
            for tup in built:
                yield Emit(tup)
            if remaining == 0:
                break
        if cursor is None or remaining == 0:
            if parents is not None and remaining != 0:
                parents.serve(ctx, [], ended=True)
            if tail is not None and ctx.replica is not None:
                ctx.replica.tell(None, None, tail.skipped)
            return
        complete, cursor = yield from ctx.index.history(thread_id, ns, before_id, page_size, cursor)


def _list_all(
    ctx: Context, filter: dict[str, Any] | None, before_id: str | None, limit: int | None
) -> Op[None]:
    """list(None): every thread. The only read that is not bounded by a thread."""
    entries = yield from ctx.index.all_threads()
    ctx = yield from keyed(ctx, [e.thread_id for e in entries])
    ordered = sorted(
        (e for e in entries if not ctx.expired(e)),
        key=lambda e: (e.thread_id, e.ns, e.checkpoint_id),
        reverse=True,
    )
    if before_id is not None:
        ordered = [e for e in ordered if e.checkpoint_id < before_id]
    resolver = Resolver(ctx)
    for entry in ordered:
        resolver.add(entry)
    matched = yield from _filtered(resolver, ordered, filter)
    if ctx.replica is not None:
        # Lag-safe thread by thread: one thread's unreplicated newest checkpoints
        # are passed over as list(thread) does, not an error for every thread.
        emitted = 0
        for thread_id in dict.fromkeys(e.thread_id for e in matched):
            tail = Tail()
            parents = Parents() if proves_items(ctx) else None
            if parents is not None:
                parents.listed([e for e in entries if e.thread_id == thread_id])
            mine = [e for e in matched if e.thread_id == thread_id]
            for i in range(0, len(mine), _LIST_CHUNK):
                chunk = mine[i : i + _LIST_CHUNK]
                built = yield from build_listed(ctx, resolver, chunk, tail)
                if parents is not None:
                    parents.serve(ctx, _served(chunk, built), ended=True)
                for tup in built:
                    if limit is not None and emitted >= limit:
                        return
                    emitted += 1
                    yield Emit(tup)
        return
    if limit is not None:
        matched = matched[:limit]
    for i in range(0, len(matched), _LIST_CHUNK):
        for tup in (yield from fetch_and_build(resolver, matched[i : i + _LIST_CHUNK])):
            yield Emit(tup)


def _served(chunk: list[CheckpointEntry], built: list[CheckpointTuple]) -> list[CheckpointEntry]:
    """The entries of ``chunk`` that ``built`` holds (a replica passes some over)."""
    ids = {(t.config["configurable"]["checkpoint_ns"], t.config["configurable"]["checkpoint_id"]) for t in built}
    return [e for e in chunk if (e.ns, e.checkpoint_id) in ids]


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
        yield from resolver.fetch_records(unknown)
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
