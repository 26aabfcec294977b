"""The DynamoDB index backend: every index operation as Query/GetItem/PutItem/batch calls.

Newest first, a namespace's tombstone comes before its items and each checkpoint
item before its own writes (see ``_keys``), so "latest" is one ``Query`` with
``Limit=1`` and a history page is one ``Query``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from s3_saver import _keys
from s3_saver._index.base import (
    REGULAR_PART,
    CheckpointEntry,
    DepthHint,
    Index,
    IndexEntry,
    Key3,
    Prepared,
    ThreadRef,
    Tombstone,
    WritesEntry,
    WritesOutcome,
)
from s3_saver._index.dynamo_items import (
    COPIED_FROM,
    GEN,
    PARTITION_KEY,
    SORT_KEY,
    TABLE_ATTRIBUTE_DEFINITIONS,
    TABLE_KEY_SCHEMA,
    TTL_ATTRIBUTE,
    DynamoCalls,
    Link,
)
from s3_saver._codec import to_attrs
from s3_saver._keys import KeyLayout
from s3_saver._protocol import Op, Sleep, backoff, gather, raise_failure, request, request_one
from s3_saver.errors import (
    CONDITION_FAILED_CODES,
    TABLE_MISSING,
    TABLE_RACING_CODES,
    ConfigurationError,
    S3SaverError,
    SetupMismatchError,
    SetupTimeoutError,
    Where,
    classify,
    error_code,
)

BATCH_GET_MAX = 100  # BatchGetItem accepts at most 100 keys per request
BATCH_WRITE_MAX = 25  # BatchWriteItem accepts at most 25 requests
_MAX_BATCH_ATTEMPTS = 10
# Passes of a delete over the thread: the second finds items that writers which
# read no tombstone yet committed during the first; a third is for good measure.
_MAX_DELETE_PASSES = 3
_POLL_SECONDS = 0.5
_POLL_LIMIT = 600


@dataclass
class _HistoryCursor:
    start: dict[str, Any] | None = None
    held: CheckpointEntry | None = None  # its writes may go on in the next page
    deleted: dict[str, int] = field(default_factory=dict)
    first: bool = True


class DynamoIndex(Index):
    def __init__(self, table: str, layout: KeyLayout, where: Where | None = None) -> None:
        self.calls = DynamoCalls(table, layout, where)
        self.table = table

    def describe(self) -> str:
        return f"DynamoDB table {self.table}"

    # -- setup -------------------------------------------------------------------------
    def setup(self, bucket: str, bucket_region: str | None, ttl: bool) -> Op[None]:
        calls = self.calls
        (described,) = yield (calls.describe(),)
        if isinstance(described, BaseException):
            if classify(described) != TABLE_MISSING:
                raise_failure(calls.describe(), described)
            _check_region(self, bucket, bucket_region)
            (created,) = yield (calls.create(),)
            if isinstance(created, BaseException) and error_code(created) not in TABLE_RACING_CODES:
                raise_failure(calls.create(), created)
            status = None
        else:
            _check_shape(self.table, described["Table"])
            status = described["Table"].get("TableStatus")
        for _ in range(_POLL_LIMIT):
            if status == "ACTIVE":
                break
            if status is not None:
                yield Sleep(_POLL_SECONDS)
            status = (yield from request_one(calls.describe()))["Table"]["TableStatus"]
        else:
            raise SetupTimeoutError(
                f"table {self.table} did not become ACTIVE within {_POLL_LIMIT * _POLL_SECONDS:.0f} s; "
                "run setup() again"
            )
        if ttl:
            described_ttl = yield from request_one(calls.describe_ttl())
            if described_ttl.get("TimeToLiveDescription", {}).get("TimeToLiveStatus") not in {"ENABLED", "ENABLING"}:
                yield from request_one(calls.enable_ttl())

    # -- writes --------------------------------------------------------------------------
    def prepare(self, thread_id: str, ns: str, parent_id: str | None) -> Op[Prepared]:
        calls = [self.calls.get_tombstone(thread_id)]
        if parent_id is not None:
            calls.append(self.calls.get_checkpoint(thread_id, ns, parent_id))
        found = yield from request(*calls)
        parent = self.calls.parse(found[1]["Item"]) if parent_id is not None and "Item" in found[1] else None
        thread = _thread_item(self.calls, found[0])
        return Prepared(thread.gen, parent if isinstance(parent, CheckpointEntry) else None, bool(thread.created))

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
            # A cancelled listing: another writer listed the thread first.
            if isinstance(result, BaseException) and error_code(result) != "TransactionCanceledException":
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
                min_gen, start = entry.gen, calls.tombstone_key(thread_id, ns)
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
        entry = calls.parse(found["Item"]) if "Item" in found else None
        if not isinstance(entry, CheckpointEntry) or entry.hidden or entry.gen < _gen_of(calls, tomb):
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
            state.deleted[ns] = _gen_of(calls, tomb)
        else:
            page = yield from request_one(call)
        state.first = False
        complete: list[CheckpointEntry] = []
        for raw in page.get("Items", []):
            item = calls.parse(raw)
            if isinstance(item, Tombstone):
                if item.ns is not None:
                    state.deleted[item.ns] = item.gen
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
        deleted = _gen_of(calls, tomb)
        links = [item.entry for item in map(calls.parse, page.get("Items", [])) if isinstance(item, Link)]
        if not links or links[0].checkpoint_id != checkpoint_id:
            return (yield from self._ancestors_by_items(thread_id, ns, checkpoint_id, channels))
        target = links[0]
        if target.gen < deleted:
            return None, []
        known = {e.checkpoint_id: e for e in links if e.gen >= deleted}
        chain: list[CheckpointEntry] = []
        unseeded = set(channels)
        cursor = target.parent_id
        while cursor is not None and unseeded:
            entry = known.get(cursor)
            if entry is None:
                start = page.get("LastEvaluatedKey")
                if start is None:
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
        return target, chain

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

    def contents(self, thread_id: str) -> Op[list[CheckpointEntry]]:
        checkpoints: list[CheckpointEntry] = []
        writes: list[WritesEntry] = []
        deleted: dict[str, int] = {}

        def take(raws: list[dict[str, Any]]) -> Op[None]:
            yield from ()
            for raw in raws:
                item = self.calls.parse(raw)
                if isinstance(item, Tombstone):
                    if item.ns is not None:
                        deleted[item.ns] = item.gen  # newest first: before its namespace's items
                elif isinstance(item, CheckpointEntry) and item.gen >= deleted.get(item.ns, 0):
                    checkpoints.append(item)
                elif isinstance(item, WritesEntry) and item.gen >= deleted.get(item.ns, 0):
                    writes.append(item)

        yield from self._each_page(thread_id, take)
        return _attach(checkpoints, writes)

    def threads(
        self, before: ThreadRef | None, page_size: int, cursor: Any
    ) -> Op[tuple[list[tuple[ThreadRef, CheckpointEntry | None]], Any]]:
        """A Query of the listing partition, then each thread's latest in one wave."""
        after = _keys.listing_sort_key(before.created, before.thread_id) if before is not None else None
        page = yield from request_one(self.calls.query_listing(after, page_size, cursor))
        refs = [
            ThreadRef(t, created)
            for created, t in (_keys.parse_listing_sort_key(r[SORT_KEY]["S"]) for r in page.get("Items", []))
        ]
        latest = yield from gather(*(self.latest(r.thread_id, "") for r in refs))
        return list(zip(refs, latest)), page.get("LastEvaluatedKey")

    def created(self, thread_id: str) -> Op[int | None]:
        found = yield from request_one(self.calls.get_tombstone(thread_id))
        return _thread_item(self.calls, found).created or None

    def runs(self, run_ids: list[str]) -> Op[dict[str, list[str]]]:
        found: dict[str, list[str]] = {r: [] for r in run_ids}
        pending: dict[str, Any] = {r: None for r in run_ids}
        while pending:
            order = list(pending)
            pages = yield from request(*(self.calls.query_run(r, pending[r]) for r in order))
            pending = {}
            for run_id, page in zip(order, pages):
                found[run_id] += [_keys.decode(r[SORT_KEY]["S"][len(_keys.run_sort_prefix(run_id)) :]) for r in page.get("Items", [])]
                if page.get("LastEvaluatedKey"):
                    pending[run_id] = page["LastEvaluatedKey"]
        return found

    def forget_runs(self, pairs: list[tuple[str, str]]) -> Op[None]:
        keys = [{k: v for k, v in self.calls.run_item(r, t).items()} for r, t in pairs]
        yield from self.write_batches([{"DeleteRequest": {"Key": k}} for k in keys], "run hints")

    def all_threads(self) -> Op[list[CheckpointEntry]]:
        """A table scan: the only operation that reads every partition."""
        entries: dict[Key3, CheckpointEntry] = {}
        writes: list[WritesEntry] = []
        deleted: dict[tuple[str, str], int] = {}
        start: dict[str, Any] | None = None
        while True:
            page = yield from request_one(self.calls.scan(start))
            for raw in page.get("Items", []):
                item = self.calls.parse(raw)  # None: an item of another key prefix
                if isinstance(item, CheckpointEntry):
                    entries[item.key] = item
                elif isinstance(item, WritesEntry):
                    writes.append(item)
                elif isinstance(item, Tombstone) and item.ns is not None:
                    deleted[(item.thread_id, item.ns)] = item.gen
            start = page.get("LastEvaluatedKey")
            if start is None:
                break
        live = {k: e for k, e in entries.items() if e.gen >= deleted.get(k[:2], 0) and not e.hidden}
        for w in writes:
            owner = live.get((w.thread_id, w.ns, w.checkpoint_id))
            if owner is not None:
                owner.writes.append(w)  # type: ignore[union-attr]
        return list(live.values())

    def restore(
        self, thread_id: str, entries: list[CheckpointEntry], writes: list[WritesEntry], created: int
    ) -> Op[None]:
        # Entries keep generation 0: where a tombstone survived the loss of the
        # rest of the index, what it deleted stays deleted.
        items = [self.calls.checkpoint_item(e) for e in entries] + [self.calls.link_item(e) for e in entries]
        items += [self.calls.writes_item(w) for w in writes]
        yield from self.write_batches([{"PutRequest": {"Item": i}} for i in items], f"entries of thread {thread_id!r}")
        yield from self.note(thread_id, created, None)

    # -- delete and copy ---------------------------------------------------------------
    def delete_thread(
        self, thread_id: str, now: int, delete_objects: Callable[[list[IndexEntry]], Op[None]]
    ) -> Op[None]:
        """The thread's tombstone first (writers refuse an older history), then per
        namespace its tombstone before any of its objects or items (readers ignore
        older generations), then objects, then items. Items of the new generation
        (the id used again meanwhile) are never touched. Tombstones stay: they keep
        a late write of the old run invisible."""
        calls = self.calls
        found, first = yield from request(
            calls.get_tombstone(thread_id), calls.query(thread_id, limit=1, projection=(PARTITION_KEY, SORT_KEY))
        )
        if "Item" not in found and not first.get("Items"):
            return  # nothing was ever stored: leave no trace
        thread = _thread_item(calls, found)
        gen = thread.gen + 1
        # The tombstone keeps the creation time until the listing entry is gone,
        # so that a delete cut short still knows which one to remove.
        yield from request(calls.put(calls.tombstone_item(Tombstone(thread_id, None, gen, now, thread.created))))
        if thread.created:
            yield from request(calls.unlist_thread(thread.created, thread_id))
        buried: set[str] = set()
        for _ in range(_MAX_DELETE_PASSES):
            deleted_any = False
            start: dict[str, Any] | None = None
            while True:
                page = yield from request_one(
                    calls.query(
                        thread_id,
                        newest_first=False,
                        start_key=start,
                        projection=(PARTITION_KEY, SORT_KEY, "loc", "token", GEN),
                    )
                )
                raws = [r for r in page.get("Items", []) if _is_older(calls.parse(r), gen)]
                if raws:
                    deleted_any = True
                    entries = [calls.parse(r) for r in raws]
                    namespaces = sorted({e.ns for e in entries} - buried)  # type: ignore[union-attr]
                    if namespaces:
                        # Readers see these namespaces as gone before anything of them is.
                        tombs = [Tombstone(thread_id, ns, gen, now) for ns in namespaces]
                        yield from self.write_batches(
                            [{"PutRequest": {"Item": calls.tombstone_item(t)}} for t in tombs],
                            f"tombstones of thread {thread_id!r}",
                        )
                        buried.update(namespaces)
                    yield from delete_objects([e for e in entries if not isinstance(e, Link)])  # type: ignore[misc]
                    yield from self.write_batches(
                        [{"DeleteRequest": {"Key": {k: r[k] for k in (PARTITION_KEY, SORT_KEY)}}} for r in raws],
                        f"deletes of thread {thread_id!r}",
                    )
                start = page.get("LastEvaluatedKey")
                if start is None:
                    break
            if not deleted_any:
                return

    def drop(
        self,
        thread_id: str,
        hide: list[CheckpointEntry],
        drop: list[CheckpointEntry],
        doomed: list[IndexEntry],
        delete_objects: Callable[[list[IndexEntry]], Op[None]],
    ) -> Op[None]:
        """Hidden items are written again with the mark (readers skip them from
        then on), then the dropped items and their writes go, then the objects
        (a cut here leaves unreferenced objects only: see ``gc`` in the README)."""
        calls = self.calls
        hidden = [replace(e, hidden=True) for e in hide]
        yield from self.write_batches(
            [{"PutRequest": {"Item": calls.checkpoint_item(e)}} for e in hidden], f"hidden checkpoints of thread {thread_id!r}"
        )
        keys = [calls.key_of(*e.key) for e in drop]
        keys += [{k: v for k, v in calls.link_item(e).items() if k in (PARTITION_KEY, SORT_KEY)} for e in drop]
        for e in drop:
            keys += [
                to_attrs({PARTITION_KEY: calls.pk(thread_id), SORT_KEY: _keys.writes_sort_key(w.ns, w.checkpoint_id, w.task_id, w.part)})
                for w in e.writes or ()
            ]
        yield from self.write_batches([{"DeleteRequest": {"Key": k}} for k in keys], f"dropped checkpoints of thread {thread_id!r}")
        yield from delete_objects(doomed)

    def copy_thread(
        self,
        source: str,
        dest: str,
        copy_objects: Callable[[list[IndexEntry]], Op[None]],
        expired: Callable[[CheckpointEntry], bool],
        now: int,
    ) -> Op[None]:
        calls = self.calls
        source_pk, dest_pk = calls.pk(source), calls.pk(dest)
        # The target may hold only what an interrupted copy from this same source
        # wrote (copies are marked): copying again completes it. Anything else is
        # the target's own history, which a copy must not mix with. Tombstones of
        # a deleted target do not count; its delete generation goes on the copies.
        page, tomb = yield from request(
            calls.query(dest, limit=1, not_copied_from=source_pk), calls.get_tombstone(dest)
        )
        while not page.get("Items") and "LastEvaluatedKey" in page:
            page = yield from request_one(
                calls.query(dest, not_copied_from=source_pk, start_key=page["LastEvaluatedKey"])
            )
        if page.get("Items"):
            raise ConfigurationError(
                f"thread {dest!r} already has checkpoints of its own in table {self.table}; copy_thread "
                "copies into an empty thread (delete_thread it first)"
            )
        dest_gen = _gen_of(calls, tomb)

        # Exactly the items whose objects the first pass copied get copied: an item
        # committed to the source meanwhile is left out, never copied without its
        # objects. Deleted and expired checkpoints (and their writes) are skipped.
        copied: set[str] = set()
        deleted: dict[str, int] = {}
        kept: set[tuple[str, str]] = set()

        def choose_and_copy(raws: list[dict[str, Any]]) -> Op[None]:
            chosen: list[IndexEntry] = []
            for raw in raws:
                entry = calls.parse(raw)
                if isinstance(entry, Tombstone):
                    if entry.ns is not None:
                        deleted[entry.ns] = entry.gen  # newest first: before its namespace's items
                    continue
                if isinstance(entry, CheckpointEntry):
                    if entry.gen < deleted.get(entry.ns, 0) or expired(entry):
                        continue
                    kept.add((entry.ns, entry.checkpoint_id))
                elif isinstance(entry, Link):
                    # Links sort below every namespace: their checkpoints were seen.
                    if entry.entry.key[1:] in kept:
                        copied.add(raw[SORT_KEY]["S"])
                    continue
                elif not isinstance(entry, WritesEntry) or (entry.ns, entry.checkpoint_id) not in kept:
                    continue  # newest first, a checkpoint's item comes before its writes
                copied.add(raw[SORT_KEY]["S"])
                chosen.append(entry)
            yield from copy_objects(chosen)

        def write_items(raws: list[dict[str, Any]]) -> Op[None]:
            copies = []
            for raw in raws:
                if raw[SORT_KEY]["S"] not in copied:
                    continue
                item = {**raw, PARTITION_KEY: {"S": dest_pk}, COPIED_FROM: {"S": source_pk}}
                item.pop(GEN, None)
                if dest_gen:
                    item[GEN] = {"N": str(dest_gen)}
                copies.append(item)
            yield from self.write_batches([{"PutRequest": {"Item": i}} for i in copies], f"copies into thread {dest!r}")

        # Every object before the first index item, as for every write: the target
        # shows nothing until all its objects exist.
        projection = (PARTITION_KEY, SORT_KEY, "loc", "token", GEN, TTL_ATTRIBUTE)
        yield from self._each_page(source, choose_and_copy, projection=projection)
        # Newest first: a copy cut short here leaves the target's latest state
        # right (and its history short) until copy_thread is called again.
        yield from self._each_page(source, write_items)
        yield from self.note(dest, now, None)

    def _each_page(
        self,
        thread_id: str,
        handle: Callable[[list[dict[str, Any]]], Op[None]],
        projection: tuple[str, ...] | None = None,
    ) -> Op[None]:
        start: dict[str, Any] | None = None
        while True:
            page = yield from request_one(self.calls.query(thread_id, start_key=start, projection=projection))
            yield from handle(page.get("Items", []))
            start = page.get("LastEvaluatedKey")
            if start is None:
                return

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


