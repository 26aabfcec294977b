"""put: a checkpoint's objects first, its index entry last (the commit point).

A put goes down in named steps, each at most one round trip:

1. ``_draft``: the keys checked, the record built, the values staged (no request);
2. ``_send``: round trip 1, the objects written beside the index's ``prepare``
   (the thread's record, and the parent's entry when this process does not know it);
3. ``_revive``: an archived thread made live again first (archived threads only);
4. ``_admit``: a deleted parent or a deleted run refused (objects taken back);
5. ``_adopt_parent``: a parent learned only now (a cold process) completes the draft;
6. ``_entry``, then ``commit_checkpoint`` (``commit``): round trip 2, the commit point;
7. ``_remember``: what this process knows from now on (no request).

A task's pending writes are in ``put_writes``; the commit point and what a writer does
when the index refuses it, which both share, in ``commit``; what a checkpoint stores
(its record, blobs and refs, and the ``Draft`` the steps pass down) in ``stage``.
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
from s3_saver._format.entries import ENTRY_BUDGET, CheckpointEntry, Loc
from s3_saver._index.activity import activity_day
from s3_saver._index.terms import Prepared
from s3_saver._ops.commit import (
    MAX_REKEYS,
    KeyGone,
    _deleted,
    _rekeyed_too_often,
    _restore_first,
    _run_deleted,
    _take_back,
    _untouch,
    commit_checkpoint,
)
from s3_saver._ops.context import Context, meta_key, target
from s3_saver._ops.keyed import keyed, rekeyed
from s3_saver._ops.stage import LOC_HEADROOM, Draft, held_key, stage, store_late
from s3_saver._transport.protocol import Op, gather
from s3_saver._transport.s3 import put_immutable
from s3_saver.errors import CheckpointTooLargeError


def put(
    ctx: Context,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
) -> Op[RunnableConfig]:
    thread_id, ns, parent_id = target(config)
    if parent_id is not None or ns != "":
        return (yield from _sealed_put(ctx, config, checkpoint, metadata, new_versions))
    # A run starting afresh: the writes of its steps sent before their puts land
    # go into the generation this one goes into (see commit._joins). Said before
    # this put sends anything, its key's load included: LangGraph sends those
    # writes beside it, and after an erase the key's load takes this put up to
    # three round trips (the erased record read, a new key's PUT refused because
    # a write of the run made one first, the winner's read) while that write is
    # at its generation check already; finding the run neither starting here nor
    # its checkpoint indexed, it was refused as one continuing the erased history.
    ctx.starting.add(thread_id)
    gen = None
    try:
        done = yield from _sealed_put(ctx, config, checkpoint, metadata, new_versions)
        known = ctx.locs.get((thread_id, ns, checkpoint["id"]))
        gen = known[1] if known is not None else None
        return done
    finally:
        ctx.starting.done(thread_id, gen)


def _sealed_put(
    ctx: Context,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
) -> Op[RunnableConfig]:
    """``_put``; with encryption, again from the draft when its commit found the key
    it sealed with destroyed by another process's erase (``commit.KeyGone``: its
    objects were taken back), under the thread's key as the key store has it now."""
    # The thread's key before anything is sealed (made here for a new thread).
    ctx = yield from keyed(ctx, [target(config)[0]], create=True)
    for _ in range(MAX_REKEYS):
        try:
            return (yield from _put(ctx, config, checkpoint, metadata, new_versions))
        except KeyGone as gone:
            ctx = yield from rekeyed(ctx, gone.thread_id)
    raise _rekeyed_too_often(target(config)[0])


def _put(
    ctx: Context,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
) -> Op[RunnableConfig]:
    draft = _draft(ctx, config, checkpoint, metadata, new_versions)
    prepared, looked = yield from _send(ctx, draft)
    if prepared.archive is not None:
        prepared = yield from _revive(ctx, draft, prepared)
    yield from _admit(ctx, draft, prepared)
    if draft.fetch_parent and (yield from _adopt_parent(ctx, draft, looked)):
        return draft.result
    entry = _entry(ctx, draft, prepared)
    yield from commit_checkpoint(ctx, draft, entry, prepared)
    _remember(ctx, draft, entry)
    return draft.result


# -- the steps -------------------------------------------------------------------------
def _draft(
    ctx: Context,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
) -> Draft:
    """What this checkpoint stores, staged: no request yet."""
    thread_id, ns, parent_id = target(config)
    checkpoint_id = checkpoint["id"]
    values = checkpoint["channel_values"]
    now = ctx.now()
    loc_estimate = _check_size(ctx, thread_id, ns, checkpoint, now)
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
    head = _head(ctx, checkpoint, merged_metadata, parent_id, values, loc)
    # A list that extends the parent's value is stored as a delta of it (the
    # parent's refs are known here, its value held: see _pieces).
    staged = stage(ctx, thread_id, ns, checkpoint_id, head, fresh, values, known[0] if known else None, now, loc_estimate)
    loc.update(staged.loc)
    return Draft(thread_id, ns, parent_id, checkpoint_id, checkpoint.get("ts"), values, now, loc_estimate,
                 fresh, carried, loc, known, head, merged_metadata, staged, staged.objects)


