"""The memory index in the bucket (manifest mode): what ``collect_garbage`` reads of a
namespace folder it found in the bucket, by the folder's node id alone: the value objects
the namespace's head names.

The head and the segments it names (sealed rows: ``memory_segments``; those it retired
too, deleted only after its swap) hold every row of its namespace, expired ones included
(they name their objects until a write, the sweep or a compaction drops them). A head names its namespace, whose node
id must be the folder's (a head copied under another id is a CorruptObjectError, and the
folder is left alone); an empty head names none, and no object.
"""

from __future__ import annotations

from s3_saver._format.codec import unpack
from s3_saver._format.memory.documents import HEAD_FORMAT, head_key, loads_head
from s3_saver._format.memory.names import node_id, show
from s3_saver._format.memory.rows import ObjectRef
from s3_saver._index.manifest.memory_documents import _MAX_SWAPS
from s3_saver._index.manifest.memory_segments import Segments
from s3_saver._transport.failures import OBJECT_MISSING, classify
from s3_saver._transport.protocol import Op, about, raise_failure
from s3_saver.errors import CorruptObjectError, StoreUnavailableError


class Collection(Segments):
    """``MemoryIndex.named_values`` on the bucket."""

    def named_values(self, node: str) -> Op[frozenset[str]]:
        key = head_key(self.prefix, node)
        for _ in range(_MAX_SWAPS):
            named = yield from self._named_once(key, node)
            if named is not None:
                return named
        raise StoreUnavailableError(
            f"s3://{self.s3.bucket}/{key}: its segments kept being compacted away under {_MAX_SWAPS} reads; "
            "the folder is left alone, and the next run of garbage collection visits it again"
        )

    def _named_once(self, key: str, node: str) -> Op[frozenset[str] | None]:
        """What the head at ``key`` and its segments name; None when a segment it names
        is gone (compacted away after the head was read: read the head again)."""
        call = about(self.s3.get(key), "the namespace head of a folder garbage collection reads")
        (answer,) = yield (call,)
        if isinstance(answer, BaseException):
            if classify(answer, call.operation) != OBJECT_MISSING:
                raise_failure(call, answer)
            return frozenset()  # no head: no row ever landed, none names an object
        where = f"s3://{self.s3.bucket}/{key}"
        stored = unpack(answer["Body"], HEAD_FORMAT, where).get("path")
        path = tuple(stored) if isinstance(stored, list) and all(isinstance(label, str) for label in stored) else ()
        if stored is not None and (not path or node_id(path) != node):
            raise CorruptObjectError(f"{where}: the head is namespace {show(stored)}'s, whose folder is not this one")
        head = loads_head(answer["Body"], path, where)
        rows = list(head.rows.values())
        refs = [*head.segments, *head.retired]
        if refs:
            loaded, gone = yield from self._load({path: refs}, "a sealed segment garbage collection reads")
            if gone:
                return None
            rows += [row for sealed in loaded[path].values() for row in sealed.values()]
        return frozenset(cell.token for row in rows for cell in (row.value, row.vectors) if isinstance(cell, ObjectRef))