def _thread_item(calls: DynamoCalls, found: dict[str, Any]) -> Tombstone:
    """The thread's tombstone item from a GetItem's answer (generation 0, not
    listed: there is none)."""
    entry = calls.parse(found["Item"]) if "Item" in found else None
    return entry if isinstance(entry, Tombstone) else Tombstone("", None, 0)


def _gen_of(calls: DynamoCalls, found: dict[str, Any]) -> int:
    """The generation of a tombstone GetItem's answer (0: no tombstone)."""
    return _thread_item(calls, found).gen


def _attach(checkpoints: list[CheckpointEntry], writes: list[WritesEntry]) -> list[CheckpointEntry]:
    """Checkpoints with their writes (writes of no checkpoint are left out)."""
    by_key = {(e.ns, e.checkpoint_id): e for e in checkpoints}
    for e in checkpoints:
        e.writes = []
    for w in writes:
        owner = by_key.get((w.ns, w.checkpoint_id))
        if owner is not None:
            owner.writes.append(w)  # type: ignore[union-attr]
    return checkpoints


def _writes_in(calls: DynamoCalls, page: dict[str, Any]) -> list[WritesEntry]:
    return [w for w in map(calls.parse, page.get("Items", [])) if isinstance(w, WritesEntry)]


def _is_older(entry: IndexEntry | Link | None, gen: int) -> bool:
    """A checkpoint, link or writes item of a generation the delete removes."""
    return isinstance(entry, (CheckpointEntry, WritesEntry, Link)) and entry.gen < gen


