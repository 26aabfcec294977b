"""audit and collect_garbage: do the index and the bucket agree?

The admin path (it lists the bucket). For each thread it compares what the
bucket holds (``live/``, ``archive/`` and, in manifest mode, ``manifests/``)
with what the index refers to (``Index.holdings``):

* **missing**: an entry a reader may follow names an object that is not there
  (a reader of it fails with ``MissingObjectError``);
* **orphan**: an object no entry refers to, older than the grace period: a
  write that crashed between its objects and its index entry (the commit
  point), or a prune or delete cut short. ``collect_garbage`` deletes these;
* **in_flight**: the same, but younger than the grace period: it may belong
  to a write that is about to commit, so it is never collected;
* **unindexed**: the objects of a thread the index knows nothing of (a lost
  index: ``rebuild_index`` brings it back; or a first write that crashed);
* **broken**: the thread's index cannot be read (a damaged manifest head or
  segment, an undecodable item).

Order matters for safety: the bucket is listed *before* the index is read. An
object listed then was written before the listing, so if the index read after
it does not refer to it, its write has not committed for at least the object's
age; only objects older than the grace period count as garbage. Candidates for
"missing" are checked again with a HEAD: an entry committed after the listing
names objects written after it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from s3_saver._format.closure import closure, closure_keys, own_object
from s3_saver._format.entries import ArchiveRef, CheckpointEntry, WritesEntry
from s3_saver._index.terms import Holdings
from s3_saver._ops.bucket import _list_all, _list_thread, _Object
from s3_saver._ops.context import Context, target
from s3_saver._ops.delete import delete_keys
from s3_saver._ops.versioning import noncurrent_warning
from s3_saver._transport.failures import (
    OBJECT_MISSING,
    classify,
)
from s3_saver._transport.mode import settle_mode
from s3_saver._transport.protocol import Op, raise_failure
from s3_saver.errors import (
    ConfigurationError,
    CorruptObjectError,
    MissingObjectError,
)

MISSING, ORPHAN, IN_FLIGHT, UNINDEXED, BROKEN = "missing", "orphan", "in_flight", "unindexed", "broken"
_HEAD_WAVE = 100  # HEADs of missing candidates per round trip
_LISTING_PAGE = 100


@dataclass(frozen=True)
class StoreProblem:
    """One disagreement between the index and the bucket (see [S3Saver.audit()][s3_saver.S3Saver.audit]).

    Attributes:
        kind: ``"missing"``, ``"orphan"``, ``"in_flight"``, ``"unindexed"`` or ``"broken"``.
        thread_id: The thread it belongs to ("" for the thread listing itself).
        key: The object's key (None for a broken index).
        detail: What refers to it, or why the index could not be read.
        size: The object's size in bytes (0 when missing).
        modified: When the object was written (None when missing).
    """

    kind: str
    thread_id: str
    key: str | None
    detail: str
    size: int = 0
    modified: datetime | None = None


@dataclass
class StoreReport:
    """What [S3Saver.audit()][s3_saver.S3Saver.audit] found (and [S3Saver.collect_garbage()][s3_saver.S3Saver.collect_garbage] deleted).

    Attributes:
        threads: Threads examined.
        objects: Objects listed.
        bytes: Their total size.
        problems: Every disagreement found, thread by thread.
        garbage: Keys ``collect_garbage`` chose to delete (in a dry run: would delete).
        deleted: Keys deleted (``collect_garbage`` without ``dry_run``).
        absent: Threads asked for that neither the index nor the bucket holds.
        notes: What the bucket's configuration will cost (a versioned bucket that
            keeps every replaced manifest head, with no rule to expire them).
            Not a disagreement: it sets no exit bit of ``verify``.
    """

    threads: int = 0
    objects: int = 0
    bytes: int = 0
    problems: list[StoreProblem] = field(default_factory=list)
    garbage: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def of(self, kind: str) -> list[StoreProblem]:
        return [p for p in self.problems if p.kind == kind]

    @property
    def missing(self) -> list[StoreProblem]:
        return self.of(MISSING)

    @property
    def orphans(self) -> list[StoreProblem]:
        return self.of(ORPHAN)

    @property
    def in_flight(self) -> list[StoreProblem]:
        return self.of(IN_FLIGHT)

    @property
    def unindexed(self) -> list[StoreProblem]:
        return self.of(UNINDEXED)

    @property
    def broken(self) -> list[StoreProblem]:
        return self.of(BROKEN)

    @property
    def ok(self) -> bool:
        """True when the index and the bucket agree (writes in flight aside)."""
        return all(p.kind == IN_FLIGHT for p in self.problems)


Progress = Callable[[int, int, int], None]


def audit(
    ctx: Context, thread_ids: Sequence[str] | None, older_than: float, progress: Progress | None = None
) -> Op[StoreReport]:
    if older_than < 0:
        raise ConfigurationError(f"older_than must not be negative, got {older_than} s")
    if isinstance(thread_ids, str):
        raise ConfigurationError(f"thread_ids must be a list of thread ids, not the string {thread_ids!r}")
    # First: a prefix of the other index mode would read as all orphans and
    # unindexed threads (and collect_garbage would delete them).
    yield from settle_mode(ctx.mode, survey=True, claim=False)
    report = StoreReport()
    note = yield from noncurrent_warning(ctx)
    report.notes += [note] if note is not None else []
    # The bucket first, the index after (see the module's docstring).
    nested: dict[str, int] = defaultdict(int)
    if thread_ids is None:
        listed = yield from _list_all(ctx, nested)
        names = set(listed)
        names.update((yield from _listed_threads(ctx, report)))
    else:
        names = {target({"configurable": {"thread_id": t}})[0] for t in thread_ids}
        listed = defaultdict(list)
        for thread_id in sorted(names):
            listed.update((yield from _list_thread(ctx, thread_id, nested)))
    report.notes += [
        f"{count} objects under s3://{ctx.s3.bucket}/{prefix} are another saver's, whose prefix lies inside this "
        f"one's folders (a prefix refused now): never collected here; move its threads to another prefix with migrate"
        for prefix, count in sorted(nested.items())
    ]
    cutoff = time.time() - older_than
    done = 0
    for thread_id in sorted(names):
        objects = listed.get(thread_id, [])
        report.threads += 1
        report.objects += len(objects)
        report.bytes += sum(o.size for o in objects)
        found = yield from _audit_thread(ctx, thread_id, objects, cutoff)
        if found is None:
            report.absent.append(thread_id)
        else:
            report.problems += found
        done += 1
        if progress is not None:
            progress(done, len(names), report.bytes)
    return report


def collect_garbage(
    ctx: Context,
    thread_ids: Sequence[str] | None,
    older_than: float,
    dry_run: bool,
    include_unindexed: bool,
    progress: Progress | None = None,
) -> Op[StoreReport]:
    report = yield from audit(ctx, thread_ids, older_than, progress)
    kinds = {ORPHAN, UNINDEXED} if include_unindexed else {ORPHAN}
    # Never an in-flight object: younger than the grace period, its write may
    # still commit. An unindexed thread's objects only when asked: its index
    # may be what was lost (rebuild_index brings it back from these objects).
    report.garbage = sorted(
        p.key for p in report.problems
        if p.kind in kinds and p.key is not None and p.modified is not None and p.modified.timestamp() <= time.time() - older_than
    )
    if dry_run:
        return report
    by_thread: dict[str, set[str]] = defaultdict(set)
    for p in report.problems:
        if p.key in set(report.garbage):
            by_thread[p.thread_id].add(p.key)
    for thread_id, doomed in sorted(by_thread.items()):
        # The index read again just before the delete: a write that reused an
        # existing object (a resumed copy, import, restore or migrate writes the
        # same bytes under the same key, and an old object keeps its age) and
        # committed since the audit keeps it. What is left is the time of one
        # request between this read and the delete.
        try:
            held = yield from ctx.index.holdings(thread_id)
        except (CorruptObjectError, MissingObjectError):
            continue
        # Stray writes found old go from the index first (while their checkpoint
        # is still absent), then their objects: never an entry naming nothing.
        strays = [w for w in _strays(held) if _own_key(ctx, w) in doomed]
        if strays:
            gone = {_own_key(ctx, w) for w in (yield from ctx.index.drop_strays(thread_id, strays))}
            held = replace(held, live=[e for e in held.live if not isinstance(e, WritesEntry) or _own_key(ctx, e) not in gone])
        keys = sorted(doomed - _referenced(ctx, thread_id, held))
        yield from delete_keys(ctx, keys, f"garbage of thread {thread_id!r}")
        report.deleted += keys
    return report


def _audit_thread(ctx: Context, thread_id: str, objects: list[_Object], cutoff: float) -> Op[list[StoreProblem] | None]:
    """The thread's problems; None when neither the index nor the bucket holds anything of it."""
    try:
        held = yield from ctx.index.holdings(thread_id)
    except (CorruptObjectError, MissingObjectError) as exc:
        # Nothing of a thread whose index cannot be read is collected: what it
        # refers to is unknown.
        return [StoreProblem(BROKEN, thread_id, None, str(exc))]
    by_key = {o.key: o for o in objects}
    if not held.found:
        if not objects:
            return None
        # A new thread's first write in flight has no index entry yet either.
        return [
            StoreProblem(IN_FLIGHT, thread_id, o.key, "no index entry of this thread yet (younger than the grace period)", o.size, o.modified)
            if o.modified.timestamp() > cutoff
            else StoreProblem(UNINDEXED, thread_id, o.key, "no index entry of this thread", o.size, o.modified)
            for o in objects
        ]
    # Writes whose checkpoint the index does not hold, their object older than the
    # grace period: a run that ended between its writes and its checkpoint (its
    # process died, or a delete refused the checkpoint). No read shows them:
    # orphans, which collect_garbage takes out of the index first.
    stray = {
        id(w) for w in _strays(held)
        if (o := by_key.get(_own_key(ctx, w))) is not None and o.modified.timestamp() <= cutoff
    }
    held = replace(held, live=[e for e in held.live if id(e) not in stray])
    needed = _needed(ctx, thread_id, held)
    keep = _referenced(ctx, thread_id, held)
    problems: list[StoreProblem] = []
    absent = sorted(k for k in needed if k not in by_key)
    for key in (yield from _still_absent(ctx, absent)):
        problems.append(StoreProblem(MISSING, thread_id, key, needed[key]))
    for obj in objects:
        if obj.key in keep:
            continue
        young = obj.modified.timestamp() > cutoff
        what = "not referenced by the index" + (" (younger than the grace period: a write may still commit it)" if young else "")
        problems.append(StoreProblem(IN_FLIGHT if young else ORPHAN, thread_id, obj.key, what, obj.size, obj.modified))
    return problems


