"""Reads of a replica region: never a mixed or partial state.

S3 replication copies each object on its own, in any order: the replica's
index (a replicated manifest head, a global table's item) can name a
checkpoint before its objects, or its values' and writes' objects, arrive, and
a head replicated late can be older than one read before. Every object a
checkpoint tuple needs is fetched anyway to build it, so a missing one is seen
at no extra cost; then:

* the latest checkpoint: its parent stands in, then the parent's parent, until
  one is complete: the newest complete checkpoint of the same line, never
  another branch. The read's [ReadSource][s3_saver.ReadSource] names the
  checkpoints passed over and how far behind the answer is
  (``Replica(on_lag="raise")`` raises instead);
* fewer pending writes of the checkpoint than this process saw there before
  (a head replicated after a newer one): told as stale, or raised;
* no checkpoint at all, where this process saw one before: None, told as
  stale (``ReadSource.newest_id``), or raised with ``on_lag="raise"``;
* a checkpoint asked for by id: [ReplicationLagError][s3_saver.errors.ReplicationLagError] (no other
  checkpoint can stand in for it);
* a history: the newest checkpoints not complete yet are passed over as for
  the latest; a gap below a complete one raises (a history with a hole is partial);
* anything else missing (a manifest segment, a DeltaChannel seed) raises
  ``ReplicationLagError`` naming the key.

A global table's replica gets the index item by item too, so what is missing
can be an item: a checkpoint's (the history has a hole) or a pending write's
(a DeltaChannel replays without it). Nothing fetched fails then; the items say
it (``CheckpointEntry.chained``): each names its parent and the parent's write
slots it was made from, and a parent taken out of the history on purpose
(prune, delete_for_runs, a failback's merge) is marked on its children. So in
a replica (not in the region written to, where nothing more will come):

* a history in which a served checkpoint's parent is not listed, unmarked and
  not expired, raises (the items below it have not all arrived);
* a DeltaChannel's history raises when an ancestor lacks a write slot its
  child names, or the walk stops at an ancestor not arrived before seeding.

Items written before these attributes existed prove nothing: they are read as
before (trusted as they arrived).
"""

from __future__ import annotations

from langgraph.checkpoint.base import CheckpointTuple

from s3_saver._format.entries import CheckpointEntry
from s3_saver._ops.context import Context
from s3_saver._ops.resolve import Resolver, fetch_and_build
from s3_saver._ops.source import checkpoint_time
from s3_saver._transport.protocol import PRIMARY, Op, T
from s3_saver.errors import MissingObjectError, ReplicationLagError

# A replica behind by more checkpoints than this answers with an error, not a walk.
MAX_SKIPPED = 64


def lag_error(ctx: Context, what: str, exc: BaseException | None = None) -> ReplicationLagError:
    reads = ctx.replica
    where = f"s3://{ctx.s3.bucket}" + (f" ({reads.region})" if reads and reads.region else "")
    detail = f": {exc}" if exc is not None else ""
    return ReplicationLagError(
        f"replication lag: {what} has not fully arrived in the replica {where} yet (S3 replication "
        f"copies objects one by one, in any order, usually within seconds; try again){detail}"
    )


def lag_safe(ctx: Context, op: Op[T]) -> Op[T]:
    """``op`` on the replica, with a missing object reported as replication lag."""
    try:
        return (yield from op)
    except MissingObjectError as exc:
        raise lag_error(ctx, "an object the replica's index names", exc) from exc


