"""archive_idle: the operator's schedule, bounded per run, and its one-time backfill.

A run walks the activity entries (``_index/activity``: a thread and a day it
was written on) oldest day first, from a cursor the index keeps, up to the
cutoff's day. It reads the latest checkpoint of the threads it meets, a few at
a time, and for each entry:

* the thread is archived, deleted or without a root checkpoint, or its latest
  checkpoint is of a later day than the entry (that write made an entry of its
  own day): the entry is stale and goes;
* its latest checkpoint is older than the cutoff: the thread is archived (the
  archive reads it again under its mark and archives it only if it is idle
  still, see ``archive_thread``'s ``still``), and the entry goes;
* otherwise (written after the cutoff, on the entry's day) the entry stays.

The cursor moves over the entries a run settled (those gone, not one that
stays), never into the last two days: writers still add entries there (a
writer's day is never before yesterday, ``activity_day``). So a run reads at
most ``budget`` entries and archives at most ``limit`` threads, whatever the
history; what stays to do is in the report.

An entry is a hint: a missing one leaves a thread live (never loses data), a
stale one is dropped, and no entry is read as proof that a thread is idle.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

from s3_saver._format.archive import ARCHIVE_CLASSES, Archive, check_class
from s3_saver._format.codec import CHECKPOINT_FORMAT, loads, typed, unpack
from s3_saver._format.entries import Activity
from s3_saver._index.activity import day_of, shift_day
from s3_saver._index.terms import Archived
from s3_saver._ops import threads
from s3_saver._ops.archive import archive_thread
from s3_saver._ops.archived import ArchiveStatus
from s3_saver._ops.context import Context
from s3_saver._ops.keyed import keyed_beside
from s3_saver._ops.resolve import Resolver
from s3_saver._transport.protocol import Op, drain, gather
from s3_saver.errors import ConfigurationError, ThreadArchivedError

CURSOR = "archive-idle"
BACKFILL = "backfill"
_PAGE = 50  # entries read per shard and request
_PROBE_MAX = 50  # threads whose latest checkpoint is read per round trip


class IdleReport(list):  # type: ignore[type-arg]
    """What one [S3Saver.archive_idle()][s3_saver.S3Saver.archive_idle] run did: a list
    of the [ArchiveStatus][s3_saver.ArchiveStatus] of each thread it archived, and
    what is left.

    Attributes:
        more: True when the run stopped at ``limit`` or ``budget`` with entries
            still to read: run it again (a schedule does). False: every thread
            idle for ``older_than`` that the activity entries name is archived.
        examined: Activity entries read and settled by this run.
        dropped: Stale entries removed (threads archived, deleted, or written since).
        cursor: Where the next run starts (a position per shard of the entries).
        backfilled: Threads given an activity entry by ``backfill=True``.
        backfill_more: True when the backfill has more of the listing to walk.
    """

    def __init__(self) -> None:
        super().__init__()
        self.more = False
        self.examined = 0
        self.dropped = 0
        self.cursor: dict[str, str] = {}
        self.backfilled = 0
        self.backfill_more = False

    @property
    def archived(self) -> list[ArchiveStatus]:
        return list(self)


def archive_idle(
    ctx: Context, older_than: timedelta, storage_class: str, limit: int | None, budget: int, backfill: bool
) -> Op[IdleReport]:
    if not isinstance(older_than, timedelta) or older_than.total_seconds() < 0:
        raise ConfigurationError(f"older_than must be a datetime.timedelta >= 0, got {older_than!r}")
    check_class(storage_class, ARCHIVE_CLASSES, "storage_class")
    for name, value in (("limit", limit), ("budget", budget)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigurationError(f"{name} must be an int >= 1{' or None' if name == 'limit' else ''}, got {value!r}")
    now = time.time()
    cutoff = datetime.fromtimestamp(now, timezone.utc) - older_than  # to the microsecond, as ts is
    report = IdleReport()
    cursor = yield from ctx.index.load_cursor(CURSOR)
    if backfill:
        yield from _backfill(ctx, report, cursor, budget, now)
    walk = _Walk(report, cursor, shift_day(day_of(now), -2))
    until = day_of(cutoff.timestamp())
    while True:
        want = None if limit is None else limit - len(report)
        if want == 0 or report.examined >= budget:
            report.more = True
            break
        page = yield from ctx.index.active_page(walk.read, until, min(_PAGE, budget - report.examined))
        if not page:
            break
        while page and (want is None or want > 0) and report.examined < budget:
            size = min(_PROBE_MAX, len(page), budget - report.examined, 2 * want if want else _PROBE_MAX)
            chunk, page = page[:size], page[size:]
            yield from _settle(ctx, walk, chunk, storage_class, cutoff, limit)
            want = None if limit is None else limit - len(report)
        if page:
            report.more = True  # read, not settled: the next run reads them again
            break
    if walk.moved != cursor:
        yield from ctx.index.save_cursor(CURSOR, walk.moved)
    report.cursor = walk.moved
    return report


class _Walk:
    """Where a run reads next (``read``) and where its cursor may go (``moved``):
    over settled entries only, per shard, up to the first entry that stays."""

    def __init__(self, report: IdleReport, cursor: dict[str, str], settled: int) -> None:
        self.report = report
        self.read = dict(cursor)
        self.moved = dict(cursor)
        self.settled = settled
        self.stuck: set[str] = set()

    def done(self, entry: Activity, gone: bool) -> None:
        self.report.examined += 1
        self.read[entry.shard] = entry.position
        if not gone or entry.day > self.settled:
            self.stuck.add(entry.shard)
        elif entry.shard not in self.stuck:
            self.moved[entry.shard] = entry.position


def _settle(
    ctx: Context, walk: _Walk, chunk: list[Activity], storage_class: str, cutoff: datetime, limit: int | None
) -> Op[None]:
    """Decide each entry of ``chunk`` (module docstring), archive the idle threads
    (up to ``limit`` in the run: the entries after that are left to the next)."""
    latest = yield from _latest_ts(ctx, sorted({a.thread_id for a in chunk}))
    stale: list[Activity] = []
    waiting: set[str] = set()  # written since the look: its other entries here stay too
    for entry in chunk:
        if limit is not None and len(walk.report) >= limit:
            break
        ts = latest.get(entry.thread_id)
        gone = True
        if ts is None:
            stale.append(entry)  # archived, deleted, no root checkpoint: nothing to archive
        elif ts > cutoff:
            if day_of(ts.timestamp()) > entry.day:
                stale.append(entry)  # written on a later day, which has its own entry
            else:
                gone = False  # the thread's current entry: idle later, maybe
        elif entry.thread_id in waiting:
            gone = False
        else:
            try:
                status = yield from archive_thread(ctx, entry.thread_id, storage_class, lambda a: _idle(ctx, a, cutoff))
                if status is None:
                    gone = False  # written to since it was read here: the next run decides
                    waiting.add(entry.thread_id)
                else:
                    walk.report.append(status)
                    latest[entry.thread_id] = None  # another entry of it in this chunk is stale
            except ThreadArchivedError:
                gone = False  # written to while archived: the next run sees it
                waiting.add(entry.thread_id)
            except ConfigurationError:
                latest[entry.thread_id] = None  # no checkpoint left to archive (expired): nothing to do
            if gone:
                stale.append(entry)
        walk.done(entry, gone)
    if stale:
        walk.report.dropped += len(stale)
        # Each entry as read (its token), never by day and thread alone: a process
        # that restored a thread archived here, or wrote it afresh, may have
        # written the same day's entry again since this read; that one stays, so
        # a later run examines the thread again (``_index/activity``).
        yield from ctx.index.drop_active(stale)


def _latest_ts(ctx: Context, thread_ids: list[str]) -> Op[dict[str, datetime | None]]:
    """Each thread's latest root checkpoint's ``ts`` (None: archived, deleted, or
    none), in one wave (and one more for checkpoint objects the index lacks). With
    encryption, the threads' keys are loaded in the same wave (their records opened)."""
    ctx, found = yield from keyed_beside(ctx, thread_ids, gather(*(_latest(ctx, t) for t in thread_ids)))
    live = {t: e for t, e in zip(thread_ids, found) if e is not None and not ctx.expired(e)}
    resolver = Resolver(ctx)
    for entry in live.values():
        resolver.add(entry)
    unread = [e for e in live.values() if resolver.record(e) is None]
    if unread:
        yield from resolver.fetch_records(unread)
    out: dict[str, datetime | None] = dict.fromkeys(thread_ids)
    for thread_id, entry in live.items():
        record = resolver.records[resolver.key(entry)]
        checkpoint = loads(ctx.serde, typed(record["checkpoint"]), f"checkpoint {entry.checkpoint_id}")
        out[thread_id] = _when(checkpoint.get("ts"))
    return out


