"""The memory index in the bucket (manifest mode): a namespace's head kept small by
sealing its older rows into immutable segments, and compacting those.

A head holds rows up to ``HEAD_BUDGET`` bytes (``VERSIONED_HEAD_BUDGET`` on a versioned
bucket, where every swap leaves the head it replaced as a noncurrent version). Past it,
the writer's next swap seals the older rows (by ``updated_us``) into segments, keeping
the newest quarter of the budget in the head: the segments are written first
(``IfNoneMatch``), then the head that names them (its compare-and-swap is the commit
point; a segment of a swap that never lands is named by no head, and deleted by the
commit once its swap is known not to have landed, or by an erase).

A key's item is its newest row: the head's, else the newest segment's that holds the
key (by number). Reads fetch what they need of the segments in one more wave, cached
(immutable): a search or an export reads every segment of its namespaces, a get only
those whose key range and Bloom filter may hold its key and the head does not answer.

Writes decide on exact rows (there is no row that inherits fields from an older one,
and no reader ever resolves one): a change of a key the head does not hold, that a
segment may hold, is applied after that segment is read (cached, or fetched in one
more wave before the swap). So an overwrite keeps the item's ``created_us`` and
``seq``, a delete of a sealed item writes a tombstone (of an item that is not there,
nothing), and the value object of the sealed row it replaces is released by the
commit, as a head row's is. This costs one GET of at most ``SEGMENT_MAX`` bytes when a
process that has not read that segment overwrites or deletes a sealed item (about 1% of
other keys too, the filter's false positives); a new key, the common put, never pays
it. The design's alternative, a row flagged to inherit its creation from an older row
that readers and compaction resolve, saves that GET on the write but makes every later
get of the key read the segment anyway, and carries partial rows through sealing and
compaction.

Compaction (in the writer's swap, or the TTL sweep's): when the segments after the
last large one (at least half of ``SEGMENT_MAX``) are more than ``TAIL_MAX``, they are
merged (with the rows being sealed) into segments of up to ``SEGMENT_MAX``; when the
bytes of rows no read returns (shadowed, tombstones, and for the sweep expired rows)
exceed the live ones, every segment is merged. A merge keeps each key's newest row,
drops shadowed ones, and drops tombstones and expired rows unless an older segment
left out of the merge may hold the key (then a tombstone stays). The merged segments go
to the head's ``retired``: deleted after the swap that retired them, and by the next
swap, which drops them from the head (delete only what you read). Counting only the
small segments (rather than "more than 8 segments") keeps a large namespace's merges
proportional to what was sealed: a namespace of 5,000 items of 3 KB holds 14 full
segments, which a count of all would merge at every seal.

The methods here are mixed into ``ManifestMemory`` (below ``memory_removal``'s
``Removals``): reading segments, completing a read's rows, and reshaping a head
before its swap.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from s3_saver._format.codec import same_record
from s3_saver._format.key_codec import new_token
from s3_saver._format.memory.documents import Head, head_key
from s3_saver._format.memory.names import node_id, show
from s3_saver._format.memory.rows import ObjectRef, Row, put_row, tombstone_row
from s3_saver._format.memory.segments import (
    TOKEN_BYTES,
    SegmentRef,
    dumps_segment,
    loads_segment,
    make_ref,
    row_bytes,
    segment_key,
)
from s3_saver._format.memory.ttl import Clock, expires_at
from s3_saver._index.manifest.memory_documents import _ANY, Documents, Known, _namespace
from s3_saver._index.memory import Change, Path
from s3_saver._transport.budget import CacheBudget
from s3_saver._transport.failures import OBJECT_MISSING, classify
from s3_saver._transport.protocol import Call, Op, about, raise_failure
from s3_saver._transport.s3 import DELETE_BATCH, S3Calls, put_immutable
from s3_saver.errors import StoreUnavailableError

log = logging.getLogger("s3_saver")

HEAD_BUDGET = 256 * 1024
VERSIONED_HEAD_BUDGET = 32 * 1024
SEGMENT_MAX = 1024 * 1024
TAIL_MAX = 8
_READ_TRIES = 4
_SEGMENT_ROW_BYTES = 256  # a decoded row's objects beside its bytes, as the heads' cache counts them

Loaded = dict[str, dict[str, Row]]
"""Segments' rows by key, by segment token."""


# -- rows over a head and its segments (pure) --------------------------------------------


