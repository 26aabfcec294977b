"""The manifest index's head and segments: read, swap, update, cache.

The head is a thread's one mutable object, replaced only by compare-and-swap;
``_update`` retries the swap against other writers (see ``backend``'s
docstring for the two kinds of 412). Sealed segments are immutable and cached.
Every other part of ``ManifestIndex`` reads and writes through these methods;
``ManifestIndex`` mixes ``ManifestHead`` in.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

from s3_saver._format.entries import (
    CheckpointEntry,
    WritesEntry,
)
from s3_saver._format.keys import KeyLayout
from s3_saver._index.manifest.doc import (
    Head,
    SegmentRef,
    _in,
    _with_writes,
    decode_head,
    decode_segment,
    encode_head,
    pieces_read,
)
from s3_saver._index.manifest.group import BatchRefused, GroupCommit
from s3_saver._index.manifest.seal import (
    _MAX_SWAPS,
    LIMITS,
    VERSIONED_LIMITS,
    Bodies,
    Limits,
    _apply_seal,
    _plan_seal,
    _SealPlan,
)
from s3_saver._index.terms import (
    Archived,
    Fenced,
    ParentGone,
)
from s3_saver._transport.budget import Cache, entry_bytes
from s3_saver._transport.failures import (
    CONDITIONAL_CONFLICT_CODES,
    OBJECT_MISSING,
    PRECONDITION_FAILED_CODES,
    classify,
    error_code,
)
from s3_saver._transport.protocol import Backoff, Op, raise_failure, request
from s3_saver._transport.s3 import S3Calls, put_immutable
from s3_saver.errors import (
    ConfigurationError,
    MissingObjectError,
    S3SaverError,
    ThreadArchivedError,
)

_SWAP_BACKOFF_MAX = 0.5  # seconds
# What a change or a check raises to refuse, on the head it was given: a fence
# (deleted, archived, run deleted), a parent gone, an archive refused (busy, or
# an archived thread's runs), a copy target taken; a segment the head names and
# another process deleted; every commit of a batch refused (``group``).
_REFUSALS = (Fenced, ParentGone, ThreadArchivedError, ConfigurationError, MissingObjectError, BatchRefused)
_JITTER = random.SystemRandom()  # never the random module's shared state (see keys.new_token)

Segment = tuple[list[CheckpointEntry], list[WritesEntry]]


class ManifestHead:
    """The head and the segments, for ``ManifestIndex``."""

    # What these methods rely on, from ManifestIndex: the attributes its __init__
    # sets, and Index.versioned_bucket.
    s3: S3Calls
    layout: KeyLayout
    bodies: Bodies
    versioned_bucket: bool
    _heads: Cache
    _segments: Cache
    _sealed: dict[str, _SealPlan]
    _lock: threading.Lock
    _group: GroupCommit

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
        to the thread's head at the same time (``group``), on the head
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


def _head_bytes(head: Head) -> int:
    """A cached head's estimated bytes: its entries with their bodies, and the
    bodies it pins (bytes shared with ``Bodies`` are counted in both: the budget
    bounds from above what the caches keep alive)."""
    parts = [*head.entries, *head.writes, *head.graveyard]
    return sum(map(entry_bytes, parts)) + sum(len(b) for b in head.pinned.values()) + 64 * len(head.segments)


def _segment_bytes(segment: Segment) -> int:
    entries, writes = segment
    return sum(map(entry_bytes, entries)) + sum(map(entry_bytes, writes))

