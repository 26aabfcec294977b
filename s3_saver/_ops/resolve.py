"""Turns index entries into CheckpointTuples, fetching what they point at in waves.

Each wave sends every fetch that is known to be needed at once: S3 GETs of
objects, the index lookups of source checkpoints that hold unchanged channels,
and the pending writes of checkpoints read without them. In the common case one
wave is enough.
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple, PendingWrite, writes_sort_key

from s3_saver._format.closure import own_object, ref_object
from s3_saver._format.codec import (
    BLOB_FORMAT,
    CHECKPOINT_FORMAT,
    WRITES_FORMAT,
    loads,
    typed,
    unpack,
)
from s3_saver._format.entries import (
    IN_BLOB_OBJECT,
    REGULAR_PART,
    CheckpointEntry,
    Key3,
    Ref,
    WritesEntry,
    ref_pieces,
    ref_tag,
)
from s3_saver._format.pieces import SPLITTABLE, Held, array_header, body_of, join
from s3_saver._index.terms import (
    one_line,
)
from s3_saver._ops.context import Context, meta_key
from s3_saver._ops.stage import held_key
from s3_saver._transport.failures import (
    DENIED,
    OBJECT_MISSING,
    classify,
    error_code,
)
from s3_saver._transport.protocol import Call, Op, gather, raise_failure
from s3_saver.errors import (
    AccessDeniedError,
    CorruptObjectError,
    MissingObjectError,
)


class Resolver:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        # By (thread, namespace, checkpoint, tag): two forms of one checkpoint
        # (a list whole, or as a delta: see stage) are two objects, and a ref
        # names the one it reads; an index entry's body is the form it names.
        self.records: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.entries: dict[Key3, CheckpointEntry] = {}
        # Objects an archive holds are read from it, never from the bucket.
        self.blobs: dict[str, dict[str, Any]] = dict(ctx.index.held_blobs())
        self.held_records: dict[str, dict[str, Any]] = ctx.index.held_records()
        # Objects' bytes as stored that the index holds (sealed with encryption).
        self.held_bodies: Any = ctx.index.held_bodies()
        self.writes: dict[str, dict[str, Any]] = {}
        self._item_missing: set[Key3] = set()
        # Object key -> (kind, what it fills, its thread).
        self._object_keys: dict[str, tuple[str, Any, str]] = {}

    # -- intake ------------------------------------------------------------------
    def add(self, entry: CheckpointEntry) -> None:
        key = entry.key
        self.entries[key] = entry
        if entry.body is not None and self.key(entry) not in self.records:
            # The entry carries its checkpoint object's bytes as stored: opened for that object.
            object_key = self.ctx.layout.object_key(own_object(entry))
            where = f"index entry for {key}"
            body = self.ctx.sealer.open(entry.thread_id, object_key, entry.body, where)
            self.records[self.key(entry)] = unpack(body, CHECKPOINT_FORMAT, where)
        self.ctx.locs.put(key, (entry.loc, entry.gen, entry.tag))

    # -- what is missing ---------------------------------------------------------------
    def _needs(
        self, targets: list[CheckpointEntry]
    ) -> tuple[dict[str, tuple[str, Any, str]], list[Key3], list[CheckpointEntry]]:
        """S3 objects to GET, index entries to look up, entries whose writes to read."""
        ctx = self.ctx
        gets: dict[str, tuple[str, Any, str]] = {}
        lookups: dict[Key3, None] = {}
        for entry in targets:
            t, ns = entry.thread_id, entry.ns
            own = self.key(entry)
            if own not in self.records:
                gets[ctx.layout.object_key(own_object(entry))] = ("checkpoint", own, t)
            # Every piece a value reads (one for a whole value), in this wave.
            for ch, ref in ((ch, p) for ch, r in entry.loc.items() for p in ref_pieces(r)):
                if ref[2] == IN_BLOB_OBJECT:
                    bkey = ctx.layout.object_key(ref_object(t, ns, ch, ref))
                    if bkey not in self.blobs:
                        gets[bkey] = ("blob", bkey, t)
                    continue
                src = (t, ns, ref[1])
                src_key = (*src, ref_tag(ref))
                if src_key in self.records:
                    continue
                src_object = ctx.layout.object_key(ref_object(t, ns, ch, ref))
                held = self.held_records.get(src_object)
                stored = self.held_bodies.get(src_object) if held is None else None
                if stored is not None:
                    where = f"{src_object}, held by {ctx.index.describe()}"
                    held = unpack(ctx.sealer.open(t, src_object, stored, where), CHECKPOINT_FORMAT, where)
                if held is not None:
                    self.records[src_key] = held
                elif src in self.entries or src in self._item_missing:
                    # Its entry is known but too large to carry the object, or
                    # not found: the bucket has the object.
                    gets[src_object] = ("checkpoint", src_key, t)
                else:
                    lookups[src] = None
            for w in one_line(entry.writes or [], ctx.s3.bucket):
                if w.body is None:
                    wkey = _writes_key(ctx, w)
                    if wkey not in self.writes:
                        gets[wkey] = ("writes", wkey, t)
        return gets, list(lookups), [e for e in targets if e.writes is None]

    def _fetch_objects(self, gets: dict[str, tuple[str, Any, str]]) -> Op[None]:
        self._object_keys.update(gets)
        calls = tuple(self.ctx.s3.get(k) for k in gets)
        results = yield calls
        for call, result in zip(calls, results):
            self._take_object(call, result)

    def _look_up(self, keys: list[Key3]) -> Op[None]:
        found = yield from self.ctx.index.entries(keys)
        for key, entry in found.items():
            if entry is None:
                self._item_missing.add(key)
            else:
                self.add(entry)

    def _read_writes(self, entry: CheckpointEntry) -> Op[None]:
        entry.writes = yield from self.ctx.index.writes(entry)

    def _take_object(self, call: Call, result: Any) -> None:
        key = call.params["Key"]
        kind, ident, thread_id = self._object_keys[key]
        if isinstance(result, BaseException):
            kind = classify(result, call.operation)
            if kind == OBJECT_MISSING:
                raise MissingObjectError(
                    f"s3://{self.ctx.s3.bucket}/{key} is referenced by the index but missing "
                    "(thread being deleted, or removed by a lifecycle rule or by hand)"
                ) from result
            if kind == DENIED:
                # Without s3:ListBucket, S3 answers a GET of a missing key with 403.
                raise AccessDeniedError(
                    f"s3://{self.ctx.s3.bucket}/{key} is referenced by the index and S3 refused to "
                    f"read it ({error_code(result)}): the object is missing, or access is denied. "
                    "Without s3:ListBucket on the bucket S3 answers 403 for a missing object; "
                    "see infra/ for the IAM policy"
                ) from result
            raise_failure(call, result)
        where = f"s3://{self.ctx.s3.bucket}/{key}"
        body = self.ctx.sealer.open(thread_id, key, result["Body"], where)
        if kind == "checkpoint":
            self.records[ident] = unpack(body, CHECKPOINT_FORMAT, where)
        elif kind == "blob":
            self.blobs[key] = unpack(body, BLOB_FORMAT, where)
        else:
            self.writes[key] = unpack(body, WRITES_FORMAT, where)

    def fetch_records(self, entries: list[CheckpointEntry]) -> Op[None]:
        """GET the checkpoint objects of ``entries`` (for metadata their entries lack)."""
        yield from self._fetch_objects(
            {self.ctx.layout.object_key(own_object(e)): ("checkpoint", self.key(e), e.thread_id) for e in entries}
        )

    @staticmethod
    def key(entry: CheckpointEntry) -> tuple[str, str, str, str]:
        """Where ``records`` holds the entry's own record."""
        return (entry.thread_id, entry.ns, entry.checkpoint_id, entry.tag)

    def record(self, entry: CheckpointEntry) -> dict[str, Any] | None:
        return self.records.get(self.key(entry))

    # -- assembly ------------------------------------------------------------------------
    def metadata(self, entry: CheckpointEntry) -> Any | None:
        """The entry's metadata, or None when only the S3 object holds it."""
        record = self.record(entry)
        what = f"metadata of {_describe(entry)}"
        if record is not None:
            return loads(self.ctx.serde, typed(record["metadata"]), what)
        pair = entry_metadata(self.ctx, entry)
        return None if pair is None else loads(self.ctx.serde, pair, what)

    def build(self, entry: CheckpointEntry) -> CheckpointTuple:
        serde = self.ctx.serde
        t, ns, cid = entry.thread_id, entry.ns, entry.checkpoint_id
        record = self.records[self.key(entry)]
        checkpoint = loads(serde, typed(record["checkpoint"]), _describe(entry))
        checkpoint["channel_values"] = {ch: self.value(entry, ch) for ch in entry.loc}
        config: RunnableConfig = {"configurable": {"thread_id": t, "checkpoint_ns": ns, "checkpoint_id": cid}}
        parent = (
            {"configurable": {"thread_id": t, "checkpoint_ns": ns, "checkpoint_id": entry.parent_id}}
            if entry.parent_id
            else None
        )
        return CheckpointTuple(
            config=config,
            checkpoint=checkpoint,
            metadata=loads(serde, typed(record["metadata"]), f"metadata of {_describe(entry)}"),
            parent_config=parent,
            pending_writes=self.pending_writes(entry),
        )

    def value(self, entry: CheckpointEntry, channel: str) -> Any:
        """The value of ``channel`` at ``entry`` (fetched by an earlier wave)."""
        ref = entry.loc[channel]
        what = f"value of {channel!r} in {_describe(entry)}"
        pieces = [self._stored(entry, channel, p, what) for p in ref_pieces(ref)]
        type_, count, data, _ = pieces[-1]
        if count is not None:
            # A delta: the list's header, then its keyframe's elements and
            # every piece's, byte for byte as the serializer wrote the whole.
            try:
                bodies = [d if c is not None else body_of(d) for _, c, d, _ in pieces]
            except ValueError as exc:
                raise CorruptObjectError(f"{what}: {exc}") from exc
            at = 0
            for body, (_, c, _, offset) in zip(bodies, pieces):
                if c is not None and offset != at:
                    raise CorruptObjectError(f"{what}: a piece starts at byte {offset} of the list, its chain ends at {at}")
                at += len(body)
            data = join(count, bodies)
        self._hold(entry, channel, ref, type_, data, [len(d) if c is not None else None for _, c, d, _ in pieces])
        return loads(self.ctx.serde, (type_, data), what)

    def _stored(self, entry: CheckpointEntry, channel: str, ref: Ref, what: str) -> tuple[str, int | None, bytes, int]:
        """(type, element count, bytes, offset) of one stored piece; count None: a whole value."""
        if ref[2] == IN_BLOB_OBJECT:
            blob = self.blobs[self.ctx.layout.object_key(ref_object(entry.thread_id, entry.ns, channel, ref))]
            return blob["type"], blob.get("count"), blob["data"], blob.get("offset", 0)
        record = self.records[(entry.thread_id, entry.ns, ref[1], ref_tag(ref))]
        piece = record.get("pieces", {}).get(channel)
        if piece is not None:
            return piece[1], piece[2], piece[3], piece[4]
        held = record["values"].get(channel)
        if held is None:
            raise CorruptObjectError(f"{what}: checkpoint {ref[1]} holds no value of it")
        return held[1], None, held[2], 0

    def _hold(self, entry: CheckpointEntry, channel: str, ref: Ref, type_: str, data: bytes, sizes: list[int | None]) -> None:
        """Remember a list value read here: the next put of the thread stores its
        extension as a delta (a Lambda reads the thread, then writes to it)."""
        found = array_header(data) if type_ == SPLITTABLE else None
        if found is None or self.ctx.replica is not None:
            return
        if sizes[0] is None:
            sizes[0] = len(data) - found[1] - sum(s or 0 for s in sizes[1:])
        held = Held(type_, found[0], data, found[1], tuple(s or 0 for s in sizes), ref[3])
        self.ctx.lists.put(held_key(entry.thread_id, entry.ns, channel, ref), held)

    def pending_writes(self, entry: CheckpointEntry) -> list[PendingWrite]:
        """The entry's pending writes in ``writes_sort_key`` order.

        Each special slot has one item (the last committed); regular slots come
        from the task's regular parts, shortest first (see ``put_writes.put_writes``).
        Writes older than their checkpoint's delete generation belong to a
        deleted thread that had a checkpoint of the same id.
        """
        parts = []
        used = [w for w in one_line(entry.writes or [], self.ctx.s3.bucket) if w.gen >= entry.gen]
        # A checkpoint put after this one names the slots it was made from (see put).
        self.ctx.slots.add(entry.key, [(w.task_id, w.part) for w in used])
        for w in used:
            if w.body is not None:
                where = f"index item for writes of {w.task_id}"
                body = self.ctx.sealer.open(w.thread_id, _writes_key(self.ctx, w), w.body, where)
                parts.append(unpack(body, WRITES_FORMAT, where))
            else:
                parts.append(self.writes[_writes_key(self.ctx, w)])
        regular_first = sorted(parts, key=lambda p: (not p["part"].startswith(REGULAR_PART), int(p["part"][1:])))
        chosen: dict[tuple[str, int], tuple[str, str, tuple[str, bytes]]] = {}
        for part in regular_first:
            for idx, channel, type_, data in part["writes"]:
                chosen.setdefault((part["task_id"], idx), (part["task_path"], channel, (type_, data)))
        ordered = sorted(chosen, key=lambda slot: writes_sort_key(chosen[slot][0], *slot))
        what = f"pending write of {_describe(entry)}"
        return [(slot[0], chosen[slot][1], loads(self.ctx.serde, chosen[slot][2], what)) for slot in ordered]


