"""The memory index in the bucket (manifest mode): what the encryption migration
(``_ops/memory/encrypt``) reads of a namespace's folder: the objects its head names now.

``Change.reseal`` itself is applied by ``memory_segments.apply`` within the head's
swap, as every change is; this module only answers ``MemoryIndex.named_objects``.
"""

from __future__ import annotations

from s3_saver._format.memory.documents import head_key, loads_head
from s3_saver._format.memory.names import node_id, show
from s3_saver._format.memory.rows import ObjectRef
from s3_saver._index.manifest.memory_documents import _MAX_SWAPS
from s3_saver._index.manifest.memory_segments import Segments
from s3_saver._index.memory import Path
from s3_saver._transport.failures import OBJECT_MISSING, classify
from s3_saver._transport.protocol import Op, about, raise_failure
from s3_saver.errors import StoreUnavailableError


class Named(Segments):
    """``MemoryIndex.named_objects`` on the bucket."""

    def named_objects(self, path: Path) -> Op[frozenset[str]]:
        key = head_key(self.prefix, node_id(path))
        for _ in range(_MAX_SWAPS):
            call = about(self.s3.get(key), f"namespace {show(path)}")
            (answer,) = yield (call,)
            if isinstance(answer, BaseException):
                if classify(answer, call.operation) != OBJECT_MISSING:
                    raise_failure(call, answer)
                return frozenset()  # no head: nothing is named
            head = loads_head(answer["Body"], path, f"s3://{self.s3.bucket}/{key}")
            rows = list(head.rows.values())
            # The segments the head reads from; those it retired are named by no read
            # from now on (the swap that retired them deletes them after it lands).
            if head.segments:
                loaded, gone = yield from self._load({path: head.segments}, f"namespace {show(path)} (a sealed segment)")
                if gone:
                    continue  # compacted away since the head was read: read it again
                rows += [row for sealed in loaded[path].values() for row in sealed.values()]
            tokens = {cell.token for row in rows for cell in (row.value, row.vectors) if isinstance(cell, ObjectRef)}
            return frozenset(
                [key, *(self.segment_key(path, ref) for ref in head.segments), *(self.value_key(path, t) for t in tokens)]
            )
        raise StoreUnavailableError(
            f"s3://{self.s3.bucket}/{key}: its segments kept being compacted away under {_MAX_SWAPS} reads; try again"
        )