def _check_region(index: DynamoIndex, bucket: str, bucket_region: str | None) -> None:
    """Refuse to create an index next to a bucket that lives in another region.

    A wrong ``region_name`` finds no table; creating one there would give the
    bucket a second, empty index. HeadBucket names the bucket's region.
    """
    where = index.calls.where
    table_region = where.region("dynamodb") if where is not None else None
    if bucket_region and table_region and bucket_region != table_region:
        raise ConfigurationError(
            f"bucket {bucket!r} lives in region {bucket_region}, but the saver's region is {table_region}, "
            f"where table {index.table!r} does not exist. setup() created nothing: set "
            f"region_name={bucket_region!r} if the table lives with the bucket, or pass clients for each region"
        )


def _check_shape(table: str, description: dict[str, Any]) -> None:
    keys = sorted((k["AttributeName"], k["KeyType"]) for k in description["KeySchema"])
    want = sorted((k["AttributeName"], k["KeyType"]) for k in TABLE_KEY_SCHEMA)
    types = {a["AttributeName"]: a["AttributeType"] for a in description.get("AttributeDefinitions", [])}
    want_types = {a["AttributeName"]: a["AttributeType"] for a in TABLE_ATTRIBUTE_DEFINITIONS}
    if keys != want or any(types.get(n) != t for n, t in want_types.items()):
        raise SetupMismatchError(
            f"table {table} has key schema {keys} with types {types}; the saver needs "
            f"{want} with types {want_types} (and TTL attribute {TTL_ATTRIBUTE!r}). "
            "Use another table name or recreate it."
        )
