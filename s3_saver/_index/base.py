"""The index interface: what every saver operation asks of an index, in parsed entries.

Two backends implement it, a DynamoDB table and a per-thread manifest in the
bucket; every operation in ``_ops`` is written once against it. Each method is
a generator operation (see ``_protocol``): it yields the calls it needs and
returns entries, never a backend's raw response.

Rules every backend keeps:

* The index write is the commit point: an operation writes its objects first,
  then calls ``commit_*``.
* Readers never see a deleted generation (``delete_thread``'s tombstones) or an
  expired entry.
* Entries carry full ``loc`` maps in memory, whatever a backend stores.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from s3_saver._protocol import Op
from s3_saver.errors import ThreadArchivedError

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
Loc = dict[str, tuple[Any, str, int, int]]
# How many ancestors a walk from this checkpoint probably reads (None: no idea);
# a backend that reads the chain in pieces reads that many at once.
DepthHint = Callable[["CheckpointEntry"], "int | None"]


@dataclass
class CheckpointEntry:
    """A checkpoint as the index describes it (values not yet loaded)."""

    thread_id: str
    ns: str
    checkpoint_id: str
    parent_id: str | None
    # channel -> (version, source checkpoint id, IN_CHECKPOINT_OBJECT | IN_BLOB_OBJECT, put time)
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


@dataclass
class Tombstone:
    """Left by ``delete_thread``: everything of the thread (``ns`` None) or of one
    namespace written before generation ``gen`` is deleted.

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


