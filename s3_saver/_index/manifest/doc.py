"""The manifest's documents: a thread's head and its sealed segments, to and from bytes.

A head lists the thread's newest checkpoints (every namespace) with their
pending writes, its delete generation and the refs of its sealed segments; a
segment holds older checkpoints and their writes, and is never changed once
written. Entries are kept in commit order (a parent before its children), and
``loc`` is stored as changes from the parent when the parent is in the same
document, in full otherwise: a document decodes on its own.

Last, how entries are picked out of a decoded document (by id, the newest of a
namespace, an entry with its own writes): both modules of ``ManifestIndex``
(``backend`` and ``lifecycle``) do it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from s3_saver._format.archive import decode_ref, encode_ref
from s3_saver._format.codec import pack, unpack
from s3_saver._format.entries import (
    IN_CHECKPOINT_OBJECT,
    Activity,
    ArchiveRef,
    CheckpointEntry,
    Loc,
    Tombstone,
    WritesEntry,
    as_ref,
    ref_pieces,
    ref_tag,
)
from s3_saver._index.manifest import bodies

HEAD_FORMAT = "s3_saver.manifest-head/1"
SEGMENT_FORMAT = "s3_saver.manifest-segment/1"

# The head is read and rewritten by every write, so it carries bodies (the
# checkpoint object, a writes part) only where "latest" needs them: the newest
# checkpoint of each namespace and its writes, up to this size each (none on a
# versioned bucket: see ``encode_head``).
BODY_IN_HEAD_MAX = 8 * 1024
# In a segment (written once, read for history) up to this size.
BODY_IN_SEGMENT_MAX = 64 * 1024
# Metadata rides along up to this size (list(filter=) reads no objects then).
META_MAX = 16 * 1024
# The tokens of a day's activity entries a head names (``Head.active_tokens``): more
# processes writing the thread that day leave their entries to the walk.
ACTIVE_TOKENS_KEPT = 8

_FULL, _DELTA = 0, 1


@dataclass
class SegmentRef:
    number: int
    token: str
    min_id: str
    max_id: str
    count: int
    # Its greatest (namespace, checkpoint id): history merges head and segments
    # in one order without reading a segment that holds nothing above (None in
    # segments sealed before it was recorded: read them first).
    top: tuple[str, str] | None = None

    def row(self) -> list[Any]:
        return [self.number, self.token, self.min_id, self.max_id, self.count, *(self.top or ())]

    @classmethod
    def of(cls, row: list[Any]) -> SegmentRef:
        return cls(*row[:5], top=(row[5], row[6]) if len(row) > 6 else None)


@dataclass
class Head:
    """A thread's manifest head (an empty one when the thread has none yet)."""

    thread_id: str
    version: int = 0  # every write changes the bytes, so an ETag is never reused
    gen: int = 0
    deleted_at: int = 0
    entries: list[CheckpointEntry] = field(default_factory=list)
    # Writes of checkpoints that are not sealed (or arrived before their checkpoint).
    writes: list[WritesEntry] = field(default_factory=list)
    segments: list[SegmentRef] = field(default_factory=list)  # oldest first
    # Left by delete_thread until the deleted entries' objects are gone.
    graveyard: list[CheckpointEntry | WritesEntry] = field(default_factory=list)
    graveyard_segments: list[SegmentRef] = field(default_factory=list)
    copied_from: str | None = None
    # When the thread was listed (0: it is not); see ManifestIndex.threads.
    created: int = 0
    # Segments a prune replaced: their objects go once nothing refers to them.
    retired: list[SegmentRef] = field(default_factory=list)
    # Runs delete_for_runs deleted: they may commit no more checkpoints.
    dead_runs: list[str] = field(default_factory=list)
    # Archived: every read goes to this archive object (entries here are writes
    # that raced the archive, parked until the restore).
    archive: ArchiveRef | None = None
    # An archive object a restore or delete still has to remove.
    stale_archive: str | None = None
    # A deleted archive's runs, whose hints still name the thread: the delete's
    # switch takes the archive reference (which named them) out, so a delete
    # cut short after it learns them here (``ManifestLifecycle.delete_thread``).
    stale_runs: list[str] = field(default_factory=list)
    # A delete's listing object still to remove (the time it was listed at).
    unlisting: int = 0
    # An archive under way: the key of the object it writes (its switch needs it).
    archiving: str | None = None
    # The latest day (yyyymmdd) whose activity entry a write made (``_index/activity``):
    # a writer of a day not after it writes none. 0: none known. And the tokens of
    # that day's entries the commits recorded (one per process whose head did not
    # show the day yet; the last ``ACTIVE_TOKENS_KEPT``): an archive or a delete
    # removes those entries (their keys) and no other.
    active: int = 0
    active_tokens: list[str] = field(default_factory=list)
    # The first day whose activity entry a write recorded, in any of the thread's
    # lives (a delete keeps it): an erase looks for entries from there on (``idle.activity_span``).
    since: int = 0
    # With encryption: the ids (hex) of the data keys an erase destroyed (written by
    # its delete switch); a commit sealed under one is refused (``backend._fence``).
    gone_keys: list[str] = field(default_factory=list)
    # The bucket it was written to: after a failback, a region's own last head
    # is told from the other region's heads replicated over it (_ops/settle).
    site: str | None = None
    etag: str | None = None  # of the stored head this was read from (None: no head)
    # Bodies of sealed checkpoints whose objects hold values the newest
    # checkpoints read (unchanged channels, pieces of lists stored as deltas:
    # see ``_format/pieces``), by (namespace, id, tag), that this process sealed or
    # read in a head written before (they are no longer stored): its reads of
    # the latest state GET no such object.
    pinned: dict[tuple[str, str, str], bytes] = field(default_factory=dict)


