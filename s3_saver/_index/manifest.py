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

This module holds the head (read, swap, update, cache), the segments and a
checkpoint's own path: commits, reads, history and the ancestor walk. The
store's setup and what concerns a thread as a whole (listing, runs, restore,
delete, prune, copy) are in ``manifest_lifecycle``, mixed into
``ManifestIndex``; sealing and the head's limits, which both use, are in
``manifest_seal``, and picking entries out of a document in ``manifest_doc``.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from s3_saver._cache import CacheBudget, entry_bytes
from s3_saver._codec import CHECKPOINT_FORMAT, unpack
from s3_saver._index.base import (
    REGULAR_PART,
    Archived,
    CheckpointEntry,
    DepthHint,
    Fenced,
    Index,
    Key3,
    ParentGone,
    Prepared,
    WritesEntry,
    WritesOutcome,
)
from s3_saver._index.manifest_doc import (
    Head,
    SegmentRef,
    record_of,
    _in,
    _newest,
    _with_writes,
    decode_head,
    decode_segment,
    encode_head,
    pieces_read,
)
from s3_saver._index.activity import ManifestActivity
from s3_saver._index.manifest_archive import ManifestArchive
from s3_saver._index.manifest_audit import ManifestHoldings
from s3_saver._index.manifest_group import BatchRefused, GroupCommit
from s3_saver._index.manifest_lifecycle import ManifestLifecycle
from s3_saver._index.manifest_seal import (
    _MAX_SWAPS,
    LIMITS,
    VERSIONED_LIMITS,
    Bodies,
    Limits,
    _apply_seal,
    _plan_seal,
    _SealPlan,
)
from s3_saver._keys import KeyLayout
from s3_saver._protocol import Backoff, Op, raise_failure, request
from s3_saver._s3 import S3Calls, put_immutable
from s3_saver.errors import (
    CONDITIONAL_CONFLICT_CODES,
    OBJECT_MISSING,
    PRECONDITION_FAILED_CODES,
    ConfigurationError,
    MissingObjectError,
    S3SaverError,
    ThreadArchivedError,
    classify,
    error_code,
)

_SWAP_BACKOFF_MAX = 0.5  # seconds
# What a change or a check raises to refuse, on the head it was given: a fence
# (deleted, archived, run deleted), a parent gone, an archive refused (busy, or
# an archived thread's runs), a copy target taken; a segment the head names and
# another process deleted; every commit of a batch refused (``manifest_group``).
_REFUSALS = (Fenced, ParentGone, ThreadArchivedError, ConfigurationError, MissingObjectError, BatchRefused)
_JITTER = random.SystemRandom()  # never the random module's shared state (see _keys.new_token)

Segment = tuple[list[CheckpointEntry], list[WritesEntry]]


class _Pinned:
    """Checkpoint records a cached head pins (``Head.pinned``), by object key."""

    def __init__(self, index: ManifestIndex) -> None:
        self._index = index

    def get(self, key: str) -> dict[str, Any] | None:
        o = self._index.layout.parse_object_key(key)
        head = self._index._cached(o.thread_id) if o is not None and o.kind == "checkpoint" else None
        body = head.pinned.get((o.ns, o.checkpoint_id, o.tag)) if head is not None and o is not None else None
        return None if body is None else unpack(body, CHECKPOINT_FORMAT, f"{key}, pinned in its thread's head")