def sealed_row(head: Head, loaded: Mapping[str, Mapping[str, Row]], key: str) -> tuple[SegmentRef, Row] | None:
    """The newest row of ``key`` in the head's segments (newest segment first), with its
    segment. ``loaded`` holds the segments that may hold the key, down to the newest
    that does."""
    for ref in reversed(head.segments):
        if ref.may_hold(key):
            row = loaded[ref.token].get(key)
            if row is not None:
                return ref, row
    return None


def merged(head: Head, loaded: Mapping[str, Mapping[str, Row]], keys: Sequence[str] | None = None) -> dict[str, Row]:
    """The namespace's items as stored (expired rows included, tombstones left out): every
    key's newest row (``keys`` None), or the head's rows and the newest row of each of
    ``keys`` (``loaded`` as ``sealed_row`` needs it)."""
    rows = dict(head.rows)
    if keys is None:
        for ref in reversed(head.segments):
            for key, row in loaded[ref.token].items():
                rows.setdefault(key, row)
    else:
        for key in keys:
            if key not in rows:
                found = sealed_row(head, loaded, key)
                if found is not None:
                    rows[key] = found[1]
    return {k: r for k, r in rows.items() if not r.tombstone}


def _tokens(row: Row) -> list[str]:
    return [c.token for c in (row.value, row.vectors) if isinstance(c, ObjectRef)]


def _in_segments(head: Head, key: str) -> bool:
    return any(ref.may_hold(key) for ref in head.segments)


def apply(head: Head, changes: list[Change], clock: Clock, loaded: Mapping[str, Mapping[str, Row]] | None = None) -> tuple[Head | None, list[str]]:
    """The head after ``changes`` (a new Head: the given one may be a cached copy), or
    None when they change nothing, and the tokens of the value objects of the rows it
    replaces or drops. A key's current row is the head's, else its newest sealed row
    (``loaded`` holds, for each changed key the head does not, the segments that may
    hold it down to the newest that does: ``Segments._rows_of``). An overwrite keeps the live row's ``created_us`` and ``seq``; a put
    over nothing (or an expired row, or a tombstone) is a new item, numbered
    ``head.seq``. A row written over a sealed one shadows it: its bytes count as the
    segment's dead bytes, and its value object is released. A delete drops the head's
    row, or leaves a tombstone where a segment may hold the key. Rows expired at the
    time of the write are dropped from the head (tombstones where a segment may hold
    their key: readers never return them). The new head drops ``retired``: the swap's
    commit deletes them after it lands."""
    loaded = loaded or {}
    rows = dict(head.rows)
    seq = head.seq
    changed = False
    dead: dict[str, int] = {}
    released: list[str] = []
    now = clock.now()

    def current(key: str) -> tuple[Row | None, SegmentRef | None]:
        if key in rows:
            return rows[key], None
        found = sealed_row(head, loaded, key)
        return (found[1], found[0]) if found is not None else (None, None)

    def shadow(ref: SegmentRef | None, old: Row, release: bool = True) -> None:
        # The sealed row stops being its key's newest: dead bytes of its segment, and its
        # value object named by no newer row (unless the new row keeps it: a refresh).
        if ref is not None:
            if not old.tombstone:  # a tombstone's bytes are dead from its seal on (``make_ref``)
                dead[ref.token] = dead.get(ref.token, 0) + row_bytes(old)
            if release:
                released.extend(_tokens(old))

    for change in changes:
        old, ref = current(change.key)
        if change.reseal is not None:
            # The migration's encrypted copy of the row, fenced on the row as read: a put or
            # delete since wins (the change's value objects are then released, named by none).
            if old is not None and old == change.reseal:
                rows[change.key] = replace(old, value=change.value, vectors=change.vectors)
                shadow(ref, old)
                changed = True
            continue
        if change.refresh is not None:
            # Fenced on the expiry read: never revives a deleted item, never overrides a newer write's.
            if old is not None and not old.tombstone and old.expires_us == change.refresh.seen_us:
                rows[change.key] = old.with_expiry(change.refresh.expires_us)
                shadow(ref, old, release=False)
                changed = True
            continue
        if change.value is None:
            if old is None or old.tombstone or (ref is not None and not old.live(now)):
                continue  # absent already (a sealed expired row: the sweep's or a compaction's)
            if _in_segments(head, change.key):
                rows[change.key] = tombstone_row(change.key, now)
                shadow(ref, old)
            else:
                del rows[change.key]
            changed = True
            continue
        now = clock.now()
        kept = old if old is not None and old.live(now) else None
        if old is not None:
            shadow(ref, old)
        if change.stamps is not None:
            # An imported item: its times as exported; its place among the namespace's
            # items is where the import puts it first (a later import keeps it).
            created, updated, expires = change.stamps
            rows[change.key] = Row(
                change.key, kept.seq if kept else seq, created, updated, expires, change.ttl_minutes, 0, change.value, change.vectors
            )
        else:
            rows[change.key] = put_row(
                change.key,
                kept=kept,
                now=now,
                seq=seq,
                value=change.value,
                vectors=change.vectors,
                ttl_minutes=change.ttl_minutes,
                expires_us=expires_at(now, change.ttl_minutes),
            )
        seq += kept is None
        changed = True
    if not changed:
        return None, []
    kept_rows: dict[str, Row] = {}
    for key, row in rows.items():
        if row.live(now):
            kept_rows[key] = row
        elif _in_segments(head, key):
            kept_rows[key] = row if row.tombstone else tombstone_row(key, row.updated_us)
    named = {t for r in kept_rows.values() for t in _tokens(r)}
    gone = [t for r in head.rows.values() for t in _tokens(r)]
    # And those of values put and replaced within these changes (two commits of one
    # group commit): named by no head once this one is written.
    put = [c.token for change in changes for c in (change.value, change.vectors) if isinstance(c, ObjectRef)]
    released = [t for t in dict.fromkeys([*gone, *released, *put]) if t not in named]
    segments = [r.with_dead(dead[r.token]) if r.token in dead else r for r in head.segments]
    return Head(head.path, seq, kept_rows, head.desc, segments=segments, gone=head.gone), released


