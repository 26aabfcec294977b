"""The memory index in the saver's table (DynamoDB mode): its items and registry, read
and queried, a namespace's registration, and what the index's writes and removals share
(``memory`` and ``memory_removal`` build on it)."""

from __future__ import annotations

from typing import Any

import ormsgpack

from s3_saver._format.memory.documents import (
    ITEM_MARK,
    item_partition,
    registry_partition,
    value_key,
)
from s3_saver._format.memory.names import node_id, registry_key, show
from s3_saver._format.memory.rows import (
    Row,
    row_from_wire,
)
from s3_saver._format.memory.ttl import Clock
from s3_saver._index.memory import Path
from s3_saver._transport.budget import Cache, CacheBudget
from s3_saver._transport.failures import CONDITION_FAILED_CODES, error_code
from s3_saver._transport.protocol import Call, Op, raise_failure, request_one
from s3_saver._transport.s3 import S3Calls
from s3_saver.errors import CorruptObjectError, Where

_MAX_TRIES = 10
_KNOWN_ENTRIES = 100_000  # namespaces this process registered or found registered
_KNOWN_BYTES = 160
_LIVE_BYTES = 120


def _done(call: Call, answer: Any) -> bool:
    """A conditional write's answer: True if applied, False if its condition failed;
    any other failure is raised."""
    if not isinstance(answer, BaseException):
        return True
    if error_code(answer) not in CONDITION_FAILED_CODES:
        raise_failure(call, answer)
    return False


def _cancelled(answer: BaseException) -> tuple[bool, bool]:
    """A creation's transaction refused by its conditions: (the registration check failed,
    the item's condition failed). Neither: another failure."""
    if error_code(answer) != "TransactionCanceledException":
        return False, False
    reasons = [r.get("Code") or "None" for r in (getattr(answer, "response", None) or {}).get("CancellationReasons") or []]
    if len(reasons) != 2 or not set(reasons) <= {"None", "ConditionalCheckFailed"}:
        return False, False
    return reasons[0] == "ConditionalCheckFailed", reasons[1] == "ConditionalCheckFailed"


def _subject(path: Path, key: str) -> str:
    return f"namespace {show(path)}, key {show(key)}"


def _key(pk: str, sk: str) -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def _n(value: int) -> dict[str, str]:
    return {"N": str(value)}