def newest_complete(ctx: Context, entry: CheckpointEntry, by_id: bool) -> Op[CheckpointTuple]:
    """The tuple of ``entry``, or (latest reads) of its newest complete ancestor."""
    reads = ctx.replica
    assert reads is not None
    thread_id, ns = entry.thread_id, entry.ns
    newest = None if by_id else reads.seen(thread_id, ns, entry.checkpoint_id)
    if not by_id and reads.on_lag == "raise" and newest is not None and newest > entry.checkpoint_id:
        raise lag_error(ctx, f"checkpoint {newest} of thread {thread_id!r} (the replica's index shows an older one)")
    skipped: list[str] = []
    while True:
        try:
            (found,) = yield from fetch_and_build(_fresh(ctx, entry), [entry])
        except MissingObjectError as exc:
            what = f"checkpoint {entry.checkpoint_id} of thread {thread_id!r}"
            if by_id or reads.on_lag == "raise" or len(skipped) >= MAX_SKIPPED or entry.parent_id is None:
                raise lag_error(ctx, what, exc) from exc
            skipped.append(entry.checkpoint_id)
            parent = yield from ctx.index.get(thread_id, ns, entry.parent_id)
            if parent is None:
                # The parent's item has not arrived (a global table replicates
                # item by item), or never will (the outage ate it): the newest
                # checkpoint older than it stands in.
                skipped.append(entry.parent_id)
                parent = yield from _older(ctx, thread_id, ns, entry.parent_id)
            if parent is None or ctx.expired(parent):
                raise lag_error(ctx, f"{what} (and its parent {entry.parent_id})", exc) from exc
            entry = parent
            continue
        parts = frozenset((w.task_id, w.part) for w in entry.writes or ())
        behind = reads.writes_behind(entry.key, parts)
        if behind and reads.on_lag == "raise":
            raise lag_error(ctx, f"pending writes of checkpoint {entry.checkpoint_id} (the replica's index shows fewer)")
        reads.tell(entry.checkpoint_id, newest, skipped, behind)
        return found


def _older(ctx: Context, thread_id: str, ns: str, before_id: str) -> Op[CheckpointEntry | None]:
    """The newest checkpoint of (thread, ns) older than ``before_id``, if any."""
    cursor = None
    while True:
        page, cursor = yield from ctx.index.history(thread_id, ns, before_id, 4, cursor)
        for entry in page:
            if entry.ns == ns and entry.checkpoint_id < before_id and not entry.hidden:
                return entry
        if cursor is None:
            return None


def nothing_yet(ctx: Context, thread_id: str, ns: str) -> None:
    """A latest read that found no checkpoint: a thread not replicated yet, or
    one this process read there before whose index came back older (a head
    written before its first checkpoint, replicated last). Told as stale then;
    ``on_lag="raise"`` raises."""
    reads = ctx.replica
    assert reads is not None
    newest = reads.seen(thread_id, ns, None)
    if newest is not None and reads.on_lag == "raise":
        raise lag_error(ctx, f"checkpoint {newest} of thread {thread_id!r} (the replica's index shows none)")
    reads.tell(None, newest, [])


class Tail:
    """A history read's state: until one complete checkpoint is out, incomplete
    ones are the unreplicated newest (passed over); after, one is a gap."""

    def __init__(self) -> None:
        self.started = False
        self.skipped: list[str] = []


def build_listed(ctx: Context, resolver: Resolver, chunk: list[CheckpointEntry], tail: Tail) -> Op[list[CheckpointTuple]]:
    """The tuples of a history chunk, lag-safe (see the module's docstring)."""
    try:
        built = yield from fetch_and_build(resolver, chunk)
    except MissingObjectError:
        # Which one: each on its own (only a chunk that met lag pays for this).
        built = []
        for entry in chunk:
            try:
                (found,) = yield from fetch_and_build(_fresh(ctx, entry), [entry])
            except MissingObjectError as exc:
                what = f"checkpoint {entry.checkpoint_id} of thread {entry.thread_id!r}"
                written_to = ctx.replica is not None and ctx.replica.site == PRIMARY
                if (tail.started and not written_to) or ctx.replica is None or ctx.replica.on_lag == "raise":
                    # A replica's hole fills as replication goes on; in the region
                    # written to, nothing will come: what never arrived is passed over.
                    raise lag_error(ctx, what + " (inside the history)", exc) from exc
                tail.skipped.append(entry.checkpoint_id)
                continue
            built.append(found)
            tail.started = True
    tail.started = tail.started or bool(built)
    return built


