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
"""

from __future__ import annotations

from typing import Any

from s3_saver._format.key_codec import new_token
from s3_saver._format.memory.documents import (
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
from s3_saver._index.memory import Erasure, Path, Purge, Swept
from s3_saver._transport.protocol import Op, gather, raise_failure, request_one
from s3_saver.errors import StoreUnavailableError


class Removals(Items):
    """Erase and the TTL sweep of the DynamoDB memory index."""

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
