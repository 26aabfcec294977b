"""rebuild_index: the index entries of threads, read back from their objects alone.

The admin path (the only one, with ``list(None)``, that lists the bucket). Every
object is self-describing: a checkpoint object holds its id, parent, metadata,
the checkpoint (with its channel versions) and the values it stored; keys name
the blobs' channels and versions and the pending-write parts. What no object
records is rebuilt from the bucket's own clock:

* ``loc``: for each channel version of a checkpoint, the object that stores that
  version (its own first, else the newest copy written no later than it);
* which of two pending-write parts of one slot was committed: the regular part
  written first, the special channel's part written last (``LastModified``);
* which pending-write calls to take: only whole ones (every part of the call is
  in the bucket, or lost its slot to a part that is), never part of a call a cut
  left half-written (``_whole_calls``);
* with a ``ttl``, an entry expires a ``ttl`` after its object was written.

Tombstones live only in the index: where one survived, what it deleted stays
deleted (see ``Index.restore``); objects of a delete that never ran are back.
An archived thread's marker comes back from its archive object under
``archive/`` (the thread has no live objects left).

With ``encryption=``, each batch of threads' keys is read from the key store (beside
the batch's first reads), the objects are opened under them and the entries' copies of
content sealed as a write seals them; what cannot be opened (an erased thread's
remnants, plaintext, no key) is left out and reported (``rebuild_keys``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Any

from s3_saver._format.archive import (
    INSTANT_CLASSES,
    decode_archive,
    latest_of,
    metadata_newest,
    newest_of,
)
from s3_saver._format.codec import (
    CHECKPOINT_FORMAT,
    WRITES_FORMAT,
    loads,
    typed,
    unpack,
)
from s3_saver._format.entries import (
    IN_BLOB_OBJECT,
    IN_CHECKPOINT_OBJECT,
    REGULAR_PART,
    ArchiveRef,
    CheckpointEntry,
    Loc,
    Ref,
    WritesEntry,
    make_ref,
)
from s3_saver._format.keys import ObjectKey
from s3_saver._ops.archive import sealed_latest
from s3_saver._ops.context import Context, meta_key, target
from s3_saver._ops.put import run_of
from s3_saver._ops.rebuild_keys import (
    ERASED,
    KEY_NOT_ARRIVED,
    Rebuilt,
    Unindexed,
    cold_archive,
    erased_at,
    keyless,
    opened,
    read_keys,
)
from s3_saver._transport.mode import settle_mode
from s3_saver._transport.protocol import Op, gather, request, request_one

_GET_WAVE = 100  # objects (and, with encryption, threads' key records) read per round trip
_ABSENT = object()

Listed = tuple[ObjectKey, str, int]  # what the key says, the key, its LastModified (epoch s)


def rebuild_index(
    ctx: Context,
    thread_id: str | None,
    incomplete: list[str] | None = None,
    incomplete_writes: list[str] | None = None,
) -> Op[Rebuilt]:
    """Rebuild the index entries of one thread, or of every thread under the prefix;
    returns how many checkpoints were indexed, and what was left out (``Rebuilt``).

    ``incomplete`` (a replica's bucket, where objects arrive one by one in any
    order): index only the checkpoints whose objects have all arrived, and
    append the others to it as ``thread/ns/checkpoint_id``. ``incomplete_writes``:
    append the tasks whose pending-write call was left out because only some of
    its objects are in the bucket, as ``thread/ns/checkpoint_id/task_id`` (a call
    is indexed whole or not at all, in every rebuild: see ``_whole_calls``).

    A rebuild of every thread makes the prefix the saver's table's: its marker
    is replaced last, once the index is whole, when it names another table.
    The operator's (not promote's, which may take only its Replica's) may move
    the prefix from any table: a lost table's.
    """
    move = thread_id is None and incomplete is None
    try:
        return (yield from _rebuild(ctx, thread_id, incomplete, incomplete_writes, move))
    except BaseException:
        if ctx.mode is not None:
            ctx.mode.stay()
        raise


def _rebuild(
    ctx: Context,
    thread_id: str | None,
    incomplete: list[str] | None,
    incomplete_writes: list[str] | None,
    move: bool,
) -> Op[Rebuilt]:
    # First: objects of the other index mode's threads are never indexed here
    # (a second history of each); the index's first write claims the prefix.
    yield from settle_mode(ctx.mode, survey=True, claim=False, move=move)
    if thread_id is not None:
        thread_id, _, _ = target({"configurable": {"thread_id": thread_id}})
        prefix = ctx.layout.thread_dir(thread_id)
    else:
        prefix = ctx.layout.root
    threads: dict[str, list[Listed]] = defaultdict(list)
    token: str | None = None
    while True:
        page = yield from request_one(ctx.s3.list_keys(prefix, token))
        for obj in page.get("Contents", []):
            parsed = ctx.layout.parse_object_key(obj["Key"])
            if parsed is not None:
                threads[parsed.thread_id].append((parsed, obj["Key"], int(obj["LastModified"].timestamp())))
        token = page.get("NextContinuationToken")
        if not token:
            break
    archives = yield from _list_archives(ctx, ctx.layout.archive_dir(thread_id) if thread_id else ctx.layout.archive_root)
    total = 0
    unindexed: list[Unindexed] = []
    ordered = sorted(set(threads) | set(archives))
    for start in range(0, len(ordered), _GET_WAVE):
        batch = ordered[start : start + _GET_WAVE]
        # With encryption, the batch's keys, in the wave of the first thread's first reads.
        keys, first = yield from gather(read_keys(ctx, batch), _read(ctx, threads.get(batch[0], [])))
        for tid in batch:
            thread_ctx = ctx if ctx.crypt is None else replace(ctx, sealer=ctx.sealer.with_keys({tid: keys[tid]}))
            if tid in threads:
                # Live objects win: an archive beside them is one a crash left before
                # its switch, or a restore left after its own (each reads the same).
                stored = first if tid == batch[0] else (yield from _read(ctx, threads[tid]))
                total += yield from _rebuild_thread(
                    thread_ctx, tid, threads[tid], stored, incomplete, incomplete_writes, unindexed
                )
            else:
                total += yield from _rebuild_archived(thread_ctx, tid, max(archives[tid], key=lambda a: a[1]), unindexed)
    if thread_id is None and ctx.index.owner is not None:
        # The index is now this bucket's, whole (promote's rebuild of the other region's table).
        yield from ctx.index.owner.take()
    if thread_id is None and ctx.mode is not None:
        # The switch (a prefix belongs to one table): from here on the prefix is this table's.
        yield from ctx.mode.take()
    return Rebuilt(total, tuple(unindexed))


def _read(ctx: Context, listed: list[Listed]) -> Op[dict[str, bytes]]:
    """The stored bytes of a thread's checkpoint and pending-write objects (the
    others are named by their keys alone), ``_GET_WAVE`` a round trip."""
    wanted = [key for parsed, key, _ in listed if parsed.kind in ("checkpoint", "writes")]
    stored: dict[str, bytes] = {}
    for i in range(0, len(wanted), _GET_WAVE):
        chunk = wanted[i : i + _GET_WAVE]
        results = yield from request(*(ctx.s3.get(key) for key in chunk))
        stored.update((key, result["Body"]) for key, result in zip(chunk, results))
    return stored


def _list_archives(ctx: Context, prefix: str) -> Op[dict[str, list[tuple[str, int, str, int]]]]:
    """Archive objects by thread: (key, LastModified, storage class, size)."""
    found: dict[str, list[tuple[str, int, str, int]]] = defaultdict(list)
    token: str | None = None
    while True:
        page = yield from request_one(ctx.s3.list_keys(prefix, token))
        for obj in page.get("Contents", []):
            tid = ctx.layout.thread_of_archive(obj["Key"])
            if tid is not None:
                modified = int(obj["LastModified"].timestamp())
                found[tid].append((obj["Key"], modified, obj.get("StorageClass") or "STANDARD", obj.get("Size", 0)))
        token = page.get("NextContinuationToken")
        if not token:
            return found


def _rebuild_archived(
    ctx: Context, thread_id: str, archive: tuple[str, int, str, int], unindexed: list[Unindexed]
) -> Op[int]:
    """An archived thread's reference, from its archive object: read whole when its
    class allows, else from what ``archive_thread`` wrote in its metadata (a cold
    archive rebuilt this way has no latest checkpoint to show in ``list_threads``).
    With encryption, an archive that does not open under the thread's key (or, cold,
    whose metadata names another key) is left out and reported."""
    key, modified, storage_class, size = archive
    ref = ArchiveRef(key, storage_class, size, modified, {"": ""})
    created, count = modified, 0
    if storage_class in INSTANT_CLASSES:
        found = yield from request_one(ctx.s3.get(key))
        left = keyless(ctx, thread_id, {key: found["Body"]}, (key,))
        data = opened(ctx, thread_id, key, found["Body"]) if left is None else left.reason
        if isinstance(data, str):
            unindexed.append(Unindexed(thread_id, data, (key,), erased_at(ctx, thread_id) if data == ERASED else None))
            return 0
        content = decode_archive(data, f"s3://{ctx.s3.bucket}/{key}")
        # The index's reference carries the latest checkpoint sealed, as archive_thread's does.
        ref.newest, ref.latest, count = newest_of(content.entries), sealed_latest(ctx, latest_of(content)), len(content.entries)
        created = content.created or modified
    else:
        head = yield from request_one(ctx.s3.head(key))
        why = cold_archive(ctx, thread_id, key, head.get("Metadata", {}))
        if why is not None:
            unindexed.append(Unindexed(thread_id, why, (key,), erased_at(ctx, thread_id) if why == ERASED else None))
            return 0
        ref.newest = metadata_newest(head.get("Metadata", {})) or ref.newest
    record = yield from ctx.index.archive_of(thread_id)
    if record.archive is not None and record.archive.key == key:
        # Indexed already (a rebuild run again after a cut, or over an index that
        # was never lost): the thread reads from this archive, as it should.
        return count
    yield from ctx.index.restore(thread_id, [], [], created)
    yield from ctx.index.mark_archive(thread_id, key)
    _, snapshot = yield from ctx.index.snapshot(thread_id)
    yield from ctx.index.switch_archive(thread_id, ref, snapshot)
    ctx.locs.forget_thread(thread_id)
    return count


def _rebuild_thread(
    ctx: Context,
    thread_id: str,
    listed: list[Listed],
    stored: dict[str, bytes],
    incomplete: list[str] | None,
    incomplete_writes: list[str] | None,
    unindexed: list[Unindexed],
) -> Op[int]:
    """One live thread's entries from its objects (``stored``: the bytes of its
    checkpoint and pending-write objects, as ``_read`` read them)."""
    # What is parsed is the opened bytes; what the entries carry is the stored bytes
    # (with encryption, the object's own sealed bytes, as a write's entry carries them).
    bodies, listed = _opened(ctx, thread_id, listed, stored, incomplete, unindexed)
    if bodies is None:
        return 0

    # Every stored copy of (namespace, channel, version): (source checkpoint, kind,
    # written at, tag). A checkpoint written again under a tag (a restore, an
    # import, a copy: see _keys) has one object per tag: the newest is indexed.
    copies: dict[tuple[str, str, Any], list[tuple[str, int, int, str]]] = defaultdict(list)
    newest: dict[tuple[str, str], tuple[ObjectKey, str, int]] = {}
    for parsed, key, written in listed:
        if parsed.kind == "blob":
            copies[(parsed.ns, parsed.channel, parsed.version)].append((parsed.checkpoint_id, IN_BLOB_OBJECT, written, parsed.tag))
        elif parsed.kind == "checkpoint":
            held = newest.get((parsed.ns, parsed.checkpoint_id))
            if held is None or (written, parsed.tag) > (held[2], held[0].tag):
                newest[(parsed.ns, parsed.checkpoint_id)] = (parsed, key, written)
    records: list[tuple[ObjectKey, str, int, dict[str, Any]]] = []
    for parsed, key, written in newest.values():
        record = unpack(bodies[key], CHECKPOINT_FORMAT, f"s3://{ctx.s3.bucket}/{key}")
        records.append((parsed, key, written, record))
        for channel, (version, *_) in [*record["values"].items(), *record.get("pieces", {}).items()]:
            copies[(parsed.ns, channel, version)].append((parsed.checkpoint_id, IN_CHECKPOINT_OBJECT, written, parsed.tag))

    versions: dict[tuple[str, str], dict[str, Any]] = {}
    updated: dict[tuple[str, str], Any] = {}
    decoded = []
    for parsed, key, written, record in records:
        where = f"checkpoint {parsed.checkpoint_id} of thread {thread_id!r}"
        checkpoint = loads(ctx.serde, typed(record["checkpoint"]), where)
        versions[(parsed.ns, parsed.checkpoint_id)] = checkpoint.get("channel_versions", {})
        updated[(parsed.ns, parsed.checkpoint_id)] = checkpoint.get("updated_channels")
        decoded.append((parsed, key, written, record, checkpoint, where))
    complete = _Completeness(records, versions, updated, copies)

    entries = []
    for parsed, key, written, record, checkpoint, where in decoded:
        if incomplete is not None and not complete(parsed.ns, parsed.checkpoint_id):
            incomplete.append(f"{thread_id}/{parsed.ns}/{parsed.checkpoint_id}")
            continue
        metadata = loads(ctx.serde, typed(record["metadata"]), f"metadata of {where}")
        loc: Loc = {}
        for channel, version in checkpoint.get("channel_versions", {}).items():
            found = _pick(copies.get((parsed.ns, channel, version), []), parsed.checkpoint_id, written, parsed.tag)
            if found is not None:
                chain = _chain(complete.records, copies, parsed.ns, channel, found, channel in record.get("carried", ()))
                if chain is None:
                    loc = None
                    break
                pieces, oldest = chain
                # A delta's put time is its oldest piece's (a ttl stores it again
                # once that is half a ttl old, before a lifecycle rule takes it).
                loc[channel] = make_ref(version, found[0], found[1], min(found[2], oldest), found[3], pieces)
        if loc is None:
            # A piece its value reads is not in the bucket: left out, never served partial.
            if incomplete is not None:
                incomplete.append(f"{thread_id}/{parsed.ns}/{parsed.checkpoint_id}")
            continue
        entries.append(
            CheckpointEntry(
                thread_id=thread_id,
                ns=parsed.ns,
                checkpoint_id=parsed.checkpoint_id,
                parent_id=record.get("parent_checkpoint_id"),
                loc=loc,
                body=stored[key],
                metadata=ctx.sealer.seal_meta(
                    thread_id, meta_key(ctx, thread_id, parsed.ns, parsed.checkpoint_id), typed(record["metadata"])
                ),
                expires_at=written + ctx.ttl_seconds if ctx.ttl_seconds else None,
                run_id=run_of(metadata),
                tag=parsed.tag,
            )
        )

    # One part per slot: the regular part written first, a special channel's written last;
    # only the parts of whole calls (a call cut between its objects left others).
    found: list[tuple[ObjectKey, int, WritesEntry]] = []
    named: dict[_CallKey, set[str]] = defaultdict(set)  # a call's parts, as its objects name them
    present: dict[_CallKey, set[str]] = defaultdict(set)
    for parsed, key, written in listed:
        if parsed.kind != "writes":
            continue
        part = unpack(bodies[key], WRITES_FORMAT, f"s3://{ctx.s3.bucket}/{key}")  # refuse what is not ours
        call = (parsed.ns, parsed.checkpoint_id, parsed.task_id, parsed.token)
        named[call].update(part.get("parts") or (parsed.part,))
        present[call].add(parsed.part)
        entry = WritesEntry(
            thread_id,
            parsed.ns,
            parsed.checkpoint_id,
            parsed.task_id,
            parsed.part,
            parsed.token,
            stored[key],
            expires_at=written + ctx.ttl_seconds if ctx.ttl_seconds else None,
        )
        found.append((parsed, written, entry))
    whole = _whole_calls(named, present)
    slots: dict[tuple[str, str, str, str], tuple[int, str, WritesEntry]] = {}
    for parsed, written, entry in found:
        if (parsed.ns, parsed.checkpoint_id, parsed.task_id, parsed.token) not in whole:
            continue
        slot = (parsed.ns, parsed.checkpoint_id, parsed.task_id, parsed.part)
        held = slots.get(slot)
        first = parsed.part.startswith(REGULAR_PART)
        if held is None or ((written, parsed.token) < held[:2]) == first:
            slots[slot] = (written, parsed.token, entry)
    if incomplete_writes is not None:
        left = {f"{thread_id}/{ns}/{cid}/{task}" for ns, cid, task, _ in set(named) - whole}
        incomplete_writes.extend(sorted(left - set(incomplete_writes)))
    # Listed as created when its oldest object was written; the run hints again.
    created = min((written for _, _, written, _ in records), default=ctx.now())
    yield from ctx.index.restore(thread_id, entries, [entry for _, _, entry in slots.values()], created)
    runs = sorted({e.run_id for e in entries if e.run_id is not None})
    yield from gather(*(ctx.index.note(thread_id, None, run) for run in runs))
    ctx.locs.forget_thread(thread_id)
    return len(entries)


def _opened(
    ctx: Context,
    thread_id: str,
    listed: list[Listed],
    stored: dict[str, bytes],
    incomplete: list[str] | None,
    unindexed: list[Unindexed],
) -> tuple[dict[str, bytes] | None, list[Listed]]:
    """The thread's read objects opened (as stored, without encryption), and its
    listing without what was left out; (None, ...) when the thread is left out whole
    (reported in ``unindexed``; in a replica region whose key store lacks the key,
    its checkpoints are ``incomplete``)."""
    every = tuple(key for _, key, _ in listed)
    left = keyless(ctx, thread_id, stored, every)
    found: dict[str, bytes] = {}
    remnants: list[str] = []
    if left is None:
        for key, data in stored.items():
            got = opened(ctx, thread_id, key, data)
            if got == ERASED:
                remnants.append(key)  # an earlier life's, sealed under a destroyed key
            elif isinstance(got, str):
                left = Unindexed(thread_id, got, every)
                break
            else:
                found[key] = got
    if left is not None:
        unindexed.append(left)
        if left.reason == KEY_NOT_ARRIVED and incomplete is not None:
            incomplete.extend(
                sorted({f"{thread_id}/{p.ns}/{p.checkpoint_id}" for p, _, _ in listed if p.kind == "checkpoint"})
            )
        return None, listed
    if remnants:
        unindexed.append(Unindexed(thread_id, ERASED, tuple(sorted(remnants)), erased_at(ctx, thread_id)))
        gone = set(remnants)
        listed = [item for item in listed if item[1] not in gone]
    return found, listed


_CallKey = tuple[str, str, str, str]  # one put_writes call: (namespace, checkpoint, task, token)


def _whole_calls(named: dict[_CallKey, set[str]], present: dict[_CallKey, set[str]]) -> set[_CallKey]:
    """The put_writes calls a rebuild may index: those whose parts are all in the
    bucket, or whose missing parts lost their slot to another such call's part.

    Invariant (only committed data is readable): a call writes its parts'
    objects in one wave and commits after, so a cut can leave some of its parts
    and not the others; indexing those would make readable a part of a write
    that no index committed (a resume without the writes it came with). No index
    tells what was committed here, so the rule is the call's atomicity: its parts
    come back together or not at all. A part of a committed call leaves the
    bucket only when another call's part took its slot (``put_writes._release``:
    a special channel written again, a regular part that lost first-wins), so a
    missing part whose slot another kept call holds is one the call lost, not one
    it never wrote. Dropping a call can leave another's missing part without a
    holder: repeated until nothing changes.

    A call's parts are named in each of its objects (``parts``) when it has more
    than one. An object without that name is a one-part call or was written
    before the name existed: it stands alone, as every part did then (dropping
    those would lose every committed pending write written before, to guard the
    one call per task a cut may have left half-written at that time).
    """
    kept = set(named)
    while True:
        held = {(ns, cid, task, part) for ns, cid, task, token in kept for part in present[(ns, cid, task, token)]}
        lost = {
            call
            for call in kept
            if any((*call[:3], part) not in held for part in named[call] - present[call])
        }
        if not lost:
            return kept
        kept -= lost


def _chain(
    records: dict[tuple[str, str], dict[str, Any]],
    copies: dict[tuple[str, str, Any], list[tuple[str, int, int, str]]],
    ns: str,
    channel: str,
    found: tuple[str, int, int, str],
    carried_delta: bool,
) -> tuple[tuple[Ref, ...], int] | None:
    """The earlier pieces of the copy ``found`` when its record says it is a
    delta (its "chains"), each as the copy of its (version, checkpoint) written
    under the same tag where there is one, and the oldest piece's write time;
    () for a whole value; None when the
    source's record or a piece is missing. ``carried_delta``: the checkpoint's
    record says it carries that channel's value as a delta."""
    source, _, _, tag = found
    record = records.get((ns, source))
    if record is None:
        # Only a blob can be picked without its checkpoint's record: a whole
        # value, unless the checkpoint says it carries a delta (its source's
        # record has not arrived yet; a piece in a blob keeps its record, see
        # ``closure.named_by``).
        return None if carried_delta else ((), found[2])
    out, oldest = [], found[2]
    for version, piece_source in record.get("chains", {}).get(channel, ()):
        candidates = [c for c in copies.get((ns, channel, version), []) if c[0] == piece_source]
        if not candidates:
            return None
        best = max(candidates, key=lambda c: (c[3] == tag, c[2]))
        out.append(make_ref(version, best[0], best[1], 0, best[3]))
        oldest = min(oldest, best[2])
    return tuple(out), oldest