def entry_metadata(ctx: Context, entry: CheckpointEntry) -> tuple[str, bytes] | None:
    """The metadata an index entry carries (None: only its object holds it), as the
    serializer wrote it: opened for the checkpoint it describes."""
    if entry.metadata is None:
        return None
    key = meta_key(ctx, entry.thread_id, entry.ns, entry.checkpoint_id)
    return ctx.sealer.open_meta(entry.thread_id, key, entry.metadata, f"index entry of {_describe(entry)}")


def _describe(entry: CheckpointEntry) -> str:
    return f"checkpoint {entry.checkpoint_id} of thread {entry.thread_id!r} (namespace {entry.ns!r})"


def _writes_key(ctx: Context, w: WritesEntry) -> str:
    return ctx.layout.writes_key(w.thread_id, w.ns, w.checkpoint_id, w.task_id, w.part, w.token)


def fetch_and_build(resolver: Resolver, targets: list[CheckpointEntry]) -> Op[list[CheckpointTuple]]:
    """Fetch, in as few waves as the data allows, everything ``targets`` point at."""
    yield from load(resolver, targets)
    return [resolver.build(e) for e in targets]


def load(resolver: Resolver, targets: list[CheckpointEntry]) -> Op[None]:
    """Send waves until everything ``targets`` point at is in ``resolver``: S3 GETs,
    index lookups and pending writes of one wave go out together."""
    while True:
        gets, lookups, unloaded = resolver._needs(targets)
        if lookups and resolver.ctx.index.local_lookups:
            # Answered from what the index read already: no request, and the
            # objects of what it does not hold go out in this same wave.
            yield from resolver._look_up(lookups)
            gets, lookups, unloaded = resolver._needs(targets)
        if not (gets or lookups or unloaded):
            return
        ops = [resolver._fetch_objects(gets)] if gets else []
        if lookups:
            ops.append(resolver._look_up(lookups))
        ops += [resolver._read_writes(e) for e in unloaded]
        yield from gather(*ops)
