"""The commit point of a write, and what a writer does when the index refuses it.

Objects first, index entry last: ``commit_checkpoint`` is put's round trip 2 (the
listing and run records the commit finds go beside it), tried again after a
refusal. The thread's record refuses a commit (a delete, an archive, a deleted
run, a restore racing it): restore first, join the new generation, or take the
objects back and raise a clear error (shared with ``put_writes``). A parent gone
since it was read (pruned, written anew by a restore): the values it held are
stored here. With encryption, a commit sealed under a key an erase destroyed (this
process cached it before another process erased the thread): its objects are taken
back and ``KeyGone`` tells the write to seal its content again under the thread's
key as the key store has it now (``keyed.rekeyed``), and to send it all again.
"""

from __future__ import annotations

from typing import Any

from s3_saver._format.entries import ArchiveRef, CheckpointEntry, Tombstone, ref_pieces
from s3_saver._format.keys import new_token
from s3_saver._index.terms import Fenced, ParentGone, Prepared
from s3_saver._ops.context import Context
from s3_saver._ops.delete import delete_keys
from s3_saver._ops.install import restore_before_write

# Shared with copy and import (defined beside ``rekeyed``, see ``keyed``); put and
# put_writes import them from here.
from s3_saver._ops.keyed import MAX_REKEYS, key_gone  # noqa: F401
from s3_saver._ops.keyed import rekeyed_too_often as _rekeyed_too_often  # noqa: F401
from s3_saver._ops.stage import Draft, stage, store_late
from s3_saver._transport.protocol import Op, gather
from s3_saver._transport.s3 import put_immutable
from s3_saver.errors import (
    RunDeletedError,
    S3SaverError,
    ThreadArchivedError,
    ThreadDeletedError,
)

# Commits refused by the thread's record and tried again (after a restore, an
# archive's mark taken off...): each round has a reason that does not repeat
# unless archives and restores keep racing the write.
_MAX_FENCED = 6


class KeyGone(Exception):
    """Internal: the commit was refused because the key its content is sealed under
    was destroyed by an erase (``Tombstone.gone_keys``). Its objects (and the
    activity entry its prepare wrote) were taken back; the write seals anew under
    the thread's key as read now and is sent again (``put``, ``put_writes``)."""

    def __init__(self, thread_id: str) -> None:
        super().__init__(f"thread {thread_id!r}: the key this write was sealed under was destroyed by an erase")
        self.thread_id = thread_id


def commit_checkpoint(ctx: Context, d: Draft, entry: CheckpointEntry, prepared: Prepared) -> Op[None]:
    """Round trip 2, the commit point: the entry, and the records that find the
    thread beside it (listing, run: hints, a failed commit's find nothing)."""
    # A root checkpoint of a thread that is not listed lists it: its first one
    # (again after a delete), or the next one when listing failed.
    created = prepared.listing if not prepared.listed else None
    run = entry.run_id if entry.run_id is not None and (entry.run_id, d.thread_id) not in ctx.noted else None
    for _ in range(_MAX_FENCED):
        # What the entry carries from its parent (values, and the earlier pieces
        # of its deltas) must still be there at the commit: the commit checks
        # that the parent's entry is in the index as read.
        carries = any(p[1] != d.checkpoint_id for ref in d.loc.values() for p in ref_pieces(ref))
        parent_tag = d.known[2] if carries and d.known is not None and d.parent_id is not None else None
        commit = ctx.index.commit_checkpoint(
            entry, created, parent_tag, active=prepared.active, key_id=ctx.sealer.key_id(d.thread_id)
        )
        try:
            if created is None and run is None:
                yield from commit
            else:
                yield from gather(commit, ctx.index.note(d.thread_id, None if ctx.index.lists_in_prepare else created, run))
                if run is not None:
                    ctx.noted.add((run, d.thread_id))
                if created is not None:
                    ctx.listed.add((d.thread_id, entry.gen))
            return
        except ParentGone:
            if (yield from _parent_gone(ctx, d, entry)):
                return
        except Fenced as fenced:
            if key_gone(ctx, fenced.record, d.thread_id) and (d.parent_id is None or fenced.record.gen == entry.gen):
                # Sealed under a key an erase destroyed: nothing of it commits. Sealed
                # again by the caller, under the thread's key as read now. (A run
                # that continues the erased history is refused below, as after a delete.)
                yield from gather(_take_back(ctx, list(d.objects)), _untouch(ctx, d.thread_id, prepared))
                raise KeyGone(d.thread_id) from None
            try:
                yield from _fenced(ctx, fenced.record, entry, list(d.objects), created=d.parent_id is None)
            except ThreadDeletedError:
                # Refused for good: the records written beside the commit go too.
                yield from gather(
                    ctx.index.unnote(d.thread_id, d.listed_early or created, run), _untouch(ctx, d.thread_id, prepared)
                )
                raise
    raise _busy(ctx, d.thread_id)


def _parent_gone(ctx: Context, d: Draft, entry: CheckpointEntry) -> Op[bool]:
    """Pruned (or written anew by a restore) since this run read it: what the
    parent's objects held is stored here, as for an unknown parent. True: this
    commit landed before (its answer was lost), nothing more to do."""
    if d.staged.deltas:
        landed = (yield from ctx.index.entries([d.own])).get(d.own)
        if landed is not None and landed.tag == entry.tag and landed.gen == entry.gen:
            # This commit landed before (its answer was lost) and the
            # parent went after it: a later checkpoint may read its pieces.
            return True
        # A delta reads pieces the parent's prune may release: the
        # checkpoint is written again whole, under a tag of its own (the
        # object just written is immutable), and the first one goes.
        first, tag = list(d.objects), new_token()
        every = {ch: v for ch, v in {**d.carried, **d.fresh}.items() if ch in d.values}
        alone = {k: v for k, v in d.head.items() if k != "carried"}
        d.staged = stage(ctx, d.thread_id, d.ns, d.checkpoint_id, alone, every, d.values, None, d.now, d.loc_estimate, tag)
        d.objects = d.staged.objects
        yield from put_immutable(ctx.s3, d.objects, same=ctx.sealer.same(d.thread_id))
        d.loc = entry.loc = dict(d.staged.loc)
        entry.body, entry.tag = d.staged.body, tag
        yield from _take_back(ctx, first)
    else:
        late = {ch: ref[0] for ch, ref in d.loc.items() if ref[1] != d.checkpoint_id and ch in d.values}
        yield from store_late(ctx, d.thread_id, d.ns, d.checkpoint_id, late, d.values, d.now, d.loc, d.objects)
    d.known = None
    return False


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
    write that never was), unless the thread's index records that entry itself."""
    if prepared.active is not None:
        yield from ctx.index.untouch(prepared.active)


def _take_back(ctx: Context, keys: list[str]) -> Op[None]:
    """Delete objects no index entry refers to (writes that were refused or lost)."""
    yield from delete_keys(ctx, keys, "refused or superseded writes")
