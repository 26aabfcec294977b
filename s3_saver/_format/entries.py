"""The index's entries: what every backend parses its records into, and what the stored
forms encode (DynamoDB items, the manifest document, the archive).

Checkpoint and writes entries, tombstones, activity entries, archive references and the
refs of a ``loc`` map, with the constants that size them. The records operations exchange
with an index (``Prepared``, ``Cut``...) and the refusals a commit raises are the index's
terms (``_index/terms``); the interface itself, ``Index``, is in ``_index/base``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# loc entry kinds: where the value of (channel, version) is stored.
IN_CHECKPOINT_OBJECT = 0
IN_BLOB_OBJECT = 1

# Pending-write parts: a task's regular writes ("r<extent>"), or one special
# channel's slot ("s<k>" for the channel with index -k in WRITES_IDX_MAP).
REGULAR_PART = "r"
SPECIAL_PART = "s"

# A checkpoint object (with the values inside it) and its index entry are sized
# to fit a DynamoDB item (400 KB, less room for keys and attribute names)
# whichever index is used, so a thread can move between index modes.
ENTRY_BUDGET = 400 * 1024 - 8 * 1024

Key3 = tuple[str, str, str]  # (thread_id, checkpoint_ns, checkpoint_id)
# channel -> a reference to the object that holds the value of its version:
# (version, source checkpoint id, IN_CHECKPOINT_OBJECT | IN_BLOB_OBJECT, put time[, tag[, pieces]]).
# The tag (see ``_format/keys``) is there only when the object was written tagged.
# ``pieces``: the value is a list stored as a delta (see ``_format/pieces``); the refs
# of the earlier pieces it reads, keyframe first (each a ref without pieces,
# put time 0), and the reference's own object holds the last piece.
Ref = tuple[Any, ...]
Loc = dict[str, Ref]


def ref_tag(ref: Ref) -> str:
    return ref[4] if len(ref) > 4 else ""


def make_ref(version: Any, source: str, kind: int, put_at: int, tag: str = "", pieces: tuple[Ref, ...] = ()) -> Ref:
    if pieces:
        return (version, source, kind, put_at, tag, tuple(pieces))
    return (version, source, kind, put_at, tag) if tag else (version, source, kind, put_at)


def ref_pieces(ref: Ref) -> tuple[Ref, ...]:
    """Every stored object the value reads, in order: a whole value is one; a
    delta's earlier pieces (keyframe first), then its own."""
    if len(ref) > 5:
        return (*ref[5], make_ref(ref[0], ref[1], ref[2], ref[3], ref[4]))
    return (ref,)


def as_ref(value: Any) -> Ref:
    """A reference as decoded from msgpack (lists) made a tuple again, pieces included."""
    if len(value) > 5:
        return (*value[:5], tuple(tuple(p) for p in value[5]))
    return tuple(value)


def retag(ref: Ref, tag: str) -> Ref:
    """The same reference to the copy of its objects written under ``tag`` (a
    thread's objects are copied together, the pieces of its deltas too)."""
    pieces = tuple(make_ref(p[0], p[1], p[2], p[3], tag) for p in ref[5]) if len(ref) > 5 else ()
    return make_ref(ref[0], ref[1], ref[2], ref[3], tag, pieces)


@dataclass
class CheckpointEntry:
    """A checkpoint as the index describes it (values not yet loaded)."""

    thread_id: str
    ns: str
    checkpoint_id: str
    parent_id: str | None
    # channel -> the reference to its value's object (see ``Ref``)
    loc: Loc
    body: bytes | None = None
    metadata: tuple[str, bytes] | None = None
    expires_at: int | None = None
    # The thread's delete generation when the entry was written (see Tombstone).
    gen: int = 0
    # None: not read yet (the resolver asks the index for them).
    writes: list[WritesEntry] | None = field(default_factory=list)
    # The run that wrote it (metadata "run_id"), for delete_for_runs.
    run_id: str | None = None
    # Taken out of the thread's history by prune or delete_for_runs, and kept
    # only because checkpoints that stay read through it: values they point at
    # (``loc``), or the writes a DeltaChannel replays. Never listed or returned.
    hidden: bool = False
    # The tag of its checkpoint object's key ("" for a put's own write; see ``_format/keys``).
    tag: str = ""
    # What a reader of a replicated index needs to prove this checkpoint's past
    # complete (a global table replicates item by item; see ``_ops/lagged``):
    # ``chained``: the entry was written by a version that records the two
    # fields below, so its parent missing from the index is a hole unless
    # ``parent_gone`` says it was taken out (prune, delete_for_runs, a
    # failback's merge). ``parent_writes``: the (task_id, part) slots of the
    # parent's pending writes this checkpoint was made from, as the writer knew
    # them (None: it did not know them).
    chained: bool = False
    parent_writes: tuple[tuple[str, str], ...] | None = None
    parent_gone: bool = False

    @property
    def key(self) -> Key3:
        return (self.thread_id, self.ns, self.checkpoint_id)


