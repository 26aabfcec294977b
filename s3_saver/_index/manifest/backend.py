"""The manifest index backend: no database, a per-thread head in the bucket.

Each thread has one small mutable head object, replaced only by
compare-and-swap (``IfMatch`` on the ETag it was read with, ``IfNoneMatch`` to
create it), and sealed immutable segments for its older checkpoints, so that
what a call reads and writes does not grow with the thread. The head swap is
the commit point of every write, and of a delete: a delete empties the head in
one swap (readers and writers see it at once) and removes the objects after.

A 412 on the head's ``IfMatch`` means "another writer got there first: read it
again and retry" (``_update``); a 412 on an immutable object's ``IfNoneMatch``
means "this key exists: compare bytes" (``put_immutable``). Different helpers.

This module holds ``ManifestIndex`` itself and a checkpoint's write path:
prepare, the commits of a checkpoint and of writes, the run and listing hints.
The head (read, swap, update, cache) and the segments are in ``head``;
reads, history and the ancestor walk in ``reads``. The store's setup and a
thread as read whole (contents, listing, runs) are in ``threads``, a thread
changed whole (restore, delete, prune, copy) in ``lifecycle``, the activity
entries in ``activity``; all are mixed into ``ManifestIndex``.
Sealing and the head's limits, which they use, are in ``seal``, and
picking entries out of a document in ``doc``.
"""

from __future__ import annotations

import threading
from dataclasses import replace

from s3_saver._format.entries import (
    REGULAR_PART,
    Activity,
    CheckpointEntry,
    WritesEntry,
)
from s3_saver._format.keys import KeyLayout
from s3_saver._index.activity import new_entry
from s3_saver._index.base import (
    Index,
)
from s3_saver._index.manifest.activity import ManifestActivity
from s3_saver._index.manifest.archive import ManifestArchive
from s3_saver._index.manifest.doc import Head, _in, record_of, with_active
from s3_saver._index.manifest.group import GroupCommit
from s3_saver._index.manifest.head import ManifestHead
from s3_saver._index.manifest.holdings import ManifestHoldings
from s3_saver._index.manifest.lifecycle import ManifestLifecycle
from s3_saver._index.manifest.reads import ManifestReads
from s3_saver._index.manifest.seal import Bodies, _plan_seal, _SealPlan
from s3_saver._index.manifest.threads import ManifestThreads, _delete_keys
from s3_saver._index.terms import (
    Fenced,
    ParentGone,
    Prepared,
    WritesOutcome,
)
from s3_saver._transport.budget import CacheBudget
from s3_saver._transport.failures import (
    CONDITIONAL_CONFLICT_CODES,
    PRECONDITION_FAILED_CODES,
    error_code,
)
from s3_saver._transport.protocol import Op, raise_failure
from s3_saver._transport.s3 import S3Calls, put_immutable


class _Pinned:
    """Checkpoint objects' bytes a cached head pins (``Head.pinned``), by object key:
    as stored (sealed, with encryption), the resolver opens and decodes them."""

    def __init__(self, index: ManifestIndex) -> None:
        self._index = index

    def get(self, key: str) -> bytes | None:
        o = self._index.layout.parts_of(key)  # a key of a reference: this layout built it
        head = self._index._cached(o.thread_id) if o is not None and o.kind == "checkpoint" else None
        return head.pinned.get((o.ns, o.checkpoint_id, o.tag)) if head is not None and o is not None else None


