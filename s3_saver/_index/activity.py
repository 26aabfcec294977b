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

* DynamoDB: partition ``<prefix>#active#<shard>`` (``ACTIVITY_SHARDS`` of them,
  by a hash of the thread: no partition takes every thread's first write of
  the day), sort key ``<yyyymmdd>!<thread>``: a shard reads oldest day first.
  The cursors are items of partition ``<prefix>#active``.
* Manifest: empty objects ``listing/active/<yyyymmdd>/<thread>``, listed in key
  order (oldest day first); the cursors are objects in the manifest folder.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone
from typing import Any

from s3_saver import _keys
from s3_saver._codec import to_attrs
from s3_saver._index.base import Activity
from s3_saver._protocol import Op, raise_failure, request, request_one
from s3_saver._s3 import DELETE_BATCH, S3Calls, put_immutable
from s3_saver.errors import OBJECT_MISSING, CorruptObjectError, classify

# The one shard of the manifest's entries (S3 spreads a prefix's keys by itself).
_ONE = "0"


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


class DynamoActivity:
    """The table's activity entries (mixed into ``DynamoIndex``)."""

    calls: Any
    table: str

    def activity_item(self, day: int, thread_id: str) -> dict[str, Any]:
        layout = self.calls.layout
        return to_attrs(
            {
                "pk": layout.activity_partition(_keys.activity_shard(thread_id)),
                "sk": _keys.activity_sort_key(day, thread_id),
            }
        )

    def touch(self, thread_id: str, day: int) -> Op[None]:
        yield from request_one(self.calls.put(self.activity_item(day, thread_id)))

    def untouch(self, thread_id: str, day: int) -> Op[None]:
        """Nothing to take back: a refused commit's transaction wrote no entry."""
        yield from ()

    def active_page(self, cursor: dict[str, str], until: int, size: int) -> Op[list[Activity]]:
        """One Query per shard (one round trip): entries up to ``until``'s last key."""
        layout = self.calls.layout
        shards = [str(s) for s in range(_keys.ACTIVITY_SHARDS)]
        calls = []
        for shard in shards:
            pk = layout.activity_partition(int(shard))
            params: dict[str, Any] = {
                "TableName": self.table,
                # Every key of day ``until`` sorts below "<until>~" ("!" < "~").
                "KeyConditionExpression": "pk = :pk AND sk < :hi",
                "ExpressionAttributeValues": {":pk": {"S": pk}, ":hi": {"S": f"{until:08d}~"}},
                "Limit": size,
                "ConsistentRead": True,
            }
            if cursor.get(shard):
                params["ExclusiveStartKey"] = {"pk": {"S": pk}, "sk": {"S": cursor[shard]}}
            calls.append(self.calls._call("query", params))
        pages = yield from request(*calls)
        found = []
        for shard, page in zip(shards, pages):
            for item in page.get("Items", []):
                sk = item["sk"]["S"]
                day, thread_id = _keys.parse_activity_sort_key(sk)
                found.append(Activity(day, thread_id, shard, sk))
        return sorted(found, key=lambda a: (a.day, a.thread_id))

    def drop_active(self, entries: list[Activity]) -> Op[None]:
        requests = [{"DeleteRequest": {"Key": self.activity_item(a.day, a.thread_id)}} for a in entries]
        yield from self.write_batches(requests, "activity entries")  # type: ignore[attr-defined]

    def _cursor_key(self, name: str) -> dict[str, Any]:
        return to_attrs({"pk": self.calls.layout.activity_partition(None), "sk": name})

    def load_cursor(self, name: str) -> Op[dict[str, str]]:
        found = yield from request_one(self.calls.get(self._cursor_key(name)))
        if "Item" not in found:
            return {}
        where = f"DynamoDB table {self.calls.table!r}: cursor {name!r}"
        return _read_cursor(found["Item"].get("at", {}).get("S", ""), where)

    def save_cursor(self, name: str, cursor: dict[str, str]) -> Op[None]:
        item = {**self._cursor_key(name), "at": {"S": _cursor_body(cursor)}}
        yield from request_one(self.calls.put(item))

    def erase_activity(self, thread_id: str, days: list[int]) -> Op[list[str]]:
        yield from self.drop_active([Activity(d, thread_id, "", "") for d in days])
        return []


class ManifestActivity:
    """The manifest's activity entries (mixed into ``ManifestIndex``)."""

    activity_objects = True
    s3: S3Calls
    layout: _keys.KeyLayout

    def touch(self, thread_id: str, day: int) -> Op[None]:
        yield from put_immutable(self.s3, {self.layout.activity_key(day, thread_id): b""})

    def untouch(self, thread_id: str, day: int) -> Op[None]:
        head = self._cached(thread_id)  # type: ignore[attr-defined]
        if head is None or head.active != day:
            yield from self.drop_active([Activity(day, thread_id, _ONE, "")])

    def active_page(self, cursor: dict[str, str], until: int, size: int) -> Op[list[Activity]]:
        root = self.layout.activity_root
        page = yield from request_one(self.s3.list_keys(root, None, cursor.get(_ONE), size))
        found = []
        for o in page.get("Contents", []):
            parsed = self.layout.parse_activity_key(o["Key"])
            if parsed is None:
                continue  # not a key this layout builds
            if parsed[0] > until:
                break
            found.append(Activity(parsed[0], parsed[1], _ONE, o["Key"]))
        return found

    def drop_active(self, entries: list[Activity]) -> Op[None]:
        keys = [self.layout.activity_key(a.day, a.thread_id) for a in entries]
        if keys:
            yield from request(*(self.s3.delete_many(keys[i : i + DELETE_BATCH]) for i in range(0, len(keys), DELETE_BATCH)))

    def load_cursor(self, name: str) -> Op[dict[str, str]]:
        call = self.s3.get(self.layout.activity_cursor_key(name))
        (result,) = yield (call,)
        if isinstance(result, BaseException):
            if classify(result, "get_object") == OBJECT_MISSING:
                return {}
            raise_failure(call, result)
        return _read_cursor(result["Body"], f"s3://{self.s3.bucket}/{self.layout.activity_cursor_key(name)}")

    def save_cursor(self, name: str, cursor: dict[str, str]) -> Op[None]:
        # A plain PUT: the cursor is replaced (last writer wins, see Index.save_cursor).
        call = self.s3._call(
            "put_object",
            {"Bucket": self.s3.bucket, "Key": self.layout.activity_cursor_key(name), "Body": _cursor_body(cursor).encode()},
        )
        yield from request_one(call)

    def erase_activity(self, thread_id: str, days: list[int]) -> Op[list[str]]:
        keys = [self.layout.activity_key(d, thread_id) for d in days]
        yield from self.drop_active([Activity(d, thread_id, _ONE, "") for d in days])
        return keys

