"""The DynamoDB index backend: every index operation as Query/GetItem/PutItem/batch calls.

Newest first, each checkpoint item comes before its own writes (see ``_keys``),
so "latest" is one ``Query`` with ``Limit=1`` and a history page is one
``Query``; every read sends a GetItem of the thread's record in the same round
trip (archived? deleted below which generation?). Every commit is one
transaction checked against that record (see ``DynamoCalls.fence``).

This module holds a checkpoint's own path: commit a checkpoint and its writes,
read the latest, one checkpoint, a history page or an ancestor chain, and the
batch calls beneath them. The table's setup and what concerns a thread as a
whole (listing, run hints, restore, delete, prune, copy) are in
``dynamo_lifecycle``, mixed into ``DynamoIndex``: one class, two modules of one
role each.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from s3_saver._format import keys as _keys
from s3_saver._format.entries import (
    REGULAR_PART,
    CheckpointEntry,
    Key3,
    Tombstone,
    WritesEntry,
)
from s3_saver._format.entries import (
    Activity,
)
from s3_saver._index.terms import (
    DepthHint,
    Fenced,
    ParentGone,
    Prepared,
    WritesOutcome,
)
from s3_saver._index.base import (
    Index,
)
from s3_saver._index.dynamodb.items import DynamoCalls, Link, _listed_first, _live_gen, _thread_item
from s3_saver._index.activity import new_entry
from s3_saver._index.dynamodb.activity import DynamoActivity
from s3_saver._index.dynamodb.threads import DynamoThreads
from s3_saver._index.dynamodb.holdings import DynamoHoldings
from s3_saver._index.dynamodb.archive import DynamoArchive
from s3_saver._index.dynamodb.lifecycle import DynamoLifecycle
from s3_saver._format.keys import KeyLayout
from s3_saver._transport.protocol import Backoff, Op, backoff, gather, raise_failure, request, request_one
from s3_saver.errors import S3SaverError, Where
from s3_saver._transport.failures import error_code, throttled

BATCH_GET_MAX = 100  # BatchGetItem accepts at most 100 keys per request
BATCH_WRITE_MAX = 25  # BatchWriteItem accepts at most 25 requests
_MAX_BATCH_ATTEMPTS = 10
_MAX_TRANSACTION_ATTEMPTS = 10
_MAX_WRITE_ROUNDS = 8
CONDITION_FAILED = "ConditionalCheckFailed"
# Cancellation reasons worth sending a transaction again for ("None": an action
# that did not fail; the others are transient).
_RETRIED_REASONS = frozenset({"None", "TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"})
_JITTER = random.SystemRandom()  # never the random module's shared state (see _keys.new_token)


@dataclass
class _HistoryCursor:
    start: dict[str, Any] | None = None
    held: CheckpointEntry | None = None  # its writes may go on in the next page
    floor: int = 0  # the thread's generation: items below it are deleted
    deleted: dict[str, int] = field(default_factory=dict)  # earlier versions' namespace tombstones
    first: bool = True


class DynamoIndex(DynamoHoldings, DynamoArchive, DynamoThreads, DynamoLifecycle, DynamoActivity, Index):
    def __init__(self, table: str, layout: KeyLayout, where: Where | None = None) -> None:
        self.calls = DynamoCalls(table, layout, where)
        self.table = table

    def describe(self) -> str:
        return f"DynamoDB table {self.table}"

    # -- writes --------------------------------------------------------------------------
    def prepare(
        self,
        thread_id: str,
        ns: str,
        parent_id: str | None,
        list_at: int | None = None,
        gen: int | None = None,
        active: int | None = None,
    ) -> Op[Prepared]:
        # The activity entry goes in the commit's transaction (no request here).
        entry = new_entry(thread_id, active) if active is not None else None
        if gen is not None and parent_id is None:
            # Deleted-stays-deleted without a read: the commit's fence (the thread's
            # record at generation ``gen``, no archive, no mark, the run alive)
            # refuses what a read here would have, and hands the record back
            # (``refused._fenced`` decides then). A write costs its objects and the commit.
            return Prepared(gen, None, True, None, active=entry)
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
            entry,
        )

    def commit_checkpoint(
        self, entry: CheckpointEntry, created: int | None = None, parent_tag: str | None = None, active: Activity | None = None
    ) -> Op[None]:
        """One transaction: the item and its link (what the ancestor walk reads),
        checked against the thread's record (``DynamoCalls.fence``) and, when the
        entry carries values from its parent (``parent_tag``: the parent's tag
        as the writer read it), against the parent's item: the commit point.
        The day's activity entry (``active``) rides in it: no request of its own,
        and never there without the commit."""
        calls = self.calls
        fence = calls.fence(entry.thread_id, entry.gen, entry.run_id)
        put_active = None
        if active is not None:
            # The thread's record then names the entry (``recording``): the
            # fence's check becomes an update under the same condition.
            check = fence.pop("ConditionCheck")
            update, names, values, put_active = self.recording(active)
            check["UpdateExpression"] = "SET " + update
            check["ExpressionAttributeNames"].update(names)
            check["ExpressionAttributeValues"].update(values)
            fence["Update"] = check
        actions = [
            {"Put": {"TableName": self.table, "Item": calls.checkpoint_item(entry)}},
            {"Put": {"TableName": self.table, "Item": calls.link_item(entry)}},
            fence,
        ]
        if parent_tag is not None and entry.parent_id is not None:
            actions.append(calls.parent_fence(entry.thread_id, entry.ns, entry.parent_id, parent_tag))
        if put_active is not None:
            actions.append(put_active)
        refused = yield from self.transact(actions, f"checkpoint {entry.checkpoint_id} of thread {entry.thread_id!r}")
        if refused:
            self._fenced(entry.thread_id, refused[2])
            raise ParentGone()

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

    def unnote(self, thread_id: str, created: int | None, run_id: str | None) -> Op[None]:
        calls = [self.calls.delete(self.calls.run_key(run_id, thread_id))] if run_id is not None else []
        if created is not None:
            calls.append(self.calls.unlist_thread(created, thread_id))
        if not calls:
            return
        results = yield tuple(calls)
        for call, result in zip(calls, results):
            if isinstance(result, BaseException) and not _listed_first(result):
                raise_failure(call, result)

    def commit_writes(self, entries: list[WritesEntry]) -> Op[WritesOutcome]:
        """One transaction of every part, checked against the thread's record.

        A part is put only if its slot is empty: the first committed regular
        part wins; a special channel's part replaces exactly the part it found
        (the transaction is sent again with that token as its condition), so
        the part it replaced is known (``WritesOutcome.unused``). A part whose
        slot holds this call's own token was applied by an earlier attempt."""
        calls = self.calls
        outcome = WritesOutcome()
        thread_id = entries[0].thread_id
        # Per part: the token it must replace (None: the slot must be empty).
        pending: dict[int, str | None] = dict.fromkeys(range(len(entries)))
        for _ in range(_MAX_WRITE_ROUNDS):
            order = list(pending)
            if not order:
                return outcome
            actions = [calls.put_part(entries[i], pending[i]) for i in order]
            actions.append(calls.fence(thread_id, entries[0].gen))
            refused = yield from self.transact(actions, f"pending writes of thread {thread_id!r}")
            if not refused:
                outcome.unused += [(entries[i], pending[i]) for i in order if pending[i] is not None]
                return outcome
            self._fenced(thread_id, refused[-1])
            for i, (code, item) in zip(order, refused):
                if code != CONDITION_FAILED:
                    continue
                entry, found = entries[i], (item or {}).get("token", {}).get("S")
                if found == entry.token:
                    # Our own part, applied by an attempt whose answer was lost.
                    if pending[i] is not None:
                        outcome.unused.append((entry, pending[i]))
                    del pending[i]
                elif entry.part.startswith(REGULAR_PART):
                    outcome.unused.append((entry, entry.token))  # first committed wins
                    del pending[i]
                else:
                    pending[i] = found  # last committed wins: replace what is there now
        raise S3SaverError(
            f"DynamoDB table {self.table}: the pending writes of thread {thread_id!r} kept changing under "
            f"other writers; gave up after {_MAX_WRITE_ROUNDS} rounds"
        )

    def transact(self, actions: list[dict[str, Any]], what: str) -> Op[list[tuple[str, Any]]]:
        """TransactWriteItems: [] once applied; the cancellation reasons (code,
        item), one per action, when a condition refused it. A conflict with
        another transaction on the same items is sent again after a backoff."""
        for attempt in range(1, _MAX_TRANSACTION_ATTEMPTS + 1):
            call = self.calls.transact(actions)
            (result,) = yield (call,)
            if not isinstance(result, BaseException):
                return []
            reasons = _reasons(result)
            codes = {code for code, _ in reasons}
            # Throttled alone: the retry policy around this operation already rode it
            # out for its throttle_budget (retrying here too would multiply it).
            if error_code(result) != "TransactionCanceledException" or not reasons or throttled(result):
                raise_failure(call, result)
            if CONDITION_FAILED in codes:
                return reasons
            if not codes <= _RETRIED_REASONS:
                raise_failure(call, result)
            if (yield Backoff(_JITTER.uniform(0, backoff(attempt)), attempt)) is False:
                break
        raise S3SaverError(
            f"DynamoDB table {self.table}: {what} kept conflicting with other transactions; "
            f"gave up after {attempt} attempts (at most {_MAX_TRANSACTION_ATTEMPTS}, within the retry budget and deadline())"
        )

    def _fenced(self, thread_id: str, reason: tuple[str, Any]) -> None:
        """Raise Fenced when the thread's record refused the transaction."""
        code, item = reason
        if code == CONDITION_FAILED:
            record = self.calls.parse(item) if item else None
            raise Fenced(record if isinstance(record, Tombstone) else Tombstone(thread_id, None, 0))

    # -- reads -------------------------------------------------------------------------
    def latest(self, thread_id: str, ns: str) -> Op[CheckpointEntry | None]:
        """One Query with Limit=1, beside the thread's record (one round trip):
        the record says whether the thread is archived and which generation a
        delete left (items of an older one are the delete's to remove, never
        read). Writes stored before their checkpoint (a newer id with no
        checkpoint item yet) can come first: the range narrows below that id."""
        calls = self.calls
        prefix = _keys.ns_sort_prefix(ns)
        upper: str | None = None
        start: dict[str, Any] | None = None
        floor: int | None = None  # the thread's generation, once its record is read
        while True:
            if upper is None:
                call = calls.query(thread_id, begins_with=prefix, limit=1, start_key=start, min_gen=floor or 0)
            else:
                call = calls.query(thread_id, between=(prefix, upper), limit=1, start_key=start, min_gen=floor or 0)
            if floor is None:
                page, record = yield from request(call, calls.get_tombstone(thread_id))
                floor = _live_gen(calls, record, thread_id)
            else:
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
            if isinstance(entry, Tombstone):
                # A namespace's tombstone, as earlier versions wrote them (they sort first).
                floor, start = max(floor, entry.gen), calls.tombstone_key(thread_id, ns)
            elif entry is None or entry.gen < floor:  # type: ignore[union-attr]
                # Deleted (a delete still to finish): read on above the record's generation.
                start = None
            elif isinstance(entry, CheckpointEntry) and entry.hidden:
                # Kept by prune for newer checkpoints, which come first: only a
                # prune of a newer one cut short leaves it on top.
                upper, start = _keys.checkpoint_sort_prefix(ns, entry.checkpoint_id), None
            elif isinstance(entry, CheckpointEntry):
                entry.writes = None  # read with the values, in the next wave
                return entry
            else:
                assert isinstance(entry, WritesEntry)
                upper, start = _keys.checkpoint_sort_prefix(ns, entry.checkpoint_id), None

    def get(self, thread_id: str, ns: str, checkpoint_id: str) -> Op[CheckpointEntry | None]:
        calls = self.calls
        # The item, its writes and the thread's record in one wave.
        writes_query = calls.query(
            thread_id, begins_with=_keys.writes_sort_prefix(ns, checkpoint_id), newest_first=False
        )
        found, page, record = yield from request(
            calls.get_checkpoint(thread_id, ns, checkpoint_id), writes_query, calls.get_tombstone(thread_id)
        )
        deleted = _live_gen(calls, record, thread_id)  # first: an archived thread's items are not read
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
            upper = _keys.checkpoint_sort_prefix(ns, before_id)
            prefix = _keys.ns_sort_prefix(ns)
            call = calls.query(thread_id, between=(prefix, upper), limit=page_size, start_key=state.start)
        else:
            call = calls.query(thread_id, begins_with=_keys.ns_sort_prefix(ns), limit=page_size, start_key=state.start)
        if state.first:
            # The thread's record beside the first page: archived, or the
            # generation below which items are a delete's to remove.
            page, record = yield from request(call, calls.get_tombstone(thread_id))
            state.floor = _live_gen(calls, record, thread_id)
        else:
            page = yield from request_one(call)
        state.first = False
        complete: list[CheckpointEntry] = []
        for raw in page.get("Items", []):
            item = calls.parse(raw)
            if isinstance(item, Tombstone):
                if item.ns is not None:  # a namespace's tombstone, as earlier versions wrote them
                    state.deleted[item.ns] = item.gen
                continue
            if item is None or isinstance(item, Link) or item.gen < max(state.floor, state.deleted.get(item.ns, 0)):
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
        page, record = yield from request(query, calls.get_tombstone(thread_id))
        deleted = _live_gen(calls, record, thread_id)
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
            if attempt and (yield Backoff(backoff(attempt), attempt)) is False:
                break
            chunks = [pending[i : i + size] for i in range(0, len(pending), size)]
            results = yield from request(*(make_call(c) for c in chunks))
            pending = [left for result in results for left in take(result)]
        if pending:
            raise S3SaverError(
                f"DynamoDB table {self.table} kept refusing {len(pending)} {what} (throttled; "
                "gave up within the retry budget and deadline())"
            )


def _reasons(exc: BaseException) -> list[tuple[str, Any]]:
    """A cancelled transaction's reasons: (code, the item as stored or None), per action."""
    reasons = (getattr(exc, "response", {}) or {}).get("CancellationReasons") or []
    return [(r.get("Code") or "None", r.get("Item")) for r in reasons]


def _writes_in(calls: DynamoCalls, page: dict[str, Any]) -> list[WritesEntry]:
    return [w for w in map(calls.parse, page.get("Items", [])) if isinstance(w, WritesEntry)]
