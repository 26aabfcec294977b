"""The memory index in the saver's table (DynamoDB mode): removals, ``erase_namespace``'s
items and registrations and the TTL sweep.

A removal unregisters a namespace without waiting: it marks its registry item
``retiring`` with a token of its own, removes the items, then deletes the registry
item only if the mark is still its own. Every write that creates an item is a
transaction that checks the registry item is there and not retiring
(``DynamoMemory._create``), and a registration overwrites the mark; an overwrite needs a
live item. So an item written after the mark makes its writer register again (the
removal then fails to delete the registry item: the namespace stays listed), and an item
written before it is seen by the removal's Query (erase: deleted; sweep: the namespace
kept).

A write whose answer is lost (a read timeout: it may have landed). A mark is sent again
as is (its condition allows a mark already its own: applied twice, the same mark). The
deletes are conditioned on what was read (``ua``, ``exu``, the mark): sent again after
they landed, they would be refused, and the removal would report a namespace it
unregistered as registered again (erase's ``written_during``), an item it deleted as not
removed. So they are never sent again as is (``Call.idempotent``): each is judged on its
item read after it (``_judged``): gone, it landed; as read, it did not (sent again);
changed since, refused.

A mark outlives a removal cut short. An erase's stays the erase's: called again, it marks
over it (no sweep takes it, so nothing unregisters a namespace an erase has not finished
with). A sweep's is ``SWEEP_MARK`` and a token: the next sweep, or the same one retried,
marks over it; a sweep still running then fails to delete the registry item and keeps the
namespace, and the one that marked last finishes the work as above.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from s3_saver._format.key_codec import new_token
from s3_saver._format.memory.documents import (
    gone_partition,
    node_folder,
    registry_partition,
    sweep_partition,
)
from s3_saver._format.memory.names import node_id, registry_bounds, registry_key, show
from s3_saver._format.memory.rows import (
    ObjectRef,
)
from s3_saver._format.memory.ttl import is_expired
from s3_saver._index.dynamodb.memory_items import (
    _MAX_TRIES,
    Items,
    _done,
    _key,
    _subject,
)
from s3_saver._index.memory import Destroy, Erasure, Path, Purge, Swept
from s3_saver._transport.failures import UNAVAILABLE, classify
from s3_saver._transport.protocol import (
    Backoff,
    Call,
    Op,
    gather,
    raise_failure,
    request_one,
)
from s3_saver.errors import StoreUnavailableError

_BACKOFF_MAX = 0.5  # seconds, before a delete judged not landed is sent again
_JITTER = random.SystemRandom()

# The verdict on a conditional delete whose answer was lost, from its item read after it
# (None: absent): True it landed, False its condition no longer holds, None it did not
# land (sent again).
Verdict = Callable[[dict[str, Any] | None], bool | None]

SWEEP_MARK = "sweep:"
"""How a sweep's ``retiring`` mark begins (an erase's is a bare token)."""


class Removals(Items):
    """Erase and the TTL sweep of the DynamoDB memory index."""

    def node_folder(self, path: Path) -> str:
        return node_folder(self.prefix, node_id(path))

    def erase_rows(self, prefix: Path, purge: Purge, destroy: Destroy | None = None) -> Op[Erasure]:
        entries = yield from self._query(registry_partition(self.prefix), "the namespace registry", registry_bounds(prefix) if prefix else None)
        paths = sorted(self._registry(entries))
        # With encryption, the keys destroyed before the marks, which record their ids: a
        # process that cached one cannot register the namespace over the mark with it
        # (``_register``); once the registry item is gone, its creation's check is refused
        # and it reads the key again (``DynamoMemory._put``). The same wave adds the ids to
        # the namespace's record of destroyed keys (``gone_partition``), which outlives the
        # registry item: a registration after the erase checks it (``_register``).
        gone = (yield from destroy(paths)) if destroy is not None else {}
        token = new_token()
        marked = yield from self._retire(paths, token, fresh=False, gone=gone)
        counts = yield from gather(*(self._erase_items(p, purge) for p in marked))
        records = tuple(f"DynamoDB table {self.table!r}, item {gone_partition(self.prefix)!r}/{node_id(p)!r}" for p in sorted(gone))
        return Erasure(tuple(marked), tuple(marked), sum(counts), token, records)

    def erase_registrations(self, erasure: Erasure, hold: Sequence[Path] = ()) -> Op[list[Path]]:
        # A held namespace keeps the erase's mark: no sweep takes an erase's, so it stays
        # registered until a put registers it again or the erase, called again, ends it.
        deleted = yield from self._unretire([p for p in erasure.namespaces if p not in hold], erasure.fence, delete=True)
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
            token = SWEEP_MARK + new_token()
            retired = yield from self._retire(empty, token, fresh=True)
            # Items created before the mark landed are seen now: those namespaces stay. Any
            # item keeps its namespace, an expired one too: this run read the namespace
            # before that item came, so it did not delete it, and an unregistered namespace
            # is found by no later sweep or erase (its row, and its value's object, would
            # stay for good). The next run deletes it, then unregisters.
            again = yield from gather(*(self._query(self._pk(p), f"namespace {show(p)} (TTL sweep)") for p in retired))
            emptied = [p for p, items in zip(retired, again) if not items]
            unregistered = yield from self._unretire(emptied, token, delete=True)
            yield from self._unretire([p for p in retired if p not in emptied], token, delete=False)
        following = page["Items"][-1]["sk"]["S"] if page.get("LastEvaluatedKey") and page["Items"] else ""
        if following != cursor:
            item = {**cursor_key, "at": {"S": following}}
            yield from request_one(self._call("put_item", {"Item": item}, "the TTL sweep's cursor"))
        return Swept(sum(n for n, _ in results), len(paths), tuple(unregistered))

    def _retire(self, paths: list[Path], token: str, *, fresh: bool, gone: dict[Path, frozenset[str]] | None = None) -> Op[list[Path]]:
        """Mark the registry items of ``paths`` retiring with ``token`` (``fresh``, a
        sweep's: only those no erase marked); returns the paths marked (the others are
        gone, or marked by an erase)."""
        condition = "attribute_exists(pk)"
        values = {":t": {"S": token}}
        if fresh:
            # Over no mark, or a sweep's: its own, sent again after a lost answer (refused,
            # the mark would stay), and one a sweep cut short left (a sweep that could not
            # take it, its own retry included, would never unregister the namespace, and a
            # creation in it would be refused once per process that knew it registered).
            # Taking a sweep's mark is safe: see the module docstring.
            condition += " AND (attribute_not_exists(retiring) OR begins_with(retiring, :sweep))"
            values[":sweep"] = {"S": SWEEP_MARK}
        def marked(p: Path) -> Call:
            ids = (gone or {}).get(p)
            params = {
                "Key": _key(registry_partition(self.prefix), registry_key(p)),
                "UpdateExpression": "SET retiring = :t" + (", gone = :g" if ids else ""),
                "ConditionExpression": condition,
                "ExpressionAttributeValues": {**values, **({":g": {"SS": sorted(ids)}} if ids else {})},
            }
            return self._call("update_item", params, f"registry of namespace {show(p)}")

        calls = tuple(marked(p) for p in paths)
        # ADD: a union, so an erase whose write lands late never takes off an id a later
        # erase added. Unconditional, sent again as is after a lost answer.
        records = tuple(
            self._call(
                "update_item",
                {
                    "Key": _key(gone_partition(self.prefix), node_id(p)),
                    "UpdateExpression": "ADD gone :g",
                    "ExpressionAttributeValues": {":g": {"SS": sorted(ids)}},
                },
                f"destroyed keys of namespace {show(p)}",
            )
            for p, ids in sorted((gone or {}).items())
            if ids
        )
        answers = yield calls + records
        for call, answer in zip(records, answers[len(calls) :]):
            if isinstance(answer, BaseException):
                raise_failure(call, answer)
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
        if not delete:
            # Sent again after it landed, it is refused: the mark is off either way.
            answers = yield tuple(calls)
            return [p for p, call, answer in zip(paths, calls, answers) if _done(call, answer)]

        def unregistered(item: dict[str, Any] | None) -> bool | None:
            # Gone: unregistered (by this delete, or by a removal that took the mark over).
            # Marked still: not landed. Else registered again since: kept.
            return True if item is None else None if item.get("retiring") == {"S": token} else False

        reads = [self._call("get_item", {"Key": c.params["Key"], "ConsistentRead": True}, c.subject or "") for c in calls]
        applied = yield from self._judged([(c, r, unregistered) for c, r in zip(calls, reads)])
        done = [p for p, ok in zip(paths, applied) if ok]
        for p in done:
            self._known.pop(p)
        return done

    def _judged(self, writes: Sequence[tuple[Call, Call, Verdict]]) -> Op[list[bool]]:
        """Conditional deletes, each with the read of its item and its ``Verdict``, in one
        round trip; for each, True if it was applied, False if its condition failed. One
        whose answer is lost is judged on its item read after it, never sent again as is:
        its condition is on what was read before it, so the copy of a delete that landed
        would be refused, and the removal would report what it did as not done."""
        if not writes:
            return []
        results = [False] * len(writes)
        pending = list(range(len(writes)))
        for lost in range(1, _MAX_TRIES + 1):
            answers = yield tuple(replace(writes[i][0], idempotent=False) for i in pending)
            unknown: list[tuple[int, BaseException]] = []
            for i, answer in zip(pending, answers):
                if isinstance(answer, BaseException) and classify(answer, writes[i][0].operation) == UNAVAILABLE:
                    unknown.append((i, answer))  # it may have landed: judged below
                else:
                    results[i] = _done(writes[i][0], answer)
            if not unknown:
                return results
            reads = tuple(writes[i][1] for i, _ in unknown)
            found = yield reads
            pending = []
            failure: tuple[Call, BaseException] | None = None  # of a delete to send again
            for (i, answer), read, item in zip(unknown, reads, found):
                if isinstance(item, BaseException):
                    raise_failure(read, item)
                verdict = writes[i][2](item.get("Item"))
                if verdict is None:
                    pending.append(i)
                    failure = (writes[i][0], answer)
                else:
                    results[i] = verdict
            if failure is None:
                return results
            go_on = yield Backoff(_JITTER.uniform(0, min(_BACKOFF_MAX, 0.01 * 2**lost)), lost)
            if go_on is False or lost == _MAX_TRIES:
                raise_failure(*failure)
        return results

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
            applied = yield from self._judged([self._delete_as_read(path, r.key, i, "ua") for i, r in zip(items, rows)])
            changed = [i for i, ok in zip(items, applied) if not ok]
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
        applied = yield from self._judged([self._delete_as_read(path, r.key, i, "exu") for i, r in expired])
        return sum(applied), len(expired) == len(rows)

    def _delete_as_read(self, path: Path, name: str, item: dict[str, Any], fence: str) -> tuple[Call, Call, Verdict]:
        """The ``DeleteItem`` of ``item`` only if its attribute ``fence`` is still as read
        (``ua``: no put since; ``exu``: the expiry read), the read of the item, and the
        verdict on a lost answer: the item gone, it landed; as read, it did not."""
        key = _key(self._pk(path), item["sk"]["S"])
        subject = _subject(path, name)
        seen = item[fence]
        params = {"Key": key, "ConditionExpression": f"{fence} = :seen", "ExpressionAttributeValues": {":seen": seen}}

        def deleted(now: dict[str, Any] | None) -> bool | None:
            return True if now is None else None if now.get(fence) == seen else False

        read = self._call("get_item", {"Key": key, "ConsistentRead": True}, subject)
        return self._call("delete_item", params, subject), read, deleted
