"""The DynamoDB index backend: every index operation as Query/GetItem/PutItem/batch calls.

Newest first, each checkpoint item comes before its own writes (see ``_format/keys``),
so "latest" is one ``Query`` with ``Limit=1`` and a history page is one
``Query``; every read sends a GetItem of the thread's record in the same round
trip (archived? deleted below which generation?). Every commit is one
transaction checked against that record (see ``DynamoCalls.fence``).

This module holds a checkpoint's writes: prepare, commit a checkpoint and its writes, note a
thread listed, and the transaction and batch calls beneath them. ``DynamoIndex`` mixes in the
rest, one role a module: the reads (``reads``), the table's setup and a thread as read whole
(``threads``), a thread changed whole (``lifecycle``), archives (``archive``), activity
entries (``activity``) and what a thread holds (``holdings``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from s3_saver._format.entries import (
    REGULAR_PART,
    Activity,
    CheckpointEntry,
    Tombstone,
    WritesEntry,
)
from s3_saver._format.keys import KeyLayout
from s3_saver._index.activity import new_entry
from s3_saver._index.base import (
    Index,
)
from s3_saver._index.dynamodb.activity import DynamoActivity
from s3_saver._index.dynamodb.archive import DynamoArchive
from s3_saver._index.dynamodb.holdings import DynamoHoldings
from s3_saver._index.dynamodb.items import DynamoCalls, _listed_first, _thread_item
from s3_saver._index.dynamodb.lifecycle import DynamoLifecycle
from s3_saver._index.dynamodb.reads import DynamoReads
from s3_saver._index.dynamodb.threads import DynamoThreads
from s3_saver._index.terms import (
    Fenced,
    ParentGone,
    Prepared,
    WritesOutcome,
)
from s3_saver._transport.failures import error_code, throttled
from s3_saver._transport.protocol import Backoff, Op, backoff, raise_failure, request
from s3_saver.errors import S3SaverError, Where

BATCH_WRITE_MAX = 25  # BatchWriteItem accepts at most 25 requests
_MAX_BATCH_ATTEMPTS = 10
_MAX_TRANSACTION_ATTEMPTS = 10
_MAX_WRITE_ROUNDS = 8
CONDITION_FAILED = "ConditionalCheckFailed"
# Cancellation reasons worth sending a transaction again for ("None": an action
# that did not fail; the others are transient).
_RETRIED_REASONS = frozenset({"None", "TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"})
_JITTER = random.SystemRandom()  # never the random module's shared state (see keys.new_token)


class DynamoIndex(DynamoReads, DynamoHoldings, DynamoArchive, DynamoThreads, DynamoLifecycle, DynamoActivity, Index):
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
            # (``commit._fenced`` decides then). A write costs its objects and the commit.
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
        self,
        entry: CheckpointEntry,
        created: int | None = None,
        parent_tag: str | None = None,
        active: Activity | None = None,
        key_id: str | None = None,
    ) -> Op[None]:
        """One transaction: the item and its link (what the ancestor walk reads),
        checked against the thread's record (``DynamoCalls.fence``) and, when the
        entry carries values from its parent (``parent_tag``: the parent's tag
        as the writer read it), against the parent's item: the commit point.
        The day's activity entry (``active``) rides in it: no request of its own,
        and never there without the commit."""
        calls = self.calls
        fence = calls.fence(entry.thread_id, entry.gen, entry.run_id, key_id)
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

    def commit_writes(self, entries: list[WritesEntry], key_id: str | None = None) -> Op[WritesOutcome]:
        """One transaction of every part, checked against the thread's record.

        A part is put only if its slot is empty: the first committed regular
        part wins; a special channel's part replaces exactly the part it found
        (the transaction is sent again with that token as its condition), so
        the part it replaced is known (``WritesOutcome.unused``). A part whose
        slot holds this call's own token was applied by an earlier attempt.

        A global table: a regular part that loses to a part another region
        committed first is adopted by the transaction that commits the call's
        other parts (``DynamoCalls.adopt_part``): its item names this region
        from then on. Readers keep one region's parts per task (``one_line``): left naming
        the other region, the slot this call kept would be read as another
        run's and passed over beside the call's own parts, a torn call."""
        calls = self.calls
        outcome = WritesOutcome()
        thread_id = entries[0].thread_id
        # Per part: the token it must replace (None: the slot must be empty).
        pending: dict[int, str | None] = dict.fromkeys(range(len(entries)))
        # Per regular part lost to another region's part: that part's token.
        adopt: dict[int, str] = {}
        for _ in range(_MAX_WRITE_ROUNDS):
            order, taking = list(pending), list(adopt)
            if not order and not taking:
                return outcome
            actions = [calls.put_part(entries[i], pending[i]) for i in order]
            actions += [calls.adopt_part(entries[i], adopt[i]) for i in taking]
            actions.append(calls.fence(thread_id, entries[0].gen, None, key_id))
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
                    if found is not None and calls.foreign(item):
                        adopt[i] = found
                else:
                    pending[i] = found  # last committed wins: replace what is there now
            for i, (code, item) in zip(taking, refused[len(order):]):
                if code != CONDITION_FAILED:
                    continue
                # The slot changed since: adopt what it holds now, if another region's.
                found = (item or {}).get("token", {}).get("S")
                if found is None:
                    # Emptied: this call's own part goes in after all.
                    outcome.unused.remove((entries[i], entries[i].token))
                    pending[i] = None
                    del adopt[i]
                elif calls.foreign(item):
                    adopt[i] = found
                else:
                    del adopt[i]
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


