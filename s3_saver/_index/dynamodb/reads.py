"""The DynamoDB index's reads: a thread's latest checkpoint, one checkpoint, its pending
writes, entries by key, history pages and a checkpoint's ancestors, for ``DynamoIndex``.

Consistent reads where a decision rests on them; older checkpoints, whose items never change,
by BatchGetItem. Writes and commits are ``backend``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from s3_saver._format import keys as _keys
from s3_saver._format.entries import (
    CheckpointEntry,
    Key3,
    Tombstone,
    WritesEntry,
)
from s3_saver._index.dynamodb.items import DynamoCalls, Link, _live_gen
from s3_saver._index.terms import (
    DepthHint,
)
from s3_saver._transport.protocol import Op, gather, request, request_one


class DynamoReads:
    """A thread's checkpoints and writes as the table holds them, for ``DynamoIndex``."""

    # What these methods rely on, from DynamoIndex: its calls, and _until_processed.
    calls: DynamoCalls
    _until_processed: Any

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


BATCH_GET_MAX = 100  # BatchGetItem accepts at most 100 keys per request


@dataclass
class _HistoryCursor:
    start: dict[str, Any] | None = None
    held: CheckpointEntry | None = None  # its writes may go on in the next page
    floor: int = 0  # the thread's generation: items below it are deleted
    deleted: dict[str, int] = field(default_factory=dict)  # earlier versions' namespace tombstones
    first: bool = True


def _writes_in(calls: DynamoCalls, page: dict[str, Any]) -> list[WritesEntry]:
    return [w for w in map(calls.parse, page.get("Items", [])) if isinstance(w, WritesEntry)]
