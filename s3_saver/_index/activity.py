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
from s3_saver._format.codec import to_attrs
from s3_saver._format.entries import Activity
from s3_saver._format.entries import Tombstone
from s3_saver._index.dynamodb.items import ACTIVE, ACTIVE_TOKEN, GEN, SINCE, _thread_item
from s3_saver._index.manifest.doc import record_of
from s3_saver._transport.protocol import Op, gather, raise_failure, request, request_one
from s3_saver._transport.s3 import DELETE_BATCH, S3Calls, put_immutable
from s3_saver._transport.failures import CONDITION_FAILED_CODES, OBJECT_MISSING, classify, error_code
from s3_saver.errors import CorruptObjectError

# The one shard of the manifest's entries (S3 spreads a prefix's keys by itself).
_ONE = "0"
# DynamoDB: the attribute of an activity entry that holds its token.
TOKEN = "tok"
# Entries read per BatchGetItem (DynamoDB's most).
_BATCH_GET = 100


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


class DynamoActivity:
    """The table's activity entries (mixed into ``DynamoIndex``)."""

    calls: Any
    table: str

    def activity_key(self, day: int, thread_id: str) -> dict[str, Any]:
        layout = self.calls.layout
        return to_attrs(
            {
                "pk": layout.activity_partition(_keys.activity_shard(thread_id)),
                "sk": _keys.activity_sort_key(day, thread_id),
            }
        )

    def activity_item(self, entry: Activity) -> dict[str, Any]:
        """The item of a new entry (its token replaces the one the item had)."""
        return {**self.activity_key(entry.day, entry.thread_id), TOKEN: {"S": entry.token}}

    def touch(self, thread_id: str, day: int) -> Op[None]:
        yield from request_one(self.calls.put(self.activity_item(new_entry(thread_id, day))))

    def stage_active(self, thread_id: str, day: int) -> Op[Activity]:
        """Nothing sent: the commit's transaction writes the item (``recording``)."""
        yield from ()
        return new_entry(thread_id, day)

    def recording(self, active: Activity) -> tuple[str, dict[str, str], dict[str, Any], dict[str, Any]]:
        """What a commit's transaction adds to record ``active``: the SET clause of
        the thread's record naming its day and token (an archive or a delete
        removes that entry, as written there and by no other; the first such
        day stays, a delete keeps it too: an erase looks from there), its
        names and values, and the Put of the entry's item. One transaction: the
        entry is never there without the commit, nor named without being there."""
        names = {"#act": ACTIVE, "#atok": ACTIVE_TOKEN, "#since": SINCE}
        values = {":act": {"N": str(active.day)}, ":atok": {"S": active.token}}
        put = {"Put": {"TableName": self.table, "Item": self.activity_item(active)}}
        return "#act = :act, #atok = :atok, #since = if_not_exists(#since, :act)", names, values, put

    def record_active(self, thread_id: str, gen: int, active: Activity | None) -> Op[None]:
        """An import's or a copy's entry, in a transaction of its own once the
        entries are written (they are many items, in batches): the record names
        it only while the thread is still in ``gen``, the generation the entries
        were written in. A delete since took them (nothing to name): no entry."""
        if active is None:
            return
        clause, names, values, put = self.recording(active)
        values[":g"] = {"N": str(gen)}
        # A thread never deleted has no generation on its record (or no record).
        condition = "#g = :g" if gen else "(attribute_not_exists(#g) OR #g = :g)"
        update = {
            "Update": {
                "TableName": self.table,
                "Key": self.calls.tombstone_key(thread_id),
                "UpdateExpression": "SET " + clause,
                "ConditionExpression": condition,
                "ExpressionAttributeNames": {**names, "#g": GEN},
                "ExpressionAttributeValues": values,
            }
        }
        yield from self.transact([update, put], f"the activity entry of thread {thread_id!r}")  # type: ignore[attr-defined]

    def untouch(self, entry: Activity) -> Op[None]:
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
                found.append(Activity(day, thread_id, shard, sk, _token(item)))
        return sorted(found, key=lambda a: (a.day, a.thread_id))

    def drop_active(self, entries: list[Activity]) -> Op[None]:
        """One DeleteItem per entry, in one round trip, each on the condition that
        the item still holds the token read (BatchWriteItem takes no condition;
        the write units are the same: one per item either way). A failed
        condition: the entry was written again since, or is gone: it stays as is."""
        calls = [self.calls._call("delete_item", self._drop_params(a)) for a in entries]
        if not calls:
            return
        results = yield tuple(calls)
        for call, result in zip(calls, results):
            if isinstance(result, BaseException) and error_code(result) not in CONDITION_FAILED_CODES:
                raise_failure(call, result)

    def _drop_params(self, entry: Activity) -> dict[str, Any]:
        params: dict[str, Any] = {
            "TableName": self.table,
            "Key": self.activity_key(entry.day, entry.thread_id),
            "ExpressionAttributeNames": {"#tok": TOKEN},
        }
        if entry.token:
            params["ConditionExpression"] = "#tok = :tok"
            params["ExpressionAttributeValues"] = {":tok": {"S": entry.token}}
        else:  # read without one (written by an earlier version): any write since adds one
            params["ConditionExpression"] = "attribute_not_exists(#tok)"
        return params

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
        """The items of ``days`` read (BatchGetItem, strongly consistent: 100 keys
        a request, in one round trip), then the thread's record, then each entry
        found deleted as read, but the one the record names (``_lives_on``)."""
        keys = [self.activity_key(d, thread_id) for d in days]
        items: list[dict[str, Any]] = []

        def read(chunk: list[Any]) -> Any:
            return self.calls._call(
                "batch_get_item", {"RequestItems": {self.table: {"Keys": chunk, "ConsistentRead": True}}}
            )

        def take(result: dict[str, Any]) -> list[Any]:
            items.extend(result.get("Responses", {}).get(self.table, []))
            return result.get("UnprocessedKeys", {}).get(self.table, {}).get("Keys", [])

        yield from self._until_processed(keys, _BATCH_GET, read, take, "activity entries")  # type: ignore[attr-defined]
        found = [Activity(*_keys.parse_activity_sort_key(i["sk"]["S"]), token=_token(i)) for i in items]
        if found:
            # After the entries: a commit whose entry was read is in the record (one transaction).
            record = _thread_item(self.calls, (yield from request_one(self.calls.get_tombstone(thread_id))))
            yield from self.drop_active(_lives_on(found, record))
        return []


