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
"""

from __future__ import annotations

import random
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from s3_saver._index.base import (
    REGULAR_PART,
    CheckpointEntry,
    DepthHint,
    Index,
    IndexEntry,
    Key3,
    Prepared,
    ThreadRef,
    WritesEntry,
    WritesOutcome,
)
from s3_saver._index.manifest_doc import (
    Head,
    SegmentRef,
    decode_head,
    decode_segment,
    encode_head,
    encode_segment,
)
from s3_saver._keys import KeyLayout, decode
from s3_saver._protocol import Op, Sleep, gather, raise_failure, request
from s3_saver._s3 import DELETE_BATCH, S3Calls, put_immutable
from s3_saver.errors import (
    CONDITIONAL_CONFLICT_CODES,
    OBJECT_MISSING,
    PRECONDITION_FAILED_CODES,
    ConfigurationError,
    S3SaverError,
    ThreadDeletedError,
    classify,
    error_code,
)

# A writer that has seen the head hold more checkpoints than SEAL_AT seals the
# oldest into a segment beside its next head read (no extra round trip); a head
# fed only by cold processes, which have seen nothing, seals at HARD_SEAL_AT in
# one more round trip. KEEP_IN_HEAD newest checkpoints stay in the head.
SEAL_AT = 48
HARD_SEAL_AT = 96
KEEP_IN_HEAD = 16
SEGMENT_MAX = 64
# Attempts of one compare-and-swap before giving up: every round has a winner, so
# this many writers on one thread at once all get through.
_MAX_SWAPS = 24
_SWAP_BACKOFF_MAX = 0.5  # seconds
_CACHE_HEADS = 512
_CACHE_SEGMENTS = 256

Segment = tuple[list[CheckpointEntry], list[WritesEntry]]


class ManifestIndex(Index):
    local_lookups = True

    def __init__(self, s3: S3Calls, layout: KeyLayout) -> None:
        self.s3 = s3
        self.layout = layout
        # The last head seen per thread (a consistent snapshot with its ETag) and
        # sealed segments (immutable): lookups of older checkpoints cost nothing.
        self._heads: OrderedDict[str, Head] = OrderedDict()
        self._segments: OrderedDict[str, Segment] = OrderedDict()
        # Segments written ahead by prepare(), waiting for the commit that refers to them.
        self._sealed: dict[str, _SealPlan] = {}
        self._lock = threading.Lock()

    def describe(self) -> str:
        return f"manifest index in s3://{self.s3.bucket}/{self.layout.manifest_root}"

    # -- setup ---------------------------------------------------------------------------
    def setup(self, bucket: str, bucket_region: str | None, ttl: bool) -> Op[None]:
        """Check that the store honours conditional writes: the manifest relies on them."""
        key = f"{self.layout.manifest_root}.setup-probe/{uuid.uuid4().hex}"
        (first,) = yield (self.s3.put_new(key, b"1"),)
        if isinstance(first, BaseException):
            raise_failure(self.s3.put_new(key, b"1"), first)
        second, stale = yield (self.s3.put_new(key, b"2"), self.s3.put_swap(key, b"3", '"0"'))
        yield from request(self.s3.delete_many([key]))
        for name, result in (("IfNoneMatch", second), ("IfMatch", stale)):
            if not isinstance(result, BaseException):
                raise ConfigurationError(
                    f"the store behind bucket {bucket!r} ignored a PutObject with {name}: the manifest "
                    "index needs conditional writes (AWS S3, MinIO, R2, SeaweedFS >= 4.48 honour them); "
                    "use a DynamoDB table (table=...) with this store"
                )
            if error_code(result) not in PRECONDITION_FAILED_CODES | CONDITIONAL_CONFLICT_CODES:
                raise_failure(self.s3.put_new(key, b"2"), result)

    # -- the head ------------------------------------------------------------------------
    def _read_head(self, thread_id: str) -> Op[Head]:
        call = self.s3.get(self.layout.manifest_head_key(thread_id))
        (result,) = yield (call,)
        return self._take_head(thread_id, call, result)

    def _take_head(self, thread_id: str, call: Any, result: Any) -> Head:
        if isinstance(result, BaseException):
            if classify(result, "get_object") != OBJECT_MISSING:
                raise_failure(call, result)
            head = Head(thread_id)
        else:
            where = f"s3://{self.s3.bucket}/{call.params['Key']}"
            head = decode_head(thread_id, result["Body"], where, result["ETag"])
        self._remember(head)
        return head

    def _swap(self, old: Head, new: Head) -> Op[bool]:
        """Replace the head ``old`` was read as with ``new``; False: another writer was first."""
        new.version = old.version + 1
        key = self.layout.manifest_head_key(old.thread_id)
        call = self.s3.put_swap(key, encode_head(new), old.etag)
        (result,) = yield (call,)
        if isinstance(result, BaseException):
            lost = error_code(result) in PRECONDITION_FAILED_CODES | CONDITIONAL_CONFLICT_CODES
            # IfMatch on a head that was deleted meanwhile: 404 on AWS, 412 elsewhere.
            if lost or (old.etag is not None and classify(result, "put_object") == OBJECT_MISSING):
                return False
            raise_failure(call, result)
        new.etag = result["ETag"]
        self._remember(new)
        return True

    def _update(self, thread_id: str, change: Callable[[Head], Head | None], start: Head | None = None) -> Op[Head]:
        """Compare-and-swap the head with ``change`` until it holds.

        ``change`` gets the head as read and returns the new one, or None when it
        holds already: a swap that was applied but answered with a failure (a
        reset) is found again on the next read and not applied twice.
        """
        head = start
        with self._lock:
            ahead = self._sealed.pop(thread_id, None)
        for attempt in range(_MAX_SWAPS):
            if head is None:
                head = yield from self._read_head(thread_id)
            new = change(head)
            if new is None:
                return head
            if ahead is None or not _apply_seal(new, ahead):
                if len(new.entries) > HARD_SEAL_AT:
                    plan = _plan_seal(self.layout, new)
                    # Objects first: a segment exists before the head that refers to it.
                    yield from put_immutable(self.s3, dict(plan.objects))
                    _apply_seal(new, plan)
            if (yield from self._swap(head, new)):
                return new
            head = None
            # Other writers: spread the retries (full jitter, capped).
            yield Sleep(random.uniform(0, min(_SWAP_BACKOFF_MAX, 0.01 * 2**attempt)))
        raise S3SaverError(
            f"the manifest head of thread {thread_id!r} in s3://{self.s3.bucket} kept changing under "
            f"other writers; gave up after {_MAX_SWAPS} attempts"
        )

    def _remember(self, head: Head) -> None:
        with self._lock:
            self._heads[head.thread_id] = head
            self._heads.move_to_end(head.thread_id)
            while len(self._heads) > _CACHE_HEADS:
                self._heads.popitem(last=False)

    def _cached(self, thread_id: str) -> Head | None:
        with self._lock:
            return self._heads.get(thread_id)

    # -- segments ------------------------------------------------------------------------
    def _load_segments(self, thread_id: str, refs: list[SegmentRef]) -> Op[list[Segment]]:
        """Sealed segments (cached: they never change), all fetched in one wave."""
        keys = [self.layout.segment_key(thread_id, r.number, r.token) for r in refs]
        with self._lock:
            missing = [k for k in keys if k not in self._segments]
        if missing:
            results = yield from request(*(self.s3.get(k) for k in missing))
            with self._lock:
                for key, result in zip(missing, results):
                    where = f"s3://{self.s3.bucket}/{key}"
                    self._segments[key] = decode_segment(thread_id, result["Body"], where)
                    while len(self._segments) > _CACHE_SEGMENTS:
                        self._segments.popitem(last=False)
        with self._lock:
            return [self._segments[k] for k in keys]

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
    def prepare(self, thread_id: str, ns: str, parent_id: str | None) -> Op[Prepared]:
        """Reads the head. When the head this process saw last was due for sealing,
        its oldest checkpoints go into a segment in the same round trip (they
        never change), for the commit to refer to: puts stay at two round trips."""
        cached = self._cached(thread_id)
        plan = _plan_seal(self.layout, cached) if cached is not None and len(cached.entries) > SEAL_AT else None
        head_call = self.s3.get(self.layout.manifest_head_key(thread_id))
        puts = tuple(self.s3.put_new(k, b) for k, b in plan.objects) if plan else ()
        results = yield (head_call, *puts)
        head = self._take_head(thread_id, head_call, results[0])
        if plan is not None and not any(isinstance(r, BaseException) for r in results[1:]):
            with self._lock:
                self._sealed[thread_id] = plan  # written: a commit may now refer to it
        parent = (yield from self._find(head, ns, parent_id)) if parent_id is not None else None
        return Prepared(head.gen, parent, bool(head.created))

    def commit_checkpoint(self, entry: CheckpointEntry, created: int | None = None) -> Op[None]:
        def change(head: Head) -> Head | None:
            _refuse_older(head, entry.gen, entry.thread_id, entry.checkpoint_id)
            old = _in(head.entries, entry.ns, entry.checkpoint_id)
            if old is not None and old.loc == entry.loc and old.parent_id == entry.parent_id:
                return None  # our own swap, applied by an earlier attempt
            stored = replace(entry, writes=[])
            rest = [e for e in head.entries if e is not old]
            # Its own checkpoint: the thread is no longer a copy to bring up to date.
            # The first writer to list the thread sets the time its listing
            # entry must carry; another writer's entry (a race) does not count.
            return replace(head, entries=[*rest, stored], copied_from=None, created=head.created or created or 0)

        yield from self._update(entry.thread_id, change, self._cached(entry.thread_id))

    def note(self, thread_id: str, created: int | None, run_id: str | None) -> Op[None]:
        keys = [self.layout.listing_key(created, thread_id)] if created is not None else []
        if run_id is not None:
            keys.append(self.layout.run_key(run_id, thread_id))
        yield from put_immutable(self.s3, {k: b"" for k in keys})

    def commit_writes(self, entries: list[WritesEntry]) -> Op[WritesOutcome]:
        thread_id = entries[0].thread_id
        outcome = WritesOutcome()

        def change(head: Head) -> Head | None:
            _refuse_older(head, entries[0].gen, thread_id, entries[0].checkpoint_id)
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

        yield from self._update(thread_id, change, self._cached(thread_id))
        return outcome

    # -- reads ---------------------------------------------------------------------------
    def latest(self, thread_id: str, ns: str) -> Op[CheckpointEntry | None]:
        head = yield from self._read_head(thread_id)
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
        head = yield from self._read_head(thread_id)
        entry = yield from self._find(head, ns, checkpoint_id)
        return None if entry is None or entry.hidden else entry

    def writes(self, entry: CheckpointEntry) -> Op[list[WritesEntry]]:
        yield from ()
        return list(entry.writes or [])  # manifest entries always come with their writes

    def entries(self, keys: list[Key3]) -> Op[dict[Key3, CheckpointEntry | None]]:
        """Older checkpoints, from the heads and segments this process has read:
        no request (the resolver reads the object of one it does not find)."""
        yield from ()
        with self._lock:
            segments = list(self._segments.values())
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
        """The head's checkpoints first, then one sealed segment per page, newest first."""
        if cursor is None:
            head = yield from self._read_head(thread_id)
            page = [_with_writes(e, head.writes) for e in head.entries]
            refs = list(head.segments)
        else:
            head, refs = cursor
            # Segments whose checkpoints are all at or above `before` hold nothing here.
            while refs and before_id is not None and refs[-1].min_id >= before_id:
                refs.pop()
            if not refs:
                return [], None
            ((entries, writes),) = yield from self._load_segments(thread_id, [refs.pop()])
            page = [_with_writes(e, writes + head.writes) for e in entries]
        page = [
            e for e in page
            if not e.hidden and (ns is None or e.ns == ns) and (before_id is None or e.checkpoint_id < before_id)
        ]
        page.sort(key=lambda e: (e.ns, e.checkpoint_id), reverse=True)
        return page, ((head, refs) if refs else None)

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
        head = yield from self._read_head(thread_id)
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

    def contents(self, thread_id: str) -> Op[list[CheckpointEntry]]:
        head = yield from self._read_head(thread_id)
        return (yield from self._contents(head))

    def _contents(self, head: Head) -> Op[list[CheckpointEntry]]:
        """Every checkpoint of the head and its segments, in commit order (segments
        oldest first, then the head), with their writes."""
        out: list[CheckpointEntry] = []
        for entries, writes in (yield from self._load_segments(head.thread_id, head.segments)):
            out += [_with_writes(e, writes + head.writes) for e in entries]
        return out + [_with_writes(e, head.writes) for e in head.entries]

    def threads(
        self, before: ThreadRef | None, page_size: int, cursor: Any
    ) -> Op[tuple[list[tuple[ThreadRef, CheckpointEntry | None]], Any]]:
        """One page of the listing's keys (newest first by name), then the heads of
        those threads in one wave. A key counts only if its time is the head's:
        one left by a writer that lost the race to list a thread, or by a delete
        cut short, does not."""
        start_after = self.layout.listing_key(before.created, before.thread_id) if before is not None else None
        page = yield from request(self.s3.list_keys(self.layout.threads_root, cursor, start_after, page_size))
        listed = [p for o in page[0].get("Contents", []) if (p := self.layout.parse_listing_key(o["Key"]))]
        heads = yield from gather(*(self._read_head(t) for _, t in listed))
        found = yield from gather(*(self._latest_in(head, "") for head in heads))
        out = [
            (ThreadRef(t, created), latest)
            for (created, t), head, latest in zip(listed, heads, found)
            if head.created == created
        ]
        return out, page[0].get("NextContinuationToken")

    def created(self, thread_id: str) -> Op[int | None]:
        head = yield from self._read_head(thread_id)
        return head.created or None

    def runs(self, run_ids: list[str]) -> Op[dict[str, list[str]]]:
        found: dict[str, list[str]] = {r: [] for r in run_ids}
        pending: dict[str, str | None] = {r: None for r in run_ids}
        while pending:
            order = list(pending)
            pages = yield from request(*(self.s3.list_keys(self.layout.runs_dir(r), pending[r]) for r in order))
            pending = {}
            for run_id, page in zip(order, pages):
                prefix = self.layout.runs_dir(run_id)
                found[run_id] += [decode(o["Key"][len(prefix) :]) for o in page.get("Contents", [])]
                if page.get("NextContinuationToken"):
                    pending[run_id] = page["NextContinuationToken"]
        return found

    def forget_runs(self, pairs: list[tuple[str, str]]) -> Op[None]:
        yield from _delete_keys(self.s3, [self.layout.run_key(r, t) for r, t in pairs])

    def all_threads(self) -> Op[list[CheckpointEntry]]:
        """Lists the manifests (the admin path), then reads every head and segment."""
        threads: list[str] = []
        token: str | None = None
        while True:
            page = yield from request(self.s3.list_keys(self.layout.manifest_root, token))
            threads += [t for o in page[0].get("Contents", []) if (t := self.layout.thread_of_head(o["Key"]))]
            token = page[0].get("NextContinuationToken")
            if not token:
                break
        out: list[CheckpointEntry] = []
        for thread_id in threads:
            out += [e for e in (yield from self.contents(thread_id)) if not e.hidden]
        return out

    def restore(
        self, thread_id: str, entries: list[CheckpointEntry], writes: list[WritesEntry], created: int
    ) -> Op[None]:
        head = yield from self._read_head(thread_id)
        # What an interrupted delete buried stays deleted.
        buried = {_grave_key(e) for e in head.graveyard}
        entries = sorted((e for e in entries if _grave_key(e) not in buried), key=lambda e: (e.checkpoint_id, e.ns))
        writes = [w for w in writes if _grave_key(w) not in buried]

        def install(h: Head) -> Head | None:
            return replace(
                h,
                entries=[replace(e, gen=h.gen, writes=[]) for e in entries],
                writes=[replace(w, gen=h.gen) for w in writes],
                segments=[],
                created=h.created or created,
            )

        installed = yield from self._update(thread_id, install, head)
        if not head.created:
            yield from self.note(thread_id, installed.created, None)
        old = [r for r in head.segments if r not in installed.segments]
        yield from _delete_keys(self.s3, [self.layout.segment_key(thread_id, r.number, r.token) for r in old])

    # -- delete, prune and copy ----------------------------------------------------------
    def delete_thread(
        self, thread_id: str, now: int, delete_objects: Callable[[list[IndexEntry]], Op[None]]
    ) -> Op[None]:
        """One swap makes the thread gone (the next generation, no entries); its old
        entries and segments wait in the head's graveyard until their objects are
        deleted, so a delete cut short is finished by the next one."""
        head = yield from self._read_head(thread_id)
        if head.etag is None:
            return  # nothing was ever stored: leave no trace

        def bury(h: Head) -> Head | None:
            return Head(
                thread_id,
                version=h.version,
                gen=h.gen + 1,
                deleted_at=now,
                graveyard=[*h.graveyard, *h.entries, *h.writes],
                graveyard_segments=[*h.graveyard_segments, *h.segments],
                retired=h.retired,
                # Kept until the graveyard is cleared, to find the listing entry.
                created=h.created,
            )

        head = yield from self._update(thread_id, bury, head)
        cleared = yield from self._clear_graveyard(head, delete_objects, unlist=True)
        if head.created and not cleared.created:
            yield from _delete_keys(self.s3, [self.layout.listing_key(head.created, thread_id)])

    def drop(
        self,
        thread_id: str,
        hide: list[CheckpointEntry],
        drop: list[CheckpointEntry],
        doomed: list[IndexEntry],
        delete_objects: Callable[[list[IndexEntry]], Op[None]],
    ) -> Op[None]:
        """One swap installs the thread's history without the dropped checkpoints
        (in new segments and head; the old segments retire), with ``doomed`` in
        the graveyard until their objects are deleted."""
        hidden = {(e.ns, e.checkpoint_id) for e in hide}
        dropped = {(e.ns, e.checkpoint_id) for e in drop}
        head = self._cached(thread_id)  # as the caller read it; a lost swap reads it again
        for _ in range(_MAX_SWAPS):
            if head is None:
                head = yield from self._read_head(thread_id)
            entries = yield from self._contents(head)
            known = {(e.ns, e.checkpoint_id) for e in entries}
            new = replace(
                head,
                entries=[
                    replace(e, writes=[], hidden=e.hidden or (e.ns, e.checkpoint_id) in hidden)
                    for e in entries
                    if (e.ns, e.checkpoint_id) not in dropped
                ],
                writes=[w for e in entries if (e.ns, e.checkpoint_id) not in dropped for w in e.writes or ()]
                # Writes that came before their checkpoint: a run in flight's.
                + [w for w in head.writes if (w.ns, w.checkpoint_id) not in known],
                segments=[],
                retired=[*head.retired, *head.segments],
                graveyard=[*head.graveyard, *doomed],
            )
            plan = _plan_seal(self.layout, new) if len(new.entries) > KEEP_IN_HEAD else None
            if plan is not None:
                # Objects first: the segments exist before the head that refers to them.
                yield from put_immutable(self.s3, dict(plan.objects))
                _apply_seal(new, plan)
            if (yield from self._swap(head, new)):
                yield from self._clear_graveyard(new, delete_objects, unlist=False)
                return
            if plan is not None:
                yield from _delete_keys(self.s3, [k for k, _ in plan.objects])  # another writer came first
            head = None
        raise S3SaverError(
            f"the manifest head of thread {thread_id!r} in s3://{self.s3.bucket} kept changing under "
            f"other writers; prune gave up after {_MAX_SWAPS} attempts (nothing was removed)"
        )

    def _clear_graveyard(
        self, head: Head, delete_objects: Callable[[list[IndexEntry]], Op[None]], unlist: bool
    ) -> Op[Head]:
        """Delete what ``head``'s graveyard holds (its entries' objects, the objects
        of every entry in its buried segments, retired segments), then take that
        out of the head. ``unlist``: the thread's listing time goes too, unless
        the thread was written to again meanwhile."""
        thread_id = head.thread_id
        buried_entries: list[IndexEntry] = list(head.graveyard)
        for entries, writes in (yield from self._load_segments(thread_id, head.graveyard_segments)):
            buried_entries += [*entries, *writes]

        def segment_keys(refs: list[SegmentRef]) -> list[str]:
            return [self.layout.segment_key(thread_id, r.number, r.token) for r in refs]

        # A buried segment goes after the objects it lists (a call again needs
        # it to find them); a retired one lists nothing that goes.
        yield from gather(delete_objects(buried_entries), _delete_keys(self.s3, segment_keys(head.retired)))
        yield from _delete_keys(self.s3, segment_keys(head.graveyard_segments))
        buried = {_grave_key(e) for e in head.graveyard}

        def clear(h: Head) -> Head | None:
            unlisted = unlist and h.created and not h.entries
            if not h.graveyard and not h.graveyard_segments and not h.retired and not unlisted:
                return None
            # Only what this call removed: another may have buried more meanwhile.
            return replace(
                h,
                graveyard=[e for e in h.graveyard if _grave_key(e) not in buried],
                graveyard_segments=[r for r in h.graveyard_segments if r not in head.graveyard_segments],
                retired=[r for r in h.retired if r not in head.retired],
                created=0 if unlisted else h.created,
            )

        return (yield from self._update(thread_id, clear, head))

    def copy_thread(
        self,
        source: str,
        dest: str,
        copy_objects: Callable[[list[IndexEntry]], Op[None]],
        expired: Callable[[CheckpointEntry], bool],
        now: int,
    ) -> Op[None]:
        """Objects, then the target's segments, then its head in one swap: a copy
        cut short leaves the target as it was (a call again does it all)."""
        src = yield from self._read_head(source)
        target = yield from self._read_head(dest)
        # A target that holds only an earlier copy of this source is brought up to date.
        if (target.entries or target.segments) and target.copied_from != source:
            raise ConfigurationError(
                f"thread {dest!r} already has checkpoints of its own ({self.describe()}); copy_thread "
                "copies into an empty thread (delete_thread it first)"
            )
        entries = [e for e in (yield from self._contents(src)) if not expired(e)]
        writes = [w for e in entries for w in e.writes or ()]
        yield from copy_objects([*entries, *writes])

        def install(h: Head) -> Head | None:
            if (h.entries or h.segments) and h.copied_from != source:
                raise ConfigurationError(f"thread {dest!r} got checkpoints of its own while being copied into")
            return replace(
                h,
                entries=[replace(e, thread_id=dest, gen=h.gen, writes=[]) for e in entries],
                writes=[replace(w, thread_id=dest, gen=h.gen) for w in writes],
                segments=[],
                copied_from=source,
                created=h.created or now,
            )

        installed = yield from self._update(dest, install, target)
        if not target.created:
            yield from self.note(dest, installed.created, None)
        # An earlier copy's segments (brought up to date above) are not referenced any more.
        old = [r for r in target.segments if r not in installed.segments]
        yield from _delete_keys(self.s3, [self.layout.segment_key(dest, r.number, r.token) for r in old])


