"""The memory store's index in the saver's DynamoDB table (design decision D1: in this
mode the table is the store of record for memory items).

One item per memory item, ``pk = <P>#m/<node id>``, ``sk = "k" + key``, holding its
row's fields as attributes (``ns`` its namespace, checked on every read; ``seq`` and
``ca`` its creation time, kept by an overwrite; ``ua``; ``exu`` its exact expiry in
microseconds and ``expires_at`` the same in seconds, rounded up, for DynamoDB's TTL;
``ttl``; ``v`` the packed value; ``vec`` the packed vectors). One registry item per
namespace, ``pk = <P>#mreg``, ``sk`` = its registry key (so a Query returns namespaces
in Python's tuple order), with its path and its registration time (the namespace order
of a search).

Writes, with no read before them: a put is one ``UpdateItem`` that keeps ``ca``/``seq``
of a live item (``if_not_exists``) and is refused on an expired one (which a
conditional ``PutItem`` then replaces as a new item); a delete one ``DeleteItem``; a
refresh one ``UpdateItem`` fenced on the expiry read. DynamoDB applies the writes of
one item one at a time: the last wins, whole. A namespace is registered (a conditional
``PutItem`` of its registry item) before its first item is written, once per process.

Costs: a get 1 request (per key), a put 1 request (2 for the first put a process makes
into a namespace: the registration first), a search of a namespace with no
sub-namespaces 2 requests in one round trip (a Query of its partition and one of the
registry), a list_namespaces page 1 Query (per MB of registry).

A value over ``INLINE_LIMIT`` bytes (packed) lives in an S3 object of its own
(``memory/n/<node id>/@v/<token>``), written before the item that names it and deleted
after the write that replaces it (the write returns the old value's reference).

Not built yet: the registration's fresh/stale/cold paths and the removal of
registrations (sweep, erase, with their retire-and-wait protocol), ``BatchGetItem`` for several keys, one transaction for a cold put.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ormsgpack

from s3_saver._format.memory.documents import (
    ITEM_MARK,
    item_partition,
    registry_partition,
    value_key,
)
from s3_saver._format.memory.names import node_id, registry_bounds, registry_key, show
from s3_saver._format.memory.rows import (
    ObjectRef,
    Row,
    row_from_wire,
    value_from_wire,
    value_to_wire,
    vectors_to_wire,
)
from s3_saver._format.memory.ttl import Clock, epoch_seconds_up, expires_at
from s3_saver._index.memory import Change, Path, Snapshot
from s3_saver._transport.budget import Cache, CacheBudget
from s3_saver._transport.failures import CONDITION_FAILED_CODES, error_code
from s3_saver._transport.protocol import Call, Op, gather, raise_failure, request_one
from s3_saver.errors import CorruptObjectError, StoreUnavailableError, Where

INLINE_LIMIT = 16 * 1024  # past ~8 KB an S3 PUT costs less than the item's write units
# A DynamoDB item holds 400 KB (names and values). The vectors are inline; beside them at
# most INLINE_LIMIT of value, a key of 1,000 bytes, a namespace of 1,024 and a few numbers.
# An item over the limit would be refused by DynamoDB (ValidationException) after its
# namespace was registered: the store refuses it first, before any request.
VECTOR_LIMIT = 400_000 - INLINE_LIMIT - 4 * 1024
_MAX_TRIES = 10
_KNOWN_ENTRIES = 100_000  # namespaces this process registered or found registered
_KNOWN_BYTES = 160


class DynamoMemory:
    """``MemoryIndex`` on the saver's table (see the module docstring)."""

    inline_limit = INLINE_LIMIT
    vector_limit = VECTOR_LIMIT
    knows_leaves = False  # a search reads its registry range in its first round trip

    def __init__(self, table: str, prefix: str, where: Where | None, budget: CacheBudget, clock: Clock) -> None:
        self.table = table
        self.prefix = prefix
        self.where = where
        self.clock = clock
        # Registrations are never removed yet (no sweep, no erase): once known, known for good.
        self._known: Cache = budget.cache("mem-known", entries=_KNOWN_ENTRIES, fixed=True)

    def _call(self, operation: str, params: dict[str, Any], subject: str) -> Call:
        # The subject (namespace, key) is named in the call's errors: its pk is a hash.
        return Call("dynamodb", operation, {"TableName": self.table, **params}, self.where, subject)

    def _pk(self, path: Path) -> str:
        return item_partition(self.prefix, node_id(path))

    def describe(self, path: Path) -> str:
        return f"DynamoDB table {self.table!r}, partition {self._pk(path)!r}"

    def value_key(self, path: Path, token: str) -> str:
        return value_key(self.prefix, node_id(path), token)

    # -- reads -------------------------------------------------------------------------

    def read(self, whole: Sequence[Path], keys: Mapping[Path, Sequence[str]], registry: Sequence[Path] = ()) -> Op[Snapshot]:
        whole = list(dict.fromkeys(whole))
        singles = [(p, k) for p, ks in keys.items() if p not in whole for k in dict.fromkeys(ks)]
        ops: list[Op[Any]] = [self._query(self._pk(p), f"namespace {show(p)}") for p in whole]
        ops += [request_one(self._get(p, k)) for p, k in singles]
        # The registry range of each prefix (BETWEEN its bounds: only its namespaces are
        # read), or the whole partition when one prefix is ().
        ranges = [None] if () in registry else [registry_bounds(p) for p in dict.fromkeys(registry)]
        if registry:
            ops += [self._query(registry_partition(self.prefix), "the namespace registry", r) for r in ranges]
        answers = yield from gather(*ops)
        nodes: dict[Path, dict[str, Row]] = {p: {} for p in [*whole, *keys]}
        for path, items in zip(whole, answers):
            for item in items:
                row = self._row(path, item)
                nodes[path][row.key] = row
        for (path, _), answer in zip(singles, answers[len(whole) :]):
            if "Item" in answer:
                row = self._row(path, answer["Item"])
                nodes[path][row.key] = row
        found: dict[Path, int] = {}
        for items in answers[len(whole) + len(singles) :]:
            found.update(self._registry(items))
        return Snapshot(nodes, found)

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

    # -- writes ------------------------------------------------------------------------

    def commit(self, groups: dict[Path, list[Change]]) -> Op[list[str]]:
        new = [p for p, changes in groups.items() if any(c.value is not None for c in changes) and self._known.get(p) is None]
        if new:
            # Listed before readable: a namespace's registry item is written before its items.
            yield from gather(*(self._register(p) for p in new))
        # Each key appears once in a commit (``prepare`` keeps a key's last put; a refresh
        # is planned only for keys the batch does not write): every change goes in one wave.
        released = yield from gather(*(self._change(path, c) for path, changes in groups.items() for c in changes))
        return [key for keys in released for key in keys]

    def _register(self, path: Path) -> Op[None]:
        item = {
            **_key(registry_partition(self.prefix), registry_key(path)),
            "path": {"L": [{"S": label} for label in path]},
            "created": {"N": str(self.clock.now())},
        }
        call = self._call("put_item", {"Item": item, "ConditionExpression": "attribute_not_exists(pk)"}, f"registry of namespace {show(path)}")
        answer = yield (call,)
        if isinstance(answer[0], BaseException) and error_code(answer[0]) not in CONDITION_FAILED_CODES:
            raise_failure(call, answer[0])
        self._known.put(path, True, _KNOWN_BYTES)  # registered now, or before (by anyone)

    def _change(self, path: Path, change: Change) -> Op[list[str]]:
        """Returns the value object the item's replaced value named (in the old
        attributes the write itself returned: delete only what you read)."""
        key = _key(self._pk(path), ITEM_MARK + change.key)
        if change.refresh is not None:
            # Fenced on the expiry read: never revives a deleted item, never overrides a newer write's.
            seen, moved = change.refresh.seen_us, change.refresh.expires_us
            call = self._call(
                "update_item",
                {
                    "Key": key,
                    "UpdateExpression": "SET exu = :moved, expires_at = :s",
                    "ConditionExpression": "exu = :seen",
                    "ExpressionAttributeValues": {":moved": _n(moved), ":s": _n(epoch_seconds_up(moved)), ":seen": _n(seen)},
                    "ReturnValues": "UPDATED_NEW",
                },
                _subject(path, change.key),
            )
            (answer,) = yield (call,)
            if isinstance(answer, BaseException) and error_code(answer) not in CONDITION_FAILED_CODES:
                raise_failure(call, answer)
            return []
        if change.value is None:
            params = {"Key": key, "ReturnValues": "ALL_OLD"}
            answer = yield from request_one(self._call("delete_item", params, _subject(path, change.key)))
            return self._released(path, answer, None)
        if change.stamps is not None:
            answer = yield from request_one(self._restore(path, key, change))
            return self._released(path, answer, change.value)
        for _ in range(_MAX_TRIES):
            now = self.clock.now()
            call = self._overwrite(path, key, change, now)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                return self._released(path, answer, change.value)
            if error_code(answer) not in CONDITION_FAILED_CODES:
                raise_failure(call, answer)
            # The key holds an expired item: replace it by a new one (created now), unless
            # a live item came meanwhile (then overwrite that one: the loop again).
            call = self._create(path, key, change, now)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                return self._released(path, answer, change.value)
            if error_code(answer) not in CONDITION_FAILED_CODES:
                raise_failure(call, answer)
        raise StoreUnavailableError(
            f"put of key {show(change.key)} in namespace {show(path)} ({self.describe(path)}): the item kept expiring "
            "and coming back between the two writes; try again"
        )

    def _released(self, path: Path, answer: dict[str, Any], value: Any) -> list[str]:
        old = (answer.get("Attributes") or {}).get("v")
        if old is None or "B" not in old:
            return []
        try:
            cell = value_from_wire(ormsgpack.unpackb(old["B"]), self.describe(path))
        except (CorruptObjectError, ormsgpack.MsgpackDecodeError, ValueError):
            return []  # not one of ours to delete
        if isinstance(cell, ObjectRef) and not (isinstance(value, ObjectRef) and value.token == cell.token):
            return [self.value_key(path, cell.token)]
        return []

    def _attributes(self, path: Path, change: Change, now: int) -> tuple[dict[str, Any], list[str]]:
        """The attributes a put sets, and those it removes (an overwrite with no expiry or
        no vectors drops the old ones)."""
        assert change.value is not None
        values: dict[str, Any] = {
            "ns": {"L": [{"S": label} for label in path]},
            "ua": _n(now),
            "v": {"B": ormsgpack.packb(value_to_wire(change.value))},
        }
        removed: list[str] = []
        exu = expires_at(now, change.ttl_minutes)
        if exu is None:
            removed += ["exu", "expires_at", "ttl"]
        else:
            values.update(exu=_n(exu), expires_at=_n(epoch_seconds_up(exu)), ttl={"N": repr(float(change.ttl_minutes or 0))})
        if change.vectors is None:
            removed.append("vec")
        else:
            values["vec"] = {"B": ormsgpack.packb(vectors_to_wire(change.vectors))}
        return values, removed

    def _overwrite(self, path: Path, key: dict[str, Any], change: Change, now: int) -> Call:
        values, removed = self._attributes(path, change, now)
        names = {f"#{name}": name for name in [*values, *removed, "ca", "seq"]}
        sets = [f"#{name} = :{name}" for name in values]
        sets += ["#ca = if_not_exists(#ca, :now)", "#seq = if_not_exists(#seq, :now)"]
        expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(f"#{n}" for n in removed) if removed else "")
        return self._call(
            "update_item",
            {
                "Key": key,
                "UpdateExpression": expression,
                # Absent, or live: an overwrite keeps created_at; an expired item is not overwritten.
                "ConditionExpression": "attribute_not_exists(#exu) OR #exu > :now",
                "ExpressionAttributeNames": {**names, "#exu": "exu"},
                "ExpressionAttributeValues": {**{f":{n}": v for n, v in values.items()}, ":now": _n(now)},
                # The old value: a value object it named is deleted after (never one unread).
                "ReturnValues": "UPDATED_OLD",
            },
            _subject(path, change.key),
        )

    def _create(self, path: Path, key: dict[str, Any], change: Change, now: int) -> Call:
        values, _ = self._attributes(path, change, now)
        item = {**key, **values, "ca": _n(now), "seq": _n(now)}
        return self._call(
            "put_item",
            {
                "Item": item,
                "ConditionExpression": "attribute_not_exists(pk) OR exu <= :now",
                "ExpressionAttributeValues": {":now": _n(now)},
                "ReturnValues": "ALL_OLD",
            },
            _subject(path, change.key),
        )

    def _restore(self, path: Path, key: dict[str, Any], change: Change) -> Call:
        """An imported item, written whole with its exported times (last writer wins, as a
        put: an import run again writes the same item)."""
        assert change.value is not None and change.stamps is not None
        created, updated, expires = change.stamps
        item = {
            **key,
            "ns": {"L": [{"S": label} for label in path]},
            "v": {"B": ormsgpack.packb(value_to_wire(change.value))},
            "ca": _n(created),
            "seq": _n(created),  # the creation time orders items in this mode (as ``_create``)
            "ua": _n(updated),
        }
        if expires is not None:
            item.update(exu=_n(expires), expires_at=_n(epoch_seconds_up(expires)))
        if change.ttl_minutes is not None:
            item["ttl"] = {"N": repr(float(change.ttl_minutes))}
        if change.vectors is not None:
            item["vec"] = {"B": ormsgpack.packb(vectors_to_wire(change.vectors))}
        return self._call("put_item", {"Item": item, "ReturnValues": "ALL_OLD"}, _subject(path, change.key))


def _subject(path: Path, key: str) -> str:
    return f"namespace {show(path)}, key {show(key)}"


def _key(pk: str, sk: str) -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def _n(value: int) -> dict[str, str]:
    return {"N": str(value)}