class ManifestIndex(
    ManifestHead, ManifestReads, ManifestHoldings, ManifestArchive, ManifestThreads, ManifestLifecycle, ManifestActivity, Index
):
    local_lookups = True
    lists_in_prepare = True

    def __init__(self, s3: S3Calls, layout: KeyLayout, budget: CacheBudget | None = None) -> None:
        self.s3 = s3
        self.layout = layout
        budget = budget if budget is not None else CacheBudget()
        # The last head seen per thread (a consistent snapshot with its ETag) and
        # sealed segments (immutable): lookups of older checkpoints cost nothing.
        # Both are charged to the saver's budget (``_transport/budget``). Invariant: a head
        # evicted is read again (its ETag stood in for a read: ``prepare``,
        # ``_commit``), a segment evicted is fetched again; no decision rests on
        # finding one (``unnote`` reads the head it lacks, ``_load_segments``
        # answers from what it loaded, not from the cache).
        self._heads = budget.cache("heads")
        self._segments = budget.cache("segments")
        # Segments written ahead by prepare(), waiting for the commit that refers
        # to them (at most one plan per thread, its keys and refs: the bytes went out).
        self._sealed: dict[str, _SealPlan] = {}
        # What this process committed, for the segments it seals (seal.Bodies).
        self.bodies = Bodies(budget)
        self._lock = threading.Lock()
        self._group = GroupCommit(threading.Lock())

    def describe(self) -> str:
        return f"manifest index in s3://{self.s3.bucket}/{self.layout.manifest_root}"

    @property
    def replaced_prefix(self) -> str:  # type: ignore[override]
        return self.layout.manifest_root  # every write replaces a head here

    def held_bodies(self) -> _Pinned:
        """The pinned bodies of the heads this process holds (read as they are
        when the resolver asks: it asks after its first wave read the head)."""
        return _Pinned(self)

    # -- writes --------------------------------------------------------------------------
    def prepare(
        self,
        thread_id: str,
        ns: str,
        parent_id: str | None,
        list_at: int | None = None,
        gen: int | None = None,
        active: int | None = None,
    ) -> Op[Prepared]:
        """Reads the head, unless this process holds it (see below; the head it
        holds says more than ``gen``: the commit swaps exactly it). When the
        head this process saw last was due for sealing,
        its oldest checkpoints go into a segment in the same round trip (they
        never change), for the commit to refer to: puts stay at two round trips.

        The listing object goes in that round trip too, before the commit that
        records its time in the head (a listing object counts only then): for a
        thread that looks new (a parentless root checkpoint, or a head this
        process saw unlisted). A thread unlisted otherwise (its listing failed,
        or it predates listings) is listed by a later write of a process that
        has seen its head.

        So does the activity entry of day ``active``, unless the head this
        process holds records it (or a later one): the commit records the day
        (and the entry's token) in the head only once the entry is written. A
        new key each time (its token): a write never lands on an entry a walk
        read and is about to drop (``_index/activity``)."""
        cached = self._cached(thread_id)
        limits = self._limits
        seal = cached is not None and len(cached.entries) > limits.seal_at
        plan = _plan_seal(self.layout, cached, self.bodies.fill, limits.keep) if cached is not None and seal else None
        objects = list(plan.objects) if plan else []
        maybe_new = not cached.created if cached is not None else parent_id is None
        listing = list_at if list_at is not None and ns == "" and maybe_new else None
        entry = new_entry(thread_id, active) if active is not None and (cached is None or cached.active < active) else None
        if entry is not None:
            objects.append((self.entry_key(entry), b""))
        if listing is not None:
            objects.append((self.layout.listing_key(listing, thread_id), b""))
        # The head this process last read or wrote stands in for a read: the
        # commit swaps it by its ETag, so a head changed since (another writer)
        # fails that swap, and the commit reads the head then and checks again
        # what was decided here (the fences, the parent: ``_update``'s check).
        # Read first only without one, when it lacks the parent (it is older), or
        # when it says archived: the write would restore the thread first, a
        # decision never made on a cache alone (another process may have restored
        # it since; see ``_REFUSALS``).
        head = cached if cached is not None and cached.etag is not None and cached.archive is None else None
        if head is not None and parent_id is not None and (yield from self._find(head, ns, parent_id)) is None:
            head = None
        calls = () if head is not None else (self.s3.get(self.layout.manifest_head_key(thread_id)),)
        wave = (*calls, *(self.s3.put_new(k, b) for k, b in objects))
        results = (yield wave) if wave else []
        if calls:
            head = self._take_head(thread_id, calls[0], results[0])
            results = results[1:]
        assert head is not None
        sealed = results[: len(plan.objects)] if plan else []
        # A segment's key carries a random token no other writer takes: a 412 is
        # this PUT sent again after its answer was lost, meeting its own write.
        # Taken for a failure, the segment would be named by no head, deleted by no call.
        landed = [not isinstance(r, BaseException) or error_code(r) in PRECONDITION_FAILED_CODES for r in sealed]
        if plan is not None and all(landed):
            # Written: a commit may now refer to it. Kept without the segments'
            # bytes (sent already; ``_drop_unused`` needs their keys only).
            kept = replace(plan, objects=[(k, b"") for k, _ in plan.objects])
            with self._lock:
                self._sealed[thread_id] = kept
        elif plan is not None and any(landed):
            # Part of the seal failed: the commit goes on without it, and the
            # segments that did land go now (no head will name them).
            yield from _delete_keys(self.s3, [k for (k, _), ok in zip(plan.objects, landed) if ok])
        hints = (entry is not None) + (listing is not None)
        for obj, result in zip(objects[len(objects) - hints :], results[len(results) - hints :]):
            # 412: the object exists (the listing of another write; a retried attempt of this one).
            if isinstance(result, BaseException) and error_code(result) not in PRECONDITION_FAILED_CODES | CONDITIONAL_CONFLICT_CODES:
                raise_failure(self.s3.put_new(*obj), result)
        parent = (yield from self._find(head, ns, parent_id)) if parent_id is not None else None
        return Prepared(head.gen, parent, bool(head.created), listing, frozenset(head.dead_runs), head.archive, entry)

    def commit_checkpoint(
        self,
        entry: CheckpointEntry,
        created: int | None = None,
        parent_tag: str | None = None,
        active: Activity | None = None,
        key_id: str | None = None,
    ) -> Op[None]:
        """One swap of the head: the commit point. Refused (``Fenced``) when the
        head says the thread was deleted since the writer read it, is archived,
        or the writer's run was deleted; ``ParentGone`` when the entry carries
        values from its parent (``parent_tag``: its tag as the writer read it)
        and the parent left the index or was written anew since. ``active``:
        the day whose activity entry ``prepare`` wrote, recorded in the head."""

        def check(head: Head) -> Op[None]:
            _fence(head, entry.gen, entry.run_id, key_id)
            if parent_tag is not None and entry.parent_id is not None:
                parent = yield from self._find(head, entry.ns, entry.parent_id)
                if parent is None or parent.tag != parent_tag:
                    raise ParentGone()

        def change(head: Head) -> Head | None:
            old = _in(head.entries, entry.ns, entry.checkpoint_id)
            if old is not None and old.loc == entry.loc and old.parent_id == entry.parent_id:
                return None  # our own swap, applied by an earlier attempt
            stored = replace(entry, writes=[])
            rest = [e for e in head.entries if e is not old]
            # Its own checkpoint: the thread is no longer a copy to bring up to date.
            # The first writer to list the thread sets the time its listing
            # entry must carry; another writer's entry (a race) does not count.
            new = replace(head, entries=[*rest, stored], copied_from=None, created=head.created or created or 0)
            return with_active(new, active)

        yield from self._commit(entry.thread_id, change, check)
        self.bodies.keep(entry)

    def note(self, thread_id: str, created: int | None, run_id: str | None) -> Op[None]:
        """The run hint; a put's listing object went with ``prepare``, the listing
        of a restored or copied thread (``created``) goes here, after its head."""
        keys = [self.layout.listing_key(created, thread_id)] if created is not None else []
        if run_id is not None:
            keys.append(self.layout.run_key(run_id, thread_id))
        yield from put_immutable(self.s3, {k: b"" for k in keys})

    def unnote(self, thread_id: str, created: int | None, run_id: str | None) -> Op[None]:
        # A listing object counts only when the head names its time: a refused
        # commit's never did, and goes whatever the head says.
        keys = [self.layout.listing_key(created, thread_id)] if created is not None else []
        if run_id is not None:
            keys.append(self.layout.run_key(run_id, thread_id))
        head = self._cached(thread_id)
        if head is None and created is not None:
            # Invariant: the listing object goes only when the head does not name
            # its time; a head this process no longer holds (evicted) is read.
            head = yield from self._read_head(thread_id)
        if head is not None and created is not None and head.created == created:
            keys = keys[1:]
        # A refused write's run hint or listing object is named by no head: on a
        # versioned bucket its key is recorded for an erase first (``_unname``).
        yield from self._unname({thread_id: keys})

    def commit_writes(self, entries: list[WritesEntry], key_id: str | None = None) -> Op[WritesOutcome]:
        thread_id = entries[0].thread_id
        outcome = WritesOutcome()

        def check(head: Head) -> Op[None]:
            yield from ()
            _fence(head, entries[0].gen, None, key_id)

        def change(head: Head) -> Head | None:
            outcome.unused.clear()
            writes = list(head.writes)
            changed = False
            for entry in entries:
                slot = (entry.ns, entry.checkpoint_id, entry.task_id, entry.part)
                old = next((w for w in writes if (w.ns, w.checkpoint_id, w.task_id, w.part) == slot), None)
                if old is not None and old.token == entry.token:
                    continue  # our own swap, applied by an earlier attempt
                if old is not None and entry.part.startswith(REGULAR_PART):
                    outcome.unused.append((entry, entry.token))  # first committed wins
                    continue
                if old is not None:
                    outcome.unused.append((entry, old.token))  # last committed wins
                    writes.remove(old)
                writes.append(entry)
                changed = True
            return replace(head, writes=writes) if changed else None

        yield from self._commit(thread_id, change, check)
        lost = {token for entry, token in outcome.unused if token == entry.token}
        for entry in entries:
            if entry.token not in lost:
                self.bodies.keep(entry)
        return outcome


def _fence(head: Head, gen: int, run_id: str | None, key_id: str | None = None) -> None:
    """A commit's check of the head (the thread's record): not deleted since the
    writer learned ``gen``, not archived, the writer's run not deleted, and
    (encryption) the key the writer sealed with not destroyed by an erase: nothing
    sealed under a destroyed key commits after the erase's switch, whatever key a
    process cached before it."""
    if head.archive is not None or gen != head.gen or (run_id is not None and run_id in head.dead_runs):
        raise Fenced(record_of(head))
    if key_id is not None and key_id in head.gone_keys:
        raise Fenced(record_of(head))
