"""The DynamoDB index's thread-level items: the thread listing and run hints
(partitions of their own, see ``listing``) and the updates of a
thread's record (its tombstone item) that list, unlist and bury it.
``DynamoCalls`` mixes ``DynamoThreadItems`` in.
"""

from __future__ import annotations

from typing import Any

from s3_saver._format import keys as _keys
from s3_saver._format.archive import encode_ref
from s3_saver._format.codec import to_attrs
from s3_saver._format.entries import Tombstone
from s3_saver._format.keys import KeyLayout
from s3_saver._index.dynamodb.table import (
    ARCHIVE,
    ARCHIVING,
    CREATED,
    DEAD_RUNS,
    GEN,
    GONE_KEYS,
    PARTITION_KEY,
    RESTORING,
    SORT_KEY,
    STALE_ARCHIVE,
    STALE_RUNS,
    UNLISTING,
    _transaction,
)
from s3_saver._transport.protocol import Call


class DynamoThreadItems:
    """The listing, run-hint and thread-record calls, for ``DynamoCalls``."""

    # What these methods rely on, from DynamoCalls: table and layout, and
    # _call and tombstone_key.
    table: str
    layout: KeyLayout

    # -- the thread listing and run hints: partitions of their own (see listing) --
    def listing_item(self, created: int, thread_id: str, unsharded: bool = False) -> dict[str, Any]:
        """The thread's listing item: in its shard, or (``unsharded``) where
        earlier versions wrote it."""
        shard = None if unsharded else _keys.shard_of(thread_id)
        return to_attrs(
            {
                PARTITION_KEY: self.layout.listing_partition("threads", shard),
                SORT_KEY: _keys.listing_sort_key(created, thread_id),
            }
        )

    def run_key(self, run_id: str, thread_id: str, unsharded: bool = False) -> dict[str, Any]:
        return self.run_item(run_id, thread_id, unsharded)

    def run_item(self, run_id: str, thread_id: str, unsharded: bool = False) -> dict[str, Any]:
        """A run's hint: in the run's shard (one query finds a run's threads), or
        (``unsharded``) where earlier versions wrote it."""
        shard = None if unsharded else _keys.shard_of(run_id)
        pk = self.layout.listing_partition("runs", shard)
        return to_attrs({PARTITION_KEY: pk, SORT_KEY: _keys.run_sort_key(run_id, thread_id)})

    def list_thread(self, created: int, thread_id: str) -> Call:
        """Records the creation time on the thread's tombstone item (only if none is
        there: two writers that both saw a new thread list it once) and puts the
        thread in the listing, in one request."""
        update = {
            "TableName": self.table,
            "Key": self.tombstone_key(thread_id),
            "UpdateExpression": f"SET #{CREATED} = :t",
            "ConditionExpression": f"attribute_not_exists(#{CREATED})",
            "ExpressionAttributeNames": {f"#{CREATED}": CREATED},
            "ExpressionAttributeValues": {":t": {"N": str(created)}},
        }
        put = {"TableName": self.table, "Item": self.listing_item(created, thread_id)}
        return _transaction(self, [{"Update": update}, {"Put": put}])

    def bury_runs(self, thread_id: str, run_ids: list[str]) -> Call:
        return self._call(
            "update_item",
            {
                "TableName": self.table,
                "Key": self.tombstone_key(thread_id),
                "UpdateExpression": f"ADD #{DEAD_RUNS} :r",
                # An archived thread keeps its runs (delete_for_runs refuses it).
                "ConditionExpression": "attribute_not_exists(#a)",
                "ExpressionAttributeNames": {f"#{DEAD_RUNS}": DEAD_RUNS, "#a": ARCHIVE},
                "ExpressionAttributeValues": {":r": {"SS": sorted(run_ids)}},
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            },
        )

    def bury_thread(
        self,
        thread_id: str,
        gen: int,
        now: int,
        stale: str | None,
        created: int,
        runs: list[str],
        read: Tombstone,
        gone: frozenset[str] = frozenset(),
    ) -> Call:
        """``delete_thread``'s switch: the thread's record moves to generation
        ``gen`` (every item below it is deleted for readers and writers), with no
        archive, marks or deleted runs left, and not listed (a run that starts it
        afresh lists it anew); the archive object (``stale``) and the listing
        entry (``unlisting``: when it was listed) wait on it until removed, and so
        do the archive's ``runs`` (the archive reference, which named them, goes).
        It answers with the record as it was just before (``ALL_OLD``): the
        activity entry it names then is the thread's last (no commit, restore,
        import or copy names one after this switch).

        Only on the record as the delete ``read`` it, in what the delete decided
        from it (the archive, an archive's mark, the listing time), or on one
        switched already (``gen``: this request sent again, or a racing delete
        of the same generation): this write takes those out, and an archive
        switched or a thread listed in between would be named by nothing after
        it. Refused (a conditional check failure), the record is read again and
        the delete decided again.

        ``gone`` (an erase with encryption): the ids of the thread's destroyed data
        keys, added to the record in the same write, so no commit sealed under one
        lands after the switch (``DynamoCalls.fence``)."""
        names = {
            "#g": GEN, "#d": "deleted_at", "#a": ARCHIVE, "#m": ARCHIVING, "#r": RESTORING, "#x": DEAD_RUNS, "#c": CREATED,
        }
        values: dict[str, Any] = {":g": {"N": str(gen)}, ":t": {"N": str(now)}}
        update = "SET #g = :g, #d = :t"
        if stale is not None:
            update += ", #s = :s"
            names["#s"] = STALE_ARCHIVE
            values[":s"] = {"S": stale}
        if created:
            update += ", #u = :u"
            names["#u"] = UNLISTING
            values[":u"] = {"N": str(created)}
        update += " REMOVE #a, #m, #r, #x, #c"
        added = []
        if runs:
            added.append("#sr :sr")
            names["#sr"] = STALE_RUNS
            values[":sr"] = {"SS": sorted(runs)}
        if gone:
            added.append("#gk :gk")
            names["#gk"] = GONE_KEYS
            values[":gk"] = {"SS": sorted(gone)}
        if added:
            update += " ADD " + ", ".join(added)
        as_read = []
        for name, value in (("#a", read.archive), ("#m", read.archiving), ("#c", read.created or None)):
            if value is None:
                as_read.append(f"attribute_not_exists({name})")
            else:
                as_read.append(f"{name} = :read{name[1:]}")
                values[f":read{name[1:]}"] = (
                    {"B": encode_ref(value)} if name == "#a" else {"S": value} if name == "#m" else {"N": str(value)}
                )
        return self._call(
            "update_item",
            {
                "TableName": self.table,
                "Key": self.tombstone_key(thread_id),
                "UpdateExpression": update,
                "ConditionExpression": f"({' AND '.join(as_read)}) OR #g = :g",
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values,
                "ReturnValues": "ALL_OLD",
            },
        )

    def unlist_thread(self, created: int, thread_id: str, pending: bool = False) -> Call:
        """Takes the thread out of the listing, in one request: its listing entry
        and, if the item says it was listed at ``created``, that time off the item
        (``created``; ``pending``: a delete's ``unlisting``)."""
        listed = [self.listing_item(created, thread_id, unsharded) for unsharded in (False, True)]
        attribute = UNLISTING if pending else CREATED
        update: dict[str, Any] = {
            "TableName": self.table,
            "Key": self.tombstone_key(thread_id),
            "UpdateExpression": "REMOVE #c",
            "ConditionExpression": "#c = :t",
            "ExpressionAttributeNames": {"#c": attribute},
            "ExpressionAttributeValues": {":t": {"N": str(created)}},
        }
        # Both places the item may be: its shard, or the unsharded partition of a
        # table setup() has not moved yet (a Delete of no item is no error).
        deletes = [{"Delete": {"TableName": self.table, "Key": key}} for key in listed]
        return _transaction(self, [*deletes, {"Update": update}])

    def query_listing(self, pk: str, after: str | None, limit: int, consistent: bool = False) -> Call:
        """One listing partition (a shard, or the unsharded one) above ``after``."""
        params: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "pk = :pk" + (" AND sk > :b" if after is not None else ""),
            "ExpressionAttributeValues": {":pk": {"S": pk}},
            "Limit": limit,
        }
        if after is not None:
            params["ExpressionAttributeValues"][":b"] = {"S": after}
        if consistent:
            params["ConsistentRead"] = True
        return self._call("query", params)

    def query_run(self, pk: str, run_id: str, start_key: dict[str, Any] | None) -> Call:
        params: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :p)",
            "ExpressionAttributeValues": {":pk": {"S": pk}, ":p": {"S": _keys.run_sort_prefix(run_id)}},
        }
        if start_key is not None:
            params["ExclusiveStartKey"] = start_key
        return self._call("query", params)
