"""The DynamoDB index's side of archival: the markers that send readers to an archive.

An archived thread keeps, in its partition, only tombstone items: its own item
and one per namespace, each carrying the archive's reference (``archive``).
Newest first, a namespace's tombstone is the first item of the namespace, so
the reads that already meet it (latest, get, history, the ancestor walk) find
the marker without one more request, and a writer finds it on the thread's item
that ``prepare`` reads. A namespace's marker switches it whole: before, its
items are read; after, the archive.

Mixed into ``DynamoIndex`` (``DynamoArchive``), as ``dynamo_lifecycle`` is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from s3_saver._archive import encode_ref
from s3_saver._index.base import ArchiveRef, CheckpointEntry, Tombstone, WritesEntry
from s3_saver._index.dynamo_items import (
    ARCHIVE,
    GEN,
    PARTITION_KEY,
    SORT_KEY,
    STALE_ARCHIVE,
    DynamoCalls,
    Link,
    _thread_item,
)
from s3_saver._protocol import Op, raise_failure, request, request_one
from s3_saver.errors import CONDITION_FAILED_CODES, ThreadArchivedError, error_code

_TRANSACTION_MAX = 100  # TransactWriteItems takes at most 100 actions
_MAX_SWITCHES = 3


class DynamoArchive:
    """Archive markers for ``DynamoIndex``."""

    # From DynamoIndex: its calls and table, and write_batches / entries helpers.
    calls: DynamoCalls
    table: str

    def archive_of(self, thread_id: str) -> Op[Tombstone]:
        found = yield from request_one(self.calls.get_tombstone(thread_id))
        return _thread_item(self.calls, found)

    def archive(
        self,
        thread_id: str,
        ref: ArchiveRef,
        archived: list[CheckpointEntry] | None,
        delete_objects: Callable[[list[Any]], Op[None]],
        known: list[CheckpointEntry] | None = None,
    ) -> Op[None]:
        calls = self.calls
        if archived is not None:
            packed = {"B": encode_ref(ref)}
            names = {"#a": ARCHIVE, "#s": STALE_ARCHIVE}
            # The thread's item refuses a second archive, and one whose object is not
            # the one intend_archive recorded (another call's came since); applied
            # already, it holds (a re-sent request).
            thread = {
                "TableName": self.table,
                "Key": calls.tombstone_key(thread_id),
                "UpdateExpression": "SET #a = :ref REMOVE #s",
                "ConditionExpression": "#a = :ref OR (attribute_not_exists(#a) AND #s = :key)",
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": {":ref": packed, ":key": {"S": ref.key}},
            }
            markers = [
                {
                    "TableName": self.table,
                    "Key": calls.tombstone_key(thread_id, ns),
                    "UpdateExpression": "SET #a = :ref",
                    "ExpressionAttributeNames": {"#a": ARCHIVE},
                    "ExpressionAttributeValues": {":ref": packed},
                }
                for ns in sorted(ref.newest)
            ]
            # The commit point: from here on every namespace reads from the archive.
            yield from self._transact([{"Update": u} for u in [thread, *markers]], thread_id)
        # What goes: exactly the archived items (a write's by its token: one that
        # replaced it under the marker, a last-wins slot, stays), or without the
        # list (a cold archive, a cleanup cut short) the items up to the newest
        # checkpoint archived in each namespace (a checkpoint parked since is newer).
        chosen = archived if archived is not None else known
        checkpoints = {(e.ns, e.checkpoint_id) for e in chosen} if chosen is not None else None
        writes = {(w.ns, w.checkpoint_id, w.task_id, w.part, w.token) for e in chosen or () for w in e.writes or ()}

        def goes(entry: CheckpointEntry | WritesEntry) -> bool:
            if checkpoints is None:
                return entry.checkpoint_id <= ref.newest.get(entry.ns, "")
            if isinstance(entry, WritesEntry):
                return (entry.ns, entry.checkpoint_id, entry.task_id, entry.part, entry.token) in writes
            return (entry.ns, entry.checkpoint_id) in checkpoints

        doomed: list[Any] = []
        keys: list[dict[str, Any]] = []
        start: dict[str, Any] | None = None
        while True:
            page = yield from request_one(
                calls.query(thread_id, start_key=start, projection=(PARTITION_KEY, SORT_KEY, "loc", "token", GEN))
            )
            for raw in page.get("Items", []):
                item = calls.parse(raw)
                entry = item.entry if isinstance(item, Link) else item
                if isinstance(entry, (CheckpointEntry, WritesEntry)) and goes(entry):
                    keys.append(_key(raw))
                    if not isinstance(item, Link):
                        doomed.append(entry)
            start = page.get("LastEvaluatedKey")
            if start is None:
                break
        # Objects before the items that point at them, as every delete does.
        yield from delete_objects(doomed)
        yield from self.write_batches([{"DeleteRequest": {"Key": k}} for k in keys], f"archived entries of thread {thread_id!r}")  # type: ignore[attr-defined]

    def unarchive(
        self, thread_id: str, ref: ArchiveRef, entries: list[CheckpointEntry], writes: list[WritesEntry]
    ) -> Op[None]:
        calls = self.calls
        namespaces = sorted(ref.newest)
        for _ in range(_MAX_SWITCHES):
            thread_raw, *tombs = yield from request(
                calls.get_tombstone(thread_id), *(calls.get_tombstone(thread_id, ns) for ns in namespaces)
            )
            thread = _thread_item(calls, thread_raw)
            if thread.archive is None or thread.archive.key != ref.key:
                if thread.archive is None:
                    return  # restored already (a call again after the switch)
                raise ThreadArchivedError(
                    f"thread {thread_id!r} was archived again in {thread.archive.key} meanwhile (table {self.table})",
                    thread_id,
                    thread.archive.storage_class,
                    thread.archive.key,
                )
            # The entries first, written under the markers (no reader sees them
            # yet), in the thread's generation.
            items = [calls.checkpoint_item(replace(e, gen=thread.gen)) for e in entries]
            items += [calls.link_item(replace(e, gen=thread.gen)) for e in entries]
            items += [calls.writes_item(replace(w, gen=thread.gen)) for w in writes]
            yield from self.write_batches([{"PutRequest": {"Item": i}} for i in items], f"entries of thread {thread_id!r}")  # type: ignore[attr-defined]
            # Then the markers go (the commit point): a namespace's tombstone of a
            # real delete keeps its generation, a marker alone is removed (an empty
            # tombstone would cost "latest" a round trip). The archive object is
            # left to delete, on the thread's item.
            switch: list[dict[str, Any]] = [
                {
                    "Update": {
                        "TableName": self.table,
                        "Key": calls.tombstone_key(thread_id),
                        "UpdateExpression": "REMOVE #a SET #s = :key",
                        "ExpressionAttributeNames": {"#a": ARCHIVE, "#s": STALE_ARCHIVE},
                        "ExpressionAttributeValues": {":key": {"S": ref.key}},
                    }
                }
            ]
            for ns, raw in zip(namespaces, tombs):
                key = calls.tombstone_key(thread_id, ns)
                if _thread_item(calls, raw).gen:
                    update = {"TableName": self.table, "Key": key, "UpdateExpression": "REMOVE #a"}
                    switch.append({"Update": {**update, "ExpressionAttributeNames": {"#a": ARCHIVE}}})
                else:
                    condition = {"ConditionExpression": "attribute_not_exists(#g)", "ExpressionAttributeNames": {"#g": GEN}}
                    switch.append({"Delete": {"TableName": self.table, "Key": key, **condition}})
            if (yield from self._transact(switch, thread_id, lost_ok=True)):
                return
        raise ThreadArchivedError(
            f"restoring thread {thread_id!r}: its tombstones in table {self.table} kept changing (a delete running?)",
            thread_id,
            ref.storage_class,
            ref.key,
        )

    def intend_archive(self, thread_id: str, key: str) -> Op[None]:
        call = self.calls._call(
            "update_item",
            {
                "TableName": self.table,
                "Key": self.calls.tombstone_key(thread_id),
                "UpdateExpression": "SET #s = :key",
                "ConditionExpression": "attribute_not_exists(#a) AND (attribute_not_exists(#s) OR #s = :key)",
                "ExpressionAttributeNames": {"#a": ARCHIVE, "#s": STALE_ARCHIVE},
                "ExpressionAttributeValues": {":key": {"S": key}},
            },
        )
        (result,) = yield (call,)
        if isinstance(result, BaseException):
            if error_code(result) not in CONDITION_FAILED_CODES:
                raise_failure(call, result)
            found = yield from self.archive_of(thread_id)
            raise _busy(thread_id, found, f"table {self.table}")

    def forget_archive(self, thread_id: str, key: str) -> Op[None]:
        call = self.calls._call(
            "update_item",
            {
                "TableName": self.table,
                "Key": self.calls.tombstone_key(thread_id),
                "UpdateExpression": "REMOVE #s",
                "ConditionExpression": "#s = :key",
                "ExpressionAttributeNames": {"#s": STALE_ARCHIVE},
                "ExpressionAttributeValues": {":key": {"S": key}},
            },
        )
        (result,) = yield (call,)
        if isinstance(result, BaseException) and error_code(result) not in CONDITION_FAILED_CODES:
            raise_failure(call, result)

    def _transact(self, actions: list[dict[str, Any]], thread_id: str, lost_ok: bool = False) -> Op[bool]:
        """TransactWriteItems in chunks of 100 (the first holds the thread's item,
        whose condition decides); False when a condition failed and ``lost_ok``."""
        chunks = [actions[i : i + _TRANSACTION_MAX] for i in range(0, len(actions), _TRANSACTION_MAX)]
        for chunk in chunks:
            call = self.calls._call("transact_write_items", {"TransactItems": chunk})
            (result,) = yield (call,)
            if isinstance(result, BaseException):
                if error_code(result) == "TransactionCanceledException" and _cancelled_by_condition(result):
                    if lost_ok:
                        return False
                    found = yield from self.archive_of(thread_id)
                    raise _busy(thread_id, found, f"table {self.table}")
                raise_failure(call, result)
        return True


def _busy(thread_id: str, found: Tombstone, where: str) -> ThreadArchivedError:
    """Why an archive cannot go on: the thread is archived, or another call's archive
    object (an archive under way, or a restore's old one) waits for deletion."""
    if found.archive is not None:
        why = f"it is archived in {found.archive.key}"
    else:
        why = f"another archive or restore of it is under way (archive object {found.stale_archive}); call again"
    return ThreadArchivedError(f"cannot archive thread {thread_id!r}: {why} ({where})", thread_id)


def _cancelled_by_condition(exc: BaseException) -> bool:
    reasons = [r.get("Code") for r in (getattr(exc, "response", {}) or {}).get("CancellationReasons", [])]
    return "ConditionalCheckFailed" in reasons


def _key(item: dict[str, Any]) -> dict[str, Any]:
    return {k: item[k] for k in (PARTITION_KEY, SORT_KEY)}