def _check_size(ctx: Context, thread_id: str, ns: str, checkpoint: Checkpoint, now: int) -> int:
    """Every key is built (and length-checked) before the first byte is written,
    with room for the keys the thread's pending writes and subgraphs need; the
    index entry must fit an item. Returns the ``loc`` map's estimated size."""
    checkpoint_id = checkpoint["id"]
    ctx.layout.check_room(thread_id, ns, checkpoint_id)
    _keys.checkpoint_sort_key(ns, checkpoint_id)
    loc_estimate = len(ormsgpack.packb({ch: [v, checkpoint_id, 1, now] for ch, v in checkpoint["channel_versions"].items()}))
    if loc_estimate + LOC_HEADROOM > ENTRY_BUDGET:
        raise CheckpointTooLargeError(
            f"checkpoint {checkpoint_id} has {len(checkpoint['channel_versions'])} channels; "
            f"their index entry (~{loc_estimate} bytes) exceeds the 400 KB an entry may take"
        )
    return loc_estimate


def _head(
    ctx: Context, checkpoint: Checkpoint, metadata: Any, parent_id: str | None, values: dict[str, Any], loc: Loc
) -> dict[str, Any]:
    """The record's fields other than its values."""
    head = {
        # The thread and namespace are in the key, not the body, so copy_thread
        # can copy objects server-side.
        "checkpoint_id": checkpoint["id"],
        "parent_checkpoint_id": parent_id,
        "checkpoint": list(ctx.serde.dumps_typed({k: v for k, v in checkpoint.items() if k != "channel_values"})),
        "metadata": list(ctx.serde.dumps_typed(metadata)),
        # The channels holding a value here (stored here or earlier): a rebuild
        # from a replica bucket tells a missing value from one never set by it.
        "valued": sorted(values),
    }
    carried_deltas = sorted(ch for ch, ref in loc.items() if len(ref) > 5)
    if carried_deltas:
        # A rebuild then never takes a piece whose checkpoint's record is
        # missing (not replicated yet) for a whole value.
        head["carried"] = carried_deltas
    return head


def _send(ctx: Context, d: Draft) -> Op[tuple[Prepared, list[Any]]]:
    """Round trip 1: the objects, beside what the index must say first."""
    # The thread's record is read beside the object writes (a deleted thread
    # stays deleted), and so is the parent's item when this process has not
    # seen it (cold start, another writer). A parent this process knows carries
    # the generation the write extends (an item never changes): the commit's
    # fence checks it, so nothing is read (for the root namespace, once the
    # process has seen the thread listed in that generation).
    d.fetch_parent = d.known is None
    d.list_at = d.now if d.ns == "" else None
    extends = d.known[1] if not d.fetch_parent and d.parent_id is not None else None
    if extends is not None and d.list_at is not None and (d.thread_id, extends) not in ctx.listed:
        extends = None
    # A process that does not know the parent (cold) also looks for this
    # checkpoint's entry when it stores a list another process may have stored
    # as a delta (see _adopt_parent): in this wave, unless the index answers from
    # what prepare reads (the manifest's head), at no request.
    d.other_form = d.fetch_parent and d.parent_id is not None and bool(d.staged.held)
    ahead = d.other_form and not ctx.index.local_lookups
    # The thread's activity entry of the day (archive_idle's walk, ``_ops/idle``):
    # once a day per thread and process, in the requests this write sends anyway.
    # A run starting afresh (no parent) sends it whatever this process wrote: the
    # thread may have been deleted since, and its entry dropped with it.
    d.day = activity_day(d.ts, d.now) if d.ns == "" else None
    day = d.day
    d.active = day if day is not None and (d.parent_id is None or (d.thread_id, day) not in ctx.active) else None
    _, prepared, *looked = yield from gather(
        put_immutable(ctx.s3, d.objects, same=ctx.sealer.same(d.thread_id)),
        ctx.index.prepare(d.thread_id, d.ns, d.parent_id if d.fetch_parent else None, d.list_at, extends, active=d.active),
        *([ctx.index.entries([d.own])] if ahead else []),
    )
    return prepared, looked


def _revive(ctx: Context, d: Draft, prepared: Prepared) -> Op[Prepared]:
    """The user came back to an archived thread: it is live again before this
    checkpoint goes on it (objects first, as ever: this one's are written)."""
    yield from _restore_first(ctx, d.thread_id, prepared.archive, list(d.objects))  # type: ignore[arg-type]
    return (yield from ctx.index.prepare(
        d.thread_id, d.ns, d.parent_id if d.fetch_parent else None, d.list_at, active=d.active
    ))


