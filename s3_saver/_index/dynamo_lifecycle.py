"""The DynamoDB index's lifecycle: the table's setup, and a thread as a whole.

What ``DynamoIndex`` does beyond one checkpoint's path (``dynamodb``): create or
check the table, list threads, find a thread's creation time and the threads
of runs, read a thread's whole contents (or every thread's, for rebuild),
restore a thread's items, delete a thread, drop pruned checkpoints and copy a
thread. Kept apart so that each module holds one role; ``DynamoIndex`` mixes
``DynamoLifecycle`` in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from s3_saver import _keys
from s3_saver._index.base import (
    ArchiveRef,
    Archived,
    CheckpointEntry,
    IndexEntry,
    Key3,
    ThreadRef,
    Tombstone,
    WritesEntry,
)
from s3_saver._index.dynamo_items import (
    COPIED_FROM,
    GEN,
    RUN,
    PARTITION_KEY,
    SORT_KEY,
    TABLE_ATTRIBUTE_DEFINITIONS,
    TABLE_KEY_SCHEMA,
    TTL_ATTRIBUTE,
    DynamoCalls,
    Link,
    _live,
    _thread_item,
)
from s3_saver._codec import to_attrs
from s3_saver._protocol import Op, Sleep, gather, raise_failure, request, request_one
from s3_saver.errors import (
    TABLE_MISSING,
    TABLE_RACING_CODES,
    ConfigurationError,
    SetupMismatchError,
    SetupTimeoutError,
    classify,
    error_code,
)

# Passes of a delete over the thread: the second finds items that writers which
# read no tombstone yet committed during the first; a third is for good measure.
_MAX_DELETE_PASSES = 3
_POLL_SECONDS = 0.5
_POLL_LIMIT = 600


class DynamoLifecycle:
    """The table's setup and the operations on a thread as a whole, for ``DynamoIndex``."""

    # What these methods rely on, from DynamoIndex: the attributes its __init__
    # sets, and its methods latest, note and write_batches.
    calls: DynamoCalls
    table: str

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

    # -- a thread as a whole: contents, listing, runs, restore -------------------------
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
                        deleted[item.ns] = _live(item, thread_id).gen  # newest first: before its namespace's items
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
        latest = yield from gather(*(_or_archived(self.latest(r.thread_id, ""), r) for r in refs))
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

    def bury_runs(self, thread_id: str, run_ids: list[str]) -> Op[None]:
        yield from request(self.calls.bury_runs(thread_id, run_ids))

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
        archive = thread.archive
        # The tombstone keeps the creation time until the listing entry is gone,
        # so that a delete cut short still knows which one to remove; and the
        # archive object, until it is deleted.
        stale = archive.key if archive is not None else thread.stale_archive
        tomb = Tombstone(thread_id, None, gen, now, thread.created, stale_archive=stale)
        yield from request(calls.put(calls.tombstone_item(tomb)))
        if archive is not None:
            # The archive's namespaces read as deleted (their markers replaced) before its object goes.
            tombs = [Tombstone(thread_id, ns, gen, now) for ns in sorted(archive.newest)]
            yield from self.write_batches(
                [{"PutRequest": {"Item": calls.tombstone_item(t)}} for t in tombs], f"tombstones of thread {thread_id!r}"
            )
        if stale is not None:
            yield from delete_objects([ArchiveRef(stale, "", 0, 0, {})])
            yield from self.forget_archive(thread_id, stale)  # type: ignore[attr-defined]
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
        page, tomb, source_item = yield from request(
            calls.query(dest, limit=1, not_copied_from=source_pk), calls.get_tombstone(dest), calls.get_tombstone(source)
        )
        _live(_thread_item(calls, source_item), source)  # an archived source is restored first
        while not page.get("Items") and "LastEvaluatedKey" in page:
            page = yield from request_one(
                calls.query(dest, not_copied_from=source_pk, start_key=page["LastEvaluatedKey"])
            )
        if page.get("Items"):
            raise ConfigurationError(
                f"thread {dest!r} already has checkpoints of its own in table {self.table}; copy_thread "
                "copies into an empty thread (delete_thread it first)"
            )
        dest_gen = _live(_thread_item(calls, tomb), dest).gen

        # Exactly the items whose objects the first pass copied get copied: an item
        # committed to the source meanwhile is left out, never copied without its
        # objects. Deleted and expired checkpoints (and their writes) are skipped.
        copied: set[str] = set()
        deleted: dict[str, int] = {}
        kept: set[tuple[str, str]] = set()
        runs: set[str] = set()  # the copy's runs, for delete_for_runs to find it too

        def choose_and_copy(raws: list[dict[str, Any]]) -> Op[None]:
            chosen: list[IndexEntry] = []
            for raw in raws:
                entry = calls.parse(raw)
                if isinstance(entry, Tombstone):
                    if entry.ns is not None:
                        deleted[entry.ns] = _live(entry, source).gen  # newest first: before its namespace's items
                    continue
                if isinstance(entry, CheckpointEntry):
                    if entry.gen < deleted.get(entry.ns, 0) or expired(entry):
                        continue
                    kept.add((entry.ns, entry.checkpoint_id))
                    if entry.run_id is not None:
                        runs.add(entry.run_id)
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
        projection = (PARTITION_KEY, SORT_KEY, "loc", "token", GEN, TTL_ATTRIBUTE, RUN)
        yield from self._each_page(source, choose_and_copy, projection=projection)
        # Newest first: a copy cut short here leaves the target's latest state
        # right (and its history short) until copy_thread is called again.
        yield from self._each_page(source, write_items)
        yield from gather(self.note(dest, now, None), *(self.note(dest, None, r) for r in sorted(runs)))

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


def _or_archived(latest: Op[CheckpointEntry | None], ref: ThreadRef) -> Op[CheckpointEntry | None]:
    """A thread's latest root checkpoint; for an archived thread, the one its
    archive reference describes (and ``ref`` says it is archived)."""
    try:
        return (yield from latest)
    except Archived as archived:
        ref.archived = archived.ref.storage_class
        return archived.ref.latest


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


def _is_older(entry: IndexEntry | Link | None, gen: int) -> bool:
    """A checkpoint, link or writes item of a generation the delete removes."""
    return isinstance(entry, (CheckpointEntry, WritesEntry, Link)) and entry.gen < gen


def _check_region(index: DynamoLifecycle, bucket: str, bucket_region: str | None) -> None:
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
