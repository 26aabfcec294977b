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

With a replica (a store made by ``S3Store.from_saver`` from a saver with a ``Replica``),
step 2 runs in the replica's bucket too, before step 3, on the folders the erase found
in the region written to (the replica's registry may lag): every version S3 Replication
brought there goes, but the current head and young current objects, as above, and a
current head that holds what the region written to no longer holds (replication has not
delivered the erase yet: the erase leaves it, reports it ``REPLICA_LAG`` and keeps the
namespace registered, so that the erase called again, once replication caught up, finds
it). Step 4 runs there too, after step 3; the replica's current registry, until the
registry step 3 wrote arrives, still names the namespaces: reported ``REPLICA_LAG``, and
the erase called again (which always visits the registry) removes it once noncurrent.
Deletes of a version are not replicated (only delete markers may be), which is why the
erase goes to the replica itself.

A put racing the erase: an item it wrote before the erase read the namespace's rows is
erased; one written after lands through a new registration (see the index modules):
each item is either erased or whole and listed, never in an unlisted namespace.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from s3_saver._crypto.records import KeyRecord
from s3_saver._format.memory.documents import (
    HEAD_NAME,
    is_memory_key,
    loads_head,
)
from s3_saver._format.memory.names import node_id
from s3_saver._index.memory import Path
from s3_saver._ops.bucket import RemainingVersion, _listed, _purge, _Version
from s3_saver._ops.erase import GRACE, NEWER, _versioned
from s3_saver._ops.memory.context import Memory
from s3_saver._transport.failures import DENIED_CODES, OBJECT_MISSING, classify
from s3_saver._transport.protocol import Op, gather, raise_failure, request_one
from s3_saver._transport.s3 import DELETE_BATCH
from s3_saver.errors import AccessDeniedError, S3SaverError

REPLICA_LAG = "in the replica, replication has not delivered the erase yet (run the erase again once it has)"


@dataclass(frozen=True)
class NamespaceEraseReport:
    """What [S3Store.erase_namespace()][s3_saver.S3Store.erase_namespace] removed, and what remains.

    The shape of [EraseReport][s3_saver.EraseReport], for a namespace prefix
    instead of a thread id.

    Attributes:
        prefix: The namespace prefix erased (``()``: every namespace).
        namespaces: The namespaces erased and unregistered.
        items: Items removed.
        buckets: The buckets erased in (the region written to, then the
            replica's, for a store made from a saver with a replica).
        deleted: Object versions, delete markers and (on an unversioned bucket)
            objects removed: value objects, the replaced versions of manifest
            heads, the registry's noncurrent versions.
        remaining: Versions left in place, each with its reason (empty: none of
            the erased items' bytes remains in the bucket).
        records: What stays, with no item and no namespace name in it: in the
            manifest mode, one empty head per erased namespace (and per
            namespace between it and the prefix); in the DynamoDB mode with
            ``encryption=``, one item of destroyed key ids per erased namespace
            that had a key.
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
        """True when no version of an erased item remains readable in the buckets erased
        in: none remains, or (with ``encryption=``) each one left is crypto-erased (its
        namespace's key destroyed), as ``EraseReport.complete`` counts them."""
        return all(r.crypto_erased for r in self.remaining)


def erase_namespace(
    mem: Memory, prefix: Path, grace: float = GRACE, replicas: Sequence[Memory] = ()
) -> Op[NamespaceEraseReport]:
    """Erase in ``mem``'s region, and in the buckets of ``replicas`` (see the module
    docstring)."""
    versioned = yield from _versioned(mem)  # type: ignore[arg-type]
    # With encryption: every registered namespace's key under the prefix destroyed first
    # (in both regions' key stores), before anything is deleted. From then on no copy of
    # their items opens, wherever a lock, a backup or a replica keeps one.
    destroyed = yield from _destroy_keys(mem, prefix)
    removed = [0]

    def purge(keys: list[str]) -> Op[None]:
        count = yield from delete_objects(mem, keys, "erase")
        if not versioned:  # on a versioned bucket, step 2 counts the versions
            removed[0] += count

    def destroy(paths: list[Path]) -> Op[dict[Path, frozenset[str]]]:
        # The namespaces the index found: one registered after the keys were destroyed (a
        # put racing the erase, with a key made before it) has its key destroyed too,
        # before the index changes anything of it. The ids go into the index, where a
        # commit under one of them is refused (``MemoryIndex.commit``'s invariant).
        destroyed.update((yield from _destroy_keys(mem, prefix, [p for p in paths if p not in destroyed])))
        return {p: frozenset(k.hex() for k in destroyed[p][0].erased_ids()) for p in paths if p in destroyed}

    erasure = yield from mem.index.erase_rows(prefix, purge, destroy if mem.crypt is not None else None)
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
    for replica in replicas:
        more, kept_there = yield from _erase_folders_in(replica, mem, erasure.nodes, young)
        deleted += more
        left += kept_there
    # Step 3: a namespace whose folder keeps a version stays registered (found again).
    folders = {mem.index.node_folder(p): p for p in erasure.namespaces}
    held = sorted({p for f, p in folders.items() for r in left if r.key.startswith(f)})
    kept = yield from mem.index.erase_registrations(erasure, held)
    left = _crypto_erased(mem, left, destroyed)
    if versioned and erasure.history:
        more, locked = yield from _erase_history(mem, erasure.history)
        deleted += more
        left += locked
        for replica in replicas:
            more, locked = yield from _erase_history(replica, erasure.history, mem)
            deleted += more
            left += locked
    if mem.crypt is not None and destroyed:
        # Every namespace is gone from the index: a new life may make a new key.
        yield from gather(*(mem.crypt.settle(node_id(p), erased, buried) for p, (erased, buried) in destroyed.items()))
        for p in destroyed:
            mem.crypt.forget(node_id(p))
    return NamespaceEraseReport(
        prefix,
        tuple(p for p in erasure.namespaces if p not in kept),
        erasure.items,
        (mem.s3.bucket, *(r.s3.bucket for r in replicas)),
        deleted + removed[0],
        tuple(left),
        erasure.records,
        tuple(kept),
    )


def _destroy_keys(
    mem: Memory, prefix: Path, paths: Sequence[Path] | None = None
) -> Op[dict[Path, tuple[KeyRecord, KeyRecord | None]]]:
    """The keys of the namespaces registered under ``prefix`` (or of ``paths``)
    destroyed (``Crypt.destroy``: the erasure written unsettled, so no new key is made
    for them until the erase settles it at its end), one wave per step; with a replica,
    buried in its region's key store too. Returns the erasures by namespace (a namespace
    that never had a key: none)."""
    if mem.crypt is None:
        return {}
    if paths is None:
        registry = (yield from mem.index.read([], {}, [prefix])).registry
        paths = [p for p in registry if p[: len(prefix)] == prefix]
    now = int(time.time())
    crypt = mem.crypt
    for p in paths:
        crypt.forget(node_id(p))  # this process seals nothing more under it
    found = yield from gather(*(crypt.destroy(node_id(p), now) for p in paths))
    return {p: (erased, buried) for p, (erased, buried) in zip(paths, found) if erased is not None}


def _crypto_erased(
    mem: Memory, left: list[RemainingVersion], destroyed: dict[Path, tuple[KeyRecord, KeyRecord | None]]
) -> list[RemainingVersion]:
    """``left`` with each version in the folder of a namespace whose key the erase
    destroyed marked crypto-erased: every item's value and vectors there (in a head, a
    segment or a value object, of any version) is sealed under that namespace's key
    (or an earlier life's, destroyed before), and no new key is made for it before the
    erase ends. The registry's versions (namespace names, no item) are not marked."""
    if not destroyed:
        return left
    folders = {mem.index.node_folder(p): erased.erased_at for p, (erased, _) in destroyed.items()}
    out = []
    for r in left:
        at = next((when for folder, when in folders.items() if r.key.startswith(folder)), _NOT_FOUND)
        if at is _NOT_FOUND:
            out.append(r)
        else:
            when = datetime.fromtimestamp(at, UTC) if isinstance(at, int) else None
            out.append(replace(r, crypto_erased=True, key_destroyed_at=when))
    return out


_NOT_FOUND: Any = object()


def _erase_history(mem: Memory, keys: Sequence[str], written: Memory | None = None) -> Op[tuple[int, list[RemainingVersion]]]:
    """Step 4 in ``mem``'s bucket: the noncurrent versions of ``keys`` (written by every
    registration: each replaced version names namespaces). In a replica (``written``: the
    region written to), a current version unlike the one there is reported: it still
    names what step 3 removed, until replication delivers the new one."""
    pages = yield from gather(*(_listed(mem, key, True) for key in keys))  # type: ignore[arg-type]
    listed = [v for key, page in zip(keys, pages) for v in page if v.key == key]
    count, left = yield from _purge_all(mem, [v for v in listed if not v.current])
    if written is not None:
        current = [v for v in listed if v.current]
        for v, same in zip(current, (yield from gather(*(_same(mem, written, v.key) for v in current)))):
            if not same:
                left.append(RemainingVersion(mem.s3.bucket, v.key, v.version_id, REPLICA_LAG))
    return count, left


def _erase_folders_in(
    replica: Memory, mem: Memory, nodes: Sequence[Path], young: float
) -> Op[tuple[int, list[RemainingVersion]]]:
    """Step 2 in a replica's bucket, on the folders of ``nodes`` (found by the erase in
    ``mem``, the region written to). Replication only writes there: every version goes but
    the current head, and a young current object that the region written to still holds
    when asked after the listing (as there: a put that may still commit, whose object
    replication brought already; gone there, the erase, or an earlier call of it, deleted
    it). A current head
    unlike the one in the region written to that holds rows is what replication has not
    replaced yet: it stays, reported (deleted, the next replicated version would be the
    head; left, it turns noncurrent when that arrives, and the erase called again
    deletes it)."""
    versioned = yield from _versioned(replica)  # type: ignore[arg-type]
    pages = yield from gather(*(_listed(replica, mem.index.node_folder(n), versioned) for n in nodes))  # type: ignore[arg-type]
    doomed: list[_Version] = []
    left: list[RemainingVersion] = []
    heads: list[tuple[Path, _Version]] = []
    recent: list[_Version] = []
    for node, page in zip(nodes, pages):
        for v in page:
            if not is_memory_key(replica.index.prefix, v.key):
                continue  # not a key this store writes: never deleted from here
            if v.current and v.key.endswith("/" + HEAD_NAME):
                heads.append((node, v))
            elif v.current and v.modified >= young:
                recent.append(v)
            else:
                doomed.append(v)
    there = yield from gather(*(_body(mem, v.key, head=True) for v in recent))
    for v, held in zip(recent, there):
        if held is None:
            doomed.append(v)
        else:
            left.append(RemainingVersion(replica.s3.bucket, v.key, v.version_id, NEWER))
    deleted, locked = yield from _purge_all(replica, doomed)
    checks = yield from gather(*(_same(replica, mem, v.key, node) for node, v in heads))
    left += [RemainingVersion(replica.s3.bucket, v.key, v.version_id, REPLICA_LAG) for (_, v), same in zip(heads, checks) if not same]
    return deleted, left + locked


def _same(replica: Memory, written: Memory, key: str, node: Path | None = None) -> Op[bool]:
    """Whether the replica's current object at ``key`` is the one in the region written
    to (byte for byte), or, for the head of ``node``, holds no row and no segment."""
    there, here = yield from gather(_body(replica, key), _body(written, key))
    if there == here or there is None:
        return True
    if node is None:
        return False
    head = loads_head(there, node, f"s3://{replica.s3.bucket}/{key}")
    return not head.rows and not head.segments and not head.retired


def _body(mem: Memory, key: str, head: bool = False) -> Op[bytes | None]:
    """The current object at ``key`` (``head``: whether there is one, b""), None when none."""
    call = mem.s3.head(key) if head else mem.s3.get(key)
    (answer,) = yield (call,)
    if isinstance(answer, BaseException):
        if classify(answer, call.operation) == OBJECT_MISSING:
            return None
        raise_failure(call, answer)
    return b"" if head else bytes(answer["Body"])


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
