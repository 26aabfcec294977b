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
(``memory/n/<node id>/@v/<token>``), written before the item that names it and deleted
after the write that replaces it (the write returns the old value's reference).

Removals (erase, the TTL sweep of an emptied namespace) unregister a namespace at once,
fenced by a mark on its registry item (see "removals" below). Expired items are hidden
from reads, deleted by the sweep early, and by DynamoDB's TTL on ``expires_at`` anyway.

Not built yet: ``BatchGetItem`` for several keys, one transaction for a cold put.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ormsgpack

from s3_saver._format.key_codec import new_token
from s3_saver._format.memory.documents import (
    ITEM_MARK,
    item_partition,
    node_folder,
    registry_partition,
    sweep_partition,
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
from s3_saver._format.memory.ttl import Clock, epoch_seconds_up, expires_at, is_expired
from s3_saver._index.memory import Change, Erasure, Path, Purge, Snapshot, Swept
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
_LIVE_BYTES = 120


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
        for path, found_rows in nodes.items():
            for key in found_rows:
                self._live.put((path, key), True, _LIVE_BYTES + len(key))
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
        # Written when absent, or over a removal under way (``retiring``), which then fails.
        condition = "attribute_not_exists(pk) OR attribute_exists(retiring)"
        call = self._call("put_item", {"Item": item, "ConditionExpression": condition}, f"registry of namespace {show(path)}")
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
            self._live.pop((path, change.key))
            return self._released(path, answer, None)
        if change.stamps is not None:
            return (yield from self._restore_fenced(path, key, change))
        overwrite = (path, change.key) in self._live
        for _ in range(_MAX_TRIES):
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

    # -- removals (erase, sweep) ------------------------------------------------------
    #
    # A removal unregisters a namespace without waiting: it marks its registry item
    # ``retiring`` with a token of its own, removes the items, then deletes the registry
    # item only if the mark is still its own. Every write that creates an item is a
    # transaction that checks the registry item is there and not retiring (``_create``),
    # and a registration overwrites the mark; an overwrite needs a live item. So an item
    # written after the mark makes its writer register again (the removal then fails to
    # delete the registry item: the namespace stays listed), and an item written before
    # it is seen by the removal's Query (erase: deleted; sweep: the namespace kept).

    def node_folder(self, path: Path) -> str:
        return node_folder(self.prefix, node_id(path))

    def erase_rows(self, prefix: Path, purge: Purge) -> Op[Erasure]:
        entries = yield from self._query(registry_partition(self.prefix), "the namespace registry", registry_bounds(prefix) if prefix else None)
        paths = sorted(self._registry(entries))
        token = new_token()
        marked = yield from self._retire(paths, token, fresh=False)
        counts = yield from gather(*(self._erase_items(p, purge) for p in marked))
        return Erasure(tuple(marked), tuple(marked), sum(counts), token, ())

    def erase_registrations(self, erasure: Erasure) -> Op[list[Path]]:
        deleted = yield from self._unretire(list(erasure.namespaces), erasure.fence, delete=True)
        return [p for p in erasure.namespaces if p not in deleted]

    def sweep(self, limit: int, now: int, purge: Purge) -> Op[Swept]:
        cursor_key = _key(sweep_partition(self.prefix), "cursor")
        found = yield from request_one(self._call("get_item", {"Key": cursor_key, "ConsistentRead": True}, "the TTL sweep's cursor"))
        cursor = str(found.get("Item", {}).get("at", {}).get("S", ""))
        params: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk" + (" AND sk > :c" if cursor else ""),
            "ExpressionAttributeValues": {":pk": {"S": registry_partition(self.prefix)}, **({":c": {"S": cursor}} if cursor else {})},
            "ConsistentRead": True,
            "Limit": limit,
        }
        page = yield from request_one(self._call("query", params, "the namespace registry"))
        paths = sorted(self._registry(page["Items"]))
        results = yield from gather(*(self._sweep_items(p, now, purge) for p in paths))
        empty = [p for p, (_, none_live) in zip(paths, results) if none_live]
        unregistered: list[Path] = []
        if empty:
            token = new_token()
            retired = yield from self._retire(empty, token, fresh=True)
            # Items created before the mark landed are seen now: those namespaces stay.
            again = yield from gather(*(self._query(self._pk(p), f"namespace {show(p)} (TTL sweep)") for p in retired))
            now_again = self.clock.now()
            emptied = [p for p, items in zip(retired, again) if not any(self._live_at(p, i, now_again) for i in items)]
            unregistered = yield from self._unretire(emptied, token, delete=True)
            yield from self._unretire([p for p in retired if p not in emptied], token, delete=False)
        following = page["Items"][-1]["sk"]["S"] if page.get("LastEvaluatedKey") and page["Items"] else ""
        if following != cursor:
            item = {**cursor_key, "at": {"S": following}}
            yield from request_one(self._call("put_item", {"Item": item}, "the TTL sweep's cursor"))
        return Swept(sum(n for n, _ in results), len(paths), tuple(unregistered))

    def _retire(self, paths: list[Path], token: str, *, fresh: bool) -> Op[list[Path]]:
        """Mark the registry items of ``paths`` retiring with ``token`` (``fresh``: only
        those no other removal marked); returns the paths marked (the others are gone,
        or marked by another removal)."""
        condition = "attribute_exists(pk)" + (" AND attribute_not_exists(retiring)" if fresh else "")
        calls = tuple(
            self._call(
                "update_item",
                {
                    "Key": _key(registry_partition(self.prefix), registry_key(p)),
                    "UpdateExpression": "SET retiring = :t",
                    "ConditionExpression": condition,
                    "ExpressionAttributeValues": {":t": {"S": token}},
                },
                f"registry of namespace {show(p)}",
            )
            for p in paths
        )
        answers = yield calls
        return [p for p, call, answer in zip(paths, calls, answers) if _done(call, answer)]

    def _unretire(self, paths: list[Path], token: str, *, delete: bool) -> Op[list[Path]]:
        """Delete the registry items of ``paths`` (or take their mark off) if their mark is
        still ``token``; returns the paths done (the others were registered again)."""
        if not paths:
            return []
        calls = []
        for p in paths:
            params: dict[str, Any] = {
                "Key": _key(registry_partition(self.prefix), registry_key(p)),
                "ConditionExpression": "retiring = :t",
                "ExpressionAttributeValues": {":t": {"S": token}},
            }
            if not delete:
                params["UpdateExpression"] = "REMOVE retiring"
            calls.append(self._call("delete_item" if delete else "update_item", params, f"registry of namespace {show(p)}"))
        answers = yield tuple(calls)
        done = [p for p, call, answer in zip(paths, calls, answers) if _done(call, answer)]
        if delete:
            for p in done:
                self._known.pop(p)
        return done

    def _live_at(self, path: Path, item: dict[str, Any], now: int) -> bool:
        return not is_expired(self._row(path, item).expires_us, now)

    def _erase_items(self, path: Path, purge: Purge) -> Op[int]:
        """Delete every item of ``path``: their value objects first (a call cut short and
        made again finds them named), then each item as read (``ua``: delete only what
        you read); an item written meanwhile is read again and deleted too."""
        subject = f"namespace {show(path)} (erase)"
        items = yield from self._query(self._pk(path), subject)
        count = 0
        for _ in range(_MAX_TRIES):
            if not items:
                return count
            rows = [self._row(path, i) for i in items]
            named = [self.value_key(path, r.value.token) for r in rows if isinstance(r.value, ObjectRef)]
            if named:
                yield from purge(named)
            calls = tuple(
                self._call(
                    "delete_item",
                    {
                        "Key": _key(self._pk(path), i["sk"]["S"]),
                        "ConditionExpression": "ua = :ua",
                        "ExpressionAttributeValues": {":ua": i["ua"]},
                    },
                    _subject(path, r.key),
                )
                for i, r in zip(items, rows)
            )
            answers = yield calls
            changed = [i for i, call, answer in zip(items, calls, answers) if not _done(call, answer)]
            count += len(items) - len(changed)
            for r in rows:
                self._live.pop((path, r.key))
            if not changed:
                return count
            again = yield tuple(self._call("get_item", {"Key": _key(self._pk(path), i["sk"]["S"]), "ConsistentRead": True}, subject) for i in changed)
            items = []
            for call, answer in zip(changed, again):
                if isinstance(answer, BaseException):
                    raise_failure(self._call("get_item", {"Key": _key(self._pk(path), call["sk"]["S"])}, subject), answer)
                if "Item" in answer:
                    items.append(answer["Item"])
        raise StoreUnavailableError(
            f"namespace {show(path)} ({self.describe(path)}): its items kept being written while being erased; "
            "run the erase again"
        )

    def _sweep_items(self, path: Path, now: int, purge: Purge) -> Op[tuple[int, bool]]:
        """Delete the items of ``path`` expired at ``now`` (their value objects first: no
        read returns an expired item), each only if its expiry is still the one read (a put
        since made it live again). Returns the items deleted and whether none was live."""
        subject = f"namespace {show(path)} (TTL sweep)"
        items = yield from self._query(self._pk(path), subject)
        rows = [self._row(path, i) for i in items]
        expired = [(i, r) for i, r in zip(items, rows) if is_expired(r.expires_us, now)]
        if not expired:
            return 0, not rows
        named = [self.value_key(path, r.value.token) for _, r in expired if isinstance(r.value, ObjectRef)]
        if named:
            yield from purge(named)
        calls = tuple(
            self._call(
                "delete_item",
                {
                    "Key": _key(self._pk(path), i["sk"]["S"]),
                    "ConditionExpression": "exu = :seen",
                    "ExpressionAttributeValues": {":seen": i["exu"]},
                },
                _subject(path, r.key),
            )
            for i, r in expired
        )
        answers = yield calls
        deleted = sum(_done(call, answer) for call, answer in zip(calls, answers))
        return deleted, len(expired) == len(rows)

    def _restore_fenced(self, path: Path, key: dict[str, Any], change: Change) -> Op[list[str]]:
        """An imported item, written whole with its exported times (last writer wins, as a
        put: an import run again writes the same item), in a transaction with the check
        ``_create`` makes: the namespace is registered and no removal is under way (every
        item is listed, against an erase or a sweep racing the import). A transaction
        returns no old values: an item it replaces that had a value object of its own
        leaves that object behind (an import over a different version of a large item)."""
        for _ in range(_MAX_TRIES):
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
