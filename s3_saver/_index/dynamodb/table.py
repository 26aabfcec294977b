"""The DynamoDB index's table: its shape, the attributes its items carry, and
the plain calls that read and write it (``DynamoTable``, mixed into
``DynamoCalls``). The item formats are in ``items``, which re-exports
these names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from s3_saver._format.keys import new_token
from s3_saver._transport.protocol import Call

PARTITION_KEY = "pk"
SORT_KEY = "sk"
TTL_ATTRIBUTE = "expires_at"
# On items copy_thread wrote: the source thread's partition key, so a copy cut
# short can be told apart from the target's own items and completed.
COPIED_FROM = "copied_from"
TABLE_KEY_SCHEMA = (
    {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
    {"AttributeName": SORT_KEY, "KeyType": "RANGE"},
)
TABLE_ATTRIBUTE_DEFINITIONS = (
    {"AttributeName": PARTITION_KEY, "AttributeType": "S"},
    {"AttributeName": SORT_KEY, "AttributeType": "S"},
)
TABLE_GLOBAL_SECONDARY_INDEXES: tuple[dict[str, Any], ...] = ()
"""The saver needs no secondary index: every read is a key lookup or a range of one partition."""


KIND_CHECKPOINT = "c"
KIND_WRITES = "w"

# The delete generation an item was written in; absent means 0.
GEN = "gen"
# On checkpoint items: the run that wrote it; set when prune kept it only for
# the checkpoints that read through it.
RUN = "run"
HIDDEN = "hidden"
# On checkpoint items written tagged (restore, import, copy): the tag of its object's key.
TAG = "tag"
# On writes items, with a global table's replica: the bucket of the region that committed it.
SITE = "site"
# On checkpoint and link items (see CheckpointEntry.chained): the parent's
# pending-write slots the checkpoint was made from (msgpack: a list of
# [task_id, part], or nil when the writer did not know them), and the mark of
# a parent taken out of the history since. Items written before these existed
# have neither: a replica reads them as before, trusting what arrived (it has
# nothing to prove a hole with); see ``_ops/lagged``.
PARENT_WRITES = "pw"
PARENT_GONE = "pg"
# On the thread's tombstone item: when the thread was listed; the runs deleted from it.
CREATED = "created"
DEAD_RUNS = "dead_runs"
# On the thread's tombstone item: the day of its latest activity entry (``_index/activity``),
# and that entry's token (an archive or a delete removes that entry only as written).
ACTIVE = "active"
ACTIVE_TOKEN = "active_tok"
# ... and the first such day, in any of its lives (a delete keeps it: ``idle.activity_span``).
SINCE = "since"
# On the thread's item and on each namespace's tombstone item: the thread is
# archived (see ``_format/archive``); a namespace's marker is what its readers meet first.
ARCHIVE = "archive"
# On the thread's item: an archive object a restore (or delete) still has to remove.
STALE_ARCHIVE = "stale_archive"
# On the thread's item: a deleted archive's runs, whose hints a delete still has
# to remove (its switch took the archive, which named them, out).
STALE_RUNS = "stale_runs"
# On the thread's item: an archive under way (the key of the object it writes),
# which any commit takes off (the archive then does not switch); a restore
# under way, which stops an archive's cleanup.
ARCHIVING = "archiving"
RESTORING = "restoring"
# On the thread's item: a delete's listing entry still to remove (when it was listed).
UNLISTING = "unlisting"
# On the thread's item (encryption): the ids of the data keys an erase destroyed; a
# commit sealed under one is refused (``DynamoCalls.fence``).
GONE_KEYS = "gone_keys"


class DynamoTable:
    """The table's plain calls, for ``DynamoCalls``."""

    # What these methods rely on, from DynamoCalls: table, and _call and pk. Declared here,
    # not imported: the item formats stand on the table, so the table names only itself.
    table: str
    _call: Callable[[str, dict[str, Any]], Call]

    # -- calls -----------------------------------------------------------------------
    def put(self, item: dict[str, Any], **options: Any) -> Call:
        return self._call("put_item", {"TableName": self.table, "Item": item, **options})

    def get(self, key: dict[str, Any]) -> Call:
        return self._call("get_item", {"TableName": self.table, "Key": key, "ConsistentRead": True})

    def batch_get(self, keys: list[dict[str, Any]]) -> Call:
        # Only older checkpoints are fetched this way, and their items never
        # change: an eventually consistent read (half the read units) is enough.
        # One not visible yet is read from its S3 object instead (see Resolver).
        return self._call("batch_get_item", {"RequestItems": {self.table: {"Keys": keys}}})

    def query(
        self,
        thread_id: str,
        *,
        begins_with: str | None = None,
        between: tuple[str, str] | None = None,
        newest_first: bool = True,
        limit: int | None = None,
        start_key: dict[str, Any] | None = None,
        projection: tuple[str, ...] | None = None,
        not_copied_from: str | None = None,
        min_gen: int = 0,
    ) -> Call:
        condition = "pk = :pk"
        values: dict[str, Any] = {":pk": {"S": self.pk(thread_id)}}
        if begins_with is not None:
            condition += " AND begins_with(sk, :p)"
            values[":p"] = {"S": begins_with}
        elif between is not None:
            condition += " AND sk BETWEEN :lo AND :hi"
            values[":lo"], values[":hi"] = {"S": between[0]}, {"S": between[1]}
        params: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": condition,
            "ExpressionAttributeValues": values,
            "ScanIndexForward": not newest_first,
            "ConsistentRead": True,
        }
        if limit is not None:
            params["Limit"] = limit
        if start_key is not None:
            params["ExclusiveStartKey"] = start_key
        # Attribute names go through placeholders: DynamoDB reserves hundreds of words.
        names: dict[str, str] = {}
        if projection is not None:
            params["ProjectionExpression"] = ", ".join(f"#{name}" for name in projection)
            names.update({f"#{name}": name for name in projection})
        filters = []
        if not_copied_from is not None:
            # Checkpoint and writes items (tombstones have no kind) that no copy wrote.
            filters.append(f"attribute_exists(#kind) AND (attribute_not_exists(#{COPIED_FROM}) OR #{COPIED_FROM} <> :src)")
            names["#kind"] = "kind"
            names[f"#{COPIED_FROM}"] = COPIED_FROM
            values[":src"] = {"S": not_copied_from}
        if min_gen:
            filters.append(f"#{GEN} >= :gen")
            names[f"#{GEN}"] = GEN
            values[":gen"] = {"N": str(min_gen)}
        if filters:
            params["FilterExpression"] = " AND ".join(filters)
        if names:
            params["ExpressionAttributeNames"] = names
        return self._call("query", params)

    def scan(self, start_key: dict[str, Any] | None = None) -> Call:
        params: dict[str, Any] = {"TableName": self.table, "ConsistentRead": True}
        if start_key is not None:
            params["ExclusiveStartKey"] = start_key
        return self._call("scan", params)

    def delete(self, key: dict[str, Any]) -> Call:
        return self._call("delete_item", {"TableName": self.table, "Key": key})

    def batch_write(self, requests: list[dict[str, Any]]) -> Call:
        return self._call("batch_write_item", {"RequestItems": {self.table: requests}})

    def describe(self) -> Call:
        return self._call("describe_table", {"TableName": self.table})

    def create(self) -> Call:
        return self._call(
            "create_table",
            {
                "TableName": self.table,
                "KeySchema": list(TABLE_KEY_SCHEMA),
                "AttributeDefinitions": list(TABLE_ATTRIBUTE_DEFINITIONS),
                "BillingMode": "PAY_PER_REQUEST",
            },
        )

    def describe_ttl(self) -> Call:
        return self._call("describe_time_to_live", {"TableName": self.table})

    def enable_ttl(self) -> Call:
        return self._call(
            "update_time_to_live",
            {
                "TableName": self.table,
                "TimeToLiveSpecification": {"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
            },
        )



def _transaction(calls: DynamoTable, actions: list[dict[str, Any]]) -> Call:
    """A TransactWriteItems with a token of its own: the call sent again (a retry
    after a lost answer) is applied once (DynamoDB's idempotency window is 10
    minutes), and botocore draws no ``uuid.uuid4`` to make one (see ``no_uuid4``)."""
    return calls._call("transact_write_items", {"TransactItems": actions, "ClientRequestToken": new_token()})
