"""sweep_ttl: one run of the TTL sweep, bounded by ``limit`` namespaces (as
``archive_idle``'s run is by its ``limit``).

An expired item is never returned by a read, whatever the sweep has done; the sweep
removes its bytes. Each run visits up to ``limit`` registered namespaces in path order
from where the last run stopped (the index keeps the cursor beside the registry: no
listing of the bucket, and a run started in another process goes on from there), so
every namespace is visited once every ``ceil(namespaces / limit)`` runs. In each it
deletes the value objects of expired items, then the items (manifest: one swap of the
namespace's head; DynamoDB: a conditional delete per item, before DynamoDB's own TTL
would, days later), and unregisters a namespace left with no item
(``list_namespaces`` lists a namespace from its first put until a sweep finds it empty).
"""

from __future__ import annotations

from s3_saver._index.memory import Swept
from s3_saver._ops.memory.context import Memory
from s3_saver._ops.memory.erase import delete_objects
from s3_saver._transport.protocol import Op


def sweep_ttl(mem: Memory, limit: int) -> Op[Swept]:
    def purge(keys: list[str]) -> Op[None]:
        yield from delete_objects(mem, keys, "the TTL sweep")

    return (yield from mem.index.sweep(limit, mem.clock.now(), purge))