def drop_expired(head: Head, now: int) -> Head:
    """``head`` without its rows expired at ``now`` (a tombstone instead where a segment
    may hold the key), nor tombstones no segment may need, nor ``retired``."""
    rows: dict[str, Row] = {}
    for key, row in head.rows.items():
        if row.live(now):
            rows[key] = row
        elif _in_segments(head, key):
            rows[key] = row if row.tombstone else tombstone_row(key, row.updated_us)
    return replace(head, rows=rows, retired=[])


@dataclass
class Reshape:
    """A head's seal or compaction, planned: the head to swap in, the segments to write
    first (ref and rows), the value objects of the expired rows it drops."""

    head: Head
    written: list[tuple[SegmentRef, list[Row]]]
    released: list[str]


def tail_start(segments: Sequence[SegmentRef]) -> int:
    """Where the small segments after the last large one begin."""
    for i in range(len(segments) - 1, -1, -1):
        if segments[i].size >= SEGMENT_MAX // 2:
            return i + 1
    return 0


def plan(head: Head, budget: int, extra_dead: int = 0) -> tuple[list[Row], list[SegmentRef]] | None:
    """What a head's next swap seals (rows of the head) and merges (segments), or None:
    neither. ``extra_dead``: bytes of sealed rows known to be dead beyond the refs' count
    (the sweep's expired rows)."""
    sealed: list[Row] = []
    if sum(row_bytes(r) for r in head.rows.values()) > budget:
        room = budget // 4
        for row in sorted(head.rows.values(), key=lambda r: (r.updated_us, r.key), reverse=True):
            size = row_bytes(row)
            if size <= room:
                room -= size
            else:
                room = 0  # the newest rows stay, nothing older past the first that does not fit
                sealed.append(row)
    refs = head.segments
    total = sum(r.size for r in refs)
    if refs and (sum(r.dead for r in refs) + extra_dead) * 2 > total:
        return sealed, list(refs)
    start = tail_start(refs)
    if len(refs) - start + bool(sealed) > TAIL_MAX:
        return sealed, list(refs[start:])
    return (sealed, []) if sealed else None


