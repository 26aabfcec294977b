"""The index interface: what every saver operation asks of an index, in parsed entries.

Two backends implement it, a DynamoDB table and a per-thread manifest in the
bucket; every operation in ``_ops`` is written once against it. Each method is
a generator operation (see ``_transport/protocol``): it yields the calls it needs and
returns entries, never a backend's raw response.

Rules every backend keeps:

* The index write is the commit point: an operation writes its objects first,
  then calls ``commit_*``.
* Readers never see a deleted generation (``delete_thread``'s tombstones) or an
  expired entry.
* Entries carry full ``loc`` maps in memory, whatever a backend stores.

The entries are the format's (``_format/entries``); the records an index exchanges with
operations are in ``terms``.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from s3_saver._format.entries import (
    Activity,
    CheckpointEntry,
    Key3,
    WritesEntry,
)
from s3_saver._index.terms import (
    Cut,
    DepthHint,
    Prepared,
    Release,
    ThreadRef,
    WritesOutcome,
)
from s3_saver._index.upkeep import Upkeep
from s3_saver._transport.protocol import Op

# Threads per page when an admin operation walks the whole listing.
_LISTING_PAGE = 100


class Index(Upkeep):
    """One index backend; ``describe()`` names it in messages."""

    # True when ``entries`` sends no request (it answers from what was read):
    # the resolver then looks up first and sends one wave of GETs after.
    local_lookups = False
    # True when ``prepare`` writes a new thread's listing record itself (the
    # commit then only makes it count): ``note`` is not asked to.
    lists_in_prepare = False
    # Which bucket owns the index's prefix (``_transport/ownership``); None: the index lives
    # in the bucket itself, so no other bucket can share it.
    owner: Any = None
    # Where the index replaces objects in the bucket (a versioned bucket keeps
    # each replaced one as a noncurrent version); None: it replaces none.
    replaced_prefix: str | None = None
    # Set by setup() (``_ops/versioning``): the bucket has versioning enabled.
    versioned_bucket = False
    # True when the activity entries are objects in the bucket (``_index/activity``).
    activity_objects = False

    @abstractmethod
    def describe(self) -> str: ...

    def held_blobs(self) -> dict[str, dict[str, Any]]:
        """Blob objects the index holds itself (an archive), by key: the resolver
        reads them from here instead of the bucket."""
        return {}

    def held_records(self) -> dict[str, dict[str, Any]]:
        """Checkpoint objects the index holds itself by key, decoded: an archive's
        objects of checkpoints it has no entry of (values a pruned or expired
        ancestor stored, which later checkpoints still read)."""
        return {}

    def held_bodies(self) -> Any:
        """Checkpoint objects' bytes as stored (sealed, with encryption) that the index
        holds by key (``.get(key)``: None when it holds none): the resolver opens and
        decodes them, as it does what it GETs."""
        return {}

    # -- setup ---------------------------------------------------------------------
    @abstractmethod
    def setup(self, bucket: str, bucket_region: str | None, ttl: bool) -> Op[None]:
        """Create what the index needs (idempotent), next to ``bucket`` (in the region
        HeadBucket named, when it did)."""

    # -- writes --------------------------------------------------------------------
    @abstractmethod
    def prepare(
        self,
        thread_id: str,
        ns: str,
        parent_id: str | None,
        list_at: int | None = None,
        gen: int | None = None,
        active: int | None = None,
    ) -> Op[Prepared]:
        """What a writer reads beside its object writes: the thread's delete
        generation, the entry of ``parent_id`` as stored (None when not asked
        for, or not found) and whether the thread is listed; ``list_at``: when
        it is not, list it as created then (a root namespace's checkpoint).
        ``gen``: the generation of the checkpoint the write extends, known to
        this process (and, with ``list_at``, the thread known listed in it):
        an index whose commit fences on the generation need read nothing.
        ``active``: the day (yyyymmdd) whose activity entry the thread needs
        (``_ops/idle``); ``Prepared.active`` says what the commit records (a new
        entry, its own token)."""

    @abstractmethod
    def commit_checkpoint(
        self,
        entry: CheckpointEntry,
        created: int | None = None,
        parent_tag: str | None = None,
        active: Activity | None = None,
        key_id: str | None = None,
    ) -> Op[None]:
        """The commit point of ``put``, fenced: atomically with the write, the
        thread's record must still be in ``entry.gen``, not archived nor being
        archived, ``entry.run_id`` not deleted, and (encryption) ``key_id``, the
        data key the entry's content is sealed under, not among the keys an
        erase destroyed (``Tombstone.gone_keys``) (else ``Fenced``); with
        ``parent_tag`` (the entry carries values from its parent), the parent's
        entry must still be in the index with that tag (else ``ParentGone``).
        ``created``: the thread is new; record when (``note`` lists it).
        ``active``: ``Prepared.active``, the thread's activity entry of that day,
        recorded with the commit (a hint, never the commit point): the thread's
        record names its day and token."""

    @abstractmethod
    def note(self, thread_id: str, created: int | None, run_id: str | None) -> Op[None]:
        """The records that find a thread, sent beside a commit: the thread
        listing entry of a new thread (``created``, unless ``prepare`` wrote it),
        and that run ``run_id`` wrote to it. Hints only: a hint whose commit
        failed finds nothing."""

    @abstractmethod
    def unnote(self, thread_id: str, created: int | None, run_id: str | None) -> Op[None]:
        """Take back what ``note`` (and a manifest ``prepare``) wrote for a commit
        that was refused: the listing entry of ``created`` (only if the thread
        is listed as created then: a refused commit's listing never counted)
        and the (run, thread) hint."""

    @abstractmethod
    def commit_writes(self, entries: list[WritesEntry], key_id: str | None = None) -> Op[WritesOutcome]:
        """The commit point of ``put_writes``: regular parts first-wins, special
        parts last-wins, in the order the index commits them. A retried request
        that meets its own commit counts as written. Fenced by the thread's
        record like ``commit_checkpoint`` (its generation, archive state and
        destroyed keys)."""

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
    def committed(self, thread_id: str) -> Op[tuple[list[CheckpointEntry], list[WritesEntry]]]:
        """``contents``, and the pending writes the index committed for checkpoints
        it does not hold (writes may come before their checkpoint's put): what a
        failback's merge must keep or set aside, never pass over."""

    def own_committed(self, thread_id: str) -> Op[tuple[list[CheckpointEntry], list[WritesEntry]] | None]:
        """``committed`` as this region's index last committed it itself, when
        another region's index replicated over it since (a manifest head, after
        a failback); None: what it holds is its own (a table keeps every item)."""
        return None
        yield  # pragma: no cover - makes this a generator

    @abstractmethod
    def threads(
        self, before: ThreadRef | None, page_size: int, cursor: Any
    ) -> Op[tuple[list[tuple[ThreadRef, CheckpointEntry | None]], Any]]:
        """One page of the thread listing, newest thread first, below ``before``,
        each thread with its latest root checkpoint (None: it has none; its
        writes may be unloaded); returns the next cursor (None at the end)."""

    def thread_ids(self) -> Op[dict[str, bool]]:
        """Every thread this index holds, listed or not (admin: promote and verify),
        each with True when ``threads`` lists it. A table lists each thread in the
        commit that first writes it: its listing is the answer."""
        ids: dict[str, bool] = {}
        cursor = None
        while True:
            page, cursor = yield from self.threads(None, _LISTING_PAGE, cursor)
            ids.update((ref.thread_id, True) for ref, _ in page)
            if cursor is None:
                return ids

    @abstractmethod
    def created(self, thread_id: str) -> Op[int | None]:
        """When the thread was listed (None: it is not)."""

    @abstractmethod
    def runs(self, run_ids: list[str]) -> Op[dict[str, list[str]]]:
        """The threads each run wrote to (hints: each may hold none of it any more)."""

    def reshard(self) -> Op[int]:
        """Move what earlier versions kept in one partition (the thread listing,
        the run hints) into this index's shards; returns how many records moved
        (``setup()``: resumable, idempotent). A manifest keeps none that way."""
        return 0
        yield  # pragma: no cover - makes this a generator

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
        self,
        thread_id: str,
        entries: list[CheckpointEntry],
        writes: list[WritesEntry],
        created: int,
        active: Activity | None = None,
        key_id: str | None = None,
    ) -> Op[None]:
        """Write the entries of a thread read back from its objects (``rebuild_index``,
        ``import_thread``), replacing what the index holds for it, except what a
        surviving tombstone or delete says is deleted; list the thread (as
        created at ``created``) unless it is listed. ``active``: the activity
        entry ``stage_active`` made, recorded on the thread's record (unless a
        delete came since the entries' generation: then nothing names it).
        ``key_id`` (encryption): the key the entries are sealed under; refused
        (``Fenced``, nothing written) when the thread's record says an erase
        destroyed it, as a commit's fence refuses (``commit_checkpoint``)."""

    # -- delete, prune and copy ------------------------------------------------------
    @abstractmethod
    def delete_thread(self, thread_id: str, now: int, release: Release, gone: frozenset[str] = frozenset()) -> Op[None]:
        """Make the thread gone for readers and writers in one write (its record's
        next generation), then ``release`` what its entries name, before the
        entries go. Cut short anywhere, a call again finishes it. What stays is
        one small record (the generation, when it was deleted). ``gone`` (an
        erase, with encryption): the ids of the thread's destroyed data keys, added
        to the record by that same write (written even for a thread the index
        holds nothing of), so that no commit sealed under one lands after it."""

    @abstractmethod
    def drop(self, thread_id: str, plan: Callable[[list[CheckpointEntry]], Op[Cut]], release: Release) -> Op[None]:
        """Take checkpoints out of a thread (prune, delete_for_runs): read every
        checkpoint (hidden and expired ones included) with its writes, ask
        ``plan`` what to hide and what to drop, change the index fenced like a
        commit (decided again when a commit lands first), then ``release`` what
        the dropped ones name and nothing still in the index names."""

    @abstractmethod
    def drop_strays(self, thread_id: str, strays: list[WritesEntry]) -> Op[list[WritesEntry]]:
        """Take out pending-write parts whose checkpoint the index does not hold
        (``collect_garbage``: a run that ended between its writes and its
        checkpoint's commit, longer ago than the grace period): each only while
        its checkpoint is still absent and its slot still holds that very part,
        checked atomically with the removal. Returns the parts taken out."""

    @abstractmethod
    def copy_thread(
        self,
        source: str,
        dest: str,
        entries: list[CheckpointEntry],
        writes: list[WritesEntry],
        now: int,
        release: Release,
        active: Activity | None = None,
        key_id: str | None = None,
    ) -> Op[None]:
        """Install a copy of ``source`` (its objects written already, under ``dest``)
        into ``dest``, listed as created ``now``; refuses (ConfigurationError) a
        ``dest`` with checkpoints of its own (an earlier copy of ``source`` is not:
        what it holds that this copy does not goes, through ``release``).
        ``active``, ``key_id``: as for ``restore``, checked on ``dest``'s record."""

    @abstractmethod
    def check_copy_target(self, source: str, dest: str) -> Op[Any]:
        """Refuse (ConfigurationError) a copy into ``dest`` before anything is written."""

