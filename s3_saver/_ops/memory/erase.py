"""erase_namespace: every item of every namespace under a prefix, and every version of
every object that held one, gone; and the TTL sweep's deletion of value objects.

Order, so that a call cut short anywhere and made again finishes (both index modes):

1. the index removes the rows (``MemoryIndex.erase_rows``): per namespace, the value
   objects its rows name first (a plain delete: on a versioned bucket their versions
   go in step 2), then the rows (manifest: the sealed segments deleted, then the head
   swapped for an empty one, which names no namespace; DynamoDB: each item deleted as
   read). The registrations stay,
   so a call made again finds the namespaces;
2. each namespace's folder is listed, every version and delete marker in it (the
   head's replaced versions, value objects' versions) is deleted, but the current head
   (the empty one, or a concurrent put's since) and current value objects younger than
   ``GRACE`` that no row named when step 1 read it (a put about to commit: it stays,
   reported, as ``erase_thread`` leaves such objects);
3. the index unregisters the namespaces, but those registered again since the erase
   began (a put meanwhile: kept, listed, reported in ``written_during``) and those whose
   folder keeps a version step 2 left (young, or locked: kept registered, reported in
   ``written_during`` too). An erase finds folders only through the registry, so it
   unregisters a namespace only once its folder holds nothing but its current head: the
   erase called again, once those may go, finds them (and a put writes a value object
   only once its namespace is registered: ``MemoryIndex.commit``);
4. on a versioned bucket, the registry's noncurrent versions (they name the erased
   namespaces) are deleted (manifest mode; DynamoDB mode's registry is in the table).

A put racing the erase: an item it wrote before the erase read the namespace's rows is
erased; one written after lands through a new registration (see the index modules):
each item is either erased or whole and listed, never in an unlisted namespace.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from s3_saver._format.memory.documents import HEAD_NAME, is_memory_key
from s3_saver._index.memory import Path
from s3_saver._ops.bucket import RemainingVersion, _listed, _purge, _Version
from s3_saver._ops.erase import GRACE, NEWER, _versioned
from s3_saver._ops.memory.batch import Memory
from s3_saver._transport.failures import DENIED_CODES
from s3_saver._transport.protocol import Op, gather, request_one
from s3_saver._transport.s3 import DELETE_BATCH
from s3_saver.errors import AccessDeniedError, S3SaverError


@dataclass(frozen=True)
class NamespaceEraseReport:
    """What [S3Store.erase_namespace()][s3_saver.S3Store.erase_namespace] removed, and what remains.

    The shape of [EraseReport][s3_saver.EraseReport], for a namespace prefix
    instead of a thread id.

    Attributes:
        prefix: The namespace prefix erased (``()``: every namespace).
        namespaces: The namespaces erased and unregistered.
        items: Items removed.
        buckets: The buckets erased in.
        deleted: Object versions, delete markers and (on an unversioned bucket)
            objects removed: value objects, the replaced versions of manifest
            heads, the registry's noncurrent versions.
        remaining: Versions left in place, each with its reason (empty: none of
            the erased items' bytes remains in the bucket).
        records: What stays, with no item and no namespace name in it: in the
            manifest mode, one empty head per erased namespace (and per
            namespace between it and the prefix).
        written_during: Namespaces that stay registered and listed: a put registered
            them again while the erase ran (its items written after the erase read
            them stay), or the erase left in their folder a version listed in
            ``remaining`` (so that the erase called again finds it).
    """

    prefix: tuple[str, ...]
    namespaces: tuple[tuple[str, ...], ...]
    items: int
    buckets: tuple[str, ...]
    deleted: int
    remaining: tuple[RemainingVersion, ...]
    records: tuple[str, ...]
    written_during: tuple[tuple[str, ...], ...]

    @property
    def complete(self) -> bool:
        """True when no version of an erased item remains in the bucket."""
        return not self.remaining


def erase_namespace(mem: Memory, prefix: Path, grace: float = GRACE) -> Op[NamespaceEraseReport]:
    versioned = yield from _versioned(mem)  # type: ignore[arg-type]
    removed = [0]

    def purge(keys: list[str]) -> Op[None]:
        count = yield from delete_objects(mem, keys, "erase")
        if not versioned:  # on a versioned bucket, step 2 counts the versions
            removed[0] += count

    erasure = yield from mem.index.erase_rows(prefix, purge)
    young = time.time() - grace
    pages = yield from gather(*(_listed(mem, mem.index.node_folder(n), versioned) for n in erasure.nodes))  # type: ignore[arg-type]
    doomed: list[_Version] = []
    left: list[RemainingVersion] = []
    for v in (v for page in pages for v in page):
        if not is_memory_key(mem.index.prefix, v.key):
            continue  # not a key this store writes: never deleted from here
        if v.current and v.key.endswith("/" + HEAD_NAME):
            continue  # the emptied head (or a racing put's): it names no erased item
        if v.current and v.modified >= young:
            left.append(RemainingVersion(mem.s3.bucket, v.key, v.version_id, NEWER))
            continue
        doomed.append(v)
    deleted, locked = yield from _purge_all(mem, doomed)
    left += locked
    # Step 3: a namespace whose folder keeps a version stays registered (found again).
    folders = {mem.index.node_folder(p): p for p in erasure.namespaces}
    held = sorted({p for f, p in folders.items() for r in left if r.key.startswith(f)})
    kept = yield from mem.index.erase_registrations(erasure, held)
    if versioned and erasure.history:
        # Written by every registration: each replaced version names namespaces.
        pages = yield from gather(*(_listed(mem, key, versioned) for key in erasure.history))  # type: ignore[arg-type]
        old = [v for key, page in zip(erasure.history, pages) for v in page if v.key == key and not v.current]
        more, locked = yield from _purge_all(mem, old)
        deleted += more
        left += locked
    return NamespaceEraseReport(
        prefix,
        tuple(p for p in erasure.namespaces if p not in kept),
        erasure.items,
        (mem.s3.bucket,),
        deleted + removed[0],
        tuple(left),
        erasure.records,
        tuple(kept),
    )


def _purge_all(mem: Memory, versions: list[_Version]) -> Op[tuple[int, list[RemainingVersion]]]:
    """Versions first, then the delete markers of keys none of whose versions a lock
    kept (a marker taken off a locked version would make it current again)."""
    count, locked = yield from _purge(mem, [v for v in versions if not v.marker])  # type: ignore[arg-type]
    held = {r.key for r in locked}
    more, _ = yield from _purge(mem, [v for v in versions if v.marker and v.key not in held])  # type: ignore[arg-type]
    return count + more, locked


def delete_objects(mem: Memory, keys: list[str], what: str) -> Generator[Any, Any, int]:
    """Delete value objects (1,000 per request, in one round trip) before the rows that
    name them go; a refusal is an error (the rows stay: the call made again retries)."""
    batches = [keys[i : i + DELETE_BATCH] for i in range(0, len(keys), DELETE_BATCH)]
    answers = yield from gather(*(request_one(mem.s3.delete_many(b)) for b in batches))
    for answer in answers:
        for err in answer.get("Errors", []):
            where = f"s3://{mem.s3.bucket}/{err.get('Key')}"
            if err.get("Code") in DENIED_CODES:
                raise AccessDeniedError(
                    f"{what} was refused the deletion of {where}: the caller needs s3:DeleteObject on the store's "
                    "memory/ folder"
                )
            raise S3SaverError(f"{what} could not delete {where}: {err.get('Code')}: {err.get('Message')}")
    return len(keys)
