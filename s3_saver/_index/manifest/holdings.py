"""What a manifest holds of one thread, for ``audit`` and ``collect_garbage``.

The head and every segment it names are read (a damaged manifest raises here:
that is what ``audit`` reports as a broken index). The manifest's own objects
are the head and its segments; segments a prune retired or a delete buried are
kept until their operation removes them.
"""

from __future__ import annotations

from typing import Any

from s3_saver._format.entries import CheckpointEntry
from s3_saver._format.keys import KeyLayout
from s3_saver._index.manifest.doc import Head, SegmentRef
from s3_saver._index.terms import Holdings
from s3_saver._transport.protocol import Op


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

    def erase_hints(self, thread_id: str) -> Op[list[str]]:
        """The thread's listing object and the hints of every run its head, its
        segments (buried ones too) and its archive name, and of the runs
        ``delete_for_runs`` took out of it: what a delete removes by key."""
        head: Head = yield from self._read_head(thread_id)
        if head.etag is None:
            return []
        runs = {r for r in head.dead_runs}
        if head.archive is not None:
            runs.update(head.archive.runs)
        grave = [e for e in head.graveyard if isinstance(e, CheckpointEntry)]
        for entries, _ in (yield from self._load_segments(thread_id, head.segments + head.graveyard_segments, buried=True)):
            grave += entries
        runs.update(e.run_id for e in [*head.entries, *grave] if e.run_id is not None)
        keys = [self.layout.run_key(r, thread_id) for r in sorted(runs)]
        keys += [self.layout.listing_key(t, thread_id) for t in sorted({head.created, head.unlisting} - {0})]
        return keys

    def _segment_keys(self, thread_id: str, refs: list[SegmentRef]) -> list[str]:
        return [self.layout.segment_key(thread_id, r.number, r.token) for r in refs]