def _token(item: dict[str, Any]) -> str:
    return item[TOKEN]["S"] if TOKEN in item else ""


def _lives_on(found: list[Activity], record: Tombstone) -> list[Activity]:
    """The entries an erase deletes: all but those the thread's record names,
    read after the delete and after ``found``. A delete removes those entries
    (``delete_thread``) and clears (manifest) or keeps (table) their names; an
    entry is written once under its own token, so a named one found after the
    delete is a new life's (a run that started the thread afresh meanwhile),
    which the thread needs to be found idle later."""
    named = {(a.day, a.token) for a in record.named_entries() if a.token}
    return [a for a in found if (a.day, a.token) not in named]


class ManifestActivity:
    """The manifest's activity entries (mixed into ``ManifestIndex``)."""

    activity_objects = True
    s3: S3Calls
    layout: _keys.KeyLayout

    def entry_key(self, entry: Activity) -> str:
        return self.layout.activity_key(entry.day, entry.thread_id, entry.token)

    def touch(self, thread_id: str, day: int) -> Op[None]:
        yield from put_immutable(self.s3, {self.entry_key(new_entry(thread_id, day)): b""})

    def stage_active(self, thread_id: str, day: int) -> Op[Activity]:
        """The entry's object, written now: the swap that records it in the head
        comes after (``with_active``), so a head names only entries written."""
        entry = new_entry(thread_id, day)
        yield from put_immutable(self.s3, {self.entry_key(entry): b""})
        return entry

    def untouch(self, entry: Activity) -> Op[None]:
        # Its own key: no other write made it. Kept if the head names it (a commit
        # that landed, its answer lost, then refused when sent again).
        head = self._cached(entry.thread_id)  # type: ignore[attr-defined]
        if head is None or head.active != entry.day or entry.token not in head.active_tokens:
            yield from self.drop_active([entry])

    def active_page(self, cursor: dict[str, str], until: int, size: int) -> Op[list[Activity]]:
        root = self.layout.activity_root
        page = yield from request_one(self.s3.list_keys(root, None, cursor.get(_ONE), size))
        found = []
        for o in page.get("Contents", []):
            parsed = self.layout.parse_activity_key(o["Key"])
            if parsed is None:
                continue  # not a key this layout builds
            day, thread_id, token = parsed
            if day > until:
                break
            found.append(Activity(day, thread_id, _ONE, o["Key"], token))
        return found

    def drop_active(self, entries: list[Activity]) -> Op[None]:
        # By key, which names the token: the entry read, never a newer one.
        keys = [self.entry_key(a) for a in entries]
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
        """Each day's entries of the thread listed (one listing per day, in one
        round trip: an admin call), then the head, then the entries deleted by
        the keys listed, but the one the head names (``_lives_on``). Returns the
        days' folders (prefixes of every key an entry of the day had)."""
        folders = [self.layout.activity_key(d, thread_id) for d in days]
        listed = yield from gather(*(self._listed(f) for f in folders))
        found = [a for entries in listed for a in entries]
        if found:
            head = yield from self._read_head(thread_id)  # type: ignore[attr-defined]
            yield from self.drop_active(_lives_on(found, record_of(head)))
        return folders

    def _listed(self, folder: str) -> Op[list[Activity]]:
        """The entries under ``folder`` (one day of one thread, with any token):
        the listing's prefix also matches threads whose encoded id extends it,
        which the exact parse leaves out."""
        want = self.layout.parse_activity_key(folder)
        out: list[Activity] = []
        token: str | None = None
        while True:
            page = yield from request_one(self.s3.list_keys(folder, token))
            for o in page.get("Contents", []):
                parsed = self.layout.parse_activity_key(o["Key"])
                if parsed is not None and want is not None and parsed[:2] == want[:2]:
                    out.append(Activity(parsed[0], parsed[1], _ONE, o["Key"], parsed[2]))
            token = page.get("NextContinuationToken")
            if not token:
                return out
