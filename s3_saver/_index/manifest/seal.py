"""How a manifest head stays small: its limits, and the sealing of its oldest
checkpoints into immutable segments.

Both modules of ``ManifestIndex`` use these: the commit path (``backend``)
seals as the head grows, prune (``lifecycle``) seals the history it
rewrites, and both retry a head swap at most ``_MAX_SWAPS`` times. They live
here because ``lifecycle`` cannot import from ``manifest``, which
imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from s3_saver._format.entries import CheckpointEntry, WritesEntry
from s3_saver._format.keys import KeyLayout, new_token
from s3_saver._index.manifest.bodies import write_key as _write_key
from s3_saver._index.manifest.doc import (
    BODY_IN_SEGMENT_MAX,
    Head,
    SegmentRef,
    encode_segment,
    pieces_read,
)
from s3_saver._transport.budget import KEY_BYTES, CacheBudget

# A writer that has seen the head hold more checkpoints than SEAL_AT seals the
# oldest into a segment beside its next head read (no extra round trip); a head
# fed only by cold processes, which have seen nothing, seals at HARD_SEAL_AT in
# one more round trip. KEEP_IN_HEAD newest checkpoints stay in the head.
SEAL_AT = 48
HARD_SEAL_AT = 96
KEEP_IN_HEAD = 16
SEGMENT_MAX = 64


@dataclass(frozen=True)
class Limits:
    """When a head seals, and how many checkpoints it keeps."""

    seal_at: int
    hard_seal_at: int
    keep: int


# On a versioned bucket every head a write replaces stays as a noncurrent
# version: there the head seals twice as often and keeps 4, so its rows (the
# bytes each replaced head keeps) stay few, and its segments hold 20 each (the
# refs of the segments, which every head carries, grow slower than with 16).
# Measured on a chat of 1 KB messages (see ``doc.encode_head``), as
# ``make bench`` writes it, noncurrent bytes per byte of the thread's own at
# 100 / 200 turns: 0.93 / 1.06x with 24/8; 0.86 / 0.96x with 24/4 (chosen),
# for 1-2% more write requests (the segments). Written straight through the
# saver, at 200 turns: 1.25x with 48/16, 0.82x with 24/4.
# An unversioned bucket keeps nothing of a replaced head: fewer, larger
# segments there (fewer requests, fewer round trips for a history).
LIMITS = Limits(SEAL_AT, HARD_SEAL_AT, KEEP_IN_HEAD)
VERSIONED_LIMITS = Limits(24, 48, 4)

# Attempts of one compare-and-swap before giving up: every round has a winner, so
# this many writers on one thread at once all get through.
_MAX_SWAPS = 24


class Bodies:
    """The bodies of the checkpoints and writes parts this process committed to a
    head, by entry, charged to the saver's cache budget (least recently used out
    first). A head keeps the bodies of only what "latest" reads, and a head read
    back after another writer's swap has lost the rest: a seal takes them from
    here, so the segments it writes carry them and a history reads no object per
    checkpoint. A body is the immutable object's bytes under a key no other
    content ever takes: one evicted is read from its object (a segment sealed
    without it names the object, as a head written by another process does)."""

    def __init__(self, budget: CacheBudget | None = None) -> None:
        self._data = (budget if budget is not None else CacheBudget()).cache("bodies")

    def keep(self, entry: CheckpointEntry | WritesEntry) -> None:
        if entry.body is None or len(entry.body) > BODY_IN_SEGMENT_MAX:
            return
        key = _body_key(entry)
        if key not in self._data:
            self._data.put(key, entry.body, len(entry.body) + 2 * KEY_BYTES)

    def fill(self, entry: Any) -> Any:
        """``entry`` with its body, when it lacks one this process holds."""
        if entry.body is not None:
            return entry
        body = self._data.get(_body_key(entry))
        return entry if body is None else replace(entry, body=body)


def _body_key(entry: CheckpointEntry | WritesEntry) -> tuple[Any, ...]:
    # A checkpoint's object key holds its tag: a restore or an import writes the same
    # checkpoint again under a new tag, and its body then stands for another object (with
    # encryption, bytes sealed for another place). A writes part's token does as much.
    if isinstance(entry, CheckpointEntry):
        return ("c", entry.thread_id, entry.ns, entry.checkpoint_id, entry.tag)
    return ("w", entry.thread_id, *_write_key(entry))


@dataclass
class _SealPlan:
    """Segments holding the oldest checkpoints of a head, and what they hold."""

    sealed: set[tuple[str, str]]
    writes: set[tuple[str, str, str, str, str]]
    refs: list[SegmentRef]
    objects: list[tuple[str, bytes]]


def _plan_seal(
    layout: KeyLayout, head: Head, fill: Callable[[Any], Any] | None = None, keep: int = KEEP_IN_HEAD
) -> _SealPlan:
    """Segments of at most SEGMENT_MAX checkpoints for all but the newest
    ``keep`` checkpoints of ``head``, with their writes (and the bodies
    ``fill`` gives those that have none in the head: ``Bodies.fill``)."""
    sealed = head.entries[:-keep]
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
    # read keep their bodies in this process's copy of the head (``Head.pinned``:
    # never stored), so its reads of the latest state GET no such object.
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