def encode_head(head: Head, versioned: bool = False) -> bytes:
    """The head as stored: its rows, and the bodies of the newest checkpoint of
    each namespace and of its writes (up to BODY_IN_HEAD_MAX each), unless the
    bucket is ``versioned``: there no body at all.

    Every write re-uploads the head, and a versioned bucket keeps each one it
    replaces as a noncurrent version, so what the head carries is paid once
    per write (and, versioned, stored for as long as the bucket keeps
    versions). A body is the bytes of an immutable object (the checkpoint, a
    writes part): a read that does not find it in the head GETs that object in
    its second round trip, beside the pieces and large values the newest
    checkpoint reads (``resolve``), and this process fills the bodies it
    committed from memory (``Bodies``). Heads carried more before: a frame of
    the other checkpoints' bodies (up to 64 KB) and the bodies "latest" reads
    from sealed checkpoints (pinned); a head written so still reads.

    Routes measured (moto, 1 KB incompressible messages, no expiry rule; the
    noncurrent bytes of 20 / 60 / 200 turns per byte of the thread's own, and
    a cold process's read of the latest state, requests / round trips):
    frame and pinned (before) 10.2 / 14.3 / 14.0x, 1-4 / 1-2; the newest body
    alone 2.1 / 2.2 / 2.1x, 4-6 / 2; no body 1.1 / 1.26 / 1.25x, 5-7 / 2;
    no body, the head sealing at 24 keeping 8, 0.89 / 0.82 / 0.93x, 5-7 / 2;
    the newest body and that sealing 1.35 / 1.42 / 1.56x; no body, sealing at
    24 keeping 4 (``seal.VERSIONED_LIMITS``, chosen) 0.66 / 0.70 /
    0.82x, 5-7 / 2, 1% more write requests (the segments' PUTs); sealing at 16
    keeping 4, 0.67 / 0.68 / 0.82x for 4% more write requests and 80 round
    trips for a cold history of 200 turns (54 chosen). Bodies moved to immutable objects the head
    names (a pack per few checkpoints) would keep a cold history's GETs to
    the head's and the segments' but cost a PUT per pack: the bench's
    workload, whose reads are in the writing process, would send more
    requests than today for no fewer bytes than no frame at all.
    On an unversioned bucket, ``make bench``'s 20-turn agent workload uploads
    8.2 MB with frame and pinned, 1.6 MB without (the newest body kept: a read
    of the latest state then finds it in the head), for the same 452 requests
    (the cheapest S3-only peer: 4.2 MB).
    """
    tips = _tips(head.entries, pieces=False) if not versioned else set()
    doc = {
        "format": HEAD_FORMAT,
        "version": head.version,
        "gen": head.gen,
        "deleted_at": head.deleted_at,
        "entries": _encode_entries(head.entries, BODY_IN_HEAD_MAX, tips),
        "writes": [_encode_write(w, BODY_IN_HEAD_MAX if (w.ns, w.checkpoint_id) in tips else 0) for w in head.writes],
        "segments": [r.row() for r in head.segments],
        "graveyard": _encode_entries([e for e in head.graveyard if isinstance(e, CheckpointEntry)], 0, None),
        "graveyard_writes": [_encode_write(w, 0) for w in head.graveyard if isinstance(w, WritesEntry)],
        "graveyard_segments": [r.row() for r in head.graveyard_segments],
        "copied_from": head.copied_from,
        "created": head.created,
        "retired": [r.row() for r in head.retired],
        "dead_runs": head.dead_runs,
        "archive": encode_ref(head.archive) if head.archive is not None else None,
        "stale_archive": head.stale_archive,
        "unlisting": head.unlisting,
        "archiving": head.archiving,
        "active": head.active,
        "active_toks": head.active_tokens,
        "since": head.since,
        "site": head.site,
    }
    if head.stale_runs:  # only while a delete is under way: no byte on every other write
        doc["stale_runs"] = head.stale_runs
    if head.gone_keys:  # only after an erase with encryption
        doc["gone_keys"] = head.gone_keys
    return pack(doc)


