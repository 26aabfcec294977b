"""The DynamoDB index's side of archival: the thread's record says where it lives.

An archived thread is one attribute of its record (``archive``, the archive
object's reference). Every read takes the record in its first round trip, so
that one write switches every namespace at once, whatever their number.

Archive (read-decide-act, fenced at the commit): ``mark_archive`` puts the
archive object's key on the record first (``archiving``); every commit checks
the record and takes such a mark off, so ``switch_archive``, which needs the
mark still there, fails if anything was committed after the thread was read
for the archive. After the switch, ``finish_archive`` removes the live objects
and items, the items in transactions that need the record to still name this
archive and no restore to be under way (a restore, ``unarchive``, puts its own
mark, ``restoring``, first): a cleanup still running can never delete an item
a restore wrote, nor its objects (a restore writes under a fresh tag).

Mixed into ``DynamoIndex`` (``DynamoArchive``), as ``lifecycle`` is.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from s3_saver._format.archive import encode_ref
from s3_saver._format.entries import (
    Activity,
    ArchiveRef,
    CheckpointEntry,
    Tombstone,
    WritesEntry,
)
from s3_saver._format.keys import new_token
from s3_saver._index.dynamodb.items import (
    DynamoCalls,
    Link,
    _thread_item,
)
from s3_saver._index.dynamodb.table import (
    ARCHIVE,
    ARCHIVING,
    GEN,
    GONE_KEYS,
    PARTITION_KEY,
    RESTORING,
    SORT_KEY,
    STALE_ARCHIVE,
    STALE_RUNS,
    TAG,
)
from s3_saver._index.terms import Fenced, Release
from s3_saver._transport.failures import CONDITION_FAILED_CODES, error_code
from s3_saver._transport.protocol import Op, raise_failure, request_one
from s3_saver.errors import ThreadArchivedError

_TRANSACTION_ACTIONS = 99  # and the record's check: 100 per transaction
_ITEM_ATTRIBUTES = (PARTITION_KEY, SORT_KEY, "loc", "token", GEN, TAG)


class DynamoArchive:
    """The archive reference on the thread's record, for ``DynamoIndex``."""

    # From DynamoIndex: its calls and table, write_batches, transact and _contents.
    calls: DynamoCalls
    table: str

    def archive_of(self, thread_id: str) -> Op[Tombstone]:
        found = yield from request_one(self.calls.get_tombstone(thread_id))
        return _thread_item(self.calls, found)

    def mark_archive(self, thread_id: str, key: str) -> Op[str | None]:
        # An earlier archive's mark (cut short, or racing this one) is taken
        # over: its object is the caller's to delete.
        result = yield from self._update(
            thread_id,
            "SET #m = :k",
            "attribute_not_exists(#a) AND attribute_not_exists(#r)",
            {"#m": ARCHIVING, "#a": ARCHIVE, "#r": RESTORING},
            {":k": {"S": key}},
            ReturnValues="ALL_OLD",
        )
        if result is None:
            raise _busy(thread_id, (yield from self.archive_of(thread_id)), f"table {self.table}")
        return result.get("Attributes", {}).get(ARCHIVING, {}).get("S")

    def snapshot(self, thread_id: str) -> Op[tuple[list[CheckpointEntry], Any]]:
        record, entries = yield from self._contents(thread_id)  # type: ignore[attr-defined]
        return entries, record

    def switch_archive(self, thread_id: str, ref: ArchiveRef, snapshot: Any) -> Op[bool]:
        # The commit point: from here on every read goes to the archive.
        result = yield from self._update(
            thread_id,
            "SET #a = :ref REMOVE #m",
            "#m = :k AND attribute_not_exists(#a)",
            {"#a": ARCHIVE, "#m": ARCHIVING},
            {":ref": {"B": encode_ref(ref)}, ":k": {"S": ref.key}},
        )
        if result is not None:
            return True
        # Refused, or applied and its answer lost (the retry then meets its own
        # switch): the record says which.
        record = yield from self.archive_of(thread_id)
        return record.archive is not None and record.archive.key == ref.key

    def finish_archive(self, thread_id: str, ref: ArchiveRef, release: Release) -> Op[None]:
        """The archived thread's live items and their objects go, objects first (a
        call again finds them through the items). The items are read, then the
        record: a restore marks it before it writes any item, so if the record
        still names this archive and no restore then, every item read is an
        archived one, and its objects may go (a restore writes its own under a
        fresh tag). The items go in transactions that need the same of the
        record: a restore that began since keeps the items it wrote."""
        calls = self.calls
        items: list[dict[str, Any]] = []
        entries: list[Any] = []
        start: dict[str, Any] | None = None
        while True:
            page = yield from request_one(calls.query(thread_id, start_key=start, projection=_ITEM_ATTRIBUTES))
            for raw in page.get("Items", []):
                item = calls.parse(raw)
                if isinstance(item, (CheckpointEntry, WritesEntry, Link)) or (isinstance(item, Tombstone) and item.ns is not None):
                    items.append({k: raw[k] for k in (PARTITION_KEY, SORT_KEY)})
                if isinstance(item, (CheckpointEntry, WritesEntry)):
                    entries.append(item)
            start = page.get("LastEvaluatedKey")
            if start is None:
                break
        if not items:
            return
        record = yield from self.archive_of(thread_id)
        if record.archive is None or record.archive.key != ref.key or record.restoring is not None:
            return  # restored, or being restored: what is left is the restore's
        yield from release(entries, [])
        fence = {
            "ConditionCheck": {
                "TableName": self.table,
                "Key": calls.tombstone_key(thread_id),
                "ConditionExpression": "#a = :ref AND attribute_not_exists(#r)",
                "ExpressionAttributeNames": {"#a": ARCHIVE, "#r": RESTORING},
                "ExpressionAttributeValues": {":ref": {"B": encode_ref(ref)}},
            }
        }
        for i in range(0, len(items), _TRANSACTION_ACTIONS):
            deletes = [{"Delete": {"TableName": self.table, "Key": k}} for k in items[i : i + _TRANSACTION_ACTIONS]]
            if (yield from self.transact([*deletes, fence], f"archived items of thread {thread_id!r}")):  # type: ignore[attr-defined]
                return  # a restore began: the items are its own now

    def unarchive(
        self,
        thread_id: str,
        ref: ArchiveRef,
        entries: list[CheckpointEntry],
        writes: list[WritesEntry],
        active: Activity | None = None,
        key_id: str | None = None,
    ) -> Op[bool]:
        """The restore's mark first (``restoring``: a token of this call, taking
        over any earlier restore's; an archive's cleanup stops at it), then the
        entries, unseen while the record names the archive, in transactions that
        need the mark to still be this call's, then the switch, which needs it
        too. So the entries readers see after a switch are all one restore's: a
        restore that was taken over writes no more and does not switch. The
        switch records ``active`` (and writes its item) in one transaction: a
        switch refused (taken over, or a delete took the archive out) leaves none.
        ``key_id``: the switch also needs the key the entries are sealed under not
        destroyed by an erase (``Index.unarchive``); only a refusal reads the record."""
        calls = self.calls
        token = new_token(8)
        marked = yield from self._update(
            thread_id, "SET #r = :t", "#a = :ref", {"#r": RESTORING, "#a": ARCHIVE},
            {":t": {"S": token}, ":ref": {"B": encode_ref(ref)}}, ReturnValues="ALL_NEW",
        )
        if marked is None:
            record = yield from self.archive_of(thread_id)
            _key_fence(record, key_id)  # an erase took the archive out: say so
            if record.archive is None:
                return False  # restored already (another call, or this one's switch answered with a failure)
            raise ThreadArchivedError(
                f"thread {thread_id!r} was archived again in {record.archive.key} meanwhile (table {self.table})",
                thread_id,
                record.archive.storage_class,
                record.archive.key,
            )
        gen = int(marked["Attributes"].get(GEN, {}).get("N", "0"))
        ours = {
            "ConditionCheck": {
                "TableName": self.table,
                "Key": calls.tombstone_key(thread_id),
                "ConditionExpression": "#r = :t",
                "ExpressionAttributeNames": {"#r": RESTORING},
                "ExpressionAttributeValues": {":t": {"S": token}},
            }
        }
        # Writes and links first, checkpoint items last: whole checkpoints either way.
        items = [calls.writes_item(replace(w, gen=gen)) for w in writes]
        items += [calls.link_item(replace(e, gen=gen)) for e in entries]
        items += [calls.checkpoint_item(replace(e, gen=gen)) for e in entries]
        for i in range(0, len(items), _TRANSACTION_ACTIONS):
            puts = [{"Put": {"TableName": self.table, "Item": item}} for item in items[i : i + _TRANSACTION_ACTIONS]]
            if (yield from self.transact([*puts, ours], f"entries of thread {thread_id!r}")):  # type: ignore[attr-defined]
                return False  # another restore took over: it writes every entry again
        # Then the switch (the commit point): the archive object is left to delete.
        update = "REMOVE #a, #r SET #s = :key"
        condition = "#a = :ref AND #r = :t"
        names = {"#a": ARCHIVE, "#r": RESTORING, "#s": STALE_ARCHIVE}
        values = {":key": {"S": ref.key}, ":ref": {"B": encode_ref(ref)}, ":t": {"S": token}}
        if key_id is not None:
            # Invariant (erase): nothing sealed under a key an erase destroyed is indexed
            # after the erase's switch; the commit point carries the check (no request).
            condition += " AND NOT contains(#k, :k)"
            names["#k"] = GONE_KEYS
            values[":k"] = {"S": key_id}
        if active is None:
            switched = (yield from self._update(thread_id, update, condition, names, values)) is not None
            return switched or (yield from self._refused_switch(thread_id, key_id))
        clause, more_names, more_values, put = self.recording(active)  # type: ignore[attr-defined]
        switch = {
            "Update": {
                "TableName": self.table,
                "Key": calls.tombstone_key(thread_id),
                "UpdateExpression": f"{update}, {clause}",
                "ConditionExpression": condition,
                "ExpressionAttributeNames": {**names, **more_names},
                "ExpressionAttributeValues": {**values, **more_values},
            }
        }
        refused = yield from self.transact([switch, put], f"the restore of thread {thread_id!r}")  # type: ignore[attr-defined]
        return not refused or (yield from self._refused_switch(thread_id, key_id))

    def _refused_switch(self, thread_id: str, key_id: str | None) -> Op[bool]:
        """A switch refused: False (taken over, or a delete took the archive out), or
        ``Fenced`` when the record names the key the restore sealed under as destroyed."""
        if key_id is not None:
            _key_fence((yield from self.archive_of(thread_id)), key_id)
        return False

    def cancel_archiving(self, thread_id: str, key: str) -> Op[None]:
        """A commit found an archive under way: take its mark off (its switch then
        fails). Its object, if written, is left to delete (``stale_archive``) when
        no other one waits there: an archive cut short leaves nothing behind."""
        moved = yield from self._update(
            thread_id, "REMOVE #m SET #s = :k", "#m = :k AND attribute_not_exists(#s)",
            {"#m": ARCHIVING, "#s": STALE_ARCHIVE}, {":k": {"S": key}},
        )
        if moved is None:
            yield from self._update(thread_id, "REMOVE #m", "#m = :k", {"#m": ARCHIVING}, {":k": {"S": key}})

    def forget_archive(self, thread_id: str, key: str) -> Op[None]:
        yield from self._update(thread_id, "REMOVE #s", "#s = :key", {"#s": STALE_ARCHIVE}, {":key": {"S": key}})

    def forget_deleted_archive(self, thread_id: str, key: str | None, runs: list[str]) -> Op[None]:
        """A delete's ``forget_archive``: ``key`` off ``stale_archive`` (its object is
        deleted) and ``runs`` off ``stale_runs`` (their hints are deleted), in one
        update. Only these runs: a delete of a later life may have added others."""
        if not runs:
            if key is not None:
                yield from self.forget_archive(thread_id, key)
            return
        names, values = {"#r": STALE_RUNS}, {":r": {"SS": sorted(runs)}}
        if key is not None:
            both = {**values, ":key": {"S": key}}
            if (yield from self._update(thread_id, "REMOVE #s DELETE #r :r", "#s = :key", {**names, "#s": STALE_ARCHIVE}, both)):
                return
        yield from self._update(thread_id, "DELETE #r :r", "attribute_exists(#r)", names, values)

    def _update(
        self,
        thread_id: str,
        update: str,
        condition: str,
        names: dict[str, str],
        values: dict[str, Any],
        **options: Any,
    ) -> Op[dict[str, Any] | None]:
        """A conditional UpdateItem of the thread's record: its answer, or None when
        the condition did not hold."""
        call = self.calls._call(
            "update_item",
            {
                "TableName": self.table,
                "Key": self.calls.tombstone_key(thread_id),
                "UpdateExpression": update,
                "ConditionExpression": condition,
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values,
                **options,
            },
        )
        (result,) = yield (call,)
        if isinstance(result, BaseException):
            if error_code(result) in CONDITION_FAILED_CODES:
                return None
            raise_failure(call, result)
        return result


def _busy(thread_id: str, found: Tombstone, where: str) -> ThreadArchivedError:
    """Why an archive cannot go on: the thread is archived, or being restored."""
    if found.archive is not None:
        why = f"it is archived in {found.archive.key}"
    else:
        why = "a restore of it is under way; call again"
    return ThreadArchivedError(f"cannot archive thread {thread_id!r}: {why} ({where})", thread_id)


def _key_fence(record: Any, key_id: str | None) -> None:
    if key_id is not None and key_id in record.gone_keys:
        raise Fenced(record)