def reshape(head: Head, sealed: list[Row], merge: list[SegmentRef], loaded: Mapping[str, Mapping[str, Row]], now: int) -> Reshape:
    """``head`` with ``sealed`` (its rows) moved to new segments, merged with the segments
    ``merge`` (a run at the end of ``head.segments``: every segment after those it leaves
    out is newer; ``loaded`` holds their rows), as ``plan`` chose."""
    merging = {r.token for r in merge}
    older = [r for r in head.segments if r.token not in merging]
    gone = {r.key for r in sealed}
    staying = {k: r for k, r in head.rows.items() if k not in gone}
    seen = set(staying)
    keep: list[Row] = []
    released: list[str] = []
    for source in [{r.key: r for r in sealed}, *(loaded[ref.token] for ref in reversed(merge))]:
        for key, row in source.items():
            if key in seen:
                continue  # shadowed by a newer row (its bytes were the segment's dead ones)
            seen.add(key)
            if row.live(now):
                keep.append(row)
                continue
            # A tombstone or an expired row: absent. Kept as a tombstone only where a
            # segment older than the merge may hold the key (else that row would show).
            if not row.tombstone:
                released.extend(_tokens(row))
            if any(ref.may_hold(key) for ref in older):
                keep.append(row if row.tombstone else tombstone_row(key, row.updated_us))
    keep.sort(key=lambda r: r.key)
    number = max((r.number for r in [*head.segments, *head.retired]), default=-1) + 1
    written: list[tuple[SegmentRef, list[Row]]] = []
    chunk: list[Row] = []
    size = 0
    for row in keep:
        bytes_ = row_bytes(row)
        if chunk and size + bytes_ > SEGMENT_MAX:
            written.append((make_ref(number + len(written), new_token(TOKEN_BYTES), chunk), chunk))
            chunk, size = [], 0
        chunk.append(row)
        size += bytes_
    if chunk:
        written.append((make_ref(number + len(written), new_token(TOKEN_BYTES), chunk), chunk))
    named = {t for r in [*keep, *staying.values()] for t in _tokens(r)}
    new = replace(head, rows=staying, segments=[*older, *(ref for ref, _ in written)], retired=list(merge))
    return Reshape(new, written, [t for t in dict.fromkeys(released) if t not in named])


# -- the index's part ----------------------------------------------------------------------