# -- helpers ---------------------------------------------------------------------------
@dataclass
class _SealPlan:
    """Segments holding the oldest checkpoints of a head, and what they hold."""

    sealed: set[tuple[str, str]]
    writes: set[tuple[str, str, str, str, str]]
    refs: list[SegmentRef]
    objects: list[tuple[str, bytes]]


def _plan_seal(layout: KeyLayout, head: Head) -> _SealPlan:
    """Segments of at most SEGMENT_MAX checkpoints for all but the newest
    KEEP_IN_HEAD checkpoints of ``head``, with their writes."""
    sealed = head.entries[:-KEEP_IN_HEAD]
    number = head.segments[-1].number + 1 if head.segments else 0
    plan = _SealPlan({(e.ns, e.checkpoint_id) for e in sealed}, set(), [], [])
    for i in range(0, len(sealed), SEGMENT_MAX):
        chunk = sealed[i : i + SEGMENT_MAX]
        ids = {(e.ns, e.checkpoint_id) for e in chunk}
        writes = [w for w in head.writes if (w.ns, w.checkpoint_id) in ids]
        plan.writes.update(_write_key(w) for w in writes)
        token = uuid.uuid4().hex[:16]
        cids = [e.checkpoint_id for e in chunk]
        plan.refs.append(SegmentRef(number, token, min(cids), max(cids), len(chunk)))
        plan.objects.append((layout.segment_key(head.thread_id, number, token), encode_segment(chunk, writes)))
        number += 1
    return plan


