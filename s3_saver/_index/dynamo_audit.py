"""What the DynamoDB index holds of one thread, for ``audit`` and ``collect_garbage``.

One Query of the thread's partition (every page): checkpoint and writes items,
the thread's and its namespaces' tombstones, and the thread item's archive
reference. Nothing of the index lives in the bucket, so there are no index
objects to list.
"""

from __future__ import annotations

from typing import Any

from s3_saver._index.base import CheckpointEntry, Holdings, Tombstone, WritesEntry
from s3_saver._index.dynamo_items import DynamoCalls
from s3_saver._protocol import Op


class DynamoHoldings:
    """``Index.holdings`` for ``DynamoIndex`` (it mixes this in)."""

    calls: DynamoCalls
    _each_page: Any  # DynamoLifecycle's paged Query of one partition

    def holdings(self, thread_id: str) -> Op[Holdings]:
        items: list[Any] = []

        def take(raws: list[dict[str, Any]]) -> Op[None]:
            yield from ()
            items.extend(self.calls.parse(raw) for raw in raws)

        yield from self._each_page(thread_id, take)
        held = Holdings(found=bool(items))
        thread_gen, ns_gen, archived = 0, {}, False
        for item in items:
            if isinstance(item, Tombstone):
                if item.ns is None:
                    thread_gen = item.gen
                    if item.archive is not None:
                        held.live.append(item.archive)
                        archived = True
                    if item.stale_archive:
                        held.kept_keys.add(item.stale_archive)
                else:
                    ns_gen[item.ns] = item.gen
        for item in items:
            # Links are twins of checkpoint items: no object of their own.
            if isinstance(item, (CheckpointEntry, WritesEntry)):
                # A tombstoned generation's objects are the delete's to remove
                # (it finishes when called again), never a reader's to follow.
                deleted = item.gen < max(thread_gen, ns_gen.get(item.ns, 0))
                # Archived, readers follow the archive: the live items left are
                # the archive's cleanup to finish (its objects may be gone
                # already) or writes parked until the restore.
                (held.kept if deleted or archived else held.live).append(item)
        return held