class _Completeness:
    """Whether every object a checkpoint reads is in the bucket listing.

    Its own object is (it was read); its blobs are named by its record. A
    channel version with no stored copy anywhere is fine only when it holds no
    value there: the record names the channels that do (``valued``). Records
    written before it was recorded are judged by who set the version: the checkpoint that gave the channel that version (its parent has
    another, its own ``updated_channels`` names the channel, or it has no
    parent) stored none. When that checkpoint cannot be told (its parent's
    object has not arrived either, and it does not say), the checkpoint counts
    as incomplete: left out is safe, served partial is not.
    """

    def __init__(
        self,
        records: list[tuple[ObjectKey, str, int, dict[str, Any]]],
        versions: dict[tuple[str, str], dict[str, Any]],
        updated: dict[tuple[str, str], Any],
        copies: dict[tuple[str, str, Any], list[tuple[str, int, int]]],
    ) -> None:
        self.records = {(p.ns, p.checkpoint_id): r for p, _, _, r in records}
        self.versions, self.updated, self.copies = versions, updated, copies

    def __call__(self, ns: str, checkpoint_id: str) -> bool:
        record = self.records[(ns, checkpoint_id)]
        for channel, version in record.get("blobs", {}).items():
            if (checkpoint_id, IN_BLOB_OBJECT) not in {c[:2] for c in self.copies.get((ns, channel, version), [])}:
                return False
        valued = record.get("valued")  # absent in objects written before it was recorded
        for channel, version in self.versions[(ns, checkpoint_id)].items():
            if self.copies.get((ns, channel, version)):
                continue
            if channel in valued if valued is not None else not self._never_valued(ns, channel, version):
                return False
        return True

    def _never_valued(self, ns: str, channel: str, version: Any) -> bool:
        holders = sorted(cid for (n, cid), vs in self.versions.items() if n == ns and vs.get(channel) == version)
        for cid in holders:
            parent = self.records[(ns, cid)].get("parent_checkpoint_id")
            before = self.versions.get((ns, parent)) if parent is not None else {}
            # The parent's object missing too: the checkpoint says itself which
            # channels its step updated (LangGraph's ``updated_channels``).
            gave = (
                before.get(channel, _ABSENT) != version
                if before is not None
                else channel in (self.updated.get((ns, cid)) or ())
            )
            if gave:
                record = self.records[(ns, cid)]
                return channel not in record.get("values", {}) and channel not in record.get("blobs", {})
        return False


def _pick(
    candidates: list[tuple[str, int, int, str]], checkpoint_id: str, written: int, tag: str
) -> tuple[str, int, int, str] | None:
    """The copy a checkpoint points at: its own (of its tag), else one written under
    its tag (the same restore, import or copy), else the newest written no later than it."""
    own = [c for c in candidates if c[0] == checkpoint_id]
    if own:
        return max(own, key=lambda c: (c[3] == tag, c[2]))
    same = [c for c in candidates if c[3] == tag]
    earlier = [c for c in (same or candidates) if c[2] <= written]
    return max(earlier or same or candidates, key=lambda c: (c[2], c[0]), default=None)
