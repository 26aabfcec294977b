"""How a manifest head stays small: its limits, and the sealing of its oldest
checkpoints into immutable segments.

Both modules of ``ManifestIndex`` use these: the commit path (``manifest``)
seals as the head grows, prune (``manifest_lifecycle``) seals the history it
rewrites, and both retry a head swap at most ``_MAX_SWAPS`` times. They live
here because ``manifest_lifecycle`` cannot import from ``manifest``, which
imports it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from s3_saver._index.base import CheckpointEntry, WritesEntry
from s3_saver._index.manifest_bodies import write_key as _write_key
from s3_saver._index.manifest_doc import BODY_IN_SEGMENT_MAX, Head, SegmentRef, encode_segment, pieces_read
from s3_saver._keys import KeyLayout, new_token

# A writer that has seen the head hold more checkpoints than SEAL_AT seals the
# oldest into a segment beside its next head read (no extra round trip); a head
# fed only by cold processes, which have seen nothing, seals at HARD_SEAL_AT in
# one more round trip. KEEP_IN_HEAD newest checkpoints stay in the head.
SEAL_AT = 48
HARD_SEAL_AT = 96
KEEP_IN_HEAD = 16
SEGMENT_MAX = 64
# Attempts of one compare-and-swap before giving up: every round has a winner, so
# this many writers on one thread at once all get through.
_MAX_SWAPS = 24


class Bodies:
    """The bodies of the checkpoints and writes parts this process committed to a
    head, by entry, up to ``limit`` bytes (oldest out first). A head keeps the
    bodies of only what "latest" reads, and a head read back after another
    writer's swap has lost the rest: a seal takes them from here, so the segments
    it writes carry them and a history reads no object per checkpoint. A body
    is the immutable object's bytes under a key no other content ever takes."""

    def __init__(self, limit: int = 16 * 1024 * 1024) -> None:
        self._limit, self._size = limit, 0
        self._data: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
        self._lock = threading.Lock()

    def keep(self, entry: CheckpointEntry | WritesEntry) -> None:
        if entry.body is None or len(entry.body) > BODY_IN_SEGMENT_MAX:
            return
        key = _body_key(entry)
        with self._lock:
            if key in self._data:
                return
            self._data[key] = entry.body
            self._size += len(entry.body)
            while self._size > self._limit:
                _, old = self._data.popitem(last=False)
                self._size -= len(old)

    def fill(self, entry: Any) -> Any:
        """``entry`` with its body, when it lacks one this process holds."""
        if entry.body is not None:
            return entry
        with self._lock:
            body = self._data.get(_body_key(entry))
        return entry if body is None else replace(entry, body=body)


def _body_key(entry: CheckpointEntry | WritesEntry) -> tuple[Any, ...]:
    if isinstance(entry, CheckpointEntry):
        return ("c", entry.thread_id, entry.ns, entry.checkpoint_id)
    return ("w", entry.thread_id, *_write_key(entry))


@dataclass
class _SealPlan:
    """Segments holding the oldest checkpoints of a head, and what they hold."""

    sealed: set[tuple[str, str]]
    writes: set[tuple[str, str, str, str, str]]
    refs: list[SegmentRef]
    objects: list[tuple[str, bytes]]


def _plan_seal(layout: KeyLayout, head: Head, fill: Callable[[Any], Any] | None = None) -> _SealPlan:
    """Segments of at most SEGMENT_MAX checkpoints for all but the newest
    KEEP_IN_HEAD checkpoints of ``head``, with their writes (and the bodies
    ``fill`` gives those that have none in the head: ``Bodies.fill``)."""
    sealed = head.entries[:-KEEP_IN_HEAD]
    number = head.segments[-1].number + 1 if head.segments else 0
    plan = _SealPlan({(e.ns, e.checkpoint_id) for e in sealed}, set(), [], [])
    for i in range(0, len(sealed), SEGMENT_MAX):
        chunk = sealed[i : i + SEGMENT_MAX]
        ids = {(e.ns, e.checkpoint_id) for e in chunk}
        writes = [w for w in head.writes if (w.ns, w.checkpoint_id) in ids]
        plan.writes.update(_write_key(w) for w in writes)
        token = new_token(8)
        cids = [e.checkpoint_id for e in chunk]
        top = max((e.ns, e.checkpoint_id) for e in chunk)
        plan.refs.append(SegmentRef(number, token, min(cids), max(cids), len(chunk), top))
        if fill is not None:
            chunk, writes = [fill(e) for e in chunk], [fill(w) for w in writes]
        plan.objects.append((layout.segment_key(head.thread_id, number, token), encode_segment(chunk, writes)))
        number += 1
    return plan


def _apply_seal(head: Head, plan: _SealPlan) -> bool:
    """Swap the sealed checkpoints of ``head`` for the plan's segment refs, if the
    head still holds every one of them (else another writer sealed them first)
    and exactly the writes the plan copied (else a write came or was replaced
    since the plan was made: a segment must not hold a write the head replaced)."""
    present = {(e.ns, e.checkpoint_id) for e in head.entries}
    if not plan.refs or not plan.sealed <= present:
        return False
    current = {_write_key(w) for w in head.writes if (w.ns, w.checkpoint_id) in plan.sealed}
    if current != plan.writes:
        return False
    # Sealed checkpoints whose objects hold values or pieces the newest ones
    # read keep their bodies in the head (a read of the latest state stays one GET).
    needed = pieces_read(head.entries)
    head.pinned = {k: b for k, b in head.pinned.items() if k in needed}
    head.pinned.update(
        ((e.ns, e.checkpoint_id, e.tag), e.body)
        for e in head.entries
        if (e.ns, e.checkpoint_id) in plan.sealed and e.body is not None and (e.ns, e.checkpoint_id, e.tag) in needed
    )
    head.entries = [e for e in head.entries if (e.ns, e.checkpoint_id) not in plan.sealed]
    head.writes = [w for w in head.writes if _write_key(w) not in plan.writes]
    head.segments = [*head.segments, *plan.refs]
    return True