def _apply_seal(head: Head, plan: _SealPlan) -> bool:
    """Swap the sealed checkpoints of ``head`` for the plan's segment refs, if the
    head still holds every one of them (else another writer sealed them first)
    and exactly the writes the plan copied (else a write came or was replaced
    since the plan was made: a segment must not hold a write the head replaced)."""
    present = {(e.ns, e.checkpoint_id) for e in head.entries}
    if not plan.refs or not plan.sealed <= present:
        return False
    current = {_write_key(w) for w in head.writes if (w.ns, w.checkpoint_id) in plan.sealed}
    if current != plan.writes:
        return False
    head.entries = [e for e in head.entries if (e.ns, e.checkpoint_id) not in plan.sealed]
    head.writes = [w for w in head.writes if _write_key(w) not in plan.writes]
    head.segments = [*head.segments, *plan.refs]
    return True


def _write_key(w: WritesEntry) -> tuple[str, str, str, str, str]:
    return (w.ns, w.checkpoint_id, w.task_id, w.part, w.token)


def _refuse_older(head: Head, gen: int, thread_id: str, checkpoint_id: str) -> None:
    if gen < head.gen:
        raise ThreadDeletedError(
            f"thread {thread_id!r} was deleted after its checkpoint {checkpoint_id!r} was written "
            "(manifest index); a run in flight cannot continue it. Start the thread afresh "
            "(invoke without a checkpoint_id) to use the id again."
        )