def pieces_read(entries: list[CheckpointEntry]) -> set[tuple[str, str, str]]:
    """(namespace, id, tag) of the checkpoint objects holding values or pieces
    that the newest checkpoint of each namespace reads (other than its own)."""
    newest: dict[str, CheckpointEntry] = {}
    for e in entries:
        if not e.hidden and (e.ns not in newest or e.checkpoint_id > newest[e.ns].checkpoint_id):
            newest[e.ns] = e
    return {
        (tip.ns, p[1], ref_tag(p))
        for tip in newest.values()
        for ref in tip.loc.values()
        for p in ref_pieces(ref)
        if p[2] == IN_CHECKPOINT_OBJECT and p[1] != tip.checkpoint_id
    }


def decode_head(thread_id: str, data: bytes, where: str, etag: str | None) -> Head:
    doc = unpack(data, HEAD_FORMAT, where)
    entries, writes = bodies.fill(
        _decode_entries(thread_id, doc["entries"]),
        [_decode_write(thread_id, w) for w in doc["writes"]],
        doc.get(bodies.FIELD),
        where,
    )
    return Head(
        thread_id=thread_id,
        version=doc["version"],
        gen=doc["gen"],
        deleted_at=doc["deleted_at"],
        entries=entries,
        writes=writes,
        segments=[SegmentRef.of(r) for r in doc["segments"]],
        graveyard=[
            *_decode_entries(thread_id, doc["graveyard"]),
            *(_decode_write(thread_id, w) for w in doc["graveyard_writes"]),
        ],
        graveyard_segments=[SegmentRef.of(r) for r in doc["graveyard_segments"]],
        copied_from=doc["copied_from"],
        created=doc.get("created", 0),
        retired=[SegmentRef.of(r) for r in doc.get("retired", [])],
        dead_runs=list(doc.get("dead_runs", [])),
        archive=decode_ref(thread_id, doc["archive"], where) if doc.get("archive") is not None else None,
        stale_archive=doc.get("stale_archive"),
        stale_runs=list(doc.get("stale_runs", [])),
        gone_keys=list(doc.get("gone_keys", [])),
        site=doc.get("site"),
        unlisting=doc.get("unlisting", 0),
        archiving=doc.get("archiving"),
        active=doc.get("active", 0),
        active_tokens=list(doc.get("active_toks", [])),
        since=doc.get("since", 0),
        etag=etag,
        pinned=bodies.unpack_pinned(doc.get(bodies.PINNED), where),
    )


def encode_segment(entries: list[CheckpointEntry], writes: list[WritesEntry]) -> bytes:
    """Rows without bodies, and every body in one frame (``bodies``)."""
    doc = {
        "format": SEGMENT_FORMAT,
        "entries": _encode_entries(entries, 0, None),
        "writes": [_encode_write(w, 0) for w in writes],
    }
    frame = bodies.pack(entries, writes)
    if frame is not None:
        doc[bodies.FIELD] = frame
    return pack(doc)


def decode_segment(thread_id: str, data: bytes, where: str) -> tuple[list[CheckpointEntry], list[WritesEntry]]:
    doc = unpack(data, SEGMENT_FORMAT, where)
    # Segments written before frames carry their bodies in their rows.
    entries, writes = _decode_entries(thread_id, doc["entries"]), [_decode_write(thread_id, w) for w in doc["writes"]]
    return bodies.fill(entries, writes, doc.get(bodies.FIELD), where)


# -- entries ------------------------------------------------------------------------
def _tips(entries: list[CheckpointEntry], pieces: bool = True) -> set[tuple[str, str]]:
    """(namespace, id) of the newest checkpoint of each namespace, and (with
    ``pieces``) of the checkpoints whose objects hold the values it carries:
    what "latest" reads."""
    newest: dict[str, CheckpointEntry] = {}
    for e in entries:
        if e.hidden:
            continue
        if e.ns not in newest or e.checkpoint_id > newest[e.ns].checkpoint_id:
            newest[e.ns] = e
    keep = set()
    for ns, tip in newest.items():
        keep.add((ns, tip.checkpoint_id))
        if pieces:
            keep.update((ns, p[1]) for ref in tip.loc.values() for p in ref_pieces(ref) if p[2] == IN_CHECKPOINT_OBJECT)
    return keep


