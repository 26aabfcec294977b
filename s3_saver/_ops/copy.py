"""copy_thread: the source's entries read, every object they name copied server-side
under the target thread and a fresh tag, then the entries written under the target.

What is copied is ``closure.closure`` of the source's entries (the objects of
pruned or expired ancestors a copied checkpoint reads included), so the copy
reads exactly as the source. Objects go before the first index entry, and under
keys no earlier call used (``closure.moved``): a copy cut short and called again
never reuses an object a garbage collection may be deleting. An archived
source is copied from its archive.

With encryption, nothing is copied server-side: a ciphertext is bound to its place
(its key and thread), so a byte-for-byte copy under the target would not open. Each
object is read, opened under the source's key for its own place, and sealed under the
target's key for its new one; the index's copies of bodies and metadata likewise.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from s3_saver._format.archive import decode_archive
from s3_saver._format.closure import closure, moved, own_object
from s3_saver._format.entries import CheckpointEntry, WritesEntry
from s3_saver._format.keys import new_tag
from s3_saver._index.activity import day_of
from s3_saver._index.terms import Archived, Fenced
from s3_saver._ops.archived import _WAVE, read_archive
from s3_saver._ops.commit import KeyGone
from s3_saver._ops.context import Context, meta_key, target
from s3_saver._ops.delete import deleter
from s3_saver._ops.install import install
from s3_saver._ops.keyed import (
    MAX_REKEYS,
    key_gone,
    keyed,
    rekeyed,
    rekeyed_too_often,
    writer_keyed,
)
from s3_saver._ops.prune import take_out_runs
from s3_saver._transport.protocol import Op, gather, raise_failure, request
from s3_saver._transport.s3 import DELETE_BATCH, copy_immutable, put_immutable
from s3_saver.errors import ConfigurationError, MissingObjectError

# Reads of the source: one, and again for each object a writer or prune took meanwhile.
_READS = 3


def copy_thread(ctx: Context, source_thread_id: str, target_thread_id: str) -> Op[None]:
    source, _, _ = target({"configurable": {"thread_id": source_thread_id}})
    dest, _, _ = target({"configurable": {"thread_id": target_thread_id}})
    if source == dest:
        raise ConfigurationError("copy_thread needs two different thread ids")
    for _ in range(MAX_REKEYS):
        try:
            return (yield from _copy(ctx, source, dest))
        except KeyGone:
            # With encryption: the target's index write refused because an erase of the
            # target (another process's, after this call read the key) destroyed the key
            # the copy is sealed under. Copied again, sealed under the key read now (a
            # new life's); what this attempt wrote, under its own tag, no index names.
            ctx = yield from rekeyed(ctx, dest)
    raise rekeyed_too_often(dest)


def _copy(ctx: Context, source: str, dest: str) -> Op[None]:
    yield from ctx.index.check_copy_target(source, dest)
    if ctx.crypt is not None:
        # Both keys: the source's to open, the target's to seal (made for a new target,
        # checked against the keys an erase of the target destroyed).
        ctx, record = yield from gather(keyed(ctx, [source]), ctx.index.archive_of(dest))
        ctx = yield from writer_keyed(ctx, dest, record)
    active = None
    for attempt in range(1, _READS + 1):
        try:
            entries = [e for e in (yield from ctx.index.contents(source)) if not ctx.expired(e)]
        except Archived as archived:
            data = yield from read_archive(ctx, source, archived.ref)
            archive = decode_archive(data, f"s3://{ctx.s3.bucket}/{archived.ref.key}")
            if active is not None:
                yield from ctx.index.untouch(active)  # install stages its own
            try:
                yield from install(ctx, dest, archive, copied_from=source)
            except Fenced as fenced:
                raise _gone(ctx, fenced, dest) from None
            yield from _no_deleted_runs(ctx, source, dest, archive.entries)
            return
        tag = new_tag()
        copies, writes = moved(entries, dest, tag)
        pairs = _pairs(ctx, entries, writes, dest, tag)
        copying = _copied(ctx, pairs, attempt) if ctx.crypt is None else _resealed(ctx, source, dest, pairs, entries, attempt)
        if active is None:
            # The copy's activity entry of the day (archive_idle, ``_index/activity``) is
            # staged beside the objects and recorded by the commit on the target's record,
            # so that a delete or an archive of the copy removes it (``install.install``).
            copied, active = yield from gather(copying, ctx.index.stage_active(dest, day_of(ctx.now())))
        else:
            copied = yield from copying
        if copied is not False:
            if ctx.crypt is not None:
                # The index's copies of bodies and metadata, sealed for the target too.
                copies, writes = _resealed_entries(ctx, source, copies, writes, copied)
            break
        # A source object went after the read: a writer replaced a special channel's
        # write (the last wins, its old object deleted), or a prune took a checkpoint.
        # The source read again names what is there now. What this attempt copied no
        # index names, under keys with this attempt's own tag, which no other call
        # writes: deleted now (a delete of the copy would never find them).
        yield from _discard(ctx, sorted(pairs.values()))
    ctx.locs.forget_thread(dest)
    try:
        yield from ctx.index.copy_thread(
            source, dest, copies, writes, ctx.now(), deleter(ctx, dest), active, ctx.sealer.key_id(dest)
        )
    except ConfigurationError:
        yield from ctx.index.untouch(active)  # refused: the target got checkpoints of its own
        raise
    except Fenced as fenced:
        yield from ctx.index.untouch(active)
        raise _gone(ctx, fenced, dest) from None
    ctx.locs.forget_thread(dest)
    yield from _no_deleted_runs(ctx, source, dest, entries)


def _discard(ctx: Context, keys: list[str]) -> Op[None]:
    calls = [ctx.s3.delete_many(keys[i : i + DELETE_BATCH]) for i in range(0, len(keys), DELETE_BATCH)]
    if calls:
        yield from request(*calls)


def _gone(ctx: Context, fenced: Fenced, dest: str) -> Exception:
    """What a copy's index write refused by the target's record raises: ``KeyGone``
    when an erase destroyed the key the copy is sealed under (sealed again by
    ``copy_thread``), else the refusal as it came."""
    return KeyGone(dest) if key_gone(ctx, fenced.record, dest) else fenced


def _pairs(ctx: Context, entries: list[CheckpointEntry], writes: list[Any], dest: str, tag: str) -> dict[str, str]:
    """Each object the source's entries read (their closure), its key -> its copy's."""
    layout = ctx.layout
    pairs = {
        layout.object_key(o): layout.object_key(replace(o, thread_id=dest, tag=tag))
        for o in closure(entries)
        if o.kind != "writes"
    }
    old_writes = [w for e in entries for w in e.writes or ()]
    pairs.update((layout.object_key(own_object(w)), layout.object_key(own_object(n))) for w, n in zip(old_writes, writes))
    return pairs


def _copied(ctx: Context, pairs: dict[str, str], attempt: int) -> Op[bool]:
    """The objects copied (True), or one of them missing at its source (False),
    which the last attempt raises."""
    try:
        yield from copy_immutable(ctx.s3, pairs)
    except MissingObjectError:
        if attempt == _READS:
            raise
        return False
    return True


def _resealed(
    ctx: Context, source: str, dest: str, pairs: dict[str, str], entries: list[CheckpointEntry], attempt: int
) -> Op[dict[str, bytes] | bool]:
    """With encryption, the copy of ``pairs`` (source key -> target key): each object
    read (in waves of ``_WAVE``; an object whose bytes the index carries is not read),
    opened under the source's key for its place, sealed under the target's for its
    new one, written as an immutable object. Returns the sealed bytes of the objects
    whose bytes the index carries (the entries' bodies), or False when a source
    object was missing (the last attempt raises), as ``_copied``."""
    layout = ctx.layout
    carried: dict[str, bytes] = {}
    for e in entries:
        if e.body is not None:
            carried[layout.object_key(own_object(e))] = e.body
        for w in e.writes or ():
            if w.body is not None:
                carried[layout.object_key(own_object(w))] = w.body
    bodies: dict[str, bytes] = {}
    items = list(pairs.items())
    for start in range(0, len(items), _WAVE):
        chunk = items[start : start + _WAVE]
        calls = tuple(ctx.s3.get(s) for s, _ in chunk if s not in carried)
        answers = (yield calls) if calls else []
        read: dict[str, bytes] = {}
        for call, answer in zip(calls, answers):
            if isinstance(answer, BaseException):
                try:
                    raise_failure(call, answer)
                except MissingObjectError:
                    if attempt == _READS:
                        raise
                    return False
            read[call.params["Key"]] = answer["Body"]
        objects: dict[str, bytes] = {}
        for s, d in chunk:
            stored = carried[s] if s in carried else read[s]
            plain = ctx.sealer.open(source, s, stored, f"s3://{ctx.s3.bucket}/{s}")
            objects[d] = ctx.sealer.seal(dest, d, plain)
            if s in carried:
                bodies[d] = objects[d]
        yield from put_immutable(ctx.s3, objects, same=ctx.sealer.same(dest))
    return bodies


def _resealed_entries(
    ctx: Context, source: str, copies: list[CheckpointEntry], writes: list[WritesEntry], bodies: dict[str, bytes]
) -> tuple[list[CheckpointEntry], list[WritesEntry]]:
    """The target's entries carrying what the target's objects hold (``bodies``, by
    object key) and their metadata sealed for the target's checkpoints."""
    layout = ctx.layout

    def body(obj_key: str, had: bytes | None) -> bytes | None:
        return bodies.get(obj_key) if had is not None else None

    out = []
    for e in copies:
        metadata = e.metadata
        if metadata is not None:
            where = f"index entry of checkpoint {e.checkpoint_id} of thread {source!r}"
            pair = ctx.sealer.open_meta(source, meta_key(ctx, source, e.ns, e.checkpoint_id), metadata, where)
            metadata = ctx.sealer.seal_meta(e.thread_id, meta_key(ctx, e.thread_id, e.ns, e.checkpoint_id), pair)
        out.append(replace(e, body=body(layout.object_key(own_object(e)), e.body), metadata=metadata))
    return out, [replace(w, body=body(layout.object_key(own_object(w)), w.body)) for w in writes]


def _no_deleted_runs(ctx: Context, source: str, dest: str, entries: list[CheckpointEntry]) -> Op[None]:
    """A delete_for_runs of a copied run may have marked the source after this
    copy read it, and looked up the run's threads before the copy's hints were
    written: the source's deleted runs, read after those hints, say which runs
    the copy must not keep (see _ops.prune.delete_for_runs)."""
    runs = {e.run_id for e in entries if e.run_id is not None}
    if not runs:
        return
    record = yield from ctx.index.archive_of(source)
    dead = sorted(runs & record.dead_runs)
    if dead:
        yield from take_out_runs(ctx, dest, dead)
