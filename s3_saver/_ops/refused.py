"""What a writer does when the thread's record refuses its commit (a delete,
an archive, a deleted run, a restore racing it): restore first, join the new
generation, or take its objects back and raise a clear error. Shared by
``put`` and ``put_writes``.
"""

from __future__ import annotations

from typing import Any

from s3_saver._format.entries import ArchiveRef, Tombstone
from s3_saver._index.terms import Prepared
from s3_saver._ops.install import restore_before_write
from s3_saver._ops.context import Context
from s3_saver._ops.delete import delete_keys
from s3_saver._transport.protocol import Op
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
