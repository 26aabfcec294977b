"""The manifest index's reads: the latest checkpoint, one checkpoint, history
and the ancestor walk, from the head and the sealed segments it names.

``ManifestIndex`` mixes ``ManifestReads`` in; the head and segment loading
they read through are in ``head``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from s3_saver._format.entries import CheckpointEntry, Key3, WritesEntry
from s3_saver._index.manifest.doc import Head, SegmentRef, _in, _newest, _with_writes
from s3_saver._index.terms import DepthHint
from s3_saver._transport.budget import Cache
from s3_saver._transport.protocol import Op


class ManifestReads:
    """Reads of checkpoints, for ``ManifestIndex``."""

    # What these methods rely on, from ManifestIndex: its segment cache, and
    # ManifestHead's _live_head, _cached and _load_segments.
    _segments: Cache

    # -- reads ---------------------------------------------------------------------------
    def latest(self, thread_id: str, ns: str) -> Op[CheckpointEntry | None]:
        head = yield from self._live_head(thread_id)
        return (yield from self._latest_in(head, ns))

    def _latest_in(self, head: Head, ns: str) -> Op[CheckpointEntry | None]:
        thread_id = head.thread_id
        newest = _newest(head.entries, ns)
        if newest is not None:
            return _with_writes(newest, head.writes)
        # A namespace with nothing in the head (an old subgraph): newest segment first.
        for ref in reversed(head.segments):
            ((entries, writes),) = yield from self._load_segments(thread_id, [ref])
            newest = _newest(entries, ns)
            if newest is not None:
                return _with_writes(newest, writes + head.writes)
        return None

    def get(self, thread_id: str, ns: str, checkpoint_id: str) -> Op[CheckpointEntry | None]:
        head = yield from self._live_head(thread_id)
        entry = yield from self._find(head, ns, checkpoint_id)
        return None if entry is None or entry.hidden else entry

    def writes(self, entry: CheckpointEntry) -> Op[list[WritesEntry]]:
        yield from ()
        return list(entry.writes or [])  # manifest entries always come with their writes

    def entries(self, keys: list[Key3]) -> Op[dict[Key3, CheckpointEntry | None]]:
        """Older checkpoints, from the heads and segments this process has read:
        no request (the resolver reads the object of one it does not find)."""
        yield from ()
        segments = self._segments.values()
        found: dict[Key3, CheckpointEntry | None] = {}
        for thread_id, ns, checkpoint_id in keys:
            head = self._cached(thread_id)
            pools = [head.entries] if head is not None else []
            pools += [entries for entries, _ in segments]
            found[(thread_id, ns, checkpoint_id)] = next(
                (e for pool in pools if (e := _in(pool, ns, checkpoint_id)) and e.thread_id == thread_id), None
            )
        return found

    def history(
        self, thread_id: str, ns: str | None, before_id: str | None, page_size: int | None, cursor: Any
    ) -> Op[tuple[list[CheckpointEntry], Any]]:
        """Pages in one order, whatever the head or a segment holds: newest first
        by (namespace, id) as a DynamoDB partition reads, one namespace's alone
        with ``ns``. Each page reads the segment that may hold the greatest entry
        not yet returned, and returns every entry no unread segment can top."""
        if cursor is None:
            head = yield from self._live_head(thread_id)
            state = _Merge(
                head,
                [_with_writes(e, head.writes) for e in head.entries],
                [r for r in head.segments if _may_hold(r, ns, before_id)],
            )
        else:
            state = cursor
            if state.refs:
                ref = max(state.refs, key=lambda r: _bound(r, ns))
                state.refs.remove(ref)
                ((entries, writes),) = yield from self._load_segments(thread_id, [ref])
                state.pool += [_with_writes(e, writes + state.head.writes) for e in entries]
        state.pool = [
            e for e in state.pool
            if not e.hidden and (ns is None or e.ns == ns) and (before_id is None or e.checkpoint_id < before_id)
        ]
        state.pool.sort(key=lambda e: (e.ns, e.checkpoint_id), reverse=True)
        bound = max((_bound(r, ns) for r in state.refs), default=None)
        cut = len(state.pool) if bound is None else next(
            (i for i, e in enumerate(state.pool) if (e.ns, e.checkpoint_id) <= bound), len(state.pool)
        )
        page, state.pool = state.pool[:cut], state.pool[cut:]
        return page, (state if state.refs or state.pool else None)

    def _load_into(
        self, known: dict[str, CheckpointEntry], head: Head, refs: list[SegmentRef], ns: str, below: str
    ) -> Op[int]:
        """Load segments in one wave into ``known`` (checkpoints of ``ns`` by id,
        with writes); returns how many of their checkpoints are older than ``below``."""
        older = 0
        for entries, writes in (yield from self._load_segments(head.thread_id, refs)):
            known.update({e.checkpoint_id: _with_writes(e, writes + head.writes) for e in entries if e.ns == ns})
            older += sum(e.checkpoint_id < below for e in entries)
        return older

    def ancestors(
        self, thread_id: str, ns: str, checkpoint_id: str, channels: set[str], depth_hint: DepthHint | None = None
    ) -> Op[tuple[CheckpointEntry | None, list[CheckpointEntry]]]:
        """The chain from the head, then from the sealed segments it reaches into.

        A sealed target comes with the segment before its own. When the walk
        runs past what was read, it reads as many segments as hold the
        checkpoints ``depth_hint`` expects it to need (one without a hint), then
        twice as many per wave: the round trips do not grow with the depth when
        the hint is right, and grow as the log of the shortfall when it is not.
        """
        head = yield from self._live_head(thread_id)
        known = {e.checkpoint_id: _with_writes(e, head.writes) for e in head.entries if e.ns == ns}
        # A stack, newest on top; segments holding only checkpoints newer than the
        # target go to the bottom: a parent is written before its child, its id is smaller.
        refs = sorted(head.segments, key=lambda r: (r.min_id < checkpoint_id, r.number))
        older = sum(e.checkpoint_id < checkpoint_id for e in head.entries)
        if checkpoint_id not in known:
            # A sealed target: its segment, with the one before it for its first ancestors.
            own = [r for r in refs if r.min_id <= checkpoint_id <= r.max_id]
            refs = [r for r in refs if r not in own]
            if own:
                before = [refs.pop()] if refs and refs[-1].min_id < checkpoint_id else []
                older += yield from self._load_into(known, head, own + before, ns, checkpoint_id)
        target = known.get(checkpoint_id)
        expected = depth_hint(target) if target is not None and depth_hint is not None else None
        wave = 0  # segments in the last wave
        chain: list[CheckpointEntry] = []
        unseeded = set(channels)
        cursor = target.parent_id if target is not None else None
        while target is not None and cursor is not None and unseeded:
            entry = known.get(cursor)
            if entry is None:
                if not refs:
                    break
                more = (expected or 0) - older if not wave else 0
                batch = _pop_wave(refs, 2 * wave or 1, more)
                wave = len(batch)
                older += yield from self._load_into(known, head, batch, ns, checkpoint_id)
                continue
            chain.append(entry)
            unseeded -= set(entry.loc)
            cursor = entry.parent_id
        return target, chain


@dataclass
class _Merge:
    """A history read under way: the head it began with, entries read and not
    yet returned, and the segments not read yet."""

    head: Head
    pool: list[CheckpointEntry]
    refs: list[SegmentRef]


_TOP = ("\U0010ffff", "\U0010ffff")  # above every (namespace, id): ids cannot hold U+10FFFF


def _bound(ref: SegmentRef, ns: str | None) -> tuple[str, str]:
    """The greatest (namespace, id) a segment may hold, of ``ns`` when given
    (unknown for refs written before ``top`` was: anything)."""
    if ref.top is None:
        return _TOP
    if ns is not None and ref.top[0] > ns:
        return (ns, ref.max_id)
    return ref.top


def _may_hold(ref: SegmentRef, ns: str | None, before_id: str | None) -> bool:
    """Whether a segment may hold an entry of ``ns`` (any: None) below ``before_id``."""
    if before_id is not None and ref.min_id >= before_id:
        return False
    return ns is None or ref.top is None or ref.top[0] >= ns



def _pop_wave(refs: list[SegmentRef], at_least: int, checkpoints: int) -> list[SegmentRef]:
    """Take segments off the top of ``refs``: ``at_least`` of them, and more
    while they do not yet hold ``checkpoints`` checkpoints."""
    batch: list[SegmentRef] = []
    while refs and (len(batch) < at_least or checkpoints > 0):
        batch.append(refs.pop())
        checkpoints -= batch[-1].count
    return batch
