"""The DynamoDB index's threads: the table's setup, a thread's contents, the threads listed,
created and active, the threads of runs, and every thread (for rebuild), for ``DynamoIndex``.

What a thread holds as the index reads it; changing a thread as a whole (restore, delete,
drop, copy) is ``lifecycle``, and the day's activity entries are ``DynamoActivity`` here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from s3_saver._format import keys as _keys
from s3_saver._format.entries import (
    CheckpointEntry,
    Key3,
    Tombstone,
    WritesEntry,
)
from s3_saver._index.dynamodb.items import (
    DynamoCalls,
    _live,
    _thread_item,
)
from s3_saver._index.dynamodb.listing import listing_page, move_unsharded, run_threads
from s3_saver._index.dynamodb.table import (
    TABLE_ATTRIBUTE_DEFINITIONS,
    TABLE_KEY_SCHEMA,
    TTL_ATTRIBUTE,
)
from s3_saver._index.terms import (
    Archived,
    ThreadRef,
)
from s3_saver._transport.failures import (
    CONDITION_FAILED_CODES,
    TABLE_MISSING,
    TABLE_RACING_CODES,
    classify,
    error_code,
)
from s3_saver._transport.protocol import Op, Sleep, gather, raise_failure, request_one
from s3_saver.errors import (
    ConfigurationError,
    SetupMismatchError,
    SetupTimeoutError,
)


class DynamoThreads:
    """The table's setup and a thread as the index reads it, for ``DynamoIndex``."""

    # What these methods rely on (declared as in the class they came from).
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
        _, entries = yield from self._contents(thread_id)
        return entries

    def committed(self, thread_id: str) -> Op[tuple[list[CheckpointEntry], list[WritesEntry]]]:
        _, checkpoints, writes = yield from self._items(thread_id)
        entries = _attach(checkpoints, writes)
        held = {(e.ns, e.checkpoint_id) for e in entries}
        return entries, [w for w in writes if (w.ns, w.checkpoint_id) not in held]

    def _contents(self, thread_id: str) -> Op[tuple[Tombstone, list[CheckpointEntry]]]:
        """The thread's record and every checkpoint of its generation (hidden and
        expired ones included) with its writes; raises Archived for an archived thread."""
        record, checkpoints, writes = yield from self._items(thread_id)
        return record, _attach(checkpoints, writes)

    def _items(self, thread_id: str) -> Op[tuple[Tombstone, list[CheckpointEntry], list[WritesEntry]]]:
        """The thread's record, and the checkpoints and writes of its generation."""
        items: list[Any] = []

        def take(raws: list[dict[str, Any]]) -> Op[None]:
            yield from ()
            items.extend(self.calls.parse(raw) for raw in raws)

        yield from self._each_page(thread_id, take)
        record = next((i for i in items if isinstance(i, Tombstone) and i.ns is None), Tombstone(thread_id, None, 0))
        _live(record, thread_id)
        # Namespaces' tombstones are what earlier versions' deletes left.
        floor = {i.ns: i.gen for i in items if isinstance(i, Tombstone) and i.ns is not None}
        kept = [i for i in items if isinstance(i, (CheckpointEntry, WritesEntry)) and i.gen >= max(record.gen, floor.get(i.ns, 0))]
        return record, [i for i in kept if isinstance(i, CheckpointEntry)], [i for i in kept if isinstance(i, WritesEntry)]

    def threads(
        self, before: ThreadRef | None, page_size: int, cursor: Any
    ) -> Op[tuple[list[tuple[ThreadRef, CheckpointEntry | None]], Any]]:
        """The listing's shards merged (one wave of Queries, ``listing_page``),
        then each thread's latest in one wave."""
        after = _keys.listing_sort_key(before.created, before.thread_id) if before is not None else None
        keys, walk = yield from listing_page(self.calls, after, page_size, cursor)
        refs = [ThreadRef(t, created) for created, t in map(_keys.parse_listing_sort_key, keys)]
        latest = yield from gather(*(_or_archived(self.latest(r.thread_id, ""), r) for r in refs))
        return list(zip(refs, latest)), walk

    def created(self, thread_id: str) -> Op[int | None]:
        found = yield from request_one(self.calls.get_tombstone(thread_id))
        return _thread_item(self.calls, found).created or None

    def activity_since(self, thread_id: str) -> Op[tuple[int, int]]:
        found = yield from request_one(self.calls.get_tombstone(thread_id))
        record = _thread_item(self.calls, found)
        return record.created, record.since

    def runs(self, run_ids: list[str]) -> Op[dict[str, list[str]]]:
        return (yield from run_threads(self.calls, run_ids))

    def reshard(self) -> Op[int]:
        return (yield from move_unsharded(self))

    def bury_runs(self, thread_id: str, run_ids: list[str]) -> Op[None]:
        call = self.calls.bury_runs(thread_id, run_ids)
        (result,) = yield (call,)
        if isinstance(result, BaseException):
            if error_code(result) not in CONDITION_FAILED_CODES:
                raise_failure(call, result)
            record = (yield from self.archive_of(thread_id))  # type: ignore[attr-defined]
            _live(record, thread_id)

    def forget_runs(self, pairs: list[tuple[str, str]]) -> Op[None]:
        # Both places a hint may be: the run's shard, and the unsharded partition
        # of a table setup() has not moved yet.
        keys = [self.calls.run_key(r, t, unsharded) for r, t in pairs for unsharded in (False, True)]
        yield from self.write_batches([{"DeleteRequest": {"Key": k}} for k in keys], "run hints")

    def all_threads(self) -> Op[list[CheckpointEntry]]:
        """A table scan: the only operation that reads every partition."""
        entries: dict[Key3, CheckpointEntry] = {}
        writes: list[WritesEntry] = []
        floor: dict[tuple[str, str | None], int] = {}
        archived: set[str] = set()
        start: dict[str, Any] | None = None
        while True:
            page = yield from request_one(self.calls.scan(start))
            for raw in page.get("Items", []):
                item = self.calls.parse(raw)  # None: an item of another key prefix
                if isinstance(item, CheckpointEntry):
                    entries[item.key] = item
                elif isinstance(item, WritesEntry):
                    writes.append(item)
                elif isinstance(item, Tombstone):
                    floor[(item.thread_id, item.ns)] = item.gen
                    if item.ns is None and item.archive is not None:
                        archived.add(item.thread_id)  # read through its archive
            start = page.get("LastEvaluatedKey")
            if start is None:
                break

        def deleted(t: str, ns: str, gen: int) -> bool:
            return gen < max(floor.get((t, None), 0), floor.get((t, ns), 0))

        live = {
            k: e for k, e in entries.items()
            if not e.hidden and e.thread_id not in archived and not deleted(e.thread_id, e.ns, e.gen)
        }
        for w in writes:
            owner = live.get((w.thread_id, w.ns, w.checkpoint_id))
            if owner is not None and not deleted(w.thread_id, w.ns, w.gen):
                owner.writes.append(w)  # type: ignore[union-attr]
        return list(live.values())

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


_POLL_SECONDS = 0.5
_POLL_LIMIT = 600


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


def _check_region(index: DynamoThreads, bucket: str, bucket_region: str | None) -> None:
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
