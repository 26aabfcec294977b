"""The memory store's documents and keys: manifest mode's objects, DynamoDB mode's partitions.

Manifest mode (under the store's ``prefix``, in the ``memory/`` folder)::

    memory/n/<node id>/@head     a namespace's head: its newest rows, and the refs of its
                                 segments (replaced only by compare-and-swap)
    memory/n/<node id>/@s/<number>.<token>  a segment: older rows, sealed (immutable; ``segments``)
    memory/@reg/head             the namespace registry: every namespace that holds (or held) an
                                 item, sorted by path (replaced only by compare-and-swap)
    memory/n/<node id>/@v/<token>  a value too large to keep in its row (both modes): immutable,
                                 written before the row that names it
    memory/@sweep/cursor         where the TTL sweep stopped (the registry key of the last
                                 namespace it visited; last writer wins)
    memory/@gc/cursor            where garbage collection stopped (both modes: the last key it
                                 listed; last writer wins)

Every name the store writes starts with ``@``, which ``encode`` never produces; node
folders are 64 hex digits (``names.node_id``). So a key parses as the store's only if
it is exactly one of these shapes (``is_memory_key``), and a saver's parsers never
take one for a thread's (``memory`` is not one of their folders).

A head stores its namespace; every read compares it with the namespace asked for (a
node id is a hash: a collision, or a head copied under another id, is a
CorruptObjectError naming both, never another namespace's items). An empty head (no
row, never numbered one: an ancestor's, or what an erase or a sweep leaves) stores no
namespace: there is nothing to mix up, and an erased namespace's name is gone with its
items. Every head written holds a fresh nonce, so no two writes of a head have the same
bytes, hence the same ETag: a writer's compare-and-swap never succeeds over a head that
was replaced and then written back alike (an erase's empty head after an earlier one). The registry holds
each namespace's registration number (``created``): search visits namespaces in that
order, which is the order of their first put (InMemoryStore's).

DynamoDB mode (the saver's table; ``<P>`` the encoded prefix, as the saver's own
partitions)::

    pk <P>#m/<node id>   sk "k" + key      an item: its row's fields as attributes, and its namespace
    pk <P>#mreg          sk registry key   a registered namespace: its path and registration time
                                           (and ``retiring``: a removal's token, while one is under way)
    pk <P>#msweep        sk "cursor"       where the TTL sweep stopped
    pk <P>#mgone         sk node id        with encryption: the ids of every key of that namespace an
                                           erase destroyed (``gone``; kept after the erase, as the
                                           manifest mode's emptied head keeps them)

``encode`` never produces ``#``: no thread's partition is one of these, and the
saver's scans skip them (``KeyLayout.thread_of``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from s3_saver._format.codec import pack, unpack
from s3_saver._format.key_codec import MEMORY_PREFIX, encode, new_token
from s3_saver._format.memory.names import registry_key, show
from s3_saver._format.memory.rows import (
    ObjectRef,
    Row,
    ValueCell,
    row_from_wire,
    row_to_wire,
    value_from_wire,
    value_to_wire,
)
from s3_saver._format.memory.segments import (
    SEGMENT_NAME,
    SegmentRef,
    ref_from_wire,
    ref_to_wire,
)
from s3_saver.errors import CorruptObjectError

HEAD_FORMAT = "s3_saver.memory-head/1"
# A head that names segments (sealed rows): a name of its own, so a version of the store
# that predates segments refuses it (CorruptObjectError) rather than reading the head's
# rows as every item of the namespace, and writing it back without its segments. A head
# that names none is written as before, and read by either.
SEALED_HEAD_FORMAT = "s3_saver.memory-head/2"
VALUE_FORMAT = "s3_saver.memory-value/1"
REGISTRY_FORMAT = "s3_saver.memory-registry/1"
HEAD_NAME = "@head"
REGISTRY_KEY = "@reg/head"
SWEEP_KEY = "@sweep/cursor"
GC_KEY = "@gc/cursor"
_NODE = re.compile(r"n/[0-9a-f]{64}/(?:" + re.escape(HEAD_NAME) + r"|@v/[0-9a-f]{32}|" + SEGMENT_NAME.pattern + ")")


def head_key(prefix: str, node: str) -> str:
    """The key of the head of the namespace whose node id is ``node``."""
    return f"{prefix}{MEMORY_PREFIX}n/{node}/{HEAD_NAME}"


def value_key(prefix: str, node: str, token: str) -> str:
    """The key of a value moved out of its row (``rows.ObjectRef``'s token)."""
    return f"{prefix}{MEMORY_PREFIX}n/{node}/@v/{token}"


def dumps_value(cell: ValueCell, path: tuple[str, ...], key: str) -> bytes:
    """A value's own object: the serializer's pair as the row keeps it, and whose it is."""
    return pack({"format": VALUE_FORMAT, "path": list(path), "key": key, "value": value_to_wire(cell)})


def loads_value(data: bytes, path: tuple[str, ...], key: str, where: str) -> ValueCell:
    at = f"{where} (namespace {show(path)}, key {show(key)})"
    record = unpack(data, VALUE_FORMAT, at)
    if record.get("path") != list(path) or record.get("key") != key:
        raise CorruptObjectError(f"{at}: the value is {show(record.get('path'))}'s key {show(record.get('key'))}'s")
    cell = value_from_wire(record.get("value"), at)
    if not isinstance(cell, ValueCell):
        raise CorruptObjectError(f"{at}: a value object that names another")
    return cell


def registry_object_key(prefix: str) -> str:
    return f"{prefix}{MEMORY_PREFIX}{REGISTRY_KEY}"


def sweep_object_key(prefix: str) -> str:
    """Manifest mode: where the TTL sweep stopped."""
    return f"{prefix}{MEMORY_PREFIX}{SWEEP_KEY}"


def gc_object_key(prefix: str) -> str:
    """Both modes: where garbage collection stopped (it lists the bucket in both)."""
    return f"{prefix}{MEMORY_PREFIX}{GC_KEY}"


def node_folder(prefix: str, node: str) -> str:
    """Every object of a namespace (its head, its value objects) is under this key prefix."""
    return f"{prefix}{MEMORY_PREFIX}n/{node}/"


def is_memory_key(prefix: str, key: str) -> bool:
    """Whether ``key`` has exactly the shape of a key the store of ``prefix`` writes."""
    root = prefix + MEMORY_PREFIX
    if not key.startswith(root):
        return False
    rest = key[len(root) :]
    return rest in (REGISTRY_KEY, SWEEP_KEY, GC_KEY) or _NODE.fullmatch(rest) is not None


def item_partition(prefix: str, node: str) -> str:
    """DynamoDB mode: the partition of a namespace's items."""
    return f"{encode(prefix) if prefix else ''}#m/{node}"


def registry_partition(prefix: str) -> str:
    """DynamoDB mode: the partition of the namespace registry."""
    return f"{encode(prefix) if prefix else ''}#mreg"


def gone_partition(prefix: str) -> str:
    """DynamoDB mode: the partition of the destroyed key ids of erased namespaces (one
    item per namespace, keyed by its node id: no namespace name in it)."""
    return f"{encode(prefix) if prefix else ''}#mgone"


def sweep_partition(prefix: str) -> str:
    """DynamoDB mode: the partition of the TTL sweep's cursor (not the registry's: a
    registry Query of every namespace must meet registry items only)."""
    return f"{encode(prefix) if prefix else ''}#msweep"


ITEM_MARK = "k"  # an item's sort key is this mark and its key


# The destroyed key ids a head keeps (a namespace erased more often than this: a process
# holding a key of its oldest lives could commit under it; each life's key is another).
GONE_KEPT = 100


def gone_ids(*groups: tuple[str, ...] | frozenset[str]) -> tuple[str, ...]:
    """The destroyed key ids of ``groups`` (a head's, then an erase's), once each, in
    order (a set sorted), the newest ``GONE_KEPT`` kept."""
    seen: dict[str, None] = {}
    for group in groups:
        for k in sorted(group) if isinstance(group, frozenset) else group:
            seen.pop(k, None)
            seen[k] = None
    return tuple(list(seen)[-GONE_KEPT:])


# -- a namespace's head ------------------------------------------------------------------


@dataclass
class Head:
    """A namespace's newest rows, by key, the refs of its sealed segments (oldest first:
    a key's item is its newest row, the head's, else the newest segment's), and ``seq``,
    the number the next new item gets (items are ordered by it: their first put's commit
    order). A delete removes its row from the head, or leaves a tombstone row where a
    segment may hold the key."""

    path: tuple[str, ...]
    seq: int = 0
    rows: dict[str, Row] = field(default_factory=dict)
    desc: bool = False
    """A namespace below this one was registered (set before its first item is written,
    never cleared, by an erase neither): a search of this namespace reads the registry
    only when set."""

    emptied: bool = False
    """An erase or a sweep emptied this head (and may be unregistering the namespace):
    a writer that reads it so registers the namespace anew (``Registry.register``)."""

    segments: list[SegmentRef] = field(default_factory=list)
    """Sealed segments, oldest first."""

    retired: list[SegmentRef] = field(default_factory=list)
    """Segments a compaction (or a sweep) took out of ``segments``: deleted after the swap
    that retired them, and again after the next swap, which drops them from here (a
    writer cut short between its swap and its deletes leaves them named here)."""

    gone: tuple[str, ...] = ()
    """With encryption: the ids (hex) of the namespace's keys that erases destroyed, set
    by the erase as it empties the head and carried by every later swap (``GONE_KEPT``
    newest). A swap of a put sealed under one of them is refused (a process that cached
    the key before the erase): checked on the head the swap replaces, so at no request."""

    @property
    def empty(self) -> bool:
        """No row, and none ever numbered since the head was last emptied: the namespace
        is not registered by this head (a put into it registers first)."""
        return self.seq == 0 and not self.rows and not self.segments

    def tokens(self) -> set[str]:
        """The value objects the head's own rows name."""
        return {c.token for r in self.rows.values() for c in (r.value, r.vectors) if isinstance(c, ObjectRef)}


def dumps_head(head: Head) -> bytes:
    sealed = bool(head.segments or head.retired)
    record: dict[str, Any] = {
        "format": SEALED_HEAD_FORMAT if sealed else HEAD_FORMAT,
        # An empty head names no namespace (see the module docstring).
        "path": None if head.empty else list(head.path),
        "seq": head.seq,
        "desc": head.desc,
        "rows": [row_to_wire(r) for r in head.rows.values()],
        "emptied": head.emptied,
        "nonce": new_token(8),  # unique bytes, so a unique ETag, per write
    }
    if sealed:
        record["segments"] = [ref_to_wire(r) for r in head.segments]
        record["retired"] = [ref_to_wire(r) for r in head.retired]
    if head.gone:
        record["gone"] = list(head.gone)
    return pack(record)


def loads_head(data: bytes, path: tuple[str, ...], where: str) -> Head:
    """The head of ``path`` from its stored bytes: CorruptObjectError naming ``where``
    (bucket and key) and the namespace for anything else, a head of another namespace
    included."""
    at = f"{where} (namespace {show(path)})"
    record = unpack(data, HEAD_FORMAT, at)
    stored, seq, wire, desc = record.get("path"), record.get("seq"), record.get("rows"), record.get("desc")
    emptied = record.get("emptied", False)
    gone = record.get("gone", [])
    if not isinstance(gone, list) or not all(isinstance(k, str) for k in gone):
        raise CorruptObjectError(f"{at}: not a memory head (gone {type(gone).__name__})")
    sealed = record["format"] == SEALED_HEAD_FORMAT
    segments_wire, retired_wire = (record.get("segments"), record.get("retired")) if sealed else ([], [])
    if not isinstance(segments_wire, list) or not isinstance(retired_wire, list):
        raise CorruptObjectError(f"{at}: not a memory head (segments {type(segments_wire).__name__})")
    segments = [ref_from_wire(r, at) for r in segments_wire]
    retired = [ref_from_wire(r, at) for r in retired_wire]
    if seq == 0 and segments:
        raise CorruptObjectError(f"{at}: segments in a head that numbered no item")
    if stored is None and seq == 0 and wire == []:
        stored = list(path)  # an empty head names no namespace: nothing in it to mix up
    if not isinstance(stored, list) or tuple(stored) != path:
        found = tuple(stored) if isinstance(stored, list) else stored
        raise CorruptObjectError(f"{at}: the head is namespace {show(found)}'s, not the one asked for")
    if (
        not isinstance(seq, int)
        or isinstance(seq, bool)
        or seq < 0
        or not isinstance(wire, list)
        or not isinstance(desc, bool)
        or not isinstance(emptied, bool)
    ):
        raise CorruptObjectError(f"{at}: not a memory head (seq {show(seq)}, rows {type(wire).__name__})")
    rows: dict[str, Row] = {}
    for obj in wire:
        row = row_from_wire(obj, at)
        if row.key in rows or row.seq >= seq:
            raise CorruptObjectError(f"{at}: key {show(row.key)} twice, or numbered {row.seq} past the head's {seq}")
        rows[row.key] = row
    return Head(path, seq, rows, desc, emptied and not rows and seq == 0, segments, retired, tuple(gone))


# -- the namespace registry --------------------------------------------------------------


@dataclass
class Registry:
    """Every registered namespace and its registration number, sorted by path (Python's
    tuple order, which is the order of their registry keys); ``seq`` the next number."""

    seq: int = 0
    created: dict[tuple[str, ...], int] = field(default_factory=dict)

    def paths(self) -> list[tuple[str, ...]]:
        return sorted(self.created)

    def register(self, paths: list[tuple[str, ...]], renew: frozenset[tuple[str, ...]] = frozenset()) -> bool:
        """Number the paths not registered yet, and those of ``renew`` anew, in the order
        given, after every number given so far; False: nothing changed.

        A writer registers a namespace after reading its head empty, and renews it when an
        erase or a sweep emptied that head (``Head.emptied``). Such a removal reads the
        registry at ``seq`` S before it empties the head, and removes only entries
        numbered below S (``remove``): a writer that registers after reading the emptied
        head is numbered S or more, so its entry stays."""
        changed = False
        for path in paths:
            if path in self.created and path not in renew:
                continue
            self.created[path] = self.seq
            self.seq += 1
            changed = True
        return changed

    def remove(self, paths: list[tuple[str, ...]], before: int) -> list[tuple[str, ...]]:
        """Remove the paths numbered below ``before``; returns those kept (registered
        again since a removal read the registry at ``seq`` ``before``)."""
        kept = []
        for path in paths:
            number = self.created.get(path)
            if number is None:
                continue
            if number < before:
                del self.created[path]
            else:
                kept.append(path)
        return kept


def dumps_registry(registry: Registry) -> bytes:
    entries = sorted(registry.created.items(), key=lambda e: registry_key(e[0]))
    return pack({"format": REGISTRY_FORMAT, "seq": registry.seq, "entries": [[list(p), n] for p, n in entries]})


def loads_registry(data: bytes, where: str) -> Registry:
    record = unpack(data, REGISTRY_FORMAT, where)
    seq, entries = record.get("seq"), record.get("entries")
    if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(entries, list):
        raise CorruptObjectError(f"{where}: not a namespace registry")
    created: dict[tuple[str, ...], int] = {}
    for entry in entries:
        if not (_is_entry(entry) and entry[1] < seq and tuple(entry[0]) not in created):
            raise CorruptObjectError(f"{where}: not a registry entry: {show(entry, 120)}")
        created[tuple(entry[0])] = entry[1]
    return Registry(seq, created)


def _is_entry(entry: Any) -> bool:
    return (
        isinstance(entry, list)
        and len(entry) == 2
        and isinstance(entry[0], list)
        and all(isinstance(label, str) and label for label in entry[0])
        and isinstance(entry[1], int)
        and not isinstance(entry[1], bool)
        and entry[1] >= 0
    )
