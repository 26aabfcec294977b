"""verify and promote: the two regions compared, and the replica made the one written to.

Both read the two regions in one operation: each call names its region (its
``Where``) and the driver sends it with that region's clients.

``verify`` compares, thread by thread, the objects of the two buckets (a
listing of the thread's objects: the admin path) and, where replication keeps
an index in both regions, the entries of the two indexes. Every object one
bucket holds and the other lacks is reported under its checkpoint (or its
pending write), committed or not: after a failback, the writes that reached
the old primary and never replicated are what the region written to holds
and the other lacks, even a pending write whose slot a newer one took. What a
failback's merge did not keep is reported apart, with the reason: its objects
can have replicated, and no index names them any more (``settle.record_set_aside``).

``promote`` refuses to leave a reachable region whose writes the new one
lacks (replication has not caught up: wait, or ``force``), then rebuilds the
new region's index from its bucket when that index is not replicated, keeping
only checkpoints whose objects have all arrived (``rebuild_index(..., incomplete)``).
Either way the new region's index-mode marker names its table from then on
(``ModeMark.take``): replication brought the other region's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from s3_saver._format.entries import CheckpointEntry
from s3_saver._index.terms import Archived
from s3_saver._ops import setup
from s3_saver._ops.context import Context
from s3_saver._ops.rebuild import rebuild_index
from s3_saver._regions.replica import Promotion, ReplicationGap, ReplicationReport
from s3_saver._regions.settle import object_keys, set_aside, settle
from s3_saver._regions.settle import thread_ids as listed_threads
from s3_saver._transport.protocol import Op, gather, request_one
from s3_saver.errors import ReplicationLagError, StoreUnavailableError


def verify(
    ctx: Context, other: Context, thread_ids: Iterable[str] | None, other_indexed: bool, records: bool = True
) -> Op[ReplicationReport]:
    """Compare the region of ``ctx`` (written to) with ``other`` (the replica);
    ``records``: with what failbacks into ``ctx`` set aside (``settle.record_set_aside``)."""
    if thread_ids is None:
        # Threads either index lists: the other's too when it has one (after a
        # failover, the old primary's table), even if replication does not keep it.
        found = yield from gather(listed_threads(ctx), listed_threads(other, missing_ok=True))
        thread_ids = sorted(set(found[0]) | set(found[1]))
    unreplicated: list[ReplicationGap] = []
    replica_only: list[ReplicationGap] = []
    aside: list[ReplicationGap] = []
    count = 0
    for thread_id in thread_ids:
        count += 1
        mine, theirs, my_keys, their_keys, recorded = yield from gather(
            _contents(ctx, thread_id),
            _contents(other, thread_id) if other_indexed else _nothing(),
            object_keys(ctx, thread_id),
            object_keys(other, thread_id),
            set_aside(ctx, thread_id) if records else _nothing(),
        )
        aside += recorded
        unreplicated += _gaps(ctx, mine, theirs if other_indexed else None, my_keys, their_keys)
        replica_only += _gaps(ctx, theirs, mine if other_indexed else None, their_keys, my_keys)
    return ReplicationReport(
        _describe(ctx), _describe(other), count, tuple(unreplicated), tuple(replica_only), tuple(aside)
    )


def promote(
    ctx: Context, other: Context, rebuild: bool | None, force: bool, indexed: bool, shared: bool
) -> Op[Promotion]:
    """Make ``other`` the region written to (the caller swaps the roles after).

    ``indexed``: replication keeps an index in ``other`` (manifest heads, a
    global table). Its index is then settled (``_regions/settle``): with ``ctx``
    answering, the union of both indexes' committed entries; without, its own
    entries whose objects all arrived. Without one (DynamoDB, no global table)
    and ``ctx`` down, nothing there holds an index: it is rebuilt from the bucket.
    ``shared``: one index both regions write (a global table): with ``ctx``
    down, what is not whole is only reported (see ``settle``).
    """
    checked = True
    try:
        # Objects only: the index there is settled from both indexes below.
        report = yield from verify(ctx, other, None, False, records=False)
    except StoreUnavailableError:
        # The outage this promotion is for: nothing to compare with.
        checked, report = False, None
    unreplicated = list(report.unreplicated) if report is not None else []
    if unreplicated and not force:
        # Invariant: only what can still arrive holds a promotion back. An
        # object the promoted region holds as a version (a delete marker over
        # it: its own delete, never replicated) reached it: waiting never
        # changes that (a replica's copies do not replicate back).
        held = yield from gather(*(_ever_held(other, g.missing) for g in unreplicated))
        unreplicated = [g for g, gone in zip(unreplicated, held) if not gone]
    if report is not None and unreplicated and not force:
        threads = sorted({g.thread_id for g in unreplicated})
        raise ReplicationLagError(
            f"replication lag: {len(unreplicated)} checkpoints or pending writes of {len(threads)} "
            f"threads (first: {threads[:3]}) in {report.primary} have not reached {report.replica}: wait for "
            "replication and promote again, or promote(force=True) to leave them (verify() reports them after)"
        )
    if checked:
        # Both regions answer (a failback, or a planned switch): the merge
        # needs the old region's own index, which a versioned bucket keeps.
        yield from setup.require_versioning("promote()", other, ctx)
    if rebuild is None:
        rebuild = not indexed and not checked
    if rebuild:
        # No index to prove what was committed: every complete checkpoint (see the README).
        incomplete: list[str] = []
        incomplete_writes: list[str] = []
        rebuilt = yield from rebuild_index(other, None, incomplete, incomplete_writes)
        return Promotion(
            _describe(other), _describe(ctx), checked, int(rebuilt), tuple(incomplete), tuple(incomplete_writes),
            rebuilt.unindexed,
        )
    settled = yield from settle(other, ctx if checked else None, write=checked or not shared)
    if other.mode is not None:
        # Its marker names its table from here on (a rebuild's does so itself): a
        # failback's, which replication brought from the promoted region, named that
        # region's table. Sent only where the marker read named another table.
        yield from other.mode.take()
    return Promotion(
        _describe(other), _describe(ctx), checked, None, tuple(settled.checkpoints), tuple(settled.writes)
    )


def _ever_held(ctx: Context, keys: tuple[str, ...]) -> Op[bool]:
    """Whether ``ctx``'s bucket holds a version or delete marker of every one of ``keys``."""
    if not keys:
        return False  # only the index lacks the entry: it can still arrive
    pages = yield from gather(*(request_one(ctx.s3.versions(key)) for key in keys))
    for key, page in zip(keys, pages):
        found = [*page.get("Versions", ()), *page.get("DeleteMarkers", ())]
        if not any(v.get("Key") == key for v in found):
            return False
    return True