@dataclass
class WritesEntry:
    """The pending writes of one task for one checkpoint: its regular writes
    (``part`` "r<n>") or one special channel's slot (``part`` "s<k>")."""

    thread_id: str
    ns: str
    checkpoint_id: str
    task_id: str
    part: str
    token: str
    body: bytes | None = None
    gen: int = 0
    expires_at: int | None = None
    # DynamoDB: the bucket of the region that committed the part. A global
    # table merges both regions' items after a failover (last writer wins per
    # part), so one task's parts can come from two regions: see ``one_line``.
    site: str | None = None


@dataclass(frozen=True)
class Activity:
    """An activity entry: thread ``thread_id`` was written on ``day`` (yyyymmdd, UTC).
    ``shard`` and ``position`` place it in the walk (a cursor per shard).

    ``token``: new for every entry written (``_index/activity``), so that a write of
    the same thread and day is never taken for an entry read before it: a delete
    removes the entry only as it was read (its token), never a newer write under
    the same day and thread. "": an entry written before tokens (or none known)."""

    day: int
    thread_id: str
    shard: str = ""
    position: str = ""
    token: str = ""


@dataclass
class Tombstone:
    """The thread's record (``ns`` None): everything of the thread written before
    generation ``gen`` is deleted (``delete_thread`` moves it on), and where the
    thread lives (its archive, the marks of operations under way). With ``ns``:
    a namespace's tombstone, which earlier versions' deletes wrote (still honoured).

    Entries carry the generation they were written in, so an entry that a run
    in flight committed after the delete started is recognised as deleted too.
    """

    thread_id: str
    ns: str | None
    gen: int
    deleted_at: int = 0
    # On the thread's item (``ns`` None): when the thread was listed (0: it is not),
    # and the runs delete_for_runs deleted from it.
    created: int = 0
    dead_runs: frozenset[str] = frozenset()
    # Archived (a marker: the thread reads from the archive object), and an
    # archive object a restore left to delete.
    archive: ArchiveRef | None = None
    stale_archive: str | None = None
    # DynamoDB: an archive under way (the key of the object it writes): the
    # archive switches only if no commit came meanwhile (a commit takes the
    # mark off); and a restore under way (an archive's cleanup stops).
    archiving: str | None = None
    restoring: str | None = None
    # A delete's listing entry still to remove (the time it was listed at).
    unlisting: int = 0
    # The day (yyyymmdd) of the thread's latest activity entry, as writes recorded
    # it (0: none known): an archive removes that entry (``_ops/archive``).
    active: int = 0
    # The first such day in any of the thread's lives (a delete keeps it): where
    # an erase starts looking for the thread's entries (``idle.activity_span``).
    since: int = 0
    # DynamoDB: a deleted archive's runs whose hints a delete still has to remove.
    stale_runs: frozenset[str] = frozenset()
    # The tokens of the activity entries of day ``active`` that writes recorded (a
    # table: the one it holds; a manifest: the last few, one per process that
    # wrote that day): an archive or a delete removes those entries and no other.
    active_tokens: tuple[str, ...] = ()
    # With encryption: the ids (hex) of the thread's data keys an erase destroyed,
    # written by the erase's delete switch. A commit sealed under one of them is
    # refused (a process that cached the key before the erase: ``_ops/commit``).
    gone_keys: frozenset[str] = frozenset()

    def named_entries(self) -> list[Activity]:
        """The activity entries this record names (an entry written before tokens:
        the day's key alone)."""
        if not self.active:
            return []
        return [Activity(self.active, self.thread_id, token=t) for t in self.active_tokens or ("",)]


@dataclass
class ArchiveRef:
    """Where an archived thread lives: one object under ``archive/`` (see ``_format/archive``).

    Written into the index by ``Index.archive`` (the switch: from then on the
    thread reads from the archive) and taken out by ``Index.unarchive``.
    """

    key: str
    storage_class: str
    size: int  # bytes of the archive object
    archived_at: int
    # The newest checkpoint archived per namespace: a cleanup run again after a
    # crash removes the live entries up to these, never a write that came later.
    newest: dict[str, str]
    # The root namespace's latest checkpoint, its object without values (the
    # thread listing shows it without reading the archive); None: no root checkpoint.
    latest: CheckpointEntry | None = None
    checkpoints: int = 0  # how many it holds
    live_bytes: int = 0  # what its objects weighed live
    # The runs it holds checkpoints of: a delete of the archived thread removes
    # their hints without reading the archive.
    runs: list[str] = field(default_factory=list)


IndexEntry = CheckpointEntry | WritesEntry | Tombstone


