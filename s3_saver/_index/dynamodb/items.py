"""The DynamoDB index's item formats: entries to items and back, and the calls built on them.

One item per checkpoint, one per part of a task's pending writes, and the
tombstones ``delete_thread`` leaves, all items of a thread in one partition.
Checkpoint items carry the checkpoint object itself when it fits (so reads
rarely touch S3) and always carry ``loc``: for every channel, the version and
the checkpoint whose object holds its value.

``DynamoCalls`` builds every call; the table's shape, attribute names and
plain calls are in ``table`` (imported from there), the thread listing, run hints
and thread-record updates in ``thread_items``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import ormsgpack

from s3_saver._format import keys as _keys
from s3_saver._format.archive import decode_ref, encode_ref
from s3_saver._format.codec import attr_size, from_attrs, plain, squeeze, to_attrs
from s3_saver._format.entries import ENTRY_BUDGET as ITEM_BUDGET
from s3_saver._format.entries import (
    CheckpointEntry,
    IndexEntry,
    Tombstone,
    WritesEntry,
    as_ref,
)
from s3_saver._format.keys import KeyLayout
from s3_saver._index.dynamodb.table import (
    ACTIVE,
    ACTIVE_TOKEN,
    ARCHIVE,
    ARCHIVING,
    CREATED,
    DEAD_RUNS,
    GEN,
    GONE_KEYS,
    HIDDEN,
    KIND_CHECKPOINT,
    KIND_WRITES,
    PARENT_GONE,
    PARENT_WRITES,
    PARTITION_KEY,
    RESTORING,
    RUN,
    SINCE,
    SITE,
    SORT_KEY,
    STALE_ARCHIVE,
    STALE_RUNS,
    TAG,
    TTL_ATTRIBUTE,
    UNLISTING,
    DynamoTable,
    _transaction,
)
from s3_saver._index.dynamodb.thread_items import DynamoThreadItems
from s3_saver._index.terms import (
    Archived,
)
from s3_saver._transport.failures import error_code
from s3_saver._transport.protocol import Call
from s3_saver.errors import CorruptObjectError, Where


@dataclass
class Link:
    """A checkpoint item's twin without the body: what the ancestor walk reads
    (see ``DynamoIndex.ancestors``). Written beside the checkpoint item."""

    entry: CheckpointEntry

    @property
    def ns(self) -> str:
        return self.entry.ns

    @property
    def gen(self) -> int:
        return self.entry.gen


# -- calls -------------------------------------------------------------------------
class DynamoCalls(DynamoThreadItems, DynamoTable):
    """Builds the DynamoDB calls for one table and key prefix, and reads its items."""

    def __init__(self, table: str, layout: KeyLayout, where: Where | None = None) -> None:
        self.table = table
        self.layout = layout
        self.where = where
        # Set for a global table (see base.one_line): writes items name their region.
        self.site: str | None = None

    def _call(self, operation: str, params: dict[str, Any]) -> Call:
        return Call("dynamodb", operation, params, self.where)

    # -- item <-> entry -----------------------------------------------------------
    def pk(self, thread_id: str) -> str:
        return self.layout.partition_key(thread_id)

    def checkpoint_item(self, entry: CheckpointEntry) -> dict[str, Any]:
        loc = ormsgpack.packb({ch: list(v) for ch, v in entry.loc.items()})
        if any(len(v) > 5 for v in entry.loc.values()):
            # The refs of a delta's pieces repeat one another (versions, ids):
            # compressed, as no version that predates pieces could read them anyway.
            loc = squeeze(loc)
        values: dict[str, Any] = {
            PARTITION_KEY: self.pk(entry.thread_id),
            SORT_KEY: _keys.checkpoint_sort_key(entry.ns, entry.checkpoint_id),
            "kind": KIND_CHECKPOINT,
            "parent": entry.parent_id,
            "loc": loc,
            TTL_ATTRIBUTE: entry.expires_at,
            GEN: entry.gen or None,
            RUN: entry.run_id,
            HIDDEN: True if entry.hidden else None,
            TAG: entry.tag or None,
            PARENT_WRITES: _pack_slots(entry.parent_writes) if entry.chained else None,
            PARENT_GONE: True if entry.parent_gone else None,
        }
        # The checkpoint object rides along when it fits, so reads skip S3; else
        # the metadata alone, so list(filter=) still never fetches S3 objects.
        if entry.body is not None and attr_size(values) + len(entry.body) + 8 <= ITEM_BUDGET:
            values["body"] = entry.body
        elif entry.metadata is not None and attr_size(values) + len(entry.metadata[1]) + 64 <= ITEM_BUDGET:
            values["meta"] = ormsgpack.packb(list(entry.metadata))
        return to_attrs(values)

    def link_item(self, entry: CheckpointEntry) -> dict[str, Any]:
        # No "kind": copy_thread's check for a target's own items skips it, as it
        # skips tombstones.
        item = self.checkpoint_item(replace(entry, body=None, metadata=None))
        item[SORT_KEY] = {"S": _keys.link_sort_key(entry.ns, entry.checkpoint_id)}
        del item["kind"]
        return item

    def writes_item(self, entry: WritesEntry) -> dict[str, Any]:
        values: dict[str, Any] = {
            PARTITION_KEY: self.pk(entry.thread_id),
            SORT_KEY: _keys.writes_sort_key(entry.ns, entry.checkpoint_id, entry.task_id, entry.part),
            "kind": KIND_WRITES,
            "token": entry.token,
            TTL_ATTRIBUTE: entry.expires_at,
            GEN: entry.gen or None,
            # Which region committed it (see base.one_line); a restore keeps the original's.
            SITE: entry.site or self.site,
        }
        if entry.body is not None and attr_size(values) + len(entry.body) + 8 <= ITEM_BUDGET:
            values["body"] = entry.body
        return to_attrs(values)

    def tombstone_item(self, tomb: Tombstone) -> dict[str, Any]:
        sk = _keys.THREAD_TOMBSTONE_SK if tomb.ns is None else _keys.ns_tombstone_sort_key(tomb.ns)
        values = {
            PARTITION_KEY: self.pk(tomb.thread_id),
            SORT_KEY: sk,
            GEN: tomb.gen,
            "deleted_at": tomb.deleted_at,
            CREATED: tomb.created or None,
            ARCHIVE: encode_ref(tomb.archive) if tomb.archive is not None else None,
            STALE_ARCHIVE: tomb.stale_archive,
        }
        return to_attrs(values)

    # -- the fences a commit carries (see ``DynamoIndex.commit_checkpoint``) ---------
    def fence(self, thread_id: str, gen: int, run_id: str | None = None, key_id: str | None = None) -> dict[str, Any]:
        """A transaction's check of the thread's record: not deleted since the
        writer learned ``gen``, not archived, no archive under way, the
        writer's run not deleted, and (encryption) the key the writer sealed
        with (``key_id``) not destroyed by an erase. Refused, it hands the record back."""
        names = {"#g": GEN, "#a": ARCHIVE, "#m": ARCHIVING}
        values: dict[str, Any] = {":g": {"N": str(gen)}}
        conditions = ["attribute_not_exists(#a)", "attribute_not_exists(#m)"]
        # A thread never deleted has no generation on its record (or no record).
        conditions.append("#g = :g" if gen else "(attribute_not_exists(#g) OR #g = :g)")
        if run_id is not None:
            conditions.append("NOT contains(#d, :r)")
            names["#d"] = DEAD_RUNS
            values[":r"] = {"S": run_id}
        if key_id is not None:
            # Invariant: nothing sealed under a destroyed key commits after the erase's
            # switch, whatever key a process cached before it (the steady state's
            # commit carries the check: no request of its own).
            conditions.append("NOT contains(#k, :k)")
            names["#k"] = GONE_KEYS
            values[":k"] = {"S": key_id}
        return {
            "ConditionCheck": {
                "TableName": self.table,
                "Key": self.tombstone_key(thread_id),
                "ConditionExpression": " AND ".join(conditions),
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values,
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    def parent_fence(self, thread_id: str, ns: str, parent_id: str, tag: str) -> dict[str, Any]:
        """A transaction's check that the parent is still in the index, as the
        writer read it (the same tag): what the child carries from it is there.

        It checks the parent's link item, not its checkpoint item: every write,
        restore, copy and archive puts the two with the same tag, and a prune,
        delete or archive removes both before it reads the index again to decide
        which objects go (``DynamoLifecycle.drop``), so either answers the same;
        a check is billed by the size of the item it reads, and the link has no
        body (about 2 write units instead of 2 per KB of state). A parent written
        before links existed fails the check: the child then stores what it
        carries itself (``ParentGone``), once."""
        names = {"#k": PARTITION_KEY, "#t": TAG}
        check: dict[str, Any] = {
            "TableName": self.table,
            "Key": to_attrs({PARTITION_KEY: self.pk(thread_id), SORT_KEY: _keys.link_sort_key(ns, parent_id)}),
            "ConditionExpression": "attribute_exists(#k) AND " + ("#t = :t" if tag else "attribute_not_exists(#t)"),
            "ExpressionAttributeNames": names,
        }
        if tag:
            check["ExpressionAttributeValues"] = {":t": {"S": tag}}
        return {"ConditionCheck": check}

    def put_part(self, entry: WritesEntry, replaces: str | None) -> dict[str, Any]:
        """A transaction's put of a pending-writes part: into an empty slot, or
        over exactly the part of token ``replaces``. Refused, it hands the slot's
        item back."""
        if replaces is None:
            condition = {"ConditionExpression": "attribute_not_exists(#k)", "ExpressionAttributeNames": {"#k": PARTITION_KEY}}
        else:
            condition = {
                "ConditionExpression": "#t = :t",
                "ExpressionAttributeNames": {"#t": "token"},
                "ExpressionAttributeValues": {":t": {"S": replaces}},
            }
        item = {"TableName": self.table, "Item": self.writes_item(entry), "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}
        return {"Put": {**item, **condition}}

    def adopt_part(self, entry: WritesEntry, token: str) -> dict[str, Any]:
        """A transaction's action naming this region (``site``) on the part of
        token ``token`` in ``entry``'s slot, if it is still there (see
        ``DynamoIndex.commit_writes``). Refused, it hands the slot's item back."""
        assert self.site is not None
        return {
            "Update": {
                "TableName": self.table,
                "Key": self.writes_key(entry),
                "UpdateExpression": "SET #s = :s",
                "ConditionExpression": "#t = :t",
                "ExpressionAttributeNames": {"#s": SITE, "#t": "token"},
                "ExpressionAttributeValues": {":s": {"S": self.site}, ":t": {"S": token}},
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    def foreign(self, item: dict[str, Any] | None) -> bool:
        """Whether a global table's writes item names another region than this one."""
        return self.site is not None and item is not None and (item.get(SITE) or {}).get("S") != self.site

    def transact(self, actions: list[dict[str, Any]]) -> Call:
        return _transaction(self, actions)

    def parse(self, raw: dict[str, Any]) -> IndexEntry | Link | None:
        """The entry an item describes; None for an item of another key prefix."""
        item = from_attrs(raw)
        try:
            thread_id = self.layout.thread_of(item[PARTITION_KEY])
            if thread_id is None:
                return None
            key = _keys.parse_sort_key(item[SORT_KEY])
            gen = item.get(GEN, 0)
            if key.kind in ("checkpoint", "link"):
                loc = {ch: as_ref(v) for ch, v in ormsgpack.unpackb(plain(item["loc"], f"loc of item {item[SORT_KEY]}")).items()}
                meta = ormsgpack.unpackb(item["meta"]) if "meta" in item else None
                entry = CheckpointEntry(
                    thread_id=thread_id,
                    ns=key.ns,
                    checkpoint_id=key.checkpoint_id,
                    parent_id=item.get("parent"),
                    loc=loc,  # type: ignore[arg-type]
                    body=item.get("body"),
                    metadata=(meta[0], bytes(meta[1])) if meta else None,
                    expires_at=item.get(TTL_ATTRIBUTE),
                    gen=gen,
                    run_id=item.get(RUN),
                    hidden=bool(item.get(HIDDEN)),
                    tag=item.get(TAG, ""),
                    chained=PARENT_WRITES in item,
                    parent_writes=_unpack_slots(item[PARENT_WRITES]) if PARENT_WRITES in item else None,
                    parent_gone=bool(item.get(PARENT_GONE)),
                )
                return entry if key.kind == "checkpoint" else Link(entry)
            if key.kind == "writes":
                return WritesEntry(
                    thread_id,
                    key.ns,
                    key.checkpoint_id,
                    key.task_id,
                    key.part,
                    item["token"],
                    item.get("body"),
                    gen,
                    item.get(TTL_ATTRIBUTE),
                    site=item.get(SITE),
                )
            ns = key.ns if key.kind == "ns_tombstone" else None
            dead = frozenset(item.get(DEAD_RUNS, ()))
            where = f"index item {item[PARTITION_KEY]!r}/{item[SORT_KEY]!r} in table {self.table}"
            archive = decode_ref(thread_id, item[ARCHIVE], where) if ARCHIVE in item else None
            return Tombstone(
                thread_id,
                ns,
                gen,
                item.get("deleted_at", 0),
                item.get(CREATED, 0),
                dead,
                archive,
                item.get(STALE_ARCHIVE),
                item.get(ARCHIVING),
                item.get(RESTORING),
                item.get(UNLISTING, 0),
                item.get(ACTIVE, 0),
                item.get(SINCE, 0),
                frozenset(item.get(STALE_RUNS, ())),
                (item[ACTIVE_TOKEN],) if ACTIVE_TOKEN in item else (),
                frozenset(item.get(GONE_KEYS, ())),
            )
        except (KeyError, IndexError, ValueError, TypeError, ormsgpack.MsgpackDecodeError) as exc:
            raise CorruptObjectError(
                f"index item {item.get(PARTITION_KEY)!r}/{item.get(SORT_KEY)!r} in table {self.table}: {exc}"
            ) from exc

    def key_of(self, thread_id: str, ns: str, checkpoint_id: str) -> dict[str, Any]:
        return to_attrs({PARTITION_KEY: self.pk(thread_id), SORT_KEY: _keys.checkpoint_sort_key(ns, checkpoint_id)})

    def tombstone_key(self, thread_id: str, ns: str | None = None) -> dict[str, Any]:
        sk = _keys.THREAD_TOMBSTONE_SK if ns is None else _keys.ns_tombstone_sort_key(ns)
        return to_attrs({PARTITION_KEY: self.pk(thread_id), SORT_KEY: sk})

    def hide(self, entry: CheckpointEntry) -> dict[str, Any]:
        """A transaction's action marking a checkpoint hidden (prune), if it is still there."""
        return {
            "Update": {
                "TableName": self.table,
                "Key": self.key_of(*entry.key),
                "UpdateExpression": "SET #h = :t",
                "ConditionExpression": "attribute_exists(#k)",
                "ExpressionAttributeNames": {"#h": HIDDEN, "#k": PARTITION_KEY},
                "ExpressionAttributeValues": {":t": {"BOOL": True}},
            }
        }

    def mark_parent_gone(self, entry: CheckpointEntry) -> list[dict[str, Any]]:
        """A transaction's actions marking, on a checkpoint's item and its link,
        that its parent leaves the history (prune, delete_for_runs): a replica
        that misses the parent then knows it for a removal, not a hole (an
        item not replicated yet). Only if the items are still there."""
        return [
            {
                "Update": {
                    "TableName": self.table,
                    "Key": key,
                    "UpdateExpression": "SET #g = :t",
                    "ConditionExpression": "attribute_exists(#k)",
                    "ExpressionAttributeNames": {"#g": PARENT_GONE, "#k": PARTITION_KEY},
                    "ExpressionAttributeValues": {":t": {"BOOL": True}},
                }
            }
            for key in (self.key_of(*entry.key), self.link_key(entry))
        ]

    def link_key(self, entry: CheckpointEntry) -> dict[str, Any]:
        return to_attrs({PARTITION_KEY: self.pk(entry.thread_id), SORT_KEY: _keys.link_sort_key(entry.ns, entry.checkpoint_id)})

    def writes_key(self, entry: WritesEntry) -> dict[str, Any]:
        sk = _keys.writes_sort_key(entry.ns, entry.checkpoint_id, entry.task_id, entry.part)
        return to_attrs({PARTITION_KEY: self.pk(entry.thread_id), SORT_KEY: sk})

    def get_checkpoint(self, thread_id: str, ns: str, checkpoint_id: str) -> Call:
        return self.get(self.key_of(thread_id, ns, checkpoint_id))

    def get_tombstone(self, thread_id: str, ns: str | None = None) -> Call:
        return self.get(self.tombstone_key(thread_id, ns))


def _pack_slots(slots: tuple[tuple[str, str], ...] | None) -> bytes:
    return ormsgpack.packb(None if slots is None else [list(s) for s in slots])


def _unpack_slots(raw: bytes) -> tuple[tuple[str, str], ...] | None:
    slots = ormsgpack.unpackb(raw)
    return None if slots is None else tuple((str(t), str(p)) for t, p in slots)


# -- a tombstone GetItem's answer --------------------------------------------------
# Both modules of DynamoIndex read these; they live here because lifecycle
# cannot import from dynamodb, which imports it.
def _thread_item(calls: DynamoCalls, found: dict[str, Any]) -> Tombstone:
    """The thread's tombstone item from a GetItem's answer (generation 0, not
    listed: there is none)."""
    entry = calls.parse(found["Item"]) if "Item" in found else None
    return entry if isinstance(entry, Tombstone) else Tombstone("", None, 0)


def _gen_of(calls: DynamoCalls, found: dict[str, Any]) -> int:
    """The generation of a tombstone GetItem's answer (0: no tombstone)."""
    return _thread_item(calls, found).gen


def _live_gen(calls: DynamoCalls, found: dict[str, Any], thread_id: str) -> int:
    """The generation of a namespace's tombstone GetItem's answer; raises Archived
    when it marks the namespace archived (readers go to the archive)."""
    return _live(_thread_item(calls, found), thread_id).gen


def _live(tomb: Tombstone, thread_id: str) -> Tombstone:
    if tomb.archive is not None:
        raise Archived(thread_id, tomb.archive)
    return tomb


def _listed_first(exc: BaseException) -> bool:
    """A listing transaction cancelled by its condition: another writer listed the thread."""
    if error_code(exc) != "TransactionCanceledException":
        return False
    reasons = [r.get("Code") for r in (getattr(exc, "response", {}) or {}).get("CancellationReasons", [])]
    return "ConditionalCheckFailed" in reasons and all(r in ("None", "ConditionalCheckFailed") for r in reasons)