def _encode_entries(
    entries: list[CheckpointEntry], body_max: int, bodies_for: set[tuple[str, str]] | None
) -> list[list[Any]]:
    """``bodies_for``: the only entries whose bodies are kept (None: all that fit)."""
    locs: dict[tuple[str, str], Loc] = {}
    out = []
    for e in entries:
        parent = locs.get((e.ns, e.parent_id)) if e.parent_id is not None else None
        if parent is None:
            loc: Any = [_FULL, {ch: list(v) for ch, v in e.loc.items()}]
        else:
            changed = {ch: list(v) for ch, v in e.loc.items() if parent.get(ch) != v}
            loc = [_DELTA, changed, [ch for ch in parent if ch not in e.loc]]
        locs[(e.ns, e.checkpoint_id)] = e.loc
        meta = list(e.metadata) if e.metadata is not None and len(e.metadata[1]) <= META_MAX else None
        keep = bodies_for is None or (e.ns, e.checkpoint_id) in bodies_for
        body = e.body if keep and e.body is not None and len(e.body) <= body_max else None
        row = [e.ns, e.checkpoint_id, e.parent_id, e.gen, e.expires_at, meta, body, loc, e.run_id, e.hidden]
        out.append([*row, e.tag] if e.tag else row)
    return out


def _decode_entries(thread_id: str, rows: list[list[Any]]) -> list[CheckpointEntry]:
    locs: dict[tuple[str, str], Loc] = {}
    out = []
    for row in rows:
        # Rows written before run ids and prune's hidden mark have 8 fields; a
        # tagged checkpoint's row has 11 (see ``_format/keys``).
        ns, cid, parent_id, gen, expires_at, meta, body, loc = row[:8]
        run_id, hidden = row[8:10] if len(row) >= 10 else (None, False)
        tag = row[10] if len(row) > 10 else ""
        if loc[0] == _FULL:
            full = {ch: as_ref(v) for ch, v in loc[1].items()}
        else:
            full = {ch: v for ch, v in locs[(ns, parent_id)].items() if ch not in loc[2]}
            full.update({ch: as_ref(v) for ch, v in loc[1].items()})
        locs[(ns, cid)] = full
        entry = CheckpointEntry(
            thread_id=thread_id,
            ns=ns,
            checkpoint_id=cid,
            parent_id=parent_id,
            loc=full,  # type: ignore[arg-type]
            body=body,
            metadata=(meta[0], bytes(meta[1])) if meta else None,
            expires_at=expires_at,
            gen=gen,
            writes=[],
            run_id=run_id,
            hidden=hidden,
            tag=tag,
        )
        out.append(entry)
    return out


def _encode_write(w: WritesEntry, body_max: int) -> list[Any]:
    body = w.body if w.body is not None and len(w.body) <= body_max else None
    return [w.ns, w.checkpoint_id, w.task_id, w.part, w.token, body, w.gen, w.expires_at]


def _decode_write(thread_id: str, row: list[Any]) -> WritesEntry:
    ns, cid, task_id, part, token, body, gen, expires_at = row
    return WritesEntry(thread_id, ns, cid, task_id, part, token, body, gen, expires_at)


# -- picking entries out of a document --------------------------------------------
def _in(entries: list[CheckpointEntry], ns: str, checkpoint_id: str) -> CheckpointEntry | None:
    return next((e for e in entries if e.checkpoint_id == checkpoint_id and e.ns == ns), None)


def _newest(entries: list[CheckpointEntry], ns: str) -> CheckpointEntry | None:
    return max((e for e in entries if e.ns == ns and not e.hidden), key=lambda e: e.checkpoint_id, default=None)


def _with_writes(entry: CheckpointEntry, writes: list[WritesEntry]) -> CheckpointEntry:
    own = [w for w in writes if w.checkpoint_id == entry.checkpoint_id and w.ns == entry.ns]
    return replace(entry, writes=own)


def record_of(head: Head) -> Tombstone:
    """The head as the thread's record (what ``Fenced`` and ``archive_of`` hand back)."""
    return Tombstone(
        head.thread_id, None, head.gen, head.deleted_at, head.created, frozenset(head.dead_runs),
        head.archive, head.stale_archive, head.archiving, None, head.unlisting, head.active,
        head.since, active_tokens=tuple(head.active_tokens), gone_keys=frozenset(head.gone_keys),
    )


def with_active(head: Head, active: Activity | None) -> Head:
    """``head`` recording the activity entry ``active``, written before the swap
    that installs it (a put's, a restore's, an import's, a copy's commit): the
    newest day's entries by their tokens, which an archive or a delete removes
    by key; an entry of an older day is left to the walk."""
    if active is None:
        return head
    day, tokens = active.day, head.active_tokens
    if day > head.active:
        tokens = [active.token]
    elif day == head.active and active.token not in tokens:
        tokens = [*tokens, active.token][-ACTIVE_TOKENS_KEPT:]
    return replace(
        head, active=max(head.active, day), active_tokens=tokens, since=min(head.since, day) if head.since else day
    )