def _strays(held: Holdings) -> list[WritesEntry]:
    """Live pending writes whose checkpoint the index does not hold (none for an
    archived thread: its writes wait in the index for its restore)."""
    if any(isinstance(e, ArchiveRef) for e in held.live):
        return []
    present = {(e.ns, e.checkpoint_id) for e in held.live + held.kept if isinstance(e, CheckpointEntry)}
    return [e for e in held.live if isinstance(e, WritesEntry) and (e.ns, e.checkpoint_id) not in present]


def _own_key(ctx: Context, entry: Any) -> str:
    return ctx.layout.object_key(own_object(entry), entry.thread_id)


def _expired(ctx: Context, entry: Any) -> bool:
    # Expired entries are never served; their objects are a lifecycle rule's to expire.
    return getattr(entry, "expires_at", None) is not None and entry.expires_at <= ctx.now()


def _referenced(ctx: Context, thread_id: str, held: Holdings) -> set[str]:
    """Every object the index names, in any state (``closure.closure``: hidden,
    expired, kept for an operation to finish): none of them is garbage."""
    return held.index_keys | held.kept_keys | closure_keys(ctx.layout, held.live + held.kept, thread_id)


def _needed(ctx: Context, thread_id: str, held: Holdings) -> dict[str, str]:
    """Objects that must exist, each with what refers to it: what the entries a
    reader may follow name (an expired entry's objects are a lifecycle rule's)."""
    needed: dict[str, str] = {key: "the manifest" for key in held.index_keys}
    for entry in (e for e in held.live if not _expired(ctx, e)):
        if isinstance(entry, ArchiveRef):
            needed.setdefault(entry.key, _name(entry))
            continue
        what = _name(entry)
        own = ctx.layout.object_key(own_object(entry), thread_id)
        for o in closure([entry]):
            key = ctx.layout.object_key(o, thread_id)
            needed.setdefault(key, what if key == own else f"{what} (a value it reads)")
    return needed


