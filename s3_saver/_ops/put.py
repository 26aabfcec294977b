"""put and put_writes: objects first, index entry last (the commit point)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ormsgpack
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    get_checkpoint_metadata,
)

from s3_saver import _keys
from s3_saver._codec import WRITES_FORMAT, pack
from s3_saver._index.activity import activity_day
from s3_saver._index.base import (
    ENTRY_BUDGET,
    REGULAR_PART,
    SPECIAL_PART,
    ArchiveRef,
    CheckpointEntry,
    Fenced,
    Loc,
    ParentGone,
    Prepared,
    Tombstone,
    WritesEntry,
    ref_pieces,
)
from s3_saver._ops.archive import restore_before_write
from s3_saver._ops.context import Context, target
from s3_saver._ops.delete import delete_keys
from s3_saver._ops.stage import LOC_HEADROOM, held_key, stage, store_late
from s3_saver._keys import new_token
from s3_saver._protocol import Op, gather
from s3_saver._reach import closure_keys
from s3_saver._s3 import put_immutable
from s3_saver.errors import (
    CheckpointTooLargeError,
    RunDeletedError,
    S3SaverError,
    ThreadArchivedError,
    ThreadDeletedError,
)

# Commits refused by the thread's record and tried again (after a restore, an
# archive's mark taken off...): each round has a reason that does not repeat
# unless archives and restores keep racing the write.
_MAX_FENCED = 6


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
    # go into the generation this one goes into (see _joins).
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


def _fenced(ctx: Context, record: Tombstone, entry: Any, objects: list[str], created: bool) -> Op[None]:
    """What a writer does when the thread's record refused its commit, before it
    tries again; raises when it must not. ``created``: the write starts the
    thread (a checkpoint without parent), so a delete since its read only
    moves it to the new generation."""
    thread_id = entry.thread_id
    if record.archive is not None:
        # Archived after this write began: it is live again before the write goes on.
        yield from _restore_first(ctx, thread_id, record.archive, objects)
        return
    run_id = getattr(entry, "run_id", None)
    if run_id is not None and run_id in record.dead_runs:
        yield from _take_back(ctx, objects)
        raise _run_deleted(ctx, thread_id, run_id, entry.checkpoint_id)
    if record.gen != entry.gen:
        if created:
            entry.gen = record.gen
            return
        yield from _take_back(ctx, objects)
        raise _deleted(ctx, thread_id, entry.checkpoint_id)
    if record.archiving is not None:
        # An archive read the thread before this commit: its switch must not
        # happen. Taking its mark off fails it (read-decide-act is fenced here).
        yield from ctx.index.cancel_archiving(thread_id, record.archiving)


def _joins(ctx: Context, own: tuple[str, str, str], gen: int) -> Op[bool]:
    """Whether pending writes of checkpoint ``own``, made before a delete (or by a
    process that never saw the thread), go into its generation ``gen``: only
    with their checkpoint. It is there when this process put or read it in
    ``gen``, or the index has it in ``gen``; or it will be when this process
    started the thread afresh in ``gen`` or is starting it (a new run's writes
    come before the puts of their checkpoints, which wait for its first one).
    Otherwise the checkpoint continues the deleted history (its put is refused)
    and so are they: committed into ``gen`` they would name a checkpoint no
    read shows, and stay stored after the delete (invariant: a deleted thread
    keeps nothing of its runs)."""
    seen = ctx.locs.get(own)
    if seen is not None:
        return seen[1] == gen
    if ctx.starting.began(own[0], gen):
        return True
    found = (yield from ctx.index.entries([own])).get(own)
    if found is not None and found.gen == gen:
        ctx.locs.put(own, (found.loc, found.gen, found.tag))
        return True
    return False


def _writes_deleted(ctx: Context, thread_id: str, checkpoint_id: str) -> ThreadDeletedError:
    return ThreadDeletedError(
        f"thread {thread_id!r} was deleted while a run wrote to it ({ctx.index.describe()}): "
        f"the pending writes of its checkpoint {checkpoint_id!r} are refused. Start the thread "
        "afresh (invoke without a checkpoint_id) to use the id again."
    )


def _deleted(ctx: Context, thread_id: str, checkpoint_id: str) -> ThreadDeletedError:
    return ThreadDeletedError(
        f"thread {thread_id!r} was deleted after its checkpoint {checkpoint_id!r} was written "
        f"({ctx.index.describe()}); a run in flight cannot continue it. Start the thread "
        "afresh (invoke without a checkpoint_id) to use the id again."
    )


def _run_deleted(ctx: Context, thread_id: str, run_id: str, checkpoint_id: str) -> RunDeletedError:
    return RunDeletedError(
        f"run {run_id!r} of thread {thread_id!r} was deleted (delete_for_runs) while it ran; "
        f"its checkpoint {checkpoint_id!r} is refused ({ctx.index.describe()})"
    )


def _busy(ctx: Context, thread_id: str) -> S3SaverError:
    return S3SaverError(
        f"thread {thread_id!r}: the commit kept being refused by archives and restores of the "
        f"thread running at the same time ({ctx.index.describe()}); nothing was committed"
    )


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
    parts = _write_parts(ctx, writes)
    # One token per call: a retried request of this call meets its own object
    # and its own index item, a task run again writes new ones. (Never drawn
    # from uuid.uuid4, which a user's tests may patch: see _keys.new_token.)
    token = new_token()
    objects: dict[str, bytes] = {}
    entries: list[WritesEntry] = []
    for part, rows in parts.items():
        key = ctx.layout.writes_key(thread_id, ns, checkpoint_id, task_id, part, token)
        _keys.writes_sort_key(ns, checkpoint_id, task_id, part)
        body = pack(
            {
                "format": WRITES_FORMAT,
                "checkpoint_id": checkpoint_id,
                "task_id": task_id,
                "task_path": task_path,
                "part": part,
                "writes": rows,
            }
        )
        objects[key] = body
        entries.append(WritesEntry(thread_id, ns, checkpoint_id, task_id, part, token, body))
    if not entries:
        return
    # A checkpoint this process wrote or read carries its generation: the
    # commit's fence checks it, nothing is read first (see put). LangGraph sends
    # a step's writes while the put of their checkpoint may still be under way
    # (or not begun): then the thread's generation as this process last saw it
    # stands in. Made in an older generation than the thread has now, or by a
    # process that never saw the thread once it has been deleted, they go into
    # the new one only with their checkpoint (_joins).
    own = (thread_id, ns, checkpoint_id)
    known = ctx.locs.get(own)
    made_in = known[1] if known is not None else ctx.locs.thread_gen(thread_id)
    _, prepared = yield from gather(put_immutable(ctx.s3, objects), ctx.index.prepare(thread_id, ns, None, None, made_in))
    if prepared.archive is not None:
        yield from _restore_first(ctx, thread_id, prepared.archive, list(objects))
        prepared = yield from ctx.index.prepare(thread_id, ns, None)
    gen = prepared.gen
    if gen and (made_in is None or made_in < gen) and not (yield from _joins(ctx, own, gen)):
        yield from _take_back(ctx, list(objects))
        raise _writes_deleted(ctx, thread_id, checkpoint_id)
    expires_at = ctx.now() + ctx.ttl_seconds if ctx.ttl_seconds else None
    for entry in entries:
        entry.gen, entry.expires_at = gen, expires_at
    # The slots are known before the commit returns: LangGraph may put the next
    # checkpoint, made from these writes, while it is under way (durability
    # "async"); a commit that fails takes them back.
    slots = ctx.slots.add((thread_id, ns, checkpoint_id), [(e.task_id, e.part) for e in entries])
    try:
        for _ in range(_MAX_FENCED):
            # The commit point: objects first, index entries last.
            try:
                outcome = yield from ctx.index.commit_writes(entries)
                break
            except Fenced as fenced:
                # A delete since the generation these writes were made in: they go
                # with their checkpoint, into the new generation only if it is there.
                record = fenced.record
                moves = record.archive is None and record.gen != entries[0].gen
                joins = moves and (yield from _joins(ctx, own, record.gen))
                yield from _fenced(ctx, record, entries[0], list(objects), created=joins)
                for entry in entries:
                    entry.gen = entries[0].gen
        else:
            raise _busy(ctx, thread_id)
    except BaseException:
        ctx.slots.discard((thread_id, ns, checkpoint_id), slots)
        raise
    unused = [
        ctx.layout.writes_key(thread_id, ns, checkpoint_id, task_id, entry.part, token)
        for entry, token in outcome.unused
    ]
    if unused:
        # Objects no index entry names any more (a lost first-wins race, a
        # replaced special slot): what leaves the index is released.
        yield from _take_back(ctx, unused)


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


def _restore_first(ctx: Context, thread_id: str, ref: ArchiveRef, objects: list[str]) -> Op[None]:
    """Restore an archived thread before a write to it; when its archive must be
    restored from a cold class first, take this write's objects back and say so."""
    try:
        yield from restore_before_write(ctx, thread_id, ref)
    except ThreadArchivedError:
        yield from _take_back(ctx, objects)
        raise


def _untouch(ctx: Context, thread_id: str, prepared: Prepared) -> Op[None]:
    """A refused write takes back the activity entry its prepare wrote (a hint of a
    write that never was), unless the thread's index records that day itself."""
    if prepared.active is not None:
        yield from ctx.index.untouch(thread_id, prepared.active)


def _take_back(ctx: Context, keys: list[str]) -> Op[None]:
    """Delete objects no index entry refers to (writes that were refused or lost)."""
    yield from delete_keys(ctx, keys, "refused or superseded writes")
