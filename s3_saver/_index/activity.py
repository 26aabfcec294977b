"""Activity entries, both backends: which threads were written on which day (UTC).

``archive_idle`` (``_ops/idle``) finds idle threads by walking these entries
oldest day first from a persisted cursor, instead of reading every thread. A
write records the entry of its day the first time a process writes the thread
that day, in the requests it sends anyway: a table's commit transaction takes
one more action; the manifest's ``prepare`` puts one more empty object beside
the checkpoint's objects, before the head swap that records the day (so a head
never names a day whose entry was not written). Entries are hints: a missing
one only delays an archive, a stale one is dropped by the walk, and whether a
thread is idle is decided on the thread itself (``_ops/idle``).

Delete only what you read: every entry written carries a new token, and every
delete names the token it read. A walk reads a thread's entry, archives the
thread, and drops the entry; meanwhile another process restores the thread by
writing it and writes the entry of the same day again. Dropped by day and
thread alone, that new entry would go, and its writer, remembering it wrote
the day's entry, writes no other that day: the thread would be examined again
only once written on a later day. With tokens the walk's drop misses it.

* DynamoDB: partition ``<prefix>#active#<shard>`` (``ACTIVITY_SHARDS`` of them,
  by a hash of the thread: no partition takes every thread's first write of
  the day), sort key ``<yyyymmdd>!<thread>``: a shard reads oldest day first.
  One item per day and thread: a write replaces the token (``tok``), and a
  delete is conditioned on the token it read. The cursors are items of
  partition ``<prefix>#active``.
* Manifest: empty objects ``listing/active/<yyyymmdd>/<thread>/<token>``,
  listed in key order (oldest day first); the cursors are objects in the
  manifest folder. S3 deletes by key, and a conditional delete (``If-Match``)
  is not honoured by every store (nor would an empty object's ETag tell two
  writes apart): the token is in the key, so a write never lands on a key a
  walk read, and a delete of the key read removes that entry and no other. A
  thread written by several processes on one day may have an entry from each;
  the walk decides once per thread and drops them all. Earlier versions wrote
  ``<yyyymmdd>/<thread>`` (no token): still read, and dropped by key (no
  writer writes that key any more).
"""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone
from typing import Any

from s3_saver._format import keys as _keys
from s3_saver._format.entries import Activity, Tombstone
from s3_saver.errors import CorruptObjectError


def new_entry(thread_id: str, day: int) -> Activity:
    """A new activity entry of ``thread_id`` on ``day``: a token of its own."""
    return Activity(day, thread_id, token=_keys.new_token(8))


def day_of(seconds: float) -> int:
    """The UTC day (yyyymmdd) of a time in seconds."""
    d = datetime.fromtimestamp(seconds, timezone.utc).date()
    return d.year * 10000 + d.month * 100 + d.day


def shift_day(day: int, days: int) -> int:
    d = date(day // 10000, day // 100 % 100, day % 100) + timedelta(days=days)
    return d.year * 10000 + d.month * 100 + d.day


def activity_day(ts: Any, now: float) -> int:
    """The day of a checkpoint's activity entry: the day of its ``ts`` (what
    ``archive_idle`` decides on), never before yesterday by the writer's clock: a
    walk's cursor never passes the last two days (``_ops/idle``), so an entry
    always lands where a walk still reads."""
    today = day_of(now)
    try:
        when = datetime.fromisoformat(ts)
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        day = day_of(when.timestamp())
    except (TypeError, ValueError, OverflowError, OSError):
        return today
    return max(day, shift_day(today, -1))


def _cursor_body(cursor: dict[str, str]) -> str:
    return json.dumps(cursor, sort_keys=True)


def _read_cursor(data: str | bytes, where: str) -> dict[str, str]:
    """A stored cursor; a body that is not one is CorruptObjectError, never a bare ValueError."""
    try:
        cursor = json.loads(data)
    except ValueError as exc:
        raise CorruptObjectError(f"{where}: not an archive_idle cursor ({exc})") from exc
    if not isinstance(cursor, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in cursor.items()):
        raise CorruptObjectError(f"{where}: not an archive_idle cursor (a JSON object of strings)")
    return cursor


def _lives_on(found: list[Activity], record: Tombstone) -> list[Activity]:
    """The entries an erase deletes: all but those the thread's record names,
    read after the delete and after ``found``. A delete removes those entries
    (``delete_thread``) and clears (manifest) or keeps (table) their names; an
    entry is written once under its own token, so a named one found after the
    delete is a new life's (a run that started the thread afresh meanwhile),
    which the thread needs to be found idle later."""
    named = {(a.day, a.token) for a in record.named_entries() if a.token}
    return [a for a in found if (a.day, a.token) not in named]


