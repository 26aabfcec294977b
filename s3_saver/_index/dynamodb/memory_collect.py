"""The memory index in the saver's table (DynamoDB mode): what ``collect_garbage`` reads
of a namespace folder it found in the bucket, by the folder's node id alone: the value
objects the items of its partition name.

Items expired but not yet deleted (by the sweep, or DynamoDB's TTL) still name their
objects: they are kept until the item goes. Each item names its namespace, whose node id
must be the partition's (an item copied under another id is a CorruptObjectError, and
the folder is left alone).
"""

from __future__ import annotations

from s3_saver._format.memory.documents import ITEM_MARK, item_partition
from s3_saver._format.memory.names import node_id, show
from s3_saver._format.memory.rows import ObjectRef
from s3_saver._index.dynamodb.memory_items import Items
from s3_saver._transport.protocol import Op
from s3_saver.errors import CorruptObjectError


class Collection(Items):
    """``MemoryIndex.named_values`` on the table."""

    def named_values(self, node: str) -> Op[frozenset[str]]:
        pk = item_partition(self.prefix, node)
        items = yield from self._query(pk, "the items of a folder garbage collection reads")
        tokens: set[str] = set()
        for item in items:
            if not item.get("sk", {}).get("S", "").startswith(ITEM_MARK):
                continue
            try:
                path = tuple(label["S"] for label in item["ns"]["L"])
            except (KeyError, TypeError) as exc:
                raise CorruptObjectError(f"DynamoDB table {self.table!r}, partition {pk!r}: not a memory item ({exc!r})") from exc
            if node_id(path) != node:
                raise CorruptObjectError(
                    f"DynamoDB table {self.table!r}, partition {pk!r}: an item of namespace {show(path)}, whose partition is not this one"
                )
            row = self._row(path, item)
            tokens.update(cell.token for cell in (row.value, row.vectors) if isinstance(cell, ObjectRef))
        return frozenset(tokens)
