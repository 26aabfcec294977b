"""The DynamoDB index's activity entries: an item per day and thread in a sharded partition,
its token replaced by each write and named by each delete (the rules both backends keep, and
the layout, are in ``_index/activity``); ``DynamoIndex`` mixes ``DynamoActivity`` in.
"""

from __future__ import annotations

from typing import Any

from s3_saver._format import keys as _keys
from s3_saver._format.codec import to_attrs
from s3_saver._format.entries import (
    Activity,
)
from s3_saver._index.activity import _cursor_body, _lives_on, _read_cursor, new_entry
from s3_saver._index.dynamodb.items import (
    _thread_item,
)
from s3_saver._index.dynamodb.table import (
    ACTIVE,
    ACTIVE_TOKEN,
    GEN,
    SINCE,
)
from s3_saver._transport.failures import (
    CONDITION_FAILED_CODES,
    error_code,
)
from s3_saver._transport.protocol import Op, raise_failure, request, request_one

# DynamoDB: the attribute of an activity entry that holds its token.
TOKEN = "tok"
# Entries read per BatchGetItem (DynamoDB's most).
_BATCH_GET = 100


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
