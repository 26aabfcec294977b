"""What a manifest holds of one thread, for ``audit`` and ``collect_garbage``.

The head and every segment it names are read (a damaged manifest raises here:
that is what ``audit`` reports as a broken index). The manifest's own objects
are the head and its segments; segments a prune retired or a delete buried are
kept until their operation removes them.
"""

from __future__ import annotations

from typing import Any

from s3_saver._index.base import Holdings
from s3_saver._index.manifest_doc import Head, SegmentRef
from s3_saver._keys import KeyLayout
from s3_saver._protocol import Op


class ManifestHoldings:
    """``Index.holdings`` for ``ManifestIndex`` (it mixes this in)."""

    layout: KeyLayout
    _read_head: Any
    _load_segments: Any

    def holdings(self, thread_id: str) -> Op[Holdings]:
        head: Head = yield from self._read_head(thread_id)
        held = Holdings(found=head.etag is not None)
        if head.etag is None:
            return held
        held.index_keys.add(self.layout.manifest_head_key(thread_id))
        held.index_keys.update(self._segment_keys(thread_id, head.segments))
        held.kept_keys.update(self._segment_keys(thread_id, head.graveyard_segments + head.retired))
        for entries, writes in (yield from self._load_segments(thread_id, head.segments)):
            held.live += entries + writes
        # An archived thread's head entries are writes parked until its restore.
        held.live += head.entries + head.writes
        held.kept += head.graveyard
        if head.archive is not None:
            held.live.append(head.archive)
        if head.stale_archive:
            held.kept_keys.add(head.stale_archive)
        return held

    def _segment_keys(self, thread_id: str, refs: list[SegmentRef]) -> list[str]:
        return [self.layout.segment_key(thread_id, r.number, r.token) for r in refs]
