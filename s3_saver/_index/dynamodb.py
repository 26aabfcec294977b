"""The DynamoDB index backend: every index operation as Query/GetItem/PutItem/batch calls.

Newest first, a namespace's tombstone comes before its items and each checkpoint
item before its own writes (see ``_keys``), so "latest" is one ``Query`` with
``Limit=1`` and a history page is one ``Query``.

This module holds a checkpoint's own path: commit a checkpoint and its writes,
read the latest, one checkpoint, a history page or an ancestor chain, and the
batch calls beneath them. The table's setup and what concerns a thread as a
whole (listing, run hints, restore, delete, prune, copy) are in
``dynamo_lifecycle``, mixed into ``DynamoIndex``: one class, two modules of one
role each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from s3_saver import _keys
from s3_saver._index.base import (
    REGULAR_PART,
    CheckpointEntry,
    DepthHint,
    Index,
    Key3,
    Prepared,
    Tombstone,
    WritesEntry,
    WritesOutcome,
)
from s3_saver._index.dynamo_items import PARTITION_KEY, DynamoCalls, Link, _live, _live_gen, _thread_item
from s3_saver._index.dynamo_audit import DynamoHoldings
from s3_saver._index.dynamo_archive import DynamoArchive
from s3_saver._index.dynamo_lifecycle import DynamoLifecycle
from s3_saver._keys import KeyLayout
from s3_saver._protocol import Op, Sleep, backoff, gather, raise_failure, request, request_one
from s3_saver.errors import CONDITION_FAILED_CODES, S3SaverError, Where, error_code

BATCH_GET_MAX = 100  # BatchGetItem accepts at most 100 keys per request
BATCH_WRITE_MAX = 25  # BatchWriteItem accepts at most 25 requests
_MAX_BATCH_ATTEMPTS = 10


@dataclass
class _HistoryCursor:
    start: dict[str, Any] | None = None
    held: CheckpointEntry | None = None  # its writes may go on in the next page
    deleted: dict[str, int] = field(default_factory=dict)
    first: bool = True


class DynamoIndex(DynamoHoldings, DynamoArchive, DynamoLifecycle, Index):
    def __init__(self, table: str, layout: KeyLayout, where: Where | None = None) -> None:
        self.calls = DynamoCalls(table, layout, where)
        self.table = table

    def describe(self) -> str:
        return f"DynamoDB table {self.table}"

    # -- writes --------------------------------------------------------------------------
    def prepare(self, thread_id: str, ns: str, parent_id: str | None, list_at: int | None = None) -> Op[Prepared]:
        calls = [self.calls.get_tombstone(thread_id)]
        if parent_id is not None:
            calls.append(self.calls.get_checkpoint(thread_id, ns, parent_id))
        found = yield from request(*calls)
        parent = self.calls.parse(found[1]["Item"]) if parent_id is not None and "Item" in found[1] else None
        thread = _thread_item(self.calls, found[0])
        # The listing and the thread's mark go in one transaction (``note``): a
        # thread whose listing failed is listed by its next root checkpoint.
        return Prepared(
            thread.gen,
            parent if isinstance(parent, CheckpointEntry) else None,
            bool(thread.created),
            list_at,
            thread.dead_runs,
            thread.archive,
        )

    def commit_checkpoint(self, entry: CheckpointEntry, created: int | None = None) -> Op[None]:
        # The item and its link (what the ancestor walk reads) in one request.
        items = [self.calls.checkpoint_item(entry), self.calls.link_item(entry)]
        yield from self.write_batches([{"PutRequest": {"Item": i}} for i in items], f"checkpoint {entry.checkpoint_id}")

    def note(self, thread_id: str, created: int | None, run_id: str | None) -> Op[None]:
        calls = []
        if created is not None:
            calls.append(self.calls.list_thread(created, thread_id))
        if run_id is not None:
            calls.append(self.calls.put(self.calls.run_item(run_id, thread_id)))
        if not calls:
            return
        results = yield tuple(calls)
        for call, result in zip(calls, results):
            if isinstance(result, BaseException) and not _listed_first(result):
                raise_failure(call, result)

    def commit_writes(self, entries: list[WritesEntry]) -> Op[WritesOutcome]:
        calls = []
        for entry in entries:
            item = self.calls.writes_item(entry)
            if entry.part.startswith(REGULAR_PART):
                # First committed wins; the stored item is handed back when we lose.
                options = {
                    "ConditionExpression": f"attribute_not_exists({PARTITION_KEY})",
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            else:
                options = {"ReturnValues": "ALL_OLD"}  # last committed wins; the old item comes back
            calls.append(self.calls.put(item, **options))
        results = yield tuple(calls)
        outcome = WritesOutcome()
        for call, result, entry in zip(calls, results, entries):
            if isinstance(result, BaseException):
                if error_code(result) not in CONDITION_FAILED_CODES:
                    raise_failure(call, result)
                winner = (getattr(result, "response", {}) or {}).get("Item", {}).get("token", {}).get("S")
                if winner != entry.token:  # else: our own write, applied by an earlier attempt
                    outcome.unused.append((entry, entry.token))
                continue
            replaced = result.get("Attributes", {}).get("token", {}).get("S")
            if replaced is not None and replaced != entry.token:
                outcome.unused.append((entry, replaced))
        return outcome

    # -- reads -------------------------------------------------------------------------
    def latest(self, thread_id: str, ns: str) -> Op[CheckpointEntry | None]:
        """One Query with Limit=1. Writes stored before their checkpoint (a newer
        id with no checkpoint item yet) can come first: the range narrows below
        that id. A deleted namespace has its tombstone on top: the search goes on
        below it, for items written since (a thread id used again)."""
        calls = self.calls
        prefix = _keys.ns_sort_prefix(ns)
        upper: str | None = None
        start: dict[str, Any] | None = None
        min_gen = 0
        while True:
            if upper is None:
                call = calls.query(thread_id, begins_with=prefix, limit=1, start_key=start, min_gen=min_gen)
            else:
                call = calls.query(thread_id, between=(prefix, upper), limit=1, start_key=start, min_gen=min_gen)
            page = yield from request_one(call)
            items = page.get("Items", [])
            if not items:
                # With a generation filter, an evaluated item that did not pass
                # (left by a delete cut short) ends a page with nothing in it.
                start = page.get("LastEvaluatedKey")
                if start is None:
                    return None
                continue
            entry = calls.parse(items[0])
            if isinstance(entry, CheckpointEntry) and entry.hidden:
                # Kept by prune for newer checkpoints, which come first: only a
                # prune of a newer one cut short leaves it on top.
                upper, start = _keys.checkpoint_sort_prefix(ns, entry.checkpoint_id), None
                continue
            if isinstance(entry, CheckpointEntry):
                entry.writes = None  # read with the values, in the next wave
                return entry
            if isinstance(entry, Tombstone):
                min_gen, start = _live(entry, thread_id).gen, calls.tombstone_key(thread_id, ns)
            else:
                assert isinstance(entry, WritesEntry)
                upper, start = _keys.checkpoint_sort_prefix(ns, entry.checkpoint_id), None

    def get(self, thread_id: str, ns: str, checkpoint_id: str) -> Op[CheckpointEntry | None]:
        calls = self.calls
        # The item, its writes and the namespace's tombstone in one wave.
        writes_query = calls.query(
            thread_id, begins_with=_keys.writes_sort_prefix(ns, checkpoint_id), newest_first=False
        )
        found, page, tomb = yield from request(
            calls.get_checkpoint(thread_id, ns, checkpoint_id), writes_query, calls.get_tombstone(thread_id, ns)
        )
        deleted = _live_gen(calls, tomb, thread_id)  # first: an archived namespace has no items
        entry = calls.parse(found["Item"]) if "Item" in found else None
        if not isinstance(entry, CheckpointEntry) or entry.hidden or entry.gen < deleted:
            return None
        entry.writes = _writes_in(calls, page)
        if page.get("LastEvaluatedKey"):
            entry.writes += yield from self._writes_pages(thread_id, ns, checkpoint_id, page["LastEvaluatedKey"])
        return entry

    def writes(self, entry: CheckpointEntry) -> Op[list[WritesEntry]]:
        return (yield from self._writes_pages(entry.thread_id, entry.ns, entry.checkpoint_id, None))

    def _writes_pages(self, thread_id: str, ns: str, checkpoint_id: str, start: Any) -> Op[list[WritesEntry]]:
        writes: list[WritesEntry] = []
        while True:
            page = yield from request_one(
                self.calls.query(
                    thread_id,
                    begins_with=_keys.writes_sort_prefix(ns, checkpoint_id),
                    newest_first=False,
                    start_key=start,
                )
            )
            writes += _writes_in(self.calls, page)
            start = page.get("LastEvaluatedKey")
            if start is None:
                return writes

    def entries(self, keys: list[Key3]) -> Op[dict[Key3, CheckpointEntry | None]]:
        """BatchGetItem, eventually consistent: only older checkpoints are read this
        way and their items never change. One not visible yet comes back None (the
        resolver then reads its S3 object)."""
        found: dict[Key3, CheckpointEntry | None] = {}

        def take(result: dict[str, Any]) -> list[Any]:
            for raw in result.get("Responses", {}).get(self.table, []):
                entry = self.calls.parse(raw)
                if isinstance(entry, CheckpointEntry):
                    found[entry.key] = entry
            return result.get("UnprocessedKeys", {}).get(self.table, {}).get("Keys", [])

        item_keys = [self.calls.key_of(*k) for k in keys]
        yield from self._until_processed(item_keys, BATCH_GET_MAX, self.calls.batch_get, take, "reads")
        return {k: found.get(k) for k in keys}

    def history(
        self, thread_id: str, ns: str | None, before_id: str | None, page_size: int | None, cursor: Any
    ) -> Op[tuple[list[CheckpointEntry], Any]]:
        calls = self.calls
        state: _HistoryCursor = cursor or _HistoryCursor()
        if ns is None:
            # The whole partition; `before` is applied by the caller to the entries.
            call = calls.query(thread_id, limit=page_size, start_key=state.start)
        elif before_id is not None:
            # `before` is a key condition: everything below the before id's items.
            # That range ends below the namespace's tombstone: read it beside the first page.
            upper = _keys.checkpoint_sort_prefix(ns, before_id)
            prefix = _keys.ns_sort_prefix(ns)
            call = calls.query(thread_id, between=(prefix, upper), limit=page_size, start_key=state.start)
        else:
            call = calls.query(thread_id, begins_with=_keys.ns_sort_prefix(ns), limit=page_size, start_key=state.start)
        if state.first and ns is not None and before_id is not None:
            page, tomb = yield from request(call, calls.get_tombstone(thread_id, ns))
            state.deleted[ns] = _live_gen(calls, tomb, thread_id)
        else:
            page = yield from request_one(call)
        state.first = False
        complete: list[CheckpointEntry] = []
        for raw in page.get("Items", []):
            item = calls.parse(raw)
            if isinstance(item, Tombstone):
                if item.ns is not None:
                    state.deleted[item.ns] = _live(item, thread_id).gen
                continue
            if item is None or isinstance(item, Link) or item.gen < state.deleted.get(item.ns, 0):
                continue
            if isinstance(item, CheckpointEntry):
                if state.held is not None:
                    complete.append(state.held)
                state.held = None if item.hidden else item
            elif state.held is not None and (item.ns, item.checkpoint_id) == (state.held.ns, state.held.checkpoint_id):
                state.held.writes.append(item)  # type: ignore[union-attr]
        state.start = page.get("LastEvaluatedKey")
        if state.start is None:
            if state.held is not None:
                complete.append(state.held)
            return complete, None
        return complete, state

    def ancestors(
        self, thread_id: str, ns: str, checkpoint_id: str, channels: set[str], depth_hint: DepthHint | None = None
    ) -> Op[tuple[CheckpointEntry | None, list[CheckpointEntry]]]:
        """The chain from the checkpoints' link items (no bodies: about 500 to a
        1 MB Query page, whatever their values weigh), then the writes of the
        chain's checkpoints in one wave of Queries: round trips do not grow with
        the bytes between the target and the seed. ``depth_hint`` is not needed.
        Checkpoints written before links existed are walked from their items."""
        calls = self.calls
        upper = _keys.link_sort_key(ns, checkpoint_id)
        query = calls.query(thread_id, between=(_keys.link_ns_prefix(ns), upper))
        page, tomb = yield from request(query, calls.get_tombstone(thread_id, ns))
        deleted = _live_gen(calls, tomb, thread_id)
        links = [item.entry for item in map(calls.parse, page.get("Items", [])) if isinstance(item, Link)]
        if not links or links[0].checkpoint_id != checkpoint_id:
            return (yield from self._ancestors_by_items(thread_id, ns, checkpoint_id, channels))
        target = links[0]
        if target.gen < deleted:
            return None, []
        known = {e.checkpoint_id: e for e in links if e.gen >= deleted}
        chain: list[CheckpointEntry] = []
        older: list[CheckpointEntry] = []
        unseeded = set(channels)
        cursor = target.parent_id
        while cursor is not None and unseeded:
            entry = known.get(cursor)
            if entry is None:
                start = page.get("LastEvaluatedKey")
                if start is None:
                    # An ancestor written before link items existed (or gone): the
                    # walk goes on over the items themselves from the last one found.
                    last = chain[-1].checkpoint_id if chain else checkpoint_id
                    _, older = yield from self._ancestors_by_items(thread_id, ns, last, unseeded)
                    break
                page = yield from request_one(calls.query(thread_id, between=(_keys.link_ns_prefix(ns), upper), start_key=start))
                known.update((e.checkpoint_id, e) for e in (i.entry for i in map(calls.parse, page.get("Items", [])) if isinstance(i, Link)) if e.gen >= deleted)
                continue
            chain.append(entry)
            unseeded -= set(entry.loc)
            cursor = entry.parent_id
        # Each chain checkpoint's writes (with their bodies), all in one wave.
        found = yield from gather(*(self._writes_pages(thread_id, ns, e.checkpoint_id, None) for e in chain))
        for entry, writes in zip(chain, found):
            entry.writes = writes
        return target, chain + older

    def _ancestors_by_items(
        self, thread_id: str, ns: str, checkpoint_id: str, channels: set[str]
    ) -> Op[tuple[CheckpointEntry | None, list[CheckpointEntry]]]:
        """The walk over the checkpoint items themselves, bodies and all (1 MB pages)."""
        upper = _keys.checkpoint_sort_key(ns, checkpoint_id)
        prefix = _keys.ns_sort_prefix(ns)
        chain: list[CheckpointEntry] = []
        unseeded = set(channels)
        target: CheckpointEntry | None = None
        cursor: str | None = None  # the next ancestor id to find
        current: CheckpointEntry | None = None  # the chain entry whose writes follow
        start: dict[str, Any] | None = None
        while True:
            page = yield from request_one(self.calls.query(thread_id, between=(prefix, upper), start_key=start))
            for raw in page.get("Items", []):
                item = self.calls.parse(raw)
                if isinstance(item, WritesEntry):
                    if current is not None and item.checkpoint_id == current.checkpoint_id:
                        current.writes.append(item)  # type: ignore[union-attr]
                    continue
                if not isinstance(item, CheckpointEntry):
                    continue
                if chain and not unseeded:
                    return target, chain  # the seeding ancestor's writes are all read
                if target is None:
                    # The range ends at the target's own item: it comes first, or it does not exist.
                    if item.checkpoint_id != checkpoint_id:
                        return None, []
                    target, cursor = item, item.parent_id
                    continue
                current = item if item.checkpoint_id == cursor else None  # else: another fork
                if current is not None:
                    chain.append(current)
                    unseeded -= set(current.loc)
                    cursor = current.parent_id
            start = page.get("LastEvaluatedKey")
            if start is None or (cursor is None and current is None):
                return target, chain

    def write_batches(self, requests: list[dict[str, Any]], what: str) -> Op[None]:
        """BatchWriteItem in chunks of 25, re-sending what DynamoDB leaves unprocessed."""

        def take(result: dict[str, Any]) -> list[Any]:
            return result.get("UnprocessedItems", {}).get(self.table, [])

        yield from self._until_processed(requests, BATCH_WRITE_MAX, self.calls.batch_write, take, what)

    def _until_processed(
        self,
        pending: list[Any],
        size: int,
        make_call: Callable[[list[Any]], Any],
        take: Callable[[dict[str, Any]], list[Any]],
        what: str,
    ) -> Op[None]:
        """Send ``pending`` in chunks of ``size``; ``take`` reads an answer and returns
        what it left unprocessed, which goes again after a backoff (throttling)."""
        for attempt in range(_MAX_BATCH_ATTEMPTS):
            if not pending:
                return
            if attempt:
                yield Sleep(backoff(attempt))
            chunks = [pending[i : i + size] for i in range(0, len(pending), size)]
            results = yield from request(*(make_call(c) for c in chunks))
            pending = [left for result in results for left in take(result)]
        if pending:
            raise S3SaverError(f"DynamoDB table {self.table} kept refusing {len(pending)} {what} (throttled)")


def _listed_first(exc: BaseException) -> bool:
    """A listing transaction cancelled by its condition: another writer listed the thread."""
    if error_code(exc) != "TransactionCanceledException":
        return False
    reasons = [r.get("Code") for r in (getattr(exc, "response", {}) or {}).get("CancellationReasons", [])]
    return "ConditionalCheckFailed" in reasons and all(r in ("None", "ConditionalCheckFailed") for r in reasons)


def _writes_in(calls: DynamoCalls, page: dict[str, Any]) -> list[WritesEntry]:
    return [w for w in map(calls.parse, page.get("Items", [])) if isinstance(w, WritesEntry)]