def _name(entry: Any) -> str:
    if isinstance(entry, ArchiveRef):
        return f"the thread's archive ({entry.storage_class})"
    if isinstance(entry, CheckpointEntry):
        return f"checkpoint {entry.checkpoint_id} (namespace {entry.ns!r})"
    return f"pending writes of task {entry.task_id} at checkpoint {entry.checkpoint_id} (namespace {entry.ns!r})"


def _still_absent(ctx: Context, keys: list[str]) -> Op[list[str]]:
    """Those of ``keys`` a HEAD does not find (an entry committed after the listing
    names objects written after it)."""
    absent: list[str] = []
    for start in range(0, len(keys), _HEAD_WAVE):
        wave = keys[start : start + _HEAD_WAVE]
        calls = tuple(ctx.s3.head(k) for k in wave)
        results = yield calls
        for key, call, result in zip(wave, calls, results):
            if isinstance(result, BaseException):
                if classify(result, "head_object") != OBJECT_MISSING:
                    raise_failure(call, result)
                absent.append(key)
    return absent


def _listed_threads(ctx: Context, report: StoreReport) -> Op[set[str]]:
    """The threads the index lists (one whose every object is gone is found here)."""
    names: set[str] = set()
    cursor: Any = None
    try:
        while True:
            page, cursor = yield from ctx.index.threads(None, _LISTING_PAGE, cursor)
            names.update(ref.thread_id for ref, _ in page)
            if cursor is None:
                return names
    except (CorruptObjectError, MissingObjectError) as exc:
        report.problems.append(StoreProblem(BROKEN, "", None, f"the thread listing cannot be read: {exc}"))
        return names