class Items:
    """The table, the prefix, the registrations known, and how an item answered becomes
    a row or a registry entry (see the module docstring)."""

    def __init__(self, table: str, prefix: str, where: Where | None, budget: CacheBudget, clock: Clock, s3: S3Calls) -> None:
        self.table = table
        self.prefix = prefix
        self.s3 = s3  # the bucket of the value objects (a value over INLINE_LIMIT): copied when a lease runs out
        self.where = where
        self.clock = clock
        # Namespaces this process registered or found registered: a hint that saves the
        # registration's write. An erase or a sweep may unregister one since: every write
        # that creates an item checks the registration in its transaction (``_create``),
        # so a stale hint costs a failed transaction and a registration, never an item
        # of an unlisted namespace.
        self._known: Cache = budget.cache("mem-known", entries=_KNOWN_ENTRIES, fixed=True)
        # Items this process wrote or read (a hint): a put of one tries the overwrite
        # first (1 request: an UpdateItem that returns the old value), of any other key
        # the creation (1 request: a transaction). A wrong guess costs one more request.
        self._live: Cache = budget.cache("mem-live")

    def _call(self, operation: str, params: dict[str, Any], subject: str) -> Call:
        # The subject (namespace, key) is named in the call's errors: its pk is a hash.
        return Call("dynamodb", operation, {"TableName": self.table, **params}, self.where, subject)

    def _pk(self, path: Path) -> str:
        return item_partition(self.prefix, node_id(path))

    def describe(self, path: Path) -> str:
        return f"DynamoDB table {self.table!r}, partition {self._pk(path)!r}"

    def value_key(self, path: Path, token: str) -> str:
        return value_key(self.prefix, node_id(path), token)

    def _get(self, path: Path, key: str) -> Call:
        key_of = _key(self._pk(path), ITEM_MARK + key)
        return self._call("get_item", {"Key": key_of, "ConsistentRead": True}, _subject(path, key))

    def _query(self, pk: str, subject: str, between: tuple[str, str] | None = None) -> Op[list[dict[str, Any]]]:
        items: list[dict[str, Any]] = []
        start: dict[str, Any] | None = None
        while True:
            params: dict[str, Any] = {
                "KeyConditionExpression": "pk = :pk",
                "ExpressionAttributeValues": {":pk": {"S": pk}},
                "ConsistentRead": True,
            }
            if between is not None:
                params["KeyConditionExpression"] += " AND sk BETWEEN :lo AND :hi"
                params["ExpressionAttributeValues"].update({":lo": {"S": between[0]}, ":hi": {"S": between[1]}})
            if start is not None:
                params["ExclusiveStartKey"] = start
            page = yield from request_one(self._call("query", params, subject))
            items += page["Items"]
            start = page.get("LastEvaluatedKey")
            if not start:
                return items

    def _row(self, path: Path, item: dict[str, Any]) -> Row:
        where = f"{self.describe(path)}, namespace {show(path)}"
        try:
            stored = tuple(label["S"] for label in item["ns"]["L"])
            sk = item["sk"]["S"]
            value = ormsgpack.unpackb(item["v"]["B"])
            vectors = ormsgpack.unpackb(item["vec"]["B"]) if "vec" in item else None
            fields = [
                sk[len(ITEM_MARK) :],
                int(item["seq"]["N"]),
                int(item["ca"]["N"]),
                int(item["ua"]["N"]),
                int(item["exu"]["N"]) if "exu" in item else None,
                float(item["ttl"]["N"]) if "ttl" in item else None,
                0,
                value,
                vectors,
            ]
        except (KeyError, TypeError, ValueError, ormsgpack.MsgpackDecodeError) as exc:
            raise CorruptObjectError(f"{where}: not a memory item ({type(exc).__name__}: {exc})") from exc
        if stored != path or not sk.startswith(ITEM_MARK):
            raise CorruptObjectError(f"{where}: the item {sk!r} is namespace {show(stored)}'s, not the one asked for")
        return row_from_wire(fields, where)

    def _registry(self, items: list[dict[str, Any]]) -> dict[Path, int]:
        found: dict[Path, int] = {}
        for item in items:
            try:
                path = tuple(label["S"] for label in item["path"]["L"])
                created = int(item["created"]["N"])
                sk = item["sk"]["S"]
            except (KeyError, TypeError, ValueError) as exc:
                raise CorruptObjectError(f"DynamoDB table {self.table!r}: not a namespace registry item: {exc}") from exc
            if registry_key(path) != sk:
                raise CorruptObjectError(f"DynamoDB table {self.table!r}: registry item {sk!r} holds namespace {show(path)}")
            found[path] = created
        return found

    def _register(self, path: Path) -> Op[None]:
        item = {
            **_key(registry_partition(self.prefix), registry_key(path)),
            "path": {"L": [{"S": label} for label in path]},
            "created": {"N": str(self.clock.now())},
        }
        # Written when absent, or over a removal under way (``retiring``), which then fails.
        condition = "attribute_not_exists(pk) OR attribute_exists(retiring)"
        call = self._call("put_item", {"Item": item, "ConditionExpression": condition}, f"registry of namespace {show(path)}")
        answer = yield (call,)
        if isinstance(answer[0], BaseException) and error_code(answer[0]) not in CONDITION_FAILED_CODES:
            raise_failure(call, answer[0])
        self._known.put(path, True, _KNOWN_BYTES)  # registered now, or before (by anyone)