def _gaps(
    ctx: Context,
    entries: list[CheckpointEntry],
    other: list[CheckpointEntry] | None,
    keys: dict[str, str],
    other_keys: dict[str, str],
) -> list[ReplicationGap]:
    """What one region holds that the other lacks: objects (every object of
    the thread's, committed or superseded: a write the other region never got
    is reported even when a newer one took its slot), and index entries when
    the other index is compared (``other`` not None).

    A pending-writes part is keyed by the call's token: the same task's writes
    made in both regions (the same bytes) differ only by it, and are the same."""
    their_parts = {_part_of(ctx, key, etag) for key, etag in other_keys.items()}
    found: dict[tuple[str, str, str, str, str | None], set[str]] = {}
    for key in keys.keys() - other_keys.keys():
        parsed = ctx.layout.parse_object_key(key)
        if parsed is None:
            continue
        if parsed.kind == "writes" and _part_of(ctx, key, keys[key]) in their_parts:
            continue
        if parsed.kind == "writes":
            ident = (parsed.thread_id, parsed.ns, parsed.checkpoint_id, "writes", parsed.task_id)
        else:
            # A blob belongs to the checkpoint that stored it.
            ident = (parsed.thread_id, parsed.ns, parsed.checkpoint_id, "checkpoint", None)
        found.setdefault(ident, set()).add(key)
    if other is not None:
        theirs = {e.key for e in other}
        their_writes = {_writes_id(w) for e in other for w in e.writes or ()}
        for entry in entries:
            if entry.hidden:
                continue  # read only through others
            if entry.key not in theirs:
                found.setdefault((*entry.key, "checkpoint", None), set())
            for w in entry.writes or ():
                if _writes_id(w) not in their_writes:
                    found.setdefault((w.thread_id, w.ns, w.checkpoint_id, "writes", w.task_id), set())
    return [ReplicationGap(*ident, tuple(sorted(missing))) for ident, missing in sorted(found.items(), key=_order)]


def _order(item: tuple[tuple[str, str, str, str, str | None], set[str]]) -> tuple[str, ...]:
    thread_id, ns, checkpoint_id, kind, task_id = item[0]
    return (thread_id, ns, checkpoint_id, kind, task_id or "")


def _writes_id(w: Any) -> tuple[str, ...]:
    return (w.ns, w.checkpoint_id, w.task_id, w.part)  # see _gaps: not the token


def _part_of(ctx: Context, key: str, etag: str) -> tuple[Any, ...] | None:
    """A pending-writes part as its slot and content (ETag: the bytes' MD5)."""
    parsed = ctx.layout.parse_object_key(key)
    if parsed is None or parsed.kind != "writes":
        return None
    return (parsed.ns, parsed.checkpoint_id, parsed.task_id, parsed.part, etag)


def _describe(ctx: Context) -> str:
    region = ctx.s3.where.region("s3")
    return f"s3://{ctx.s3.bucket}" + (f" ({region})" if region else "")


def _nothing() -> Op[list[Any]]:
    return []
    yield  # pragma: no cover - makes this a generator


def _contents(ctx: Context, thread_id: str) -> Op[list[CheckpointEntry]]:
    try:
        return (yield from ctx.index.contents(thread_id))
    except Archived:
        return []  # one archive object: its key is compared with the objects
