"""What a checkpoint stores: its record, its blob objects, and the refs to them
(and the blobs a put adds for values its parent does not account for).

A fresh channel's value is stored whole, or, when it is a list that extends the
value its parent stored, as a piece of a delta chain (``_format/pieces``): the record
(and the index entry that carries it) names the earlier pieces in the
channel's ``loc`` ref, so every operation that follows refs follows the chain.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from s3_saver._format.codec import (
    BLOB_FORMAT,
    CHECKPOINT_FORMAT,
    CHECKPOINT_PIECES_FORMAT,
    PIECE_FORMAT,
    pack,
)
from s3_saver._format.entries import (
    ENTRY_BUDGET,
    IN_BLOB_OBJECT,
    IN_CHECKPOINT_OBJECT,
    Loc,
    Ref,
    make_ref,
    ref_pieces,
    ref_tag,
)
from s3_saver._format.pieces import SPLITTABLE, Held, array_header, extends, keep
from s3_saver._ops.context import Context
from s3_saver._transport.protocol import Op
from s3_saver._transport.s3 import put_immutable

# Room for keys, parent id and attribute names next to ``loc`` in the item.
LOC_HEADROOM = 16 * 1024


@dataclass
class Delta:
    """A fresh channel stored as a piece: the list's element count, the earlier
    pieces it reads (refs, keyframe first) and where its own bytes start."""

    count: int
    earlier: tuple[Ref, ...]
    start: int
    header: int  # the length of the list's header (its elements start there)

    @property
    def offset(self) -> int:
        """Where the piece's bytes start among the elements' (a read checks it)."""
        return self.start - self.header


@dataclass
class Staged:
    record: dict[str, Any]
    body: bytes
    objects: dict[str, bytes]
    # The refs of the channels stored here.
    loc: Loc
    # What the process remembers of each list value once the commit is in.
    held: dict[str, Held] = field(default_factory=dict)
    # The tag of every object written here (see ``_format/keys``).
    tag: str = ""

    @property
    def deltas(self) -> bool:
        return any(len(ref) > 5 for ref in self.loc.values())


@dataclass
class Draft:
    """One checkpoint as ``put`` carries it down its steps: what it stores, and what
    the put learns on the way (the parent, the generation it goes into)."""

    thread_id: str
    ns: str
    parent_id: str | None
    checkpoint_id: str
    ts: Any  # the checkpoint's "ts": the day of its activity entry
    values: dict[str, Any]
    now: int
    loc_estimate: int
    fresh: dict[str, Any]  # channel -> version: stored by this checkpoint
    carried: dict[str, Any]  # channel -> version: unchanged since the parent
    loc: Loc  # channel -> the ref to its value, as known so far
    known: tuple[Loc, int, str] | None  # the parent as this process knows it: loc, generation, tag
    head: dict[str, Any]  # the record's fields other than its values
    metadata: Any  # merged with the config's
    staged: Staged
    objects: dict[str, bytes]  # every object written so far (taken back when refused)
    fetch_parent: bool = False  # the parent is read beside the writes: this process did not know it
    list_at: int | None = None
    other_form: bool = False
    day: int | None = None
    active: int | None = None
    gen: int = 0
    listed_early: int | None = None
    run_id: str | None = None

    @property
    def own(self) -> tuple[str, str, str]:
        return (self.thread_id, self.ns, self.checkpoint_id)

    @property
    def result(self) -> dict[str, Any]:
        return {"configurable": {"thread_id": self.thread_id, "checkpoint_ns": self.ns, "checkpoint_id": self.checkpoint_id}}


def held_key(thread_id: str, ns: str, channel: str, ref: Ref) -> tuple[Any, ...]:
    """The stored value a ref names (its last piece's object: versions alone may
    repeat across forks when a graph numbers them itself)."""
    return (thread_id, ns, channel, ref[0], ref[1], ref[2], ref_tag(ref))


def stage(
    ctx: Context,
    thread_id: str,
    ns: str,
    checkpoint_id: str,
    head: dict[str, Any],
    fresh: dict[str, Any],
    values: dict[str, Any],
    parent_loc: Loc | None,
    now: int,
    loc_estimate: int,
    tag: str = "",
) -> Staged:
    """The objects that store ``fresh`` channels (and the record), and their refs.

    ``head``: the record's fields other than its values (checkpoint, metadata...).
    ``parent_loc``: the parent's refs, when a list may be stored as a delta of
    the parent's value (None: everything whole).
    """
    serialized = {ch: ctx.serde.dumps_typed(values[ch]) for ch in fresh}
    held: dict[str, Held] = {}
    deltas: dict[str, Delta] = {}
    for ch, (type_, data) in serialized.items():
        if type_ != SPLITTABLE or array_header(data) is None:
            continue
        base = _delta_base(ctx, thread_id, ns, ch, parent_loc, type_, data, now)
        if base is None:
            count, start = array_header(data)  # type: ignore[misc]
            held[ch] = Held(type_, count, data, start, (len(data) - start,), now)
            continue
        delta, parent_held = base
        deltas[ch] = delta
        k = len(delta.earlier)
        held[ch] = Held(type_, delta.count, data, delta.header, (*parent_held.sizes[:k], len(data) - delta.start), parent_held.oldest)
    stored = {ch: (t, d[deltas[ch].start:] if ch in deltas else d) for ch, (t, d) in serialized.items()}
    inline, blobs = split(ctx, stored, loc_estimate)
    record = {
        **head,
        "format": CHECKPOINT_PIECES_FORMAT if deltas else CHECKPOINT_FORMAT,
        "values": {ch: [fresh[ch], *stored[ch]] for ch in inline if ch not in deltas},
        "blobs": {ch: fresh[ch] for ch in blobs},
    }
    if deltas:
        record["pieces"] = {
            ch: [fresh[ch], stored[ch][0], deltas[ch].count, stored[ch][1], deltas[ch].offset] for ch in inline if ch in deltas
        }
        # The earlier pieces by (version, checkpoint): a rebuild from the bucket
        # alone finds their objects as it finds any value's.
        record["chains"] = {ch: [[p[0], p[1]] for p in d.earlier] for ch, d in deltas.items()}
    body = pack(record)
    if deltas and not tag:
        # Whether a list is stored whole or as a delta depends on what the
        # writing process holds: a put retried by a fresh process stores it
        # whole. Each form has keys of its own (a tag from the record's bytes,
        # before encryption: the same record, the same tag),
        # so neither meets the other's immutable objects; the commit that
        # lands last names one of them, and the other is garbage.
        tag = hashlib.sha256(body).hexdigest()[:8]
    # Every object is sealed for its own key (a no-op without encryption); the index
    # entry carries the checkpoint object's bytes as stored, so the same ciphertext.
    own_key = ctx.layout.checkpoint_key(thread_id, ns, checkpoint_id, tag)
    body = ctx.sealer.seal(thread_id, own_key, body)
    objects = {own_key: body}
    for ch in blobs:
        key = ctx.layout.blob_key(thread_id, ns, ch, fresh[ch], checkpoint_id, tag)
        t, data = stored[ch]
        delta = deltas.get(ch)
        objects[key] = ctx.sealer.seal(thread_id, key, _blob(ch, fresh[ch], t, data, delta))
    loc: Loc = {}
    for ch in serialized:
        kind = IN_BLOB_OBJECT if ch in blobs else IN_CHECKPOINT_OBJECT
        if ch in deltas:
            # The ref's put time is its oldest piece's: a ttl stores the value
            # again once any piece it reads is half a ttl old (see put._carry).
            loc[ch] = make_ref(fresh[ch], checkpoint_id, kind, held[ch].oldest, tag, deltas[ch].earlier)
        else:
            loc[ch] = make_ref(fresh[ch], checkpoint_id, kind, now, tag)
    return Staged(record, body, objects, loc, held, tag)


def store_late(
    ctx: Context,
    thread_id: str,
    ns: str,
    checkpoint_id: str,
    late: dict[str, Any],
    values: dict[str, Any],
    now: int,
    loc: Loc,
    objects: dict[str, bytes],
) -> Op[None]:
    """Store unchanged channels the parent does not account for (parent gone or
    unknown, or its copy past half the ttl) in blobs of this checkpoint, still
    before the index entry."""
    if not late:
        return
    late_blobs = {ch: (late[ch], ctx.serde.dumps_typed(values[ch])) for ch in late}
    late_objects = {}
    for ch, (version, typed) in late_blobs.items():
        key = ctx.layout.blob_key(thread_id, ns, ch, version, checkpoint_id)
        late_objects[key] = ctx.sealer.seal(thread_id, key, _blob(ch, version, *typed))
    yield from put_immutable(ctx.s3, late_objects, same=ctx.sealer.same(thread_id))
    objects.update(late_objects)
    for ch in late:
        loc[ch] = make_ref(late[ch], checkpoint_id, IN_BLOB_OBJECT, now)


def _blob(channel: str, version: Any, type_: str, data: bytes, delta: Delta | None = None) -> bytes:
    """A value's object of its own: whole, or a delta's piece (its count and offset)."""
    if delta is None:
        return pack({"format": BLOB_FORMAT, "channel": channel, "version": version, "type": type_, "data": data})
    return pack({
        "format": PIECE_FORMAT, "channel": channel, "version": version, "type": type_,
        "count": delta.count, "data": data, "offset": delta.offset,
    })


def _delta_base(
    ctx: Context, thread_id: str, ns: str, ch: str, parent_loc: Loc | None, type_: str, data: bytes, now: int
) -> tuple[Delta, Held] | None:
    """The delta that stores ``data`` after the parent's value of ``ch``, or None
    when it is stored whole: no parent value held here, not an extension of it,
    a piece past half the ttl, or a chain that the tiers say to merge whole."""
    ref = parent_loc.get(ch) if parent_loc is not None and ctx.list_deltas else None
    if ref is None:
        return None
    held = ctx.lists.get(held_key(thread_id, ns, ch, ref))
    if held is None or held.type != type_ or len(ref_pieces(ref)) != len(held.sizes):
        return None
    if ctx.ttl_seconds and held.oldest < now - ctx.ttl_seconds // 2:
        return None
    found = extends(held, data)
    if found is None:
        return None
    count, start = found
    base_end = start + len(held.data) - held.start
    k = keep(list(held.sizes), len(data) - base_end)
    if k == 0:
        return None
    earlier = tuple(make_ref(p[0], p[1], p[2], 0, ref_tag(p)) for p in ref_pieces(ref)[:k])
    return Delta(count, earlier, start + sum(held.sizes[:k]), start), held


def split(ctx: Context, stored: dict[str, tuple[str, bytes]], loc_estimate: int) -> tuple[list[str], list[str]]:
    """Which fresh values go inside the checkpoint object, which into blob objects.

    Small values ride in the checkpoint object (and so in its index item); the
    largest move out until the item fits DynamoDB's limit.
    """
    inline = sorted((ch for ch, (_, b) in stored.items() if len(b) <= ctx.inline_threshold),
                    key=lambda ch: len(stored[ch][1]))
    blobs = [ch for ch in stored if ch not in inline]
    room = ENTRY_BUDGET - loc_estimate - LOC_HEADROOM
    total = sum(len(stored[ch][1]) + len(ch) + 48 for ch in inline)
    while inline and total > room:
        ch = inline.pop()
        total -= len(stored[ch][1]) + len(ch) + 48
        blobs.append(ch)
    return inline, blobs
