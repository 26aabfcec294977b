"""put_writes: a task's pending writes, objects first, index entries last (the commit point).

Named steps, as ``put``'s: ``_draft_writes`` (the parts, no request), ``_send_writes``
(round trip 1: the objects beside the index's ``prepare``; an archived thread restored,
a deleted generation refused), ``_commit_writes`` (round trip 2, the commit point, again
after a refusal), ``_release`` (what no entry names any more).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import WRITES_IDX_MAP

from s3_saver._format import keys as _keys
from s3_saver._format.codec import WRITES_FORMAT, pack
from s3_saver._format.entries import REGULAR_PART, SPECIAL_PART, WritesEntry
from s3_saver._format.keys import new_token
from s3_saver._index.terms import Fenced, WritesOutcome
from s3_saver._ops.commit import (
    _MAX_FENCED,
    MAX_REKEYS,
    KeyGone,
    _busy,
    _fenced,
    _joins,
    _rekeyed_too_often,
    _restore_first,
    _take_back,
    _writes_deleted,
    key_gone,
)
from s3_saver._ops.context import Context, target
from s3_saver._ops.keyed import keyed, rekeyed
from s3_saver._transport.protocol import Op, gather
from s3_saver._transport.s3 import put_immutable


def put_writes(
    ctx: Context,
    config: RunnableConfig,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
) -> Op[None]:
    """Store a task's writes: its regular writes as one part, each special channel as its own.

    Which write wins follows the order in which the index commits them, never a
    clock: the regular part is written only if no part of the same extent
    exists (first wins, a retried task changes nothing), a special channel's
    slot is overwritten (last wins). LangGraph only ever writes a task's
    regular writes again as the same list or that list extended (the null
    task's writes accumulate), so parts of different extents agree on the slots
    they share, and readers take the shortest part first.
    """
    thread_id, ns, checkpoint_id = target(config, need_checkpoint_id=True)
    assert checkpoint_id is not None
    own = (thread_id, ns, checkpoint_id)
    # The thread's key before anything is sealed (writes may come before the first put).
    ctx = yield from keyed(ctx, [thread_id], create=True)
    for _ in range(MAX_REKEYS):
        objects, entries = _draft_writes(ctx, own, writes, task_id, task_path)
        if not entries:
            return
        gen = yield from _send_writes(ctx, own, objects)
        try:
            outcome = yield from _commit_writes(ctx, own, entries, objects, gen)
        except KeyGone:
            # The key this process cached was destroyed by another process's erase:
            # sealed again (new objects, a new token) under the key read now.
            ctx = yield from rekeyed(ctx, thread_id)
            continue
        yield from _release(ctx, own, task_id, outcome)
        return
    raise _rekeyed_too_often(thread_id)


def _draft_writes(
    ctx: Context, own: tuple[str, str, str], writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
) -> tuple[dict[str, bytes], list[WritesEntry]]:
    """The parts' objects and entries: no request yet."""
    thread_id, ns, checkpoint_id = own
    parts = _write_parts(ctx, writes)
    # One token per call: a retried request of this call meets its own object
    # and its own index item, a task run again writes new ones. (Never drawn
    # from uuid.uuid4, which a user's tests may patch: see keys.new_token.)
    token = new_token()
    objects: dict[str, bytes] = {}
    entries: list[WritesEntry] = []
    for part, rows in parts.items():
        key = ctx.layout.writes_key(thread_id, ns, checkpoint_id, task_id, part, token)
        _keys.writes_sort_key(ns, checkpoint_id, task_id, part)
        record = {
            "format": WRITES_FORMAT,
            "checkpoint_id": checkpoint_id,
            "task_id": task_id,
            "task_path": task_path,
            "part": part,
            "writes": rows,
        }
        if len(parts) > 1:
            # Each part names the call's whole set: the objects are written in one
            # wave, so a cut can leave some of them without the rest (and without
            # the commit). A rebuild from the bucket takes a call only when its set
            # is there (see rebuild._whole_calls); a one-part call needs no name.
            record["parts"] = sorted(parts)
        # Sealed for its own key: the index entry carries the same bytes.
        body = ctx.sealer.seal(thread_id, key, pack(record))
        objects[key] = body
        entries.append(WritesEntry(thread_id, ns, checkpoint_id, task_id, part, token, body))
    return objects, entries


def _send_writes(ctx: Context, own: tuple[str, str, str], objects: dict[str, bytes]) -> Op[int]:
    """Round trip 1: the objects beside the index's prepare. Returns the generation
    the writes go into; refuses writes a delete left behind."""
    thread_id, ns, checkpoint_id = own
    # A checkpoint this process wrote or read carries its generation: the
    # commit's fence checks it, nothing is read first (see put). LangGraph sends
    # a step's writes while the put of their checkpoint may still be under way
    # (or not begun): then the thread's generation as this process last saw it
    # stands in. Made in an older generation than the thread has now, or by a
    # process that never saw the thread once it has been deleted, they go into
    # the new one only with their checkpoint (_joins).
    known = ctx.locs.get(own)
    made_in = known[1] if known is not None else ctx.locs.thread_gen(thread_id)
    _, prepared = yield from gather(
        put_immutable(ctx.s3, objects, same=ctx.sealer.same(thread_id)), ctx.index.prepare(thread_id, ns, None, None, made_in)
    )
    if prepared.archive is not None:
        yield from _restore_first(ctx, thread_id, prepared.archive, list(objects))
        prepared = yield from ctx.index.prepare(thread_id, ns, None)
    gen = prepared.gen
    if gen and (made_in is None or made_in < gen) and not (yield from _joins(ctx, own, gen)):
        yield from _take_back(ctx, list(objects))
        raise _writes_deleted(ctx, thread_id, checkpoint_id)
    return gen


def _commit_writes(
    ctx: Context, own: tuple[str, str, str], entries: list[WritesEntry], objects: dict[str, bytes], gen: int
) -> Op[WritesOutcome]:
    """Round trip 2, the commit point: objects first, index entries last."""
    thread_id, _, _ = own
    expires_at = ctx.now() + ctx.ttl_seconds if ctx.ttl_seconds else None
    for entry in entries:
        entry.gen, entry.expires_at = gen, expires_at
    # The slots are known before the commit returns: LangGraph may put the next
    # checkpoint, made from these writes, while it is under way (durability
    # "async"); a commit that fails takes them back.
    slots = ctx.slots.add(own, [(e.task_id, e.part) for e in entries])
    try:
        for _ in range(_MAX_FENCED):
            try:
                return (yield from ctx.index.commit_writes(entries, ctx.sealer.key_id(thread_id)))
            except Fenced as fenced:
                # A delete since the generation these writes were made in: they go
                # with their checkpoint, into the new generation only if it is there.
                record = fenced.record
                moves = record.archive is None and record.gen != entries[0].gen
                joins = moves and (yield from _joins(ctx, own, record.gen))
                if key_gone(ctx, record, thread_id) and (joins or record.gen == entries[0].gen):
                    # Sealed under a key an erase destroyed: sealed again by the caller.
                    yield from _take_back(ctx, list(objects))
                    raise KeyGone(thread_id) from None
                yield from _fenced(ctx, record, entries[0], list(objects), created=joins)
                for entry in entries:
                    entry.gen = entries[0].gen
        raise _busy(ctx, thread_id)
    except BaseException:
        ctx.slots.discard(own, slots)
        raise


def _release(ctx: Context, own: tuple[str, str, str], task_id: str, outcome: WritesOutcome) -> Op[None]:
    """Objects no index entry names any more (a lost first-wins race, a replaced
    special slot): what leaves the index is released."""
    thread_id, ns, checkpoint_id = own
    unused = [
        ctx.layout.writes_key(thread_id, ns, checkpoint_id, task_id, entry.part, token)
        for entry, token in outcome.unused
    ]
    if unused:
        yield from _take_back(ctx, unused)


def _write_parts(ctx: Context, writes: Sequence[tuple[str, Any]]) -> dict[str, list[list[Any]]]:
    """Rows ``[idx, channel, type, data]`` by part: "r<extent>" for the regular
    writes, "s<k>" for the special channel with index -k (WRITES_IDX_MAP)."""
    parts: dict[str, list[list[Any]]] = {}
    regular: list[list[Any]] = []
    for idx, (channel, value) in enumerate(writes):
        row = [WRITES_IDX_MAP.get(channel, idx), channel, *ctx.serde.dumps_typed(value)]
        if channel in WRITES_IDX_MAP:
            parts[f"{SPECIAL_PART}{-row[0]}"] = [row]  # within one call, the last one wins
        else:
            regular.append(row)
    if regular:
        parts[f"{REGULAR_PART}{regular[-1][0] + 1}"] = regular
    return parts