def _admit(ctx: Context, d: Draft, prepared: Prepared) -> Op[None]:
    """The generation this write goes into; a deleted parent or run refuses it."""
    d.gen, parent = prepared.gen, prepared.parent
    if prepared.listed:
        ctx.listed.add((d.thread_id, d.gen))
    if d.fetch_parent:
        # A hidden parent (kept by a prune for newer checkpoints) still holds what
        # it names; the commit checks that it is still there.
        d.known = (parent.loc, parent.gen, parent.tag) if parent is not None else None
    # What a refused write takes back: its objects, and a listing object the
    # manifest's prepare wrote beside them.
    d.listed_early = prepared.listing if ctx.index.lists_in_prepare else None
    if d.gen and d.parent_id is not None and (d.known is None or d.known[1] < d.gen):
        # The parent was deleted after this run read it: refuse to continue the
        # deleted history, and take back what was just written.
        yield from gather(
            _take_back(ctx, list(d.objects)), ctx.index.unnote(d.thread_id, d.listed_early, None), _untouch(ctx, d.thread_id, prepared)
        )
        raise _deleted(ctx, d.thread_id, d.parent_id)
    d.run_id = run_of(d.metadata)
    if d.run_id is not None and d.run_id in prepared.dead_runs:
        yield from gather(
            _take_back(ctx, list(d.objects)), ctx.index.unnote(d.thread_id, d.listed_early, None), _untouch(ctx, d.thread_id, prepared)
        )
        raise _run_deleted(ctx, d.thread_id, d.run_id, d.checkpoint_id)


def _adopt_parent(ctx: Context, d: Draft, looked: list[Any]) -> Op[bool]:
    """A parent this process learned only now: carry what it holds, store what it
    does not. True: another form of this checkpoint is committed already (it stays)."""
    late: dict[str, Any] = {}
    # A value the parent holds as a delta is stored again whole: the record
    # is written already, and a rebuild reads in its "carried" which
    # channels are deltas (a piece is never taken for a whole value).
    wholes = {ch: ref for ch, ref in d.known[0].items() if len(ref) <= 5} if d.known else {}
    _carry(ctx, d.carried, wholes, d.values, d.now, d.loc, late)
    yield from store_late(ctx, d.thread_id, d.ns, d.checkpoint_id, late, d.values, d.now, d.loc, d.objects)
    # Another form of this checkpoint may be committed already: a put of it
    # whose answer was lost, by a process that stored a list as a delta.
    # The first form committed stays (a later checkpoint may read its pieces).
    found = looked[0] if looked else (yield from ctx.index.entries([d.own])) if d.other_form else {}
    first = found.get(d.own)
    if first is not None and first.gen == d.gen and first.tag != d.staged.tag and not first.hidden and not ctx.expired(first):
        yield from _take_back(ctx, sorted(set(d.objects) - closure_keys(ctx.layout, [first])))
        ctx.locs.put(first.key, (first.loc, first.gen, first.tag))
        return True
    return False


def _entry(ctx: Context, d: Draft, prepared: Prepared) -> CheckpointEntry:
    return CheckpointEntry(
        thread_id=d.thread_id,
        ns=d.ns,
        checkpoint_id=d.checkpoint_id,
        parent_id=d.parent_id,
        loc=d.loc,
        body=d.staged.body,
        # Sealed (with encryption) for the checkpoint it describes, as the body is.
        metadata=ctx.sealer.seal_meta(
            d.thread_id, meta_key(ctx, d.thread_id, d.ns, d.checkpoint_id), tuple(d.staged.record["metadata"])  # type: ignore[arg-type]
        ),
        # A full ttl from this write: the newest checkpoint is always the last to
        # expire (values it points at are at most ttl/2 old, see _carry).
        expires_at=d.now + ctx.ttl_seconds if ctx.ttl_seconds else None,
        gen=d.gen,
        run_id=d.run_id,
        tag=d.staged.tag,
        # What a replica needs to prove this checkpoint's past complete (see
        # CheckpointEntry.chained): the parent's write slots LangGraph made it
        # from, as this process wrote or read them (None: it did not).
        chained=True,
        parent_writes=_slots_of(ctx, (d.thread_id, d.ns, d.parent_id)) if d.parent_id is not None else (),
    )


def _remember(ctx: Context, d: Draft, entry: CheckpointEntry) -> None:
    ctx.locs.put(d.own, (d.loc, entry.gen, entry.tag))
    if d.day is not None:
        ctx.active.add((d.thread_id, d.day))  # recorded (or recorded already: the head said so)
    ctx.slots.add(d.own, ())  # known from now on: its writes are this process's
    for ch, held in d.staged.held.items():
        if ch in d.loc:
            ctx.lists.put(held_key(d.thread_id, d.ns, ch, d.loc[ch]), held)


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