def _in(entries: list[CheckpointEntry], ns: str, checkpoint_id: str) -> CheckpointEntry | None:
    return next((e for e in entries if e.checkpoint_id == checkpoint_id and e.ns == ns), None)


def _newest(entries: list[CheckpointEntry], ns: str) -> CheckpointEntry | None:
    return max((e for e in entries if e.ns == ns and not e.hidden), key=lambda e: e.checkpoint_id, default=None)


def _with_writes(entry: CheckpointEntry, writes: list[WritesEntry]) -> CheckpointEntry:
    own = [w for w in writes if w.checkpoint_id == entry.checkpoint_id and w.ns == entry.ns]
    return replace(entry, writes=own)


def _pop_wave(refs: list[SegmentRef], at_least: int, checkpoints: int) -> list[SegmentRef]:
    """Take segments off the top of ``refs``: ``at_least`` of them, and more
    while they do not yet hold ``checkpoints`` checkpoints."""
    batch: list[SegmentRef] = []
    while refs and (len(batch) < at_least or checkpoints > 0):
        batch.append(refs.pop())
        checkpoints -= batch[-1].count
    return batch


def _grave_key(entry: CheckpointEntry | WritesEntry) -> tuple[Any, ...]:
    if isinstance(entry, CheckpointEntry):
        return ("c", entry.ns, entry.checkpoint_id)
    return ("w", entry.ns, entry.checkpoint_id, entry.task_id, entry.part, entry.token)


def _delete_keys(s3: S3Calls, keys: list[str]) -> Op[None]:
    if keys:
        yield from request(*(s3.delete_many(keys[i : i + DELETE_BATCH]) for i in range(0, len(keys), DELETE_BATCH)))
