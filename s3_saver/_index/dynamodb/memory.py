"""The memory store's index in the saver's DynamoDB table (design decision D1: in this
mode the table is the store of record for memory items).

One item per memory item, ``pk = <P>#m/<node id>``, ``sk = "k" + key``, holding its
row's fields as attributes (``ns`` its namespace, checked on every read; ``seq`` and
``ca`` its creation time, kept by an overwrite; ``ua``; ``exu`` its exact expiry in
microseconds and ``expires_at`` the same in seconds, rounded up, for DynamoDB's TTL;
``ttl``; ``v`` the packed value; ``vec`` the packed vectors; ``wt`` the token of the
write that made it; ``vo`` its value object's token, when its value lives in one; ``pv``
the ``vo`` of the item an overwrite replaced, or ""). One registry item per
namespace, ``pk = <P>#mreg``, ``sk`` = its registry key (so a Query returns namespaces
in Python's tuple order), with its path and its registration time (the namespace order
of a search).

Writes, with no read before them: a put of an item that exists is one ``UpdateItem``
that keeps ``ca``/``seq`` and returns the old value (its value object, if any, is
deleted after), refused when the item is absent or expired; a put that creates an item
is one ``TransactWriteItems`` of a check that the namespace is registered (and not being
unregistered) and a conditional ``Put``. The process tries first the one its hint says
(a key it wrote or read: the overwrite); a wrong guess costs one more request. A delete
is one ``DeleteItem`` (two for an item whose value lives in an object: ``_delete``); a refresh one ``UpdateItem`` fenced on the expiry read. DynamoDB
applies the writes of one item one at a time: the last wins, whole. A namespace is
registered (a conditional ``PutItem`` of its registry item) before its first item is
written, once per process, and again when a creation's check finds it unregistered.

An overwrite whose answer is lost (a read timeout: it may have landed) is never
answered by sending the same write again (``Call.idempotent``): the put reads the item
and judges (``_put``). The old value's object is deleted by whoever learns the item was
replaced: the write's own answer (its ``v``, ``vo`` and ``pv``), or, answer lost, the
item read after it (its ``pv``) or the next writer's answer (the ``pv`` it returns).
Left behind (to gc, as an object whose commit never landed): the object an item
replaced when two overwrites of the key in a row both lose their answers. Not handled:
a write that lands after its timeout and after the read that judged it (DynamoDB
bounds no such delay).

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

With encryption, a put carries the id of the namespace key it is sealed under (``kid``):
on its item (an overwrite is refused over another key's item), on the registry item its
registration writes (a creation's check is refused under another key), and an erase
writes the ids it destroyed on its mark (``gone``: no registration over it with one) and
adds them to the namespace's record of destroyed keys (``<P>#mgone``, which outlives the
registry item: a registration with a key id is a transaction checking it, so a process that
read the key before a whole erase cannot register afresh under it). A creation refused by
its check is not registered again blindly: the writer reads the key first (``KeyFenced``),
so a key an erase destroyed never commits. No request more (the registration, a process's
first put into a namespace, is one transaction instead of one ``PutItem``).

Not built yet: ``BatchGetItem`` for several keys, one transaction for a cold put.

The module holds reads and writes; the items and what they share are ``memory_items``'s,
removals ``memory_removal``'s.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import ormsgpack

from s3_saver._format.key_codec import new_token
from s3_saver._format.memory.documents import (
    ITEM_MARK,
    registry_partition,
)
from s3_saver._format.memory.names import registry_bounds, show
from s3_saver._format.memory.rows import (
    ObjectRef,
    Row,
    value_from_wire,
)
from s3_saver._format.memory.ttl import epoch_seconds_up
from s3_saver._index.dynamodb.memory_collect import Collection
from s3_saver._index.dynamodb.memory_items import (
    _LIVE_BYTES,
    _MAX_TRIES,
    _cancelled,
    _key,
    _n,
    _sealed_elsewhere,
    _subject,
)
from s3_saver._index.dynamodb.memory_removal import Removals
from s3_saver._index.dynamodb.memory_reseal import Reseals
from s3_saver._index.memory import (
    Change,
    KeyFenced,
    Path,
    Snapshot,
    Stage,
    fresh_objects,
)
from s3_saver._index.memory_lease import renewed
from s3_saver._transport.failures import (
    CONDITION_FAILED_CODES,
    UNAVAILABLE,
    classify,
    error_code,
)
from s3_saver._transport.protocol import Backoff, Op, gather, raise_failure, request_one
from s3_saver.errors import CorruptObjectError, StoreUnavailableError

INLINE_LIMIT = 16 * 1024  # past ~8 KB an S3 PUT costs less than the item's write units
_BACKOFF_MAX = 0.5  # seconds, before a put whose answer was lost is written again
_JITTER = random.SystemRandom()

# A DynamoDB item holds 400 KB (names and values). The vectors are inline; beside them at
# most INLINE_LIMIT of value, a key of 1,000 bytes, a namespace of 1,024 and a few numbers.
# An item over the limit would be refused by DynamoDB (ValidationException) after its
# namespace was registered: the store refuses it first, before any request.
VECTOR_LIMIT = 400_000 - INLINE_LIMIT - 4 * 1024


class DynamoMemory(Collection, Removals, Reseals):
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

    def commit(self, groups: dict[Path, list[Change]], stage: Stage | None = None) -> Op[list[str]]:
        # A reseal (the encryption migration's) never creates an item: it registers nothing.
        new = [
            p for p, changes in groups.items()
            if any(c.value is not None and c.reseal is None for c in changes) and self._known.get(p) is None
        ]
        if new:
            # Listed before readable: a namespace's registry item is written before its items.
            yield from gather(*(self._register(p, _kid(groups[p])) for p in new))
        if stage is not None:
            # And before its value objects (``MemoryIndex.commit``'s invariant): an erase
            # finds them even if this commit is cut short before its items.
            yield from stage()
        # Each key appears once in a commit (``prepare`` keeps a key's last put; a refresh
        # is planned only for keys the batch does not write): every change goes in one wave.
        released = yield from gather(*(self._change(path, c) for path, changes in groups.items() for c in changes))
        return [key for keys in released for key in keys]

    def _change(self, path: Path, change: Change) -> Op[list[str]]:
        """Returns the value object the item's replaced value named (in the old
        attributes the write itself returned: delete only what you read)."""
        key = _key(self._pk(path), ITEM_MARK + change.key)
        if change.reseal is not None:
            return (yield from self._reseal(path, change))  # the encryption migration's, fenced
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
            released = yield from self._delete(path, key, change.key)
            self._live.pop((path, change.key))
            return released
        if change.stamps is not None:
            return (yield from self._restore_fenced(path, key, change))
        return (yield from self._put(path, key, change))

    def _put(self, path: Path, key: dict[str, Any], change: Change) -> Op[list[str]]:
        """The overwrite of a live item (one ``UpdateItem``, tried first when the process
        has seen the key), else the creation (one transaction, see ``_create``).

        The overwrite is never sent again blindly after a lost answer (``Call.idempotent``):
        sent again as is, it would return its own item as the old one (the value object it
        replaced left behind), or, landed and replaced by another writer since (who deleted
        its value object, named by the item that writer replaced), name that deleted object
        again: the key unreadable. So it is judged on the item read after it: its write
        token there, it landed (it releases the ``pv`` its item recorded); else its value
        object is copied to a fresh token (a source gone proves it landed and was replaced:
        done) and the write sent again, naming the copy. A creation is a transaction with a
        ``ClientRequestToken``: sent again, DynamoDB applies it once."""
        assert change.value is not None
        overwrite = (path, change.key) in self._live
        copied: list[str] = []  # value objects of writes judged not current: named by no row from now on
        lost = 0
        # Up to _MAX_TRIES refusals (the item changing between the writes), and up to
        # _MAX_TRIES lost answers (bounded below, where each is judged).
        for _ in range(2 * _MAX_TRIES):
            # The lease: never name a value object older than VALUE_LEASE (``memory_lease``).
            (change,) = yield from renewed(self.s3, self.value_key, self.clock, path, [change])
            now = self.clock.now()
            refused = False  # this round's overwrite refused by its condition
            if overwrite:
                token = new_token()
                call = self._overwrite(path, key, change, now, token)
                (answer,) = yield (call,)
                if not isinstance(answer, BaseException):
                    self._live.put((path, change.key), True, _LIVE_BYTES + len(change.key))
                    return self._released(path, answer.get("Attributes") or {}, change.value) + copied
                if classify(answer, call.operation) == UNAVAILABLE:
                    # The answer lost (or a failure that may have been applied): judge it.
                    lost += 1
                    item = (yield from request_one(self._get(path, change.key))).get("Item") or {}
                    if item.get("wt", {}).get("S") == token:
                        # Landed, and still the key's item: what it replaced is in its ``pv``.
                        self._live.put((path, change.key), True, _LIVE_BYTES + len(change.key))
                        return self._released(path, {"pv": item.get("pv", {})}, change.value) + copied
                    fresh = yield from fresh_objects(self.s3, self, path, [change], _subject(path, change.key))
                    if fresh is None:
                        # Landed, then replaced: that writer released this one's value object
                        # and the one it had replaced (its ``pv``). Ordered before it: done.
                        return copied
                    (change,), old = fresh
                    copied += [self.value_key(path, t) for t in old]
                    go_on = yield Backoff(_JITTER.uniform(0, min(_BACKOFF_MAX, 0.01 * 2**lost)), lost)
                    if go_on is False or lost >= _MAX_TRIES:
                        raise_failure(call, answer)
                    continue
                if error_code(answer) not in CONDITION_FAILED_CODES:
                    raise_failure(call, answer)
                refused = True
                # No live item (absent, deleted or expired): create one.
            call = self._create(path, key, change, now, new_token())
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                self._live.put((path, change.key), True, _LIVE_BYTES + len(change.key))
                return copied
            registry, item_refused = _cancelled(answer)
            if item_refused and not registry and refused and change.sealed_with is not None:
                # Overwrite and creation refused each other: the item may be a new life's,
                # under a registry item naming no key (``_sealed_elsewhere``). Read once.
                item = (yield from request_one(self._get(path, change.key))).get("Item")
                if _sealed_elsewhere(item, change.sealed_with, now):
                    raise KeyFenced([path], self.describe(path))
            if item_refused and not (registry and change.sealed_with is not None):
                overwrite = True  # a live item is there: overwrite it (its created_at kept)
            elif registry:
                # Unregistered (an erase or a sweep) or being unregistered since this
                # process learned it: register again, then create.
                self._known.pop(path)
                if change.sealed_with is not None:
                    # With encryption, the key first: an erase may have destroyed it, or
                    # registered the namespace under another since (a new life). The put is
                    # sealed again under the key read then (``sealing.rekeying``), and
                    # registers with it (invariant of ``MemoryIndex.commit``).
                    raise KeyFenced([path], self.describe(path))
                yield from self._register(path)
                overwrite = False
            else:
                raise_failure(call, answer)
        raise StoreUnavailableError(
            f"put of key {show(change.key)} in namespace {show(path)} ({self.describe(path)}): the item kept changing "
            "(created, deleted, or its namespace unregistered) between the writes; try again"
        )

    def _delete(self, path: Path, key: dict[str, Any], name: str) -> Op[list[str]]:
        """A ``DeleteItem`` of an item with no value object (or of none): nothing to lose
        if its answer is lost and it is sent again. An item with a value object is refused
        by it, with the item as it is (or read after it), and deleted by a second
        ``DeleteItem`` conditioned on that value object (delete only what you read): sent
        again after a lost answer, it is refused, and the objects of the item read are
        released either way (that item is gone: deleted by this delete, or replaced by a
        writer it is ordered before). Sent again blindly, a single ``DeleteItem`` whose
        answer was lost would find nothing, and the value object would stay, unnamed."""
        subject = _subject(path, name)
        for _ in range(_MAX_TRIES):
            call = self._call(
                "delete_item",
                {
                    "Key": key,
                    "ConditionExpression": "attribute_not_exists(#vo)",
                    "ExpressionAttributeNames": {"#vo": "vo"},
                    "ReturnValues": "ALL_OLD",
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                },
                subject,
            )
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                return self._released(path, answer.get("Attributes") or {}, None)
            if error_code(answer) not in CONDITION_FAILED_CODES:
                raise_failure(call, answer)
            seen = (getattr(answer, "response", None) or {}).get("Item")
            if seen is None:  # a store that does not return it: read it
                seen = (yield from request_one(self._get(path, name))).get("Item")
            if seen is None or "vo" not in seen:
                continue  # changed meanwhile: judge it again
            call = self._call(
                "delete_item",
                {
                    "Key": key,
                    "ConditionExpression": "#vo = :vo",
                    "ExpressionAttributeNames": {"#vo": "vo"},
                    "ExpressionAttributeValues": {":vo": seen["vo"]},
                    "ReturnValues": "ALL_OLD",
                },
                subject,
            )
            (answer,) = yield (call,)
            if isinstance(answer, BaseException) and error_code(answer) not in CONDITION_FAILED_CODES:
                raise_failure(call, answer)
            return self._released(path, seen, None)
        raise StoreUnavailableError(
            f"delete of key {show(name)} in namespace {show(path)} ({self.describe(path)}): the item kept changing "
            "between the two deletes; try again"
        )

    def _released(self, path: Path, old: dict[str, Any], value: Any) -> list[str]:
        """The value objects named by the item ``old`` (attributes as the write returned
        them, or as read): its value's (``v``, ``vo``) and the one it had replaced (``pv``:
        released by its own writer too, unless that writer's answer was lost; deleting it
        twice is harmless, as it is named by no row). Never the object of ``value``, the
        one the commit names."""
        tokens: list[str] = [t for t in (old.get("vo", {}).get("S"), old.get("pv", {}).get("S")) if t]
        packed = old.get("v")
        if packed is not None and "B" in packed:
            try:
                cell = value_from_wire(ormsgpack.unpackb(packed["B"]), self.describe(path))
            except (CorruptObjectError, ormsgpack.MsgpackDecodeError, ValueError):
                cell = None  # not one of ours to delete
            if isinstance(cell, ObjectRef):
                tokens.append(cell.token)
        mine = value.token if isinstance(value, ObjectRef) else None
        return [self.value_key(path, t) for t in dict.fromkeys(tokens) if t != mine]

    def _restore_fenced(self, path: Path, key: dict[str, Any], change: Change) -> Op[list[str]]:
        """An imported item, written whole with its exported times (last writer wins, as a
        put: an import run again writes the same item), in a transaction with the check
        ``_create`` makes: the namespace is registered and no removal is under way (every
        item is listed, against an erase or a sweep racing the import). A transaction
        returns no old values: an item it replaces that had a value object of its own
        leaves that object behind (an import over a different version of a large item)."""
        for _ in range(_MAX_TRIES):
            (change,) = yield from renewed(self.s3, self.value_key, self.clock, path, [change])  # the lease, as a put's
            call = self._restore(path, key, change, new_token())
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                self._live.put((path, change.key), True, _LIVE_BYTES + len(change.key))
                return []
            registry, _ = _cancelled(answer)
            if not registry:
                raise_failure(call, answer)
            self._known.pop(path)
            if change.sealed_with is not None:
                raise KeyFenced([path], self.describe(path))  # the key first, as a put's (``_put``)
            yield from self._register(path)
        raise StoreUnavailableError(
            f"import of key {show(change.key)} in namespace {show(path)} ({self.describe(path)}): its namespace kept "
            "being unregistered between the writes; try again"
        )


def _kid(changes: list[Change]) -> str | None:
    """The key a namespace's puts are sealed under (all under one: the batch's), None without encryption."""
    return next((c.sealed_with for c in changes if c.sealed_with is not None), None)
