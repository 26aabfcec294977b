"""put: a checkpoint's objects first, its index entry last (the commit point).

A task's pending writes (``put_writes``) are in ``put_writes``; what a writer
does when its commit is refused, which both share, in ``refused``.
"""

from __future__ import annotations

from typing import Any

import ormsgpack
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    get_checkpoint_metadata,
)

from s3_saver._format import keys as _keys
from s3_saver._format.closure import closure_keys
from s3_saver._format.keys import new_token
from s3_saver._index.activity import activity_day
from s3_saver._format.entries import (
    ENTRY_BUDGET,
    CheckpointEntry,
    Loc,
    ref_pieces,
)
from s3_saver._index.terms import (
    Fenced,
    ParentGone,
)
from s3_saver._ops.context import Context, target
from s3_saver._ops.refused import (
    _MAX_FENCED,
    _busy,
    _deleted,
    _fenced,
    _restore_first,
    _run_deleted,
    _take_back,
    _untouch,
)
from s3_saver._ops.stage import LOC_HEADROOM, held_key, stage, store_late
from s3_saver._transport.protocol import Op, gather
from s3_saver._transport.s3 import put_immutable
from s3_saver.errors import CheckpointTooLargeError, ThreadDeletedError


def put(
    ctx: Context,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
) -> Op[RunnableConfig]:
    thread_id, ns, parent_id = target(config)
    if parent_id is not None or ns != "":
        return (yield from _put(ctx, config, checkpoint, metadata, new_versions))
    # A run starting afresh: the writes of its steps sent before their puts land
    # go into the generation this one goes into (see refused._joins).
    ctx.starting.add(thread_id)
    gen = None
    try:
        done = yield from _put(ctx, config, checkpoint, metadata, new_versions)
        known = ctx.locs.get((thread_id, ns, checkpoint["id"]))
        gen = known[1] if known is not None else None
        return done
    finally:
        ctx.starting.done(thread_id, gen)