class ManifestIndex(ManifestHoldings, ManifestArchive, ManifestLifecycle, ManifestActivity, Index):
    local_lookups = True
    lists_in_prepare = True

    def __init__(self, s3: S3Calls, layout: KeyLayout, budget: CacheBudget | None = None) -> None:
        self.s3 = s3
        self.layout = layout
        budget = budget if budget is not None else CacheBudget()
        # The last head seen per thread (a consistent snapshot with its ETag) and
        # sealed segments (immutable): lookups of older checkpoints cost nothing.
        # Both are charged to the saver's budget (``_cache``). Invariant: a head
        # evicted is read again (its ETag stood in for a read: ``prepare``,
        # ``_commit``), a segment evicted is fetched again; no decision rests on
        # finding one (``unnote`` reads the head it lacks, ``_load_segments``
        # answers from what it loaded, not from the cache).
        self._heads = budget.cache("heads")
        self._segments = budget.cache("segments")
        # Segments written ahead by prepare(), waiting for the commit that refers
        # to them (at most one plan per thread, its keys and refs: the bytes went out).
        self._sealed: dict[str, _SealPlan] = {}
        # What this process committed, for the segments it seals (manifest_seal.Bodies).
        self.bodies = Bodies(budget)
        self._lock = threading.Lock()
        self._group = GroupCommit(threading.Lock())

    def describe(self) -> str:
        return f"manifest index in s3://{self.s3.bucket}/{self.layout.manifest_root}"

    @property
    def replaced_prefix(self) -> str:  # type: ignore[override]
        return self.layout.manifest_root  # every write replaces a head here

    def held_records(self) -> _Pinned:  # type: ignore[override]
        """The pinned bodies of the heads this process holds (read as they are
        when the resolver asks: it asks after its first wave read the head)."""
        return _Pinned(self)

    # -- the head ------------------------------------------------------------------------
    def _read_head(self, thread_id: str) -> Op[Head]:
        call = self.s3.get(self.layout.manifest_head_key(thread_id))
        (result,) = yield (call,)
        return self._take_head(thread_id, call, result)

    def _live_head(self, thread_id: str) -> Op[Head]:
        """The head, for a read of checkpoints: an archived thread's reads go to its archive."""
        head = yield from self._read_head(thread_id)
        if head.archive is not None:
            raise Archived(thread_id, head.archive)
        return head

    def _take_head(self, thread_id: str, call: Any, result: Any) -> Head:
        if isinstance(result, BaseException):
            if classify(result, "get_object") != OBJECT_MISSING:
                raise_failure(call, result)
            head = Head(thread_id)
        else:
            where = f"s3://{self.s3.bucket}/{call.params['Key']}"
            head = decode_head(thread_id, result["Body"], where, result["ETag"])
            self._learn_versioning(result)
            # A head carries no bodies but the newest checkpoint's (none on a
            # versioned bucket, see ``encode_head``): the ones this process
            # committed or held pinned (bytes of immutable objects) come from
            # memory, not from their objects.
            head.entries = [self.bodies.fill(e) for e in head.entries]
            head.writes = [self.bodies.fill(w) for w in head.writes]
            held = self._cached(thread_id)
            if held is not None:
                needed = pieces_read(head.entries)
                head.pinned.update((k, b) for k, b in held.pinned.items() if k in needed and k not in head.pinned)
        self._remember(head)
        return head

    def _learn_versioning(self, result: dict[str, Any]) -> None:
        """A versioned bucket answers a head's GET or PUT with its version id
        ("null" only when versioning is suspended): a process that never ran
        ``setup()`` (a Lambda handler) writes for a versioned bucket from its
        first head on, at no request."""
        if result.get("VersionId") not in (None, "null"):
            self.versioned_bucket = True

    @property
    def _limits(self) -> Limits:
        return VERSIONED_LIMITS if self.versioned_bucket else LIMITS

    def _swap(self, old: Head, new: Head) -> Op[bool]:
        """Replace the head ``old`` was read as with ``new``; False: another writer was first."""
        new.version, new.site = old.version + 1, self.s3.bucket
        key = self.layout.manifest_head_key(old.thread_id)
        # A versioned bucket keeps the head this swap replaces: one without bodies there.
        call = self.s3.put_swap(key, encode_head(new, versioned=self.versioned_bucket), old.etag)
        (result,) = yield (call,)
        if isinstance(result, BaseException):
            lost = error_code(result) in PRECONDITION_FAILED_CODES | CONDITIONAL_CONFLICT_CODES
            # IfMatch on a head that was deleted meanwhile: 404 on AWS, 412 elsewhere.
            if lost or (old.etag is not None and classify(result, "put_object") == OBJECT_MISSING):
                return False
            raise_failure(call, result)
        new.etag = result["ETag"]
        self._learn_versioning(result)
        self._remember(new)
        return True

    def _update(
        self,
        thread_id: str,
        change: Callable[[Head], Head | None],
        start: Head | None = None,
        check: Callable[[Head], Op[None]] | None = None,
    ) -> Op[Head]:
        """Compare-and-swap the head with ``change`` until it holds.

        ``change`` gets the head as read and returns the new one, or None when it
        holds already: a swap that was applied but answered with a failure (a
        reset) is found again on the next read and not applied twice. ``check``
        runs first on each head read (it may read segments, and raise).
        What they raise on ``start`` (a head read before: the cache) is decided
        again on a head read now (see ``_REFUSALS``).

        Segments written for this swap (a seal planned ahead by ``prepare``, or
        one made here) that the head did not take are deleted: no head will
        ever name them.
        """
        head = start
        fresh = False  # ``head`` was read by this call (``start`` was read before it)
        with self._lock:
            ahead = self._sealed.pop(thread_id, None)
        plans = [ahead] if ahead is not None else []
        closed = False
        try:
            for attempt in range(_MAX_SWAPS):
                if head is None:
                    head, fresh = (yield from self._read_head(thread_id)), True
                while True:
                    try:
                        if check is not None:
                            yield from check(head)
                        new = change(head)
                        break
                    except _REFUSALS:
                        # Invariant: a refusal decided on a head read earlier (this
                        # process's cache, ``start``) is never final: another process
                        # may have changed the head since (restored an archived
                        # thread, pruned a segment). It is decided again on the head
                        # read now, and only a refusal decided on that reaches the
                        # caller. A swap that lands proves its head current, so the
                        # steady state (no refusal) reads nothing more.
                        if fresh:
                            raise
                        head, fresh = (yield from self._read_head(thread_id)), True
                if new is None:
                    return head
                if ahead is None or not _apply_seal(new, ahead):
                    if len(new.entries) > self._limits.hard_seal_at:
                        plan = _plan_seal(self.layout, new, self.bodies.fill, self._limits.keep)
                        plans.append(plan)
                        # Objects first: a segment exists before the head that refers to it.
                        yield from put_immutable(self.s3, dict(plan.objects))
                        _apply_seal(new, plan)
                if (yield from self._swap(head, new)):
                    head = new
                    return new
                head = None
                # Other writers: spread the retries (full jitter, capped), within the
                # retry budget and deadline().
                if (yield Backoff(_JITTER.uniform(0, min(_SWAP_BACKOFF_MAX, 0.01 * 2**attempt)), attempt + 1)) is False:
                    break
            raise S3SaverError(
                f"the manifest head of thread {thread_id!r} in s3://{self.s3.bucket} kept changing under "
                f"other writers; gave up after {attempt + 1} attempts (at most {_MAX_SWAPS}, within the "
                "retry budget and deadline())"
            )
        except GeneratorExit:
            closed = True  # cut short (the driver closed it): no request can be made now
            raise
        finally:
            if plans and not closed:
                yield from self._drop_unused(thread_id, plans, head)

    def _commit(self, thread_id: str, change: Callable[[Head], Head | None], check: Callable[[Head], Op[None]]) -> Op[None]:
        """A writer's commit: one swap with the other commits this process makes
        to the thread's head at the same time (``manifest_group``), on the head
        this process holds (its ETag stands in for a read)."""

        def update(change: Callable[[Head], Head | None], check: Callable[[Head], Op[None]]) -> Op[Head]:
            return self._update(thread_id, change, self._cached(thread_id), check)

        yield from self._group.commit(thread_id, change, check, update)

    def _drop_unused(self, thread_id: str, plans: list[_SealPlan], head: Head | None) -> Op[None]:
        """Delete the segments of ``plans`` that ``head`` (the last one this
        update read or wrote; None: read it) does not name."""
        if head is None:
            head = yield from self._read_head(thread_id)
        named = {(r.number, r.token) for r in head.segments + head.retired + head.graveyard_segments}
        unused = [
            key for plan in plans for ref, (key, _) in zip(plan.refs, plan.objects) if (ref.number, ref.token) not in named
        ]
        if unused:
            yield from request(self.s3.delete_many(unused))

    def _remember(self, head: Head) -> None:
        self._heads.put(head.thread_id, head, _head_bytes(head))

    def _cached(self, thread_id: str) -> Head | None:
        return self._heads.get(thread_id)  # type: ignore[no-any-return]

    # -- segments ------------------------------------------------------------------------
    def _load_segments(self, thread_id: str, refs: list[SegmentRef], buried: bool = False) -> Op[list[Segment]]:
        """Sealed segments (cached: they never change), all fetched in one wave.

        ``buried``: segments in a graveyard, deleted after the objects they list
        (a cleanup cut short between that delete and the head's swap leaves the
        head naming them): one that is gone lists nothing left to delete."""
        keys = [self.layout.segment_key(thread_id, r.number, r.token) for r in refs]
        # Invariant: the answer is what was found or loaded here, never a second
        # look at the cache, which may have evicted a segment meanwhile (another
        # thread's read, or this wave alone over the budget).
        found = {k: s for k in keys if (s := self._segments.get(k)) is not None}
        missing = [k for k in keys if k not in found]
        if missing:
            calls = [self.s3.get(k) for k in missing]
            results = yield tuple(calls)
            for key, call, result in zip(missing, calls, results):
                if isinstance(result, BaseException):
                    if buried and classify(result, "get_object") == OBJECT_MISSING:
                        continue
                    raise_failure(call, result)
                where = f"s3://{self.s3.bucket}/{key}"
                segment = found[key] = decode_segment(thread_id, result["Body"], where)
                self._segments.put(key, segment, _segment_bytes(segment))
        return [found[k] for k in keys if not buried or k in found]

    def _find(self, head: Head, ns: str, checkpoint_id: str) -> Op[CheckpointEntry | None]:
        """A checkpoint with its writes, from the head or the segments whose id range
        holds it; hidden ones too (a writer's parent, prune's retained checkpoints)."""
        entry = _in(head.entries, ns, checkpoint_id)
        if entry is not None:
            return _with_writes(entry, head.writes)
        refs = [r for r in head.segments if r.min_id <= checkpoint_id <= r.max_id]
        for entries, writes in (yield from self._load_segments(head.thread_id, refs)):
            entry = _in(entries, ns, checkpoint_id)
            if entry is not None:
                return _with_writes(entry, writes + head.writes)
        return None

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
        in the head only once the entry is written."""
        cached = self._cached(thread_id)
        limits = self._limits
        seal = cached is not None and len(cached.entries) > limits.seal_at
        plan = _plan_seal(self.layout, cached, self.bodies.fill, limits.keep) if cached is not None and seal else None
        objects = list(plan.objects) if plan else []
        maybe_new = not cached.created if cached is not None else parent_id is None
        listing = list_at if list_at is not None and ns == "" and maybe_new else None
        active = active if active is not None and (cached is None or cached.active < active) else None
        if active is not None:
            objects.append((self.layout.activity_key(active, thread_id), b""))
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
        if plan is not None and not any(isinstance(r, BaseException) for r in sealed):
            # Written: a commit may now refer to it. Kept without the segments'
            # bytes (sent already; ``_drop_unused`` needs their keys only).
            kept = replace(plan, objects=[(k, b"") for k, _ in plan.objects])
            with self._lock:
                self._sealed[thread_id] = kept
        hints = (active is not None) + (listing is not None)
        for obj, result in zip(objects[len(objects) - hints :], results[len(results) - hints :]):
            # 412: the entry exists (another write of the day, or a retried attempt of this one).
            if isinstance(result, BaseException) and error_code(result) not in PRECONDITION_FAILED_CODES | CONDITIONAL_CONFLICT_CODES:
                raise_failure(self.s3.put_new(*obj), result)
        parent = (yield from self._find(head, ns, parent_id)) if parent_id is not None else None
        return Prepared(head.gen, parent, bool(head.created), listing, frozenset(head.dead_runs), head.archive, active)

    def commit_checkpoint(
        self, entry: CheckpointEntry, created: int | None = None, parent_tag: str | None = None, active: int | None = None
    ) -> Op[None]:
        """One swap of the head: the commit point. Refused (``Fenced``) when the
        head says the thread was deleted since the writer read it, is archived,
        or the writer's run was deleted; ``ParentGone`` when the entry carries
        values from its parent (``parent_tag``: its tag as the writer read it)
        and the parent left the index or was written anew since. ``active``:
        the day whose activity entry ``prepare`` wrote, recorded in the head."""

        def check(head: Head) -> Op[None]:
            _fence(head, entry.gen, entry.run_id)
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
            return replace(
                head,
                entries=[*rest, stored],
                copied_from=None,
                created=head.created or created or 0,
                active=max(head.active, active or 0),
            )

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
        if keys:
            yield from request(self.s3.delete_many(keys))

    def commit_writes(self, entries: list[WritesEntry]) -> Op[WritesOutcome]:
        thread_id = entries[0].thread_id
        outcome = WritesOutcome()

        def check(head: Head) -> Op[None]:
            yield from ()
            _fence(head, entries[0].gen, None)

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

    # -- reads ---------------------------------------------------------------------------
    def latest(self, thread_id: str, ns: str) -> Op[CheckpointEntry | None]:
        head = yield from self._live_head(thread_id)
        return (yield from self._latest_in(head, ns))

    def _latest_in(self, head: Head, ns: str) -> Op[CheckpointEntry | None]:
        thread_id = head.thread_id
        newest = _newest(head.entries, ns)
        if newest is not None:
            return _with_writes(newest, head.writes)
        # A namespace with nothing in the head (an old subgraph): newest segment first.
        for ref in reversed(head.segments):
            ((entries, writes),) = yield from self._load_segments(thread_id, [ref])
            newest = _newest(entries, ns)
            if newest is not None:
                return _with_writes(newest, writes + head.writes)
        return None

    def get(self, thread_id: str, ns: str, checkpoint_id: str) -> Op[CheckpointEntry | None]:
        head = yield from self._live_head(thread_id)
        entry = yield from self._find(head, ns, checkpoint_id)
        return None if entry is None or entry.hidden else entry

    def writes(self, entry: CheckpointEntry) -> Op[list[WritesEntry]]:
        yield from ()
        return list(entry.writes or [])  # manifest entries always come with their writes

    def entries(self, keys: list[Key3]) -> Op[dict[Key3, CheckpointEntry | None]]:
        """Older checkpoints, from the heads and segments this process has read:
        no request (the resolver reads the object of one it does not find)."""
        yield from ()
        segments = self._segments.values()
        found: dict[Key3, CheckpointEntry | None] = {}
        for thread_id, ns, checkpoint_id in keys:
            head = self._cached(thread_id)
            pools = [head.entries] if head is not None else []
            pools += [entries for entries, _ in segments]
            found[(thread_id, ns, checkpoint_id)] = next(
                (e for pool in pools if (e := _in(pool, ns, checkpoint_id)) and e.thread_id == thread_id), None
            )
        return found

    def history(
        self, thread_id: str, ns: str | None, before_id: str | None, page_size: int | None, cursor: Any
    ) -> Op[tuple[list[CheckpointEntry], Any]]:
        """Pages in one order, whatever the head or a segment holds: newest first
        by (namespace, id) as a DynamoDB partition reads, one namespace's alone
        with ``ns``. Each page reads the segment that may hold the greatest entry
        not yet returned, and returns every entry no unread segment can top."""
        if cursor is None:
            head = yield from self._live_head(thread_id)
            state = _Merge(
                head,
                [_with_writes(e, head.writes) for e in head.entries],
                [r for r in head.segments if _may_hold(r, ns, before_id)],
            )
        else:
            state = cursor
            if state.refs:
                ref = max(state.refs, key=lambda r: _bound(r, ns))
                state.refs.remove(ref)
                ((entries, writes),) = yield from self._load_segments(thread_id, [ref])
                state.pool += [_with_writes(e, writes + state.head.writes) for e in entries]
        state.pool = [
            e for e in state.pool
            if not e.hidden and (ns is None or e.ns == ns) and (before_id is None or e.checkpoint_id < before_id)
        ]
        state.pool.sort(key=lambda e: (e.ns, e.checkpoint_id), reverse=True)
        bound = max((_bound(r, ns) for r in state.refs), default=None)
        cut = len(state.pool) if bound is None else next(
            (i for i, e in enumerate(state.pool) if (e.ns, e.checkpoint_id) <= bound), len(state.pool)
        )
        page, state.pool = state.pool[:cut], state.pool[cut:]
        return page, (state if state.refs or state.pool else None)

    def _load_into(
        self, known: dict[str, CheckpointEntry], head: Head, refs: list[SegmentRef], ns: str, below: str
    ) -> Op[int]:
        """Load segments in one wave into ``known`` (checkpoints of ``ns`` by id,
        with writes); returns how many of their checkpoints are older than ``below``."""
        older = 0
        for entries, writes in (yield from self._load_segments(head.thread_id, refs)):
            known.update({e.checkpoint_id: _with_writes(e, writes + head.writes) for e in entries if e.ns == ns})
            older += sum(e.checkpoint_id < below for e in entries)
        return older

    def ancestors(
        self, thread_id: str, ns: str, checkpoint_id: str, channels: set[str], depth_hint: DepthHint | None = None
    ) -> Op[tuple[CheckpointEntry | None, list[CheckpointEntry]]]:
        """The chain from the head, then from the sealed segments it reaches into.

        A sealed target comes with the segment before its own. When the walk
        runs past what was read, it reads as many segments as hold the
        checkpoints ``depth_hint`` expects it to need (one without a hint), then
        twice as many per wave: the round trips do not grow with the depth when
        the hint is right, and grow as the log of the shortfall when it is not.
        """
        head = yield from self._live_head(thread_id)
        known = {e.checkpoint_id: _with_writes(e, head.writes) for e in head.entries if e.ns == ns}
        # A stack, newest on top; segments holding only checkpoints newer than the
        # target go to the bottom: a parent is written before its child, its id is smaller.
        refs = sorted(head.segments, key=lambda r: (r.min_id < checkpoint_id, r.number))
        older = sum(e.checkpoint_id < checkpoint_id for e in head.entries)
        if checkpoint_id not in known:
            # A sealed target: its segment, with the one before it for its first ancestors.
            own = [r for r in refs if r.min_id <= checkpoint_id <= r.max_id]
            refs = [r for r in refs if r not in own]
            if own:
                before = [refs.pop()] if refs and refs[-1].min_id < checkpoint_id else []
                older += yield from self._load_into(known, head, own + before, ns, checkpoint_id)
        target = known.get(checkpoint_id)
        expected = depth_hint(target) if target is not None and depth_hint is not None else None
        wave = 0  # segments in the last wave
        chain: list[CheckpointEntry] = []
        unseeded = set(channels)
        cursor = target.parent_id if target is not None else None
        while target is not None and cursor is not None and unseeded:
            entry = known.get(cursor)
            if entry is None:
                if not refs:
                    break
                more = (expected or 0) - older if not wave else 0
                batch = _pop_wave(refs, 2 * wave or 1, more)
                wave = len(batch)
                older += yield from self._load_into(known, head, batch, ns, checkpoint_id)
                continue
            chain.append(entry)
            unseeded -= set(entry.loc)
            cursor = entry.parent_id
        return target, chain


# -- helpers ---------------------------------------------------------------------------
def _head_bytes(head: Head) -> int:
    """A cached head's estimated bytes: its entries with their bodies, and the
    bodies it pins (bytes shared with ``Bodies`` are counted in both: the budget
    bounds from above what the caches keep alive)."""
    parts = [*head.entries, *head.writes, *head.graveyard]
    return sum(map(entry_bytes, parts)) + sum(len(b) for b in head.pinned.values()) + 64 * len(head.segments)


def _segment_bytes(segment: Segment) -> int:
    entries, writes = segment
    return sum(map(entry_bytes, entries)) + sum(map(entry_bytes, writes))


@dataclass
class _Merge:
    """A history read under way: the head it began with, entries read and not
    yet returned, and the segments not read yet."""

    head: Head
    pool: list[CheckpointEntry]
    refs: list[SegmentRef]


_TOP = ("\U0010ffff", "\U0010ffff")  # above every (namespace, id): ids cannot hold U+10FFFF


def _bound(ref: SegmentRef, ns: str | None) -> tuple[str, str]:
    """The greatest (namespace, id) a segment may hold, of ``ns`` when given
    (unknown for refs written before ``top`` was: anything)."""
    if ref.top is None:
        return _TOP
    if ns is not None and ref.top[0] > ns:
        return (ns, ref.max_id)
    return ref.top


def _may_hold(ref: SegmentRef, ns: str | None, before_id: str | None) -> bool:
    """Whether a segment may hold an entry of ``ns`` (any: None) below ``before_id``."""
    if before_id is not None and ref.min_id >= before_id:
        return False
    return ns is None or ref.top is None or ref.top[0] >= ns


def _fence(head: Head, gen: int, run_id: str | None) -> None:
    """A commit's check of the head (the thread's record): not deleted since the
    writer learned ``gen``, not archived, the writer's run not deleted."""
    if head.archive is not None or gen != head.gen or (run_id is not None and run_id in head.dead_runs):
        raise Fenced(record_of(head))


def _pop_wave(refs: list[SegmentRef], at_least: int, checkpoints: int) -> list[SegmentRef]:
    """Take segments off the top of ``refs``: ``at_least`` of them, and more
    while they do not yet hold ``checkpoints`` checkpoints."""
    batch: list[SegmentRef] = []
    while refs and (len(batch) < at_least or checkpoints > 0):
        batch.append(refs.pop())
        checkpoints -= batch[-1].count
    return batch
