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

Writes, with no read before them: a put of an item that exists is one ``UpdateItem``
that keeps ``ca``/``seq`` and returns the old value (its value object, if any, is
deleted after), refused when the item is absent or expired; a put that creates an item
is one ``TransactWriteItems`` of a check that the namespace is registered (and not being
unregistered) and a conditional ``Put``. The process tries first the one its hint says
(a key it wrote or read: the overwrite); a wrong guess costs one more request. A delete
is one ``DeleteItem``; a refresh one ``UpdateItem`` fenced on the expiry read. DynamoDB
applies the writes of one item one at a time: the last wins, whole. A namespace is
registered (a conditional ``PutItem`` of its registry item) before its first item is
written, once per process, and again when a creation's check finds it unregistered.

Costs: a get 1 request (per key), a put 1 request (2 for the first put a process makes
into a namespace: the registration first; 2 when the hint guessed wrong), a search of a
namespace with no sub-namespaces 2 requests in one round trip (a Query of its partition
and one of the registry), a list_namespaces page 1 Query (per MB of registry).

A value over ``INLINE_LIMIT`` bytes (packed) lives in an S3 object of its own
(``memory/n/<node id>/@v/<token>``), written before the item that names it (within its
lease: ``memory_lease``) and deleted after the write that replaces it (the write returns
the old value's reference).

Removals (erase, the TTL sweep of an emptied namespace) unregister a namespace at once,
fenced by a mark on its registry item (``memory_removal``). Expired items are hidden
from reads, deleted by the sweep early, and by DynamoDB's TTL on ``expires_at`` anyway.

Not built yet: ``BatchGetItem`` for several keys, one transaction for a cold put.

The module holds reads and writes; the items and what they share are ``memory_items``'s,
removals ``memory_removal``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ormsgpack

from s3_saver._format.key_codec import new_token
from s3_saver._format.memory.documents import (
    ITEM_MARK,
    registry_partition,
)
from s3_saver._format.memory.names import registry_bounds, registry_key, show
from s3_saver._format.memory.rows import (
    ObjectRef,
    Row,
    value_from_wire,
    value_to_wire,
    vectors_to_wire,
)
from s3_saver._format.memory.ttl import epoch_seconds_up, expires_at
from s3_saver._index.dynamodb.memory_items import (
    _LIVE_BYTES,
    _MAX_TRIES,
    _cancelled,
    _key,
    _n,
    _subject,
)
from s3_saver._index.dynamodb.memory_collect import Collection
from s3_saver._index.dynamodb.memory_removal import Removals
from s3_saver._index.memory import Change, Path, Snapshot
from s3_saver._index.memory_lease import renewed
from s3_saver._transport.failures import CONDITION_FAILED_CODES, error_code
from s3_saver._transport.protocol import Call, Op, gather, raise_failure, request_one
from s3_saver.errors import CorruptObjectError, StoreUnavailableError

INLINE_LIMIT = 16 * 1024  # past ~8 KB an S3 PUT costs less than the item's write units

# A DynamoDB item holds 400 KB (names and values). The vectors are inline; beside them at
# most INLINE_LIMIT of value, a key of 1,000 bytes, a namespace of 1,024 and a few numbers.
# An item over the limit would be refused by DynamoDB (ValidationException) after its
# namespace was registered: the store refuses it first, before any request.
VECTOR_LIMIT = 400_000 - INLINE_LIMIT - 4 * 1024


class DynamoMemory(Collection, Removals):
    """``MemoryIndex`` on the saver's table (see the module docstring)."""

    inline_limit = INLINE_LIMIT
    vector_limit = VECTOR_LIMIT
    knows_leaves = False  # a search reads its registry range in its first round trip

    # -- reads and writes ---------------------------------------------------------------

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
        for path, found_rows in nodes.items():
            for key in found_rows:
                self._live.put((path, key), True, _LIVE_BYTES + len(key))
        found: dict[Path, int] = {}
        for items in answers[len(whole) + len(singles) :]:
            found.update(self._registry(items))
        return Snapshot(nodes, found)

    def commit(self, groups: dict[Path, list[Change]]) -> Op[list[str]]:
        new = [p for p, changes in groups.items() if any(c.value is not None for c in changes) and self._known.get(p) is None]
        if new:
            # Listed before readable: a namespace's registry item is written before its items.
            yield from gather(*(self._register(p) for p in new))
        # Each key appears once in a commit (``prepare`` keeps a key's last put; a refresh
        # is planned only for keys the batch does not write): every change goes in one wave.
        released = yield from gather(*(self._change(path, c) for path, changes in groups.items() for c in changes))
        return [key for keys in released for key in keys]

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
            self._live.pop((path, change.key))
            return self._released(path, answer, None)
        if change.stamps is not None:
            return (yield from self._restore_fenced(path, key, change))
        overwrite = (path, change.key) in self._live
        for _ in range(_MAX_TRIES):
            # The lease: never name a value object older than VALUE_LEASE (``memory_lease``).
            (change,) = yield from renewed(self.s3, self.value_key, self.clock, path, [change])
            now = self.clock.now()
            if overwrite:
                call = self._overwrite(path, key, change, now)
                (answer,) = yield (call,)
                if not isinstance(answer, BaseException):
                    self._live.put((path, change.key), True, _LIVE_BYTES + len(change.key))
                    return self._released(path, answer, change.value)
                if error_code(answer) not in CONDITION_FAILED_CODES:
                    raise_failure(call, answer)
                # No live item (absent, deleted or expired): create one.
            call = self._create(path, key, change, now)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                self._live.put((path, change.key), True, _LIVE_BYTES + len(change.key))
                return []
            registry, item = _cancelled(answer)
            if item:
                overwrite = True  # a live item is there: overwrite it (its created_at kept)
            elif registry:
                # Unregistered (an erase or a sweep) or being unregistered since this
                # process learned it: register again, then create.
                self._known.pop(path)
                yield from self._register(path)
                overwrite = False
            else:
                raise_failure(call, answer)
        raise StoreUnavailableError(
            f"put of key {show(change.key)} in namespace {show(path)} ({self.describe(path)}): the item kept changing "
            "(created, deleted, or its namespace unregistered) between the writes; try again"
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
                # Live: an overwrite keeps created_at. Never a creation: an item is created only
                # by ``_create``, whose transaction checks the namespace is registered (an
                # item written here after an erase or a sweep removed it would be unlisted).
                "ConditionExpression": "attribute_exists(#pk) AND (attribute_not_exists(#exu) OR #exu > :now)",
                "ExpressionAttributeNames": {**names, "#exu": "exu", "#pk": "pk"},
                "ExpressionAttributeValues": {**{f":{n}": v for n, v in values.items()}, ":now": _n(now)},
                # The old value: a value object it named is deleted after (never one unread).
                "ReturnValues": "UPDATED_OLD",
            },
            _subject(path, change.key),
        )

    def _create(self, path: Path, key: dict[str, Any], change: Change, now: int) -> Call:
        """A new item (over nothing, or an expired one), in a transaction with a check that
        the namespace is registered and no removal is under way: the invariant "every item
        is listed" holds against erases and sweeps (``_erase_items``, ``_sweep_empty``)
        without a read before the write. (A replaced expired item's value object, if it had
        one, is left behind, unnamed: a transaction returns no old values.)"""
        values, _ = self._attributes(path, change, now)
        item = {**key, **values, "ca": _n(now), "seq": _n(now)}
        actions = [
            {
                "ConditionCheck": {
                    "TableName": self.table,
                    "Key": _key(registry_partition(self.prefix), registry_key(path)),
                    "ConditionExpression": "attribute_exists(pk) AND attribute_not_exists(retiring)",
                }
            },
            {
                "Put": {
                    "TableName": self.table,
                    "Item": item,
                    "ConditionExpression": "attribute_not_exists(pk) OR exu <= :now",
                    "ExpressionAttributeValues": {":now": _n(now)},
                }
            },
        ]
        # A token of its own: sent again after a lost answer, it is applied once.
        params = {"TransactItems": actions, "ClientRequestToken": new_token()}
        return Call("dynamodb", "transact_write_items", params, self.where, _subject(path, change.key))

    def _restore_fenced(self, path: Path, key: dict[str, Any], change: Change) -> Op[list[str]]:
        """An imported item, written whole with its exported times (last writer wins, as a
        put: an import run again writes the same item), in a transaction with the check
        ``_create`` makes: the namespace is registered and no removal is under way (every
        item is listed, against an erase or a sweep racing the import). A transaction
        returns no old values: an item it replaces that had a value object of its own
        leaves that object behind (an import over a different version of a large item)."""
        for _ in range(_MAX_TRIES):
            (change,) = yield from renewed(self.s3, self.value_key, self.clock, path, [change])  # the lease, as a put's
            call = self._restore(path, key, change)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                self._live.put((path, change.key), True, _LIVE_BYTES + len(change.key))
                return []
            registry, _ = _cancelled(answer)
            if not registry:
                raise_failure(call, answer)
            self._known.pop(path)
            yield from self._register(path)
        raise StoreUnavailableError(
            f"import of key {show(change.key)} in namespace {show(path)} ({self.describe(path)}): its namespace kept "
            "being unregistered between the writes; try again"
        )

    def _restore(self, path: Path, key: dict[str, Any], change: Change) -> Call:
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
        actions = [
            {
                "ConditionCheck": {
                    "TableName": self.table,
                    "Key": _key(registry_partition(self.prefix), registry_key(path)),
                    "ConditionExpression": "attribute_exists(pk) AND attribute_not_exists(retiring)",
                }
            },
            {"Put": {"TableName": self.table, "Item": item}},
        ]
        # A token of its own: sent again after a lost answer, it is applied once.
        params = {"TransactItems": actions, "ClientRequestToken": new_token()}
        return Call("dynamodb", "transact_write_items", params, self.where, _subject(path, change.key))