@dataclass
class ArchiveRef:
    """Where an archived thread lives: one object under ``archive/`` (see ``_archive``).

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


class Archived(ThreadArchivedError):
    """Raised by an index read of an archived thread; the operations catch it and
    read the archive (instant classes) or tell the caller to restore it."""

    def __init__(self, thread_id: str, ref: ArchiveRef) -> None:
        super().__init__(
            f"thread {thread_id!r} is archived in s3 object {ref.key} ({ref.storage_class}): "
            f"restore_thread({thread_id!r}) brings it back before it can be changed",
            thread_id,
            ref.storage_class,
            ref.key,
        )
        self.ref = ref


IndexEntry = CheckpointEntry | WritesEntry | Tombstone


@dataclass
class Prepared:
    """What a writer reads beside its object writes."""

    gen: int  # the thread's delete generation (0: never deleted)
    parent: CheckpointEntry | None  # the parent's entry as stored, when asked for
    listed: bool  # the thread is in the thread listing already
    # Not listed: the time to list it at, beside the commit (None: it cannot be
    # listed by this write; see ManifestIndex.prepare).
    listing: int | None = None
    # Runs delete_for_runs deleted from the thread: they may write no more.
    dead_runs: frozenset[str] = frozenset()
    # The thread is archived: it is restored before this write goes on.
    archive: ArchiveRef | None = None


@dataclass
class ThreadRef:
    """A thread in the listing: its id and when its first checkpoint was written."""

    thread_id: str
    created: int
    archived: str | None = None  # the archive's storage class


@dataclass
class Holdings:
    """What one thread's index refers to, for ``audit`` and ``collect_garbage``.

    ``live``: entries a reader may follow (their objects must exist, unless the
    entry has expired: ``audit`` checks ``expires_at``). ``kept``: entries no
    reader follows any more whose objects are not garbage either: a delete,
    prune or archive still to finish them, writes parked under an archive.
    ``index_keys``: the index's own objects (a manifest's head and segments;
    none for DynamoDB).
    """

    live: list[Any] = field(default_factory=list)
    kept: list[Any] = field(default_factory=list)
    kept_keys: set[str] = field(default_factory=set)  # objects not to collect (a restore's stale archive...)
    index_keys: set[str] = field(default_factory=set)
    found: bool = False  # the index holds anything of the thread at all


@dataclass
class WritesOutcome:
    """What committing pending-write parts left unreferenced: object tokens of parts
    that lost a first-wins race or that a last-wins write replaced."""

    unused: list[tuple[WritesEntry, str]] = field(default_factory=list)


class Index(ABC):
    """One index backend; ``describe()`` names it in messages."""

    # True when ``entries`` sends no request (it answers from what was read):
    # the resolver then looks up first and sends one wave of GETs after.
    local_lookups = False
    # True when ``prepare`` writes a new thread's listing record itself (the
    # commit then only makes it count): ``note`` is not asked to.
    lists_in_prepare = False

    @abstractmethod
    def describe(self) -> str: ...

    def held_blobs(self) -> dict[str, dict[str, Any]]:
        """Blob objects the index holds itself (an archive), by key: the resolver
        reads them from here instead of the bucket."""
        return {}

    # -- setup ---------------------------------------------------------------------
    @abstractmethod
    def setup(self, bucket: str, bucket_region: str | None, ttl: bool) -> Op[None]:
        """Create what the index needs (idempotent), next to ``bucket`` (in the region
        HeadBucket named, when it did)."""

    # -- writes --------------------------------------------------------------------
    @abstractmethod
    def prepare(self, thread_id: str, ns: str, parent_id: str | None, list_at: int | None = None) -> Op[Prepared]:
        """What a writer reads beside its object writes: the thread's delete
        generation, the entry of ``parent_id`` as stored (None when not asked
        for, or not found) and whether the thread is listed; ``list_at``: when
        it is not, list it as created then (a root namespace's checkpoint)."""

    @abstractmethod
    def commit_checkpoint(self, entry: CheckpointEntry, created: int | None = None) -> Op[None]:
        """The commit point of ``put``. May raise ThreadDeletedError when the
        index can tell that the thread was deleted since ``prepare``.
        ``created``: the thread is new; record when (``note`` lists it)."""

    @abstractmethod
    def note(self, thread_id: str, created: int | None, run_id: str | None) -> Op[None]:
        """The records that find a thread, sent beside a commit: the thread
        listing entry of a new thread (``created``, unless ``prepare`` wrote it),
        and that run ``run_id`` wrote to it. Hints only: a hint whose commit
        failed finds nothing."""

    @abstractmethod
    def commit_writes(self, entries: list[WritesEntry]) -> Op[WritesOutcome]:
        """The commit point of ``put_writes``: regular parts first-wins, special
        parts last-wins, in the order the index commits them. A retried request
        that meets its own commit counts as written. May raise ThreadDeletedError
        like ``commit_checkpoint``."""

    # -- reads ---------------------------------------------------------------------
    @abstractmethod
    def latest(self, thread_id: str, ns: str) -> Op[CheckpointEntry | None]:
        """The newest live checkpoint of (thread, ns); its writes may be unloaded (None)."""

    @abstractmethod
    def get(self, thread_id: str, ns: str, checkpoint_id: str) -> Op[CheckpointEntry | None]:
        """A live checkpoint with its writes, or None."""

    @abstractmethod
    def writes(self, entry: CheckpointEntry) -> Op[list[WritesEntry]]:
        """Every pending-write part of a checkpoint."""

    @abstractmethod
    def entries(self, keys: list[Key3]) -> Op[dict[Key3, CheckpointEntry | None]]:
        """Checkpoints that hold values of newer ones (None: not found)."""

    @abstractmethod
    def history(
        self, thread_id: str, ns: str | None, before_id: str | None, page_size: int | None, cursor: Any
    ) -> Op[tuple[list[CheckpointEntry], Any]]:
        """One page of live checkpoints with their writes, newest first, below
        ``before_id``; returns the next cursor (None at the end). ``ns`` None:
        every namespace, newest first within each."""

    @abstractmethod
    def ancestors(
        self, thread_id: str, ns: str, checkpoint_id: str, channels: set[str], depth_hint: DepthHint | None = None
    ) -> Op[tuple[CheckpointEntry | None, list[CheckpointEntry]]]:
        """The checkpoint (None: not found) and its parent chain (parent first) with
        writes, until every channel is seeded (in an entry's ``loc``) or the root
        is reached."""

    @abstractmethod
    def contents(self, thread_id: str) -> Op[list[CheckpointEntry]]:
        """Every checkpoint of the thread, hidden ones included, with its writes
        (prune and delete_for_runs)."""

    @abstractmethod
    def threads(
        self, before: ThreadRef | None, page_size: int, cursor: Any
    ) -> Op[tuple[list[tuple[ThreadRef, CheckpointEntry | None]], Any]]:
        """One page of the thread listing, newest thread first, below ``before``,
        each thread with its latest root checkpoint (None: it has none; its
        writes may be unloaded); returns the next cursor (None at the end)."""

    @abstractmethod
    def created(self, thread_id: str) -> Op[int | None]:
        """When the thread was listed (None: it is not)."""

    @abstractmethod
    def runs(self, run_ids: list[str]) -> Op[dict[str, list[str]]]:
        """The threads each run wrote to (hints: each may hold none of it any more)."""

    @abstractmethod
    def bury_runs(self, thread_id: str, run_ids: list[str]) -> Op[None]:
        """Record that these runs were deleted from the thread, before anything of
        them goes: a write of such a run refuses (RunDeletedError)."""

    @abstractmethod
    def forget_runs(self, pairs: list[tuple[str, str]]) -> Op[None]:
        """Drop the (run, thread) hints of runs that were deleted."""

    @abstractmethod
    def all_threads(self) -> Op[list[CheckpointEntry]]:
        """Every live checkpoint of every thread of this prefix, with writes (admin)."""

    @abstractmethod
    def restore(
        self, thread_id: str, entries: list[CheckpointEntry], writes: list[WritesEntry], created: int
    ) -> Op[None]:
        """Write the entries of a thread read back from its objects (``rebuild_index``),
        replacing what the index holds for it, except what a surviving tombstone
        or delete says is deleted; list the thread (as created at ``created``)
        unless it is listed."""

    # -- delete and copy -------------------------------------------------------------
    @abstractmethod
    def delete_thread(
        self, thread_id: str, now: int, delete_objects: Callable[[list[IndexEntry]], Op[None]]
    ) -> Op[None]:
        """Make the thread gone for readers and writers at once, then call
        ``delete_objects`` with the entries whose objects go, before their
        entries do. Cut short anywhere, a call again finishes it."""

    @abstractmethod
    def drop(
        self,
        thread_id: str,
        hide: list[CheckpointEntry],
        drop: list[CheckpointEntry],
        doomed: list[IndexEntry],
        delete_objects: Callable[[list[IndexEntry]], Op[None]],
    ) -> Op[None]:
        """Take checkpoints out of a thread (prune, delete_for_runs): ``hide``
        stay for the checkpoints that read through them (``hidden``), ``drop``
        go with their writes, and then the objects of ``doomed`` (the entries,
        trimmed to what nothing kept refers to) through ``delete_objects``.
        Entries go before objects: cut short, nothing kept points at a missing
        object."""

    @abstractmethod
    def copy_thread(
        self,
        source: str,
        dest: str,
        copy_objects: Callable[[list[IndexEntry]], Op[None]],
        expired: Callable[[CheckpointEntry], bool],
        now: int,
    ) -> Op[None]:
        """Copy the live entries of ``source`` to the empty thread ``dest``: all
        their objects first (``copy_objects``), then exactly those entries; list
        ``dest`` as created ``now``."""

    # -- archive -----------------------------------------------------------------------
    @abstractmethod
    def archive_of(self, thread_id: str) -> Op[Tombstone]:
        """The thread's own record: ``archive`` (None: live) and ``stale_archive``."""

    @abstractmethod
    def archive(
        self,
        thread_id: str,
        ref: ArchiveRef,
        archived: list[CheckpointEntry] | None,
        delete_objects: Callable[[list[Any]], Op[None]],
        known: list[CheckpointEntry] | None = None,
    ) -> Op[None]:
        """Switch the thread to its archive object (the commit point: from then on
        every read goes there), then remove the live entries ``archived`` (with
        their writes) after their objects. ``archived`` None: the switch happened
        before (a cleanup cut short): remove what is left of ``known`` (the
        archive's entries, when it could be read), else up to ``ref.newest``.
        A write committed after the switch stays, parked until the restore.
        The switch needs ``intend_archive(ref.key)`` first, and takes that mark off.
        Raises ThreadArchivedError when the thread is archived in another object,
        or the mark is another's."""

    @abstractmethod
    def unarchive(
        self, thread_id: str, ref: ArchiveRef, entries: list[CheckpointEntry], writes: list[WritesEntry]
    ) -> Op[None]:
        """Install the entries read back from ``ref`` (their objects are written)
        and take the archive marker out, in that order (the commit point), with
        ``ref``'s object left to delete (``stale_archive``); writes parked under
        the marker stay."""

    @abstractmethod
    def intend_archive(self, thread_id: str, key: str) -> Op[None]:
        """Record, before it is written, the archive object ``key`` as one to delete
        (``stale_archive``) unless ``archive`` makes it the thread's archive: a call
        cut short and not repeated as is (the thread changed) leaves nothing behind.
        Raises ThreadArchivedError when the thread is archived, or another archive
        object waits for deletion."""

    # -- audit -------------------------------------------------------------------------
    @abstractmethod
    def holdings(self, thread_id: str) -> Op[Holdings]:
        """Everything the index holds of one thread, tombstoned, hidden, expired and
        archived included, and the index's own objects; a damaged index raises
        (``CorruptObjectError``, ``MissingObjectError``)."""

    @abstractmethod
    def forget_archive(self, thread_id: str, key: str) -> Op[None]:
        """The archive object ``key`` is deleted: drop it from ``stale_archive``."""
