"""What the DynamoDB index holds of one thread, for ``audit`` and ``collect_garbage``.

One Query of the thread's partition (every page): checkpoint and writes items,
the thread's and its namespaces' tombstones, and the thread item's archive
reference. Nothing of the index lives in the bucket, so there are no index
objects to list.
"""

from __future__ import annotations

from typing import Any

from s3_saver._format.entries import CheckpointEntry, Tombstone, WritesEntry
from s3_saver._index.dynamodb.items import DynamoCalls
from s3_saver._index.terms import Holdings
from s3_saver._transport.protocol import Op


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
        record = next((i for i in items if isinstance(i, Tombstone) and i.ns is None), Tombstone(thread_id, None, 0))
        floor = {i.ns: i.gen for i in items if isinstance(i, Tombstone) and i.ns is not None}
        if record.archive is not None:
            held.live.append(record.archive)
        # An archive object to delete, or one an archive under way is writing.
        held.kept_keys.update(k for k in (record.stale_archive, record.archiving) if k)
        for item in items:
            # Links are twins of checkpoint items: no object of their own.
            if isinstance(item, (CheckpointEntry, WritesEntry)):
                # A deleted generation's objects are the delete's to remove (it
                # finishes when called again), never a reader's to follow; an
                # archived thread's live items are its cleanup's to finish.
                deleted = item.gen < max(record.gen, floor.get(item.ns, 0))
                (held.kept if deleted or record.archive is not None else held.live).append(item)
        return held