class Segments(Documents):
    """Segments of the manifest memory index: loading them (cached), completing a read,
    and sealing or compacting a head before its swap (see the module docstring)."""

    head_budget: int | None = None
    """A head's row bytes before it seals (None: ``HEAD_BUDGET``, or ``VERSIONED_HEAD_BUDGET``
    on a versioned bucket). Tests set it small."""

    def __init__(self, s3: S3Calls, prefix: str, budget: CacheBudget, clock: Clock) -> None:
        super().__init__(s3, prefix, budget, clock)
        # Immutable, under keys never reused: an entry is never stale.
        self._sealed = budget.cache("mem-segments")
        self.versioned = False

    @property
    def budget_bytes(self) -> int:
        if self.head_budget is not None:
            return self.head_budget
        return VERSIONED_HEAD_BUDGET if self.versioned else HEAD_BUDGET

    def learn(self, answer: Any) -> None:
        """A versioned bucket answers a head's GET or PUT with its version id ("null" only
        when versioning is suspended): the head budget follows, at no request."""
        if isinstance(answer, dict) and answer.get("VersionId") not in (None, "null"):
            self.versioned = True

    def _head_answer(self, path: Path, call: Call, answer: Any, held: Any = _ANY) -> Known:
        self.learn(answer)
        return super()._head_answer(path, call, answer, held)

    def segment_key(self, path: Path, ref: SegmentRef) -> str:
        return segment_key(self.prefix, node_id(path), ref)

    def _load(self, wanted: Mapping[Path, Sequence[SegmentRef]], subject: str = "") -> Op[tuple[dict[Path, Loaded], set[Path]]]:
        """The rows of the segments ``wanted`` (cached, else fetched in one wave), and the
        namespaces of which one is gone (a compaction retired it after the head naming it
        was read: read the head again)."""
        found: dict[Path, Loaded] = {p: {} for p in wanted}
        # Invariant: the answer is what was found or loaded here, never a second look at
        # the cache, which may have evicted a segment meanwhile.
        fetch: list[tuple[Path, SegmentRef]] = []
        for path, refs in wanted.items():
            for ref in refs:
                rows = self._sealed.get(self.segment_key(path, ref))
                if rows is None:
                    fetch.append((path, ref))
                else:
                    found[path][ref.token] = rows
        gone: set[Path] = set()
        if fetch:
            calls = tuple(about(self.s3.get(self.segment_key(p, r)), subject or f"{_namespace(p)} (a sealed segment)") for p, r in fetch)
            answers = yield calls
            for (path, ref), call, answer in zip(fetch, calls, answers):
                if isinstance(answer, BaseException):
                    if classify(answer, call.operation) != OBJECT_MISSING:
                        raise_failure(call, answer)
                    gone.add(path)
                    continue
                rows = loads_segment(answer["Body"], path, ref, f"s3://{self.s3.bucket}/{call.params['Key']}")
                self._sealed.put(call.params["Key"], rows, sum(row_bytes(r) + _SEGMENT_ROW_BYTES for r in rows.values()))
                found[path][ref.token] = rows
        return found, gone

    def _rows_of(
        self, heads: Mapping[Path, Head], whole: Iterable[Path] = (), keys: Mapping[Path, Sequence[str]] | None = None
    ) -> Op[tuple[dict[Path, Loaded], set[Path]]]:
        """The segments a read or a change needs (cached, else fetched), and the namespaces
        of which one is gone (see ``_load``): every segment of the namespaces ``whole``;
        for ``keys`` the head does not hold, the newest segment that may hold each, then
        the next older one only where that one did not (a Bloom filter's false positive):
        a sealed key costs one segment, in one wave, almost always."""
        whole = set(whole)
        loaded: dict[Path, Loaded] = {p: {} for p in heads}
        need: dict[Path, list[SegmentRef]] = {p: list(heads[p].segments) for p in whole if heads[p].segments}
        pending = {p: [k for k in dict.fromkeys(ks) if k not in heads[p].rows] for p, ks in (keys or {}).items() if p not in whole}
        while True:
            for path, waiting in pending.items():
                left = []
                for key in waiting:
                    for ref in reversed(heads[path].segments):
                        if not ref.may_hold(key):
                            continue
                        rows = loaded[path].get(ref.token)
                        if rows is None:
                            wanted = need.setdefault(path, [])
                            if ref not in wanted:
                                wanted.append(ref)
                            left.append(key)
                            break
                        if key in rows:
                            break  # its newest sealed row
                pending[path] = left
            if not need:
                return loaded, set()
            found, gone = yield from self._load(need)
            if gone:
                return loaded, gone
            for path, segments in found.items():
                loaded[path].update(segments)
            need = {}

    def _complete(self, heads: dict[Path, Head], whole: Iterable[Path], keys: Mapping[Path, Sequence[str]]) -> Op[dict[Path, dict[str, Row]]]:
        """Each namespace's rows as a read returns them (``merged``): of the namespaces
        ``whole``, every item; of the others, the head's and those of ``keys``. Segments
        in one wave (a key's older candidates after it, rarely); a namespace whose
        segment is gone is read again (its head, then what it names)."""
        whole = set(whole)
        for _ in range(_READ_TRIES):
            loaded, gone = yield from self._rows_of(heads, whole, keys)
            if not gone:
                return {p: merged(h, loaded[p], None if p in whole else list(keys.get(p, ()))) for p, h in heads.items()}
            paths = sorted(gone)
            calls = tuple(about(self.s3.get(head_key(self.prefix, node_id(p))), _namespace(p)) for p in paths)
            answers = yield calls
            for path, call, answer in zip(paths, calls, answers):
                heads[path] = self._head_answer(path, call, answer)[1]
        raise StoreUnavailableError(
            f"the segments of namespace {show(min(gone))} (s3://{self.s3.bucket}) kept being compacted away while "
            "being read; try again"
        )

    def _reshape(self, path: Path, head: Head, extra_dead: int = 0) -> Op[Reshape | None]:
        """``head`` sealed and compacted as its next swap must (``plan``), its new segments
        written (one wave, ``IfNoneMatch``): a Reshape whose head names them (the head as
        given when nothing is due), or None when a segment to merge is gone (the head is
        stale: read it again)."""
        chosen = plan(head, self.budget_bytes, extra_dead)
        if chosen is None:
            return Reshape(head, [], [])
        sealed, merge = chosen
        loaded: Loaded = {}
        if merge:
            found, gone = yield from self._load({path: merge})
            if gone:
                return None
            loaded = found[path]
        shaped = reshape(head, sealed, merge, loaded, self.clock.now())
        if shaped.written:
            objects = {self.segment_key(path, ref): dumps_segment(path, ref, rows) for ref, rows in shaped.written}
            yield from put_immutable(self.s3, objects, same=lambda _key, stored, wanted: same_record(stored, wanted))
            for ref, rows in shaped.written:
                # What this process wrote it has read: its gets and searches fetch no segment it sealed.
                self._sealed.put(self.segment_key(path, ref), {r.key: r for r in rows}, sum(row_bytes(r) + _SEGMENT_ROW_BYTES for r in rows))
        return shaped

    def _retired_keys(self, path: Path, *heads: Head) -> list[str]:
        """The keys of the segments these heads retired."""
        return list(dict.fromkeys(self.segment_key(path, ref) for head in heads for ref in head.retired))

    def _drop(self, keys: list[str], what: str) -> Op[None]:
        """Delete objects no head names any more, after the swap that stopped naming them.
        Best effort: the swap is done; an object left is named by no head (an erase
        removes it)."""
        for start in range(0, len(keys), DELETE_BATCH):
            call = self.s3.delete_many(keys[start : start + DELETE_BATCH])
            (answer,) = yield (call,)
            if isinstance(answer, BaseException) or answer.get("Errors"):
                log.warning("%s: %s left behind (named by no head; erase_namespace removes them): %s", call.describe(), what, answer)