def _put(
    ctx: Context,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
) -> Op[RunnableConfig]:
    thread_id, ns, parent_id = target(config)
    checkpoint_id = checkpoint["id"]
    values = checkpoint["channel_values"]
    now = ctx.now()
    # Every key is built (and length-checked) before the first byte is written,
    # with room for the keys the thread's pending writes and subgraphs need.
    ctx.layout.check_room(thread_id, ns, checkpoint_id)
    _keys.checkpoint_sort_key(ns, checkpoint_id)
    loc_estimate = len(ormsgpack.packb({ch: [v, checkpoint_id, 1, now] for ch, v in checkpoint["channel_versions"].items()}))
    if loc_estimate + LOC_HEADROOM > ENTRY_BUDGET:
        raise CheckpointTooLargeError(
            f"checkpoint {checkpoint_id} has {len(checkpoint['channel_versions'])} channels; "
            f"their index entry (~{loc_estimate} bytes) exceeds the 400 KB an entry may take"
        )

    # Channels whose value this checkpoint stores: new versions, plus unchanged
    # channels whose stored copy cannot be found or is about to expire.
    fresh: dict[str, Any] = {ch: new_versions[ch] for ch in new_versions if ch in values}
    carried = {ch: v for ch, v in checkpoint["channel_versions"].items() if ch not in new_versions}
    loc: Loc = {}
    # A first checkpoint has no parent: every channel is stored here.
    known = ctx.locs.get((thread_id, ns, parent_id)) if parent_id else ({}, 0, "")
    if known is not None:
        _carry(ctx, carried, known[0], values, now, loc, fresh)

    merged_metadata = get_checkpoint_metadata(config, metadata)
    head = {
        # The thread and namespace are in the key, not the body, so copy_thread
        # can copy objects server-side.
        "checkpoint_id": checkpoint_id,
        "parent_checkpoint_id": parent_id,
        "checkpoint": list(ctx.serde.dumps_typed({k: v for k, v in checkpoint.items() if k != "channel_values"})),
        "metadata": list(ctx.serde.dumps_typed(merged_metadata)),
        # The channels holding a value here (stored here or earlier): a rebuild
        # from a replica bucket tells a missing value from one never set by it.
        "valued": sorted(values),
    }
    carried_deltas = sorted(ch for ch, ref in loc.items() if len(ref) > 5)
    if carried_deltas:
        # A rebuild then never takes a piece whose checkpoint's record is
        # missing (not replicated yet) for a whole value.
        head["carried"] = carried_deltas
    # A list that extends the parent's value is stored as a delta of it (the
    # parent's refs are known here, its value held: see _pieces).
    staged = stage(ctx, thread_id, ns, checkpoint_id, head, fresh, values, known[0] if known else None, now, loc_estimate)
    record, body, objects = staged.record, staged.body, staged.objects
    loc.update(staged.loc)

    # The thread's record is read beside the object writes (a deleted thread
    # stays deleted), and so is the parent's item when this process has not
    # seen it (cold start, another writer). A parent this process knows carries
    # the generation the write extends (an item never changes): the commit's
    # fence checks it, so nothing is read (for the root namespace, once the
    # process has seen the thread listed in that generation).
    fetch_parent = known is None
    list_at = now if ns == "" else None
    extends = known[1] if not fetch_parent and parent_id is not None else None
    if extends is not None and list_at is not None and (thread_id, extends) not in ctx.listed:
        extends = None
    # A process that does not know the parent (cold) also looks for this
    # checkpoint's entry when it stores a list another process may have stored
    # as a delta (see below): in this wave, unless the index answers from what
    # prepare reads (the manifest's head), at no request.
    own = (thread_id, ns, checkpoint_id)
    other_form = fetch_parent and parent_id is not None and bool(staged.held)
    ahead = other_form and not ctx.index.local_lookups
    # The thread's activity entry of the day (archive_idle's walk, ``_ops/idle``):
    # once a day per thread and process, in the requests this write sends anyway.
    # A run starting afresh (no parent) sends it whatever this process wrote: the
    # thread may have been deleted since, and its entry dropped with it.
    day = activity_day(checkpoint.get("ts"), now) if ns == "" else None
    active = day if day is not None and (parent_id is None or (thread_id, day) not in ctx.active) else None
    _, prepared, *looked = yield from gather(
        put_immutable(ctx.s3, objects),
        ctx.index.prepare(thread_id, ns, parent_id if fetch_parent else None, list_at, extends, active=active),
        *([ctx.index.entries([own])] if ahead else []),
    )
    if prepared.archive is not None:
        # The user came back to an archived thread: it is live again before this
        # checkpoint goes on it (objects first, as ever: this one's are written).
        yield from _restore_first(ctx, thread_id, prepared.archive, list(objects))
        prepared = yield from ctx.index.prepare(
            thread_id, ns, parent_id if fetch_parent else None, list_at, active=active
        )
    gen, parent = prepared.gen, prepared.parent
    if prepared.listed:
        ctx.listed.add((thread_id, gen))
    if fetch_parent:
        # A hidden parent (kept by a prune for newer checkpoints) still holds what
        # it names; the commit checks that it is still there.
        known = (parent.loc, parent.gen, parent.tag) if parent is not None else None
    # What a refused write takes back: its objects, and a listing object the
    # manifest's prepare wrote beside them.
    listed_early = prepared.listing if ctx.index.lists_in_prepare else None
    if gen and parent_id is not None and (known is None or known[1] < gen):
        # The parent was deleted after this run read it: refuse to continue the
        # deleted history, and take back what was just written.
        yield from gather(
            _take_back(ctx, list(objects)), ctx.index.unnote(thread_id, listed_early, None), _untouch(ctx, thread_id, prepared)
        )
        raise _deleted(ctx, thread_id, parent_id)
    run_id = run_of(merged_metadata)
    if run_id is not None and run_id in prepared.dead_runs:
        yield from gather(
            _take_back(ctx, list(objects)), ctx.index.unnote(thread_id, listed_early, None), _untouch(ctx, thread_id, prepared)
        )
        raise _run_deleted(ctx, thread_id, run_id, checkpoint_id)
    if fetch_parent:
        late: dict[str, Any] = {}
        # A value the parent holds as a delta is stored again whole: the record
        # is written already, and a rebuild reads in its "carried" which
        # channels are deltas (a piece is never taken for a whole value).
        wholes = {ch: ref for ch, ref in known[0].items() if len(ref) <= 5} if known else {}
        _carry(ctx, carried, wholes, values, now, loc, late)
        yield from store_late(ctx, thread_id, ns, checkpoint_id, late, values, now, loc, objects)
        # Another form of this checkpoint may be committed already: a put of it
        # whose answer was lost, by a process that stored a list as a delta.
        # The first form committed stays (a later checkpoint may read its pieces).
        found = looked[0] if looked else (yield from ctx.index.entries([own])) if other_form else {}
        first = found.get(own)
        if first is not None and first.gen == gen and first.tag != staged.tag and not first.hidden and not ctx.expired(first):
            yield from _take_back(ctx, sorted(set(objects) - closure_keys(ctx.layout, [first])))
            ctx.locs.put(first.key, (first.loc, first.gen, first.tag))
            return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}

    entry = CheckpointEntry(
        thread_id=thread_id,
        ns=ns,
        checkpoint_id=checkpoint_id,
        parent_id=parent_id,
        loc=loc,
        body=body,
        metadata=tuple(record["metadata"]),  # type: ignore[arg-type]
        # A full ttl from this write: the newest checkpoint is always the last to
        # expire (values it points at are at most ttl/2 old, see _carry).
        expires_at=now + ctx.ttl_seconds if ctx.ttl_seconds else None,
        gen=gen,
        run_id=run_id,
        tag=staged.tag,
        # What a replica needs to prove this checkpoint's past complete (see
        # CheckpointEntry.chained): the parent's write slots LangGraph made it
        # from, as this process wrote or read them (None: it did not).
        chained=True,
        parent_writes=_slots_of(ctx, (thread_id, ns, parent_id)) if parent_id is not None else (),
    )
    # A root checkpoint of a thread that is not listed lists it: its first one
    # (again after a delete), or the next one when listing failed.
    created = prepared.listing if not prepared.listed else None
    run = entry.run_id if entry.run_id is not None and (entry.run_id, thread_id) not in ctx.noted else None
    for _ in range(_MAX_FENCED):
        # What the entry carries from its parent (values, and the earlier pieces
        # of its deltas) must still be there at the commit: the commit checks
        # that the parent's entry is in the index as read.
        carries = any(p[1] != checkpoint_id for ref in loc.values() for p in ref_pieces(ref))
        parent_tag = known[2] if carries and known is not None and parent_id is not None else None
        # The commit point: objects first, index entry last. The records that find
        # the thread (listing, run) go beside it: hints, a failed commit's find nothing.
        commit = ctx.index.commit_checkpoint(entry, created, parent_tag, active=prepared.active)
        try:
            if created is None and run is None:
                yield from commit
            else:
                yield from gather(commit, ctx.index.note(thread_id, None if ctx.index.lists_in_prepare else created, run))
                if run is not None:
                    ctx.noted.add((run, thread_id))
                if created is not None:
                    ctx.listed.add((thread_id, entry.gen))
            break
        except ParentGone:
            # Pruned (or written anew by a restore) since this run read it: what
            # the parent's objects held is stored here, as for an unknown parent.
            if staged.deltas:
                landed = (yield from ctx.index.entries([own])).get(own)
                if landed is not None and landed.tag == entry.tag and landed.gen == entry.gen:
                    # This commit landed before (its answer was lost) and the
                    # parent went after it: a later checkpoint may read its pieces.
                    break
                # A delta reads pieces the parent's prune may release: the
                # checkpoint is written again whole, under a tag of its own (the
                # object just written is immutable), and the first one goes.
                first, tag = list(objects), new_token()
                every = {ch: v for ch, v in {**carried, **fresh}.items() if ch in values}
                alone = {k: v for k, v in head.items() if k != "carried"}
                staged = stage(ctx, thread_id, ns, checkpoint_id, alone, every, values, None, now, loc_estimate, tag)
                objects = staged.objects
                yield from put_immutable(ctx.s3, objects)
                loc = entry.loc = dict(staged.loc)
                entry.body, entry.tag = staged.body, tag
                yield from _take_back(ctx, first)
            else:
                late = {ch: ref[0] for ch, ref in loc.items() if ref[1] != checkpoint_id and ch in values}
                yield from store_late(ctx, thread_id, ns, checkpoint_id, late, values, now, loc, objects)
            known = None
        except Fenced as fenced:
            try:
                yield from _fenced(ctx, fenced.record, entry, list(objects), created=parent_id is None)
            except ThreadDeletedError:
                # Refused for good: the records written beside the commit go too.
                yield from gather(
                    ctx.index.unnote(thread_id, listed_early or created, run), _untouch(ctx, thread_id, prepared)
                )
                raise
    else:
        raise _busy(ctx, thread_id)
    ctx.locs.put((thread_id, ns, checkpoint_id), (loc, entry.gen, entry.tag))
    if day is not None:
        ctx.active.add((thread_id, day))  # recorded (or recorded already: the head said so)
    ctx.slots.add((thread_id, ns, checkpoint_id), ())  # known from now on: its writes are this process's
    for ch, held in staged.held.items():
        if ch in loc:
            ctx.lists.put(held_key(thread_id, ns, ch, loc[ch]), held)
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}


# -- helpers ---------------------------------------------------------------------
def _slots_of(ctx: Context, parent: tuple[str, str, str]) -> tuple[tuple[str, str], ...] | None:
    slots = ctx.slots.get(parent)
    return None if slots is None else tuple(sorted(slots))


def run_of(metadata: Any) -> str | None:
    """The run a checkpoint belongs to: metadata "run_id" (LangGraph's server and
    callers set it through ``config["metadata"]``)."""
    run_id = (metadata or {}).get("run_id")
    return None if run_id is None or run_id == "" else str(run_id)


def _carry(
    ctx: Context,
    carried: dict[str, Any],
    parent_loc: Loc,
    values: dict[str, Any],
    now: int,
    loc: Loc,
    fresh: dict[str, Any],
) -> None:
    """Point unchanged channels at their stored copy, or mark them to store again."""
    refresh_before = now - ctx.ttl_seconds // 2 if ctx.ttl_seconds else None
    for ch, version in carried.items():
        known = parent_loc.get(ch)
        if known is not None and known[0] == version and (refresh_before is None or known[3] >= refresh_before):
            loc[ch] = known
        elif ch in values:
            fresh[ch] = version