def _latest(ctx: Context, thread_id: str) -> Op[Any]:
    try:
        return (yield from ctx.index.latest(thread_id, ""))
    except Archived:
        return None


def _when(ts: Any) -> datetime | None:
    try:
        when = datetime.fromisoformat(ts)
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def _idle(ctx: Context, archive: Archive, cutoff: datetime) -> bool:
    """The thread as the archive read it under its mark is idle still."""
    roots = [e for e in archive.entries if e.ns == "" and not e.hidden]
    if not roots:
        return False
    newest = max(roots, key=lambda e: e.checkpoint_id)
    record = unpack(newest.body or b"", CHECKPOINT_FORMAT, f"checkpoint {newest.checkpoint_id}")
    when = _when(loads(ctx.serde, typed(record["checkpoint"]), f"checkpoint {newest.checkpoint_id}").get("ts"))
    return when is not None and when <= cutoff


# -- the backfill -----------------------------------------------------------------------------
def _backfill(ctx: Context, report: IdleReport, cursor: dict[str, str], budget: int, now: float) -> Op[None]:
    """Give threads written before activity entries existed one each: ``budget``
    threads of the listing per run, resumed from a cursor of its own. An entry
    goes on the day of the thread's latest checkpoint, but never behind the
    walk's cursor (it would never be read)."""
    state = yield from ctx.index.load_cursor(BACKFILL)
    if state.get("done"):
        return
    before = None
    if state.get("thread") is not None:
        created = datetime.fromtimestamp(int(state["created"]), timezone.utc)
        before = threads.ThreadInfo(state["thread"], created, "", "", {})
    infos, _ = yield from drain(threads.list_threads(ctx, None, budget, before))
    floor = max((_day_at(ctx, p) for p in cursor.values()), default=None)
    floor = shift_day(floor, 1) if floor is not None else None
    days = {}
    for info in infos:
        when = _when(info.ts)
        if info.archived is None and when is not None:
            day = day_of(when.timestamp())
            days[info.thread_id] = max(day, floor) if floor is not None else day
    yield from gather(*(ctx.index.touch(t, d) for t, d in days.items()))
    report.backfilled = len(days)
    report.backfill_more = len(infos) >= budget
    if infos:
        last = infos[-1]
        state = {"thread": last.thread_id, "created": str(int(last.created_at.timestamp()))}
    if not report.backfill_more:
        state["done"] = "1"
    yield from ctx.index.save_cursor(BACKFILL, state)


