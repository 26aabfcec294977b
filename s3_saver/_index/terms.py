"""What operations and an index exchange: the records an index answers with (``Prepared``,
``Cut``, ``ThreadRef``, ``Holdings``, ``WritesOutcome``, ``Activity``), the refusals a commit
raises (``Fenced``, ``ParentGone``, ``Archived``), the callbacks an index takes (``Release``,
``DepthHint``), and ``one_line``, a global table's pending writes read as one region's.

The entries themselves (what is stored) are the format's; these are the index's terms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from s3_saver._format.entries import (
    Activity,
    ArchiveRef,
    CheckpointEntry,
    Tombstone,
    WritesEntry,
)
from s3_saver._transport.protocol import Op
from s3_saver.errors import ThreadArchivedError

# How many ancestors a walk from this checkpoint probably reads (None: no idea);
# a backend that reads the chain in pieces reads that many at once.
DepthHint = Callable[["CheckpointEntry"], "int | None"]


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
        # With encryption: the keys the read loaded beside the index read that raised
        # this (``_ops/keyed.keyed_beside``), with which the read goes on against the
        # archive (an operation's ``Sealer``; None: none loaded).
        self.sealer: Any = None


class Fenced(Exception):
    """A commit the thread's record refused: it was deleted since the writer
    read it (``gen``), archived, being archived (a DynamoDB mark the writer may
    take off), or the writer's run was deleted. ``record`` is the record as the
    index holds it; the operation decides (``_ops.put``)."""

    def __init__(self, record: Tombstone) -> None:
        super().__init__(f"thread {record.thread_id!r}: the commit was refused by the thread's record")
        self.record = record


class ParentGone(Exception):
    """A checkpoint commit whose parent entry left the index (pruned, deleted by
    delete_for_runs) or was written anew (restored, under another tag) since the
    writer read it: the values it carries from the parent may be gone, so it
    stores them itself and commits again."""
# Called by an index once entries are out of it: ``release(gone, staying)``
# deletes the objects ``gone`` names that nothing in ``staying`` names (``_format/closure``).
Release = Callable[[list[Any], list[Any]], "Op[None]"]


@dataclass
class Cut:
    """What prune or delete_for_runs takes out of a thread: checkpoints to hide
    (newer ones read through them) and checkpoints to drop, with their writes."""

    hide: list[CheckpointEntry] = field(default_factory=list)
    drop: list[CheckpointEntry] = field(default_factory=list)


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
    # The activity entry the commit records, with its day and token (the manifest's
    # prepare wrote it; a table's commit writes it), None: none to record.
    active: Activity | None = None


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


def one_line(writes: list[WritesEntry], site: str) -> list[WritesEntry]:
    """The pending writes of one checkpoint, one region's line per task.

    After a failover both regions can have run the same task of the same
    checkpoint (the old one before the outage, its writes never replicated;
    the promoted one after). A global table then holds parts of both, and a
    task whose writes came from two runs would read as a state no run made.
    Per (namespace, checkpoint, task), only the parts of one region stay: the
    reading region's own (the one written to), else those of the region whose
    part comes first. A part another region committed first, that a call of
    the reading region kept in its slot instead of its own (first write wins),
    names the reading region: its commit adopts it (``DynamoIndex.commit_writes``),
    so that call reads whole. Writes without a site (the manifest, whose head
    is one region's) pass as they are.
    """
    sites: dict[tuple[str, str, str], set[str]] = {}
    for w in writes:
        if w.site is not None:
            sites.setdefault((w.ns, w.checkpoint_id, w.task_id), set()).add(w.site)
    mixed = {task: (site if site in found else min(found)) for task, found in sites.items() if len(found) > 1}
    if not mixed:
        return writes
    return [w for w in writes if mixed.get((w.ns, w.checkpoint_id, w.task_id), w.site) == w.site]