def _fresh(ctx: Context, entry: CheckpointEntry) -> Resolver:
    resolver = Resolver(ctx)
    resolver.add(entry)
    return resolver


# -- holes a replicated index's items leave (see the module's docstring) ---------------
def proves_items(ctx: Context) -> bool:
    """Reads of a replica region, where a missing item can still arrive."""
    return ctx.replica is not None and ctx.replica.site != PRIMARY


def parent_gone(ctx: Context, entry: CheckpointEntry) -> bool:
    """The entry's parent is out of the history in the region that wrote it too:
    marked so, or expired (with a ttl, entries expire oldest first: the
    parent's expiry is estimated from the ids' times and the entry's own)."""
    if entry.parent_gone:
        return True
    if entry.expires_at is None or entry.parent_id is None:
        return False
    born, parent_born = checkpoint_time(entry.checkpoint_id), checkpoint_time(entry.parent_id)
    if born is None or parent_born is None:
        return False
    return parent_born + (entry.expires_at - born) <= ctx.now()


class Parents:
    """A replica history's check that no served checkpoint's parent is missing.

    Listings are newest first within a namespace: a parent not met once the
    listing has gone below its id (or ended) is not in the index."""

    def __init__(self) -> None:
        self.present: set[tuple[str, str]] = set()  # (ns, checkpoint id) listed, served or not
        self.low: dict[str, str] = {}  # per namespace, the oldest id listed so far
        self.expected: dict[tuple[str, str], CheckpointEntry] = {}  # (ns, parent id) -> a served child

    def listed(self, entries: list[CheckpointEntry]) -> None:
        for e in entries:
            self.present.add((e.ns, e.checkpoint_id))
            if e.ns not in self.low or e.checkpoint_id < self.low[e.ns]:
                self.low[e.ns] = e.checkpoint_id

    def serve(self, ctx: Context, entries: list[CheckpointEntry], ended: bool = False) -> None:
        """Before ``entries`` are handed out: raises when a parent of theirs (or of
        one served before) is known missing; ``ended``: the listing is whole."""
        for e in entries:
            if e.chained and e.parent_id is not None:
                self.expected.setdefault((e.ns, e.parent_id), e)
        for (ns, parent_id), child in list(self.expected.items()):
            if (ns, parent_id) in self.present:
                del self.expected[(ns, parent_id)]
            elif ended or self.low.get(ns, parent_id) < parent_id:
                if not parent_gone(ctx, child):
                    raise lag_error(
                        ctx,
                        f"checkpoint {parent_id} of thread {child.thread_id!r}, the parent of {child.checkpoint_id} "
                        "(its index item; inside the history)",
                    )
                del self.expected[(ns, parent_id)]


def check_delta_chain(
    ctx: Context, target_entry: CheckpointEntry, picked: list[CheckpointEntry], unseeded: bool, cut: bool
) -> None:
    """A DeltaChannel's walk in a replica: every ancestor picked holds the write
    slots its child names, and a walk that ended before every channel was
    seeded ended at the root, or where the parent is gone (``cut``: an
    expired ancestor ended it)."""
    child = target_entry
    for entry in picked:
        if child.chained and child.parent_writes:
            have = {(w.task_id, w.part) for w in entry.writes or ()}
            missing = sorted(set(child.parent_writes) - have)
            if missing:
                raise lag_error(
                    ctx,
                    f"pending writes {missing} of checkpoint {entry.checkpoint_id} of thread {entry.thread_id!r} "
                    f"(their index items), which {child.checkpoint_id} was made from",
                )
        child = entry
    if unseeded and not cut and child.chained and child.parent_id is not None and not parent_gone(ctx, child):
        raise lag_error(
            ctx, f"checkpoint {child.parent_id} of thread {child.thread_id!r}, the parent of {child.checkpoint_id} (its index item)"
        )