def _day_at(ctx: Context, position: str) -> int:
    """The day of a cursor's position (a sort key, or an object key under the root)."""
    root = ctx.layout.activity_root
    return int((position[len(root) :] if position.startswith(root) else position)[:8])


def activity_span(ctx: Context, thread_id: str, versioned: bool) -> Op[list[int]]:
    """The days a thread's activity entries can be on (``erase_thread``): none is
    before the first day a write recorded one in any of the thread's lives (a
    delete keeps that day: an earlier life's entries of older days wait for the
    walk), nor before the day before it was listed, nor after tomorrow; and
    none is behind the walk's cursor, which passes only entries it removed,
    unless the bucket keeps versions of them (``versioned``, entries that are
    objects): the walk's delete leaves each a noncurrent version there.

    Why from the first day, not a record of each entry the walk drops: the walk
    and the writes pay nothing for it (no request, a few bytes in the record),
    and a replica's erase finds the same days in the replicated record. The
    erase pays one listing per day of the thread's life (an admin call)."""
    cursor, (created, since) = yield from gather(ctx.index.load_cursor(CURSOR), ctx.index.activity_since(thread_id))
    today = day_of(time.time())
    starts = [shift_day(day_of(created), -1)] if created else []
    starts += [since] if since else []
    first = min(starts) if starts else None
    lows = [_day_at(ctx, p) for p in cursor.values()]
    if lows and (first is None or not (versioned and ctx.index.activity_objects)):
        first = min(lows) if first is None else max(first, min(lows))
    first = shift_day(today, -2) if first is None else min(first, shift_day(today, -2))
    days = [first]
    while days[-1] < shift_day(today, 1):
        days.append(shift_day(days[-1], 1))
    return days
