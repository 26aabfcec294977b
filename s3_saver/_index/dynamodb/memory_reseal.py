"""The encryption migration's rewrite of one item in the table (``Change.reseal``): its
value and vectors replaced by their encrypted form, fenced on the item as read.

One ``UpdateItem`` per item, conditioned on the item's update time and its packed value
being those the migration read (``ua`` moves and ``v`` changes with every put; a delete
removes the item): a put or a delete that landed since wins, and the rewrite never
creates an item (so it never brings a deleted one back). The item's times, expiry,
place and write token are left as they are: the item is the same version, encrypted.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import ormsgpack

from s3_saver._format.memory.documents import ITEM_MARK
from s3_saver._format.memory.names import node_id
from s3_saver._format.memory.rows import (
    ObjectRef,
    VectorsCell,
    value_to_wire,
    vectors_to_wire,
)
from s3_saver._index.dynamodb.memory_items import Items, _key, _n, _subject
from s3_saver._index.memory import Change, Path
from s3_saver._transport.failures import CONDITION_FAILED_CODES, error_code
from s3_saver._transport.protocol import Op, raise_failure


class Reseals(Items):
    """``Change.reseal`` and ``MemoryIndex.named_objects`` on the table (see the module
    docstring)."""

    def named_objects(self, path: Path) -> Op[frozenset[str]]:
        # The table holds the rows: the folder's only objects are value objects.
        tokens = yield from self.named_values(node_id(path))  # type: ignore[attr-defined]
        return frozenset(self.value_key(path, t) for t in tokens)

    def _reseal(self, path: Path, change: Change) -> Op[list[str]]:
        """Returns the value objects to delete: the item's old one when the rewrite
        landed, the rewrite's own when the item changed since it was read."""
        row = change.reseal
        assert row is not None and change.value is not None
        sets = {"v": {"B": ormsgpack.packb(value_to_wire(change.value))}}
        removed: list[str] = []
        if isinstance(change.vectors, VectorsCell):
            sets["vec"] = {"B": ormsgpack.packb(vectors_to_wire(change.vectors))}
        if isinstance(change.value, ObjectRef):
            sets["vo"] = {"S": change.value.token}
        elif isinstance(row.value, ObjectRef):
            removed.append("vo")
        expression = "SET " + ", ".join(f"#{n} = :{n}" for n in sets) + (" REMOVE " + ", ".join(f"#{n}" for n in removed) if removed else "")
        names = {f"#{n}": n for n in [*sets, *removed, "ua", "pk"]}
        call = self._call(
            "update_item",
            {
                "Key": _key(self._pk(path), ITEM_MARK + change.key),
                "UpdateExpression": expression,
                # The item as read (a put moves ``ua`` and writes ``v``; a delete removes it):
                # anything that landed since wins over the migration's copy.
                "ConditionExpression": "attribute_exists(#pk) AND #ua = :seen AND #v = :was",
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": {
                    **{f":{n}": v for n, v in sets.items()},
                    ":seen": _n(row.updated_us),
                    ":was": {"B": ormsgpack.packb(value_to_wire(row.value))},
                },
                "ReturnValues": "UPDATED_OLD",
            },
            _subject(path, change.key),
        )
        # Never sent again blindly: a copy of a landed rewrite would find its condition
        # false and release the object the item now names. A lost answer fails the call;
        # the migration run again reads the item and judges it.
        call = replace(call, idempotent=False)
        (answer,) = yield (call,)
        if isinstance(answer, BaseException):
            if error_code(answer) not in CONDITION_FAILED_CODES:
                raise_failure(call, answer)
            return [self.value_key(path, c.token) for c in (change.value, change.vectors) if isinstance(c, ObjectRef)]
        old: dict[str, Any] = answer.get("Attributes") or {}
        mine = change.value.token if isinstance(change.value, ObjectRef) else None
        tokens = [old.get("vo", {}).get("S")]
        return [self.value_key(path, t) for t in dict.fromkeys(tokens) if t and t != mine]
