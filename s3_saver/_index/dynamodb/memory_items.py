"""The memory index in the saver's table (DynamoDB mode): its items and registry, read
and queried, a namespace's registration, and what the index's writes and removals share
(``memory`` and ``memory_removal`` build on it)."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import ormsgpack

from s3_saver._format.key_codec import new_token
from s3_saver._format.memory.documents import (
    ITEM_MARK,
    gone_partition,
    item_partition,
    registry_partition,
    value_key,
)
from s3_saver._format.memory.names import node_id, registry_key, show
from s3_saver._format.memory.rows import (
    ObjectRef,
    Row,
    row_from_wire,
    value_to_wire,
    vectors_to_wire,
)
from s3_saver._format.memory.ttl import Clock, epoch_seconds_up, expires_at
from s3_saver._index.memory import Change, KeyFenced, Path
from s3_saver._transport.budget import Cache, CacheBudget
from s3_saver._transport.failures import CONDITION_FAILED_CODES, error_code
from s3_saver._transport.protocol import Backoff, Call, Op, backoff, raise_failure, request_one
from s3_saver._transport.s3 import S3Calls
from s3_saver.errors import CorruptObjectError, Where

_MAX_TRIES = 10
_MAX_CONFLICTS = 10  # a registration's transaction cancelled by conflicts, sent again
_JITTER = random.SystemRandom()  # never the random module's shared state
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


def _conflicted(answer: BaseException) -> bool:
    """A transaction cancelled by a conflict with another write on its items, and by
    nothing else (throttling is the retry policy's, a condition the caller's)."""
    if error_code(answer) != "TransactionCanceledException":
        return False
    reasons = {r.get("Code") or "None" for r in (getattr(answer, "response", None) or {}).get("CancellationReasons") or []}
    return "TransactionConflict" in reasons and reasons <= {"None", "TransactionConflict"}


def _sealed_elsewhere(item: dict[str, Any] | None, kid: str, now: int) -> bool:
    """Whether ``item`` (as read) is live and sealed under another key than ``kid``.

    A put's overwrite refused (the item is not live, or under another key) and its
    creation refused too (a live item is there): with a registry item that names a key,
    the creation's check would have refused a stale key first. One that names none
    (written before the fence, or by a process without encryption) lets it through, and
    overwrite and creation would refuse each other until the tries ran out
    (``StoreUnavailableError``). A key not the writer's is its stale one: it reads the key
    record and seals again (``KeyFenced``), as a refused creation's writer does."""
    if not item or ("exu" in item and int(item["exu"]["N"]) <= now):
        return False
    other = item.get("kid", {}).get("S")
    return other is not None and other != kid


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
        self.s3 = s3  # the value objects' bucket (copies, after a lost answer or a lease run out)
        self.prefix = prefix
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

    def _register(self, path: Path, kid: str | None = None) -> Op[None]:
        """``kid`` (encryption): the key the registering put is sealed under, recorded
        for every creation in the namespace to check (``_fenced``). Raises ``KeyFenced``
        when an erase destroyed that key."""
        item = {
            **_key(registry_partition(self.prefix), registry_key(path)),
            "path": {"L": [{"S": label} for label in path]},
            "created": {"N": str(self.clock.now())},
        }
        # Written when absent, or over a removal under way (``retiring``), which then fails.
        condition = "attribute_not_exists(pk) OR attribute_exists(retiring)"
        params: dict[str, Any] = {"Item": item, "ConditionExpression": condition}
        subject = f"registry of namespace {show(path)}"
        if kid is None:
            call = self._call("put_item", params, subject)
            (answer,) = yield (call,)
            _done(call, answer)
            self._known.put(path, True, _KNOWN_BYTES)  # registered now, or before (by anyone)
            return
        item["kid"] = {"S": kid}
        # Never over an erase's mark naming this key as destroyed (``gone``: a process
        # that cached it before the erase): refused, the creation's check refuses the put,
        # and the writer reads the key again.
        params["ConditionExpression"] = "attribute_not_exists(pk) OR (attribute_exists(retiring) AND NOT contains(gone, :kid))"
        params["ExpressionAttributeValues"] = {":kid": {"S": kid}}
        # Invariant (``MemoryIndex.commit``): a registration never carries a key an erase
        # destroyed. The mark above holds the ids only while the erase runs: a whole erase
        # deletes the registry item, and a process that read the key before it (and never
        # registered the namespace itself, so no creation of its finds the item gone)
        # would register afresh with the destroyed id and commit under it: lost. So the
        # registration is a transaction with a check of what the erase leaves for good,
        # the namespace's destroyed ids (``gone_partition``, written before the registry
        # item goes): one request still, on a process's first put into a namespace only.
        check = {
            "ConditionCheck": {
                "TableName": self.table,
                "Key": _key(gone_partition(self.prefix), node_id(path)),
                "ConditionExpression": "attribute_not_exists(pk) OR NOT contains(gone, :kid)",
                "ExpressionAttributeValues": {":kid": {"S": kid}},
            }
        }
        put = {"Put": {"TableName": self.table, **params}}
        for attempt in range(1, _MAX_CONFLICTS + 1):
            # A new token each time: a cancelled transaction is not applied, and its
            # token would answer a changed retry with IdempotentParameterMismatch.
            items = {"TransactItems": [check, put], "ClientRequestToken": new_token()}
            call = Call("dynamodb", "transact_write_items", items, self.where, subject)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                break
            destroyed, registered = _cancelled(answer)
            if destroyed:
                raise KeyFenced([path], self.describe(path))
            if registered:
                break
            # Cancelled by a conflict: an erase's write of the destroyed ids (or another
            # registration) on one of its items at that moment. Not applied: sent again,
            # after a pause, within the retry policy's budget and deadline (Backoff).
            if not _conflicted(answer) or (yield Backoff(_JITTER.uniform(0, backoff(attempt)), attempt)) is False:
                raise_failure(call, answer)
        else:
            raise_failure(call, answer)
        self._known.put(path, True, _KNOWN_BYTES)  # registered now, or before (by anyone)

    # -- the calls of a put ---------------------------------------------------------------
    # Every item a put writes carries ``wt`` (the write's token: how a write whose answer
    # was lost recognises its own item) and ``vo`` (its value object's token, when its
    # value lives in one); an overwrite also records ``pv``, the ``vo`` of the item it
    # replaced (read by DynamoDB, as every operand, before the update), so that the
    # writer, its judge after a lost answer, or the next writer releases that object.

    def _attributes(self, path: Path, change: Change, now: int, token: str) -> tuple[dict[str, Any], list[str]]:
        """The attributes a put sets, and those it removes (an overwrite with no expiry, no
        vectors or no value object drops the old ones)."""
        assert change.value is not None
        values: dict[str, Any] = {
            "ns": {"L": [{"S": label} for label in path]},
            "ua": _n(now),
            "v": {"B": ormsgpack.packb(value_to_wire(change.value))},
            "wt": {"S": token},
        }
        removed: list[str] = []
        exu = expires_at(now, change.ttl_minutes)
        if exu is None:
            removed += ["exu", "expires_at", "ttl"]
        else:
            values.update(exu=_n(exu), expires_at=_n(epoch_seconds_up(exu)), ttl={"N": repr(float(change.ttl_minutes or 0))})
        _vectors_and_object(change, values, removed)
        if change.sealed_with is not None:
            # The key its value is sealed under: an overwrite by a process that cached an
            # older life's key is refused on it (``_overwrite``).
            values["kid"] = {"S": change.sealed_with}
        return values, removed

    def _overwrite(self, path: Path, key: dict[str, Any], change: Change, now: int, token: str) -> Call:
        values, removed = self._attributes(path, change, now, token)
        sets = [f"#{name} = :{name}" for name in values]
        sets += ["#ca = if_not_exists(#ca, :now)", "#seq = if_not_exists(#seq, :now)", "#pv = if_not_exists(#vo, :nil)"]
        expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(f"#{n}" for n in removed) if removed else "")
        names = {f"#{name}": name for name in [*values, *removed, "ca", "seq", "pv", "vo", "exu", "pk"]}
        condition = "attribute_exists(#pk) AND (attribute_not_exists(#exu) OR #exu > :now)"
        if change.sealed_with is not None:
            # Invariant (``MemoryIndex.commit``): never over an item of another key's life
            # (the namespace erased and written anew since this process cached its key).
            condition += " AND (attribute_not_exists(#kid) OR #kid = :kid)"
        call = self._call(
            "update_item",
            {
                "Key": key,
                "UpdateExpression": expression,
                # Live: an overwrite keeps created_at. Never a creation: an item is created only
                # by ``_create``, whose transaction checks the namespace is registered (an
                # item written here after an erase or a sweep removed it would be unlisted).
                "ConditionExpression": condition,
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": {**{f":{n}": v for n, v in values.items()}, ":now": _n(now), ":nil": {"S": ""}},
                # The old value, its object and the one it had replaced: deleted after (never one unread).
                "ReturnValues": "UPDATED_OLD",
            },
            _subject(path, change.key),
        )
        # Judged by ``DynamoMemory._put`` after a lost answer, never sent again as is.
        return replace(call, idempotent=False)

    def _create(self, path: Path, key: dict[str, Any], change: Change, now: int, token: str) -> Call:
        """A new item (over nothing, or an expired one), in a transaction with a check that
        the namespace is registered and no removal is under way: the invariant "every item
        is listed" holds against erases and sweeps (``_erase_items``, ``_sweep_empty``)
        without a read before the write. (A replaced expired item's value object, if it had
        one, is left behind, unnamed: a transaction returns no old values.)"""
        values, _ = self._attributes(path, change, now, token)
        item = {**key, **values, "ca": _n(now), "seq": _n(now)}
        put = {"Put": {"TableName": self.table, "Item": item, "ConditionExpression": "attribute_not_exists(pk) OR exu <= :now", "ExpressionAttributeValues": {":now": _n(now)}}}
        return self._fenced(path, change.key, put, change.sealed_with)

    def _restore(self, path: Path, key: dict[str, Any], change: Change, token: str) -> Call:
        """An imported item, written whole with its exported times."""
        assert change.value is not None and change.stamps is not None
        created, updated, expires = change.stamps
        item = {
            **key,
            "ns": {"L": [{"S": label} for label in path]},
            "v": {"B": ormsgpack.packb(value_to_wire(change.value))},
            "ca": _n(created),
            "seq": _n(created),  # the creation time orders items in this mode (as ``_create``)
            "ua": _n(updated),
            "wt": {"S": token},
        }
        if expires is not None:
            item.update(exu=_n(expires), expires_at=_n(epoch_seconds_up(expires)))
        if change.ttl_minutes is not None:
            item["ttl"] = {"N": repr(float(change.ttl_minutes))}
        _vectors_and_object(change, item, [])
        if change.sealed_with is not None:
            item["kid"] = {"S": change.sealed_with}
        return self._fenced(path, change.key, {"Put": {"TableName": self.table, "Item": item}}, change.sealed_with)

    def _fenced(self, path: Path, name: str, put: dict[str, Any], kid: str | None = None) -> Call:
        """``put`` in a transaction with the check that the namespace is registered and no
        removal is under way (``memory_removal``); ``kid`` (encryption): and registered
        under that key (its registration's, ``_register``), not an earlier life's."""
        check: dict[str, Any] = {
            "ConditionCheck": {
                "TableName": self.table,
                "Key": _key(registry_partition(self.prefix), registry_key(path)),
                "ConditionExpression": "attribute_exists(pk) AND attribute_not_exists(retiring)",
            }
        }
        if kid is not None:
            check["ConditionCheck"]["ConditionExpression"] += " AND (attribute_not_exists(kid) OR kid = :kid)"
            check["ConditionCheck"]["ExpressionAttributeValues"] = {":kid": {"S": kid}}
        # A token of its own: sent again after a lost answer, DynamoDB applies it once.
        params = {"TransactItems": [check, put], "ClientRequestToken": new_token()}
        return Call("dynamodb", "transact_write_items", params, self.where, _subject(path, name))


def _vectors_and_object(change: Change, values: dict[str, Any], removed: list[str]) -> None:
    """Adds to ``values`` (or ``removed``) the packed vectors and the value object's token."""
    if change.vectors is None:
        removed.append("vec")
    else:
        values["vec"] = {"B": ormsgpack.packb(vectors_to_wire(change.vectors))}
    if isinstance(change.value, ObjectRef):
        values["vo"] = {"S": change.value.token}
    else:
        removed.append("vo")
