"""What a thread needs: the one reachability closure over its index entries.

An object is needed while any index entry names it, whatever state the entry
is in (live, hidden by a prune, expired but present, parked) and whoever wrote
the object: a checkpoint names its own object and, through ``loc``, the object
holding each channel's value (a blob, or the checkpoint object of the ancestor
that stored the value inline, which may have been pruned since), and for a
list stored as a delta every object holding one of its pieces; a pending-write
entry names its part's object. Prune, delete_for_runs, archive, export, copy,
restore, delete, audit and garbage collection all decide with this function and
nothing else: what an operation deletes is what the entries it removes name
minus what the entries that stay name; what it copies or archives is what its
entries name.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

from s3_saver._format.entries import (
    IN_BLOB_OBJECT,
    ArchiveRef,
    CheckpointEntry,
    Ref,
    WritesEntry,
    ref_pieces,
    ref_tag,
    retag,
)
from s3_saver._format.keys import KeyLayout, ObjectKey, new_token


def ref_object(thread_id: str, ns: str, channel: str, ref: Ref) -> ObjectKey:
    """The object a ``loc`` reference names."""
    version, source, kind = ref[0], ref[1], ref[2]
    if kind == IN_BLOB_OBJECT:
        return ObjectKey("blob", thread_id, ns, source, channel=channel, version=version, tag=ref_tag(ref))
    return ObjectKey("checkpoint", thread_id, ns, source, tag=ref_tag(ref))


def own_object(entry: CheckpointEntry | WritesEntry) -> ObjectKey:
    """The entry's own object: its checkpoint object, or its pending-writes part."""
    if isinstance(entry, CheckpointEntry):
        return ObjectKey("checkpoint", entry.thread_id, entry.ns, entry.checkpoint_id, tag=entry.tag)
    return ObjectKey(
        "writes", entry.thread_id, entry.ns, entry.checkpoint_id, task_id=entry.task_id, part=entry.part, token=entry.token
    )


def named_by(entry: Any) -> Iterator[ObjectKey]:
    """Every object one entry names (a checkpoint's writes not included)."""
    if isinstance(entry, CheckpointEntry):
        yield own_object(entry)
        for channel, ref in entry.loc.items():
            # A delta names every piece it reads: a base is kept while any
            # kept version reads it, and goes with the last one.
            for i, piece in enumerate(ref_pieces(ref)):
                yield ref_object(entry.thread_id, entry.ns, channel, piece)
                if i and piece[2] == IN_BLOB_OBJECT:
                    # A piece in a blob keeps its checkpoint's object: its record
                    # says which pieces come before (a rebuild reads it there).
                    yield ObjectKey("checkpoint", entry.thread_id, entry.ns, piece[1], tag=ref_tag(piece))
    elif isinstance(entry, WritesEntry):
        yield own_object(entry)


def closure(entries: Iterable[Any]) -> dict[ObjectKey, Any]:
    """Every object the entries name (a checkpoint's writes included), each with
    the first entry that names it."""
    out: dict[ObjectKey, Any] = {}
    for entry in entries:
        for o in named_by(entry):
            out.setdefault(o, entry)
        if isinstance(entry, CheckpointEntry):
            for w in entry.writes or ():
                out.setdefault(own_object(w), w)
    return out


def closure_keys(layout: KeyLayout, entries: Iterable[Any], thread_id: str | None = None) -> set[str]:
    """The keys of ``closure(entries)`` (archive references included as their
    objects), under ``thread_id`` when given."""
    entries = list(entries)
    keys = {layout.object_key(o, thread_id) for o in closure(entries)}
    keys.update(e.key for e in entries if isinstance(e, ArchiveRef))
    return keys


def released(layout: KeyLayout, gone: Iterable[Any], staying: Iterable[Any]) -> list[str]:
    """The keys of the objects that entries leaving the index name and no entry
    that stays names: what may be deleted once ``gone`` is out of the index."""
    return sorted(closure_keys(layout, gone) - closure_keys(layout, staying))


def moved(entries: list[CheckpointEntry], thread_id: str, tag: str) -> tuple[list[CheckpointEntry], list[WritesEntry]]:
    """The entries as written anew under ``thread_id`` (restore, import, copy):
    every object under ``tag``, each writes part under a fresh token, so that
    none of the keys was ever written before. Writes come apart, in order."""
    out: list[CheckpointEntry] = []
    writes: list[WritesEntry] = []
    for e in entries:
        out.append(replace(e, thread_id=thread_id, tag=tag, loc={ch: retag(r, tag) for ch, r in e.loc.items()}, writes=[]))
        writes += [replace(w, thread_id=thread_id, token=new_token()) for w in e.writes or ()]
    return out, writes
