"""encrypt_namespaces: encryption turned on for a memory store written without it.

For each registered namespace under the prefix, in path order:

1. the namespace's key is made first (the key store's conditional create, as the first
   encrypted put does: two processes agree on one key);
2. its rows are read as stored (``MemoryIndex.read``; the values of large items from
   their objects), and every row that holds plaintext (its value, its value object or
   its vectors) is written again encrypted in its place, in one commit per namespace
   (``Change.reseal``): the item's times, expiry and place stay, and each rewrite is
   fenced on the row as read, so a put or delete that landed since wins (never
   overwritten by the old value, never brought back). A large value is encrypted into a
   new value object, written before the commit (objects first, index last); the commit
   releases the old object, or the new one when the item changed meanwhile. Rows a
   writer changed are read again and the namespace retried (up to ``_ATTEMPTS`` reads:
   then it is reported ``busy``). In the manifest mode the one commit shadows every
   plaintext row of the sealed segments at once, so they are all dead and the swap
   merges them away (their rows encrypted, in new segments);
3. the namespace's folder is listed, and every noncurrent version and delete marker in
   it is deleted (the head's replaced versions, deleted value objects and segments: they
   hold the plaintext), as ``erase_namespace`` deletes them; so is every current object
   that the index does not name (``MemoryIndex.named_objects``, read after the listing)
   and that is older than the grace period: what a run cut short between its commit and
   its deletes left. A younger one may be a put about to commit: it stays, reported
   (``YOUNG_STRAY``: run again in an hour). Versions Object Lock holds stay, reported.
   The table keeps no old item (its backups and point-in-time recovery are the
   operator's).

Cut after any request, the call again finishes: the key is there (or made), each row is
either plaintext or encrypted, whole (a rewrite is one conditional write, or one swap of
the head), and the rows still plaintext are found by the next read. A namespace
encrypted already costs its read (and a GET per large value) and, on a versioned
bucket, its folder's listing.

Readers meanwhile: a store without ``encryption=`` cannot read an item once encrypted
(``EncryptedObjectError``), and an encrypting store cannot read one not encrypted yet
(``PlaintextObjectError``): nothing reads one as the other. Stop the writers, run the
migration, start them with ``encryption=``, and run it once more (it encrypts what a
writer without encryption put after its namespace was done).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

from s3_saver._crypto.sealer import SEALED_TAG
from s3_saver._format.codec import unpack
from s3_saver._format.memory import rows
from s3_saver._format.memory.documents import VALUE_FORMAT, is_memory_key, loads_value
from s3_saver._format.memory.names import show
from s3_saver._format.memory.segments import SEGMENT_DIR, SEGMENT_FORMAT
from s3_saver._index.memory import Change, Path
from s3_saver._ops.bucket import RemainingVersion, _listed, _Version
from s3_saver._ops.erase import GRACE, _versioned
from s3_saver._ops.memory import sealing
from s3_saver._ops.memory.batch import _delete_released, _move_large_values
from s3_saver._ops.memory.context import Memory
from s3_saver._ops.memory.erase import _purge_all
from s3_saver._transport.failures import OBJECT_MISSING, classify
from s3_saver._transport.protocol import Emit, Op, about, raise_failure
from s3_saver.errors import ConfigurationError, S3SaverError

YOUNG_STRAY = (
    "an object no item names, younger than the grace period: a put about to commit, or a value or segment a "
    "migration (or a writer) cut short did not delete, which may hold plaintext: run the migration again in an hour"
)
_ATTEMPTS = 3  # reads of a namespace that writers keep changing, before it is reported busy

ENCRYPTED = "encrypted"
BUSY = "busy"


@dataclass(frozen=True)
class NamespaceEncryptStatus:
    """What [S3Store.encrypt_namespaces()][s3_saver.S3Store.encrypt_namespaces] did to one namespace.

    Attributes:
        namespace: The namespace.
        state: ``"encrypted"`` (every item's value and vectors is encrypted now) or
            ``"busy"`` (written to through every attempt: run again).
        items: Items this call wrote again encrypted (0: encrypted already).
        deleted: Object versions and delete markers removed (what a versioned bucket
            kept of the plaintext).
        remaining: Versions that stay, with their reason: a lock holds them, or an
            object no item names younger than the grace period (``YOUNG_STRAY``: a
            put about to commit, or what a run cut short left; run again in an hour).
    """

    namespace: tuple[str, ...]
    state: str
    items: int = 0
    deleted: int = 0
    remaining: tuple[RemainingVersion, ...] = ()

    @property
    def complete(self) -> bool:
        """True when no plaintext of the namespace is left: encrypted, no version remains."""
        return self.state == ENCRYPTED and not self.remaining


def encrypt_namespaces(mem: Memory, prefix: Path, replicas: tuple[Memory, ...] | list[Memory] = ()) -> Op[None]:
    """Every registered namespace under ``prefix`` through the migration (see the module
    docstring), one ``NamespaceEncryptStatus`` emitted per namespace."""
    check(mem, replicas)
    versioned = yield from _versioned(mem)  # type: ignore[arg-type]
    registry = (yield from mem.index.read([], {}, [prefix])).registry
    for path in sorted(p for p in registry if p[: len(prefix)] == prefix):
        yield Emit((yield from _namespace(mem, path, versioned)))


def check(mem: Memory, replicas: tuple[Memory, ...] | list[Memory]) -> None:
    """Refuses what the migration cannot do: without a key, and with a replica."""
    if mem.crypt is None:
        raise ConfigurationError(
            "encrypt_namespaces encrypts with the store's key: build the store with encryption=KmsKey(...) or "
            "LocalKey(...) (or S3Store.from_saver of an encrypting saver)"
        )
    if replicas:
        raise ConfigurationError(
            f"encrypt_namespaces with a replica (s3://{replicas[0].s3.bucket}): S3 Replication copied the plaintext "
            "versions there, and the migration cannot remove them from the replica bucket. Encrypt before adding the "
            "replica (or remove it, migrate, and set it up again)"
        )


def _namespace(mem: Memory, path: Path, versioned: bool) -> Op[NamespaceEncryptStatus]:
    # The key first (a conditional create): every later step seals under it.
    mem = yield from sealing.keyed(mem, [path], create=True)
    state, items = BUSY, 0
    for _ in range(_ATTEMPTS):
        found = (yield from mem.index.read([path], {})).nodes.get(path, {})
        changes = yield from _plaintext(mem, path, found)
        if not changes:
            state = ENCRYPTED
            break
        groups = {path: changes}
        # Large values go to new objects once sealed (the stage: before the rows name them).
        released = yield from mem.index.commit(groups, partial(_move_large_values, mem, groups))
        yield from _delete_released(mem, released)
        items += len(changes)  # rewrites a writer won over are counted again on the next read
    deleted, remaining = yield from _sweep(mem, path, versioned)
    return NamespaceEncryptStatus(path, state, items, deleted, tuple(remaining))


def _plaintext(mem: Memory, path: Path, found: dict[str, rows.Row]) -> Op[list[Change]]:
    """A fenced rewrite (``Change.reseal``) of each row of ``found`` that holds plaintext;
    the large values read from their objects in one wave. Expired rows too: their bytes
    are stored until a sweep removes them."""
    live = [r for r in found.values() if not r.tombstone]
    objects = [r for r in live if isinstance(r.value, rows.ObjectRef)]
    calls = tuple(
        about(mem.s3.get(mem.index.value_key(path, r.value.token)), f"namespace {show(path)}, key {show(r.key)}")  # type: ignore[union-attr]
        for r in objects
    )
    answers = (yield calls) if calls else ()
    values: dict[str, rows.ValueCell] = {}
    for r, call, answer in zip(objects, calls, answers):
        if isinstance(answer, BaseException):
            if classify(answer, call.operation) == OBJECT_MISSING:
                continue  # a writer replaced the row since the read: the next read sees its row
            raise_failure(call, answer)
        values[r.key] = loads_value(answer["Body"], path, r.key, f"s3://{mem.s3.bucket}/{call.params['Key']}")
    changes: list[Change] = []
    for r in sorted(live, key=lambda r: r.key):
        value = values.get(r.key) if isinstance(r.value, rows.ObjectRef) else r.value
        if value is None:
            continue
        assert isinstance(value, rows.ValueCell)
        vectors = r.vectors
        plain_value = value.type_tag != SEALED_TAG
        plain_vectors = isinstance(vectors, rows.VectorsCell) and vectors.dtype != rows.SEALED_DTYPE
        if not plain_value and not plain_vectors:
            continue
        if plain_value:
            value = sealing.seal_value(mem, path, r.key, value)
        if plain_vectors:
            assert isinstance(vectors, rows.VectorsCell)
            vectors = sealing.seal_vectors(mem, path, r.key, vectors)
        # A value over the inline limit goes to a new object (``_move_large_values``),
        # never the old one: the old object is released once the rewrite lands. No
        # ``sealed_with``: a rewrite applies only over the row as read, and an erase that
        # destroys the key removes every row (the head emptied; the items deleted after the
        # erase's mark, each as read, a rewrite changing no ``ua``), so a rewrite under a
        # destroyed key never stays.
        changes.append(Change(r.key, value, vectors, r.ttl_minutes, reseal=r))
    return changes


def _sweep(mem: Memory, path: Path, versioned: bool) -> Op[tuple[int, list[RemainingVersion]]]:
    """The namespace's folder listed, then what its index names now (read after the
    listing: a write committed meanwhile is named). Deleted: every noncurrent version and
    delete marker (the head's replaced versions, deleted value objects and segments), as
    ``erase_namespace`` step 2 deletes them, and every current object the index does not
    name that is older than the grace period (a value object or segment this migration,
    or a writer, released and did not delete: cut short before its delete). A younger
    one may be a put about to commit: it stays, reported (``YOUNG_STRAY``). Versions are
    immutable: each deleted by its id is what was listed."""
    listed = yield from _listed(mem, mem.index.node_folder(path), versioned)  # type: ignore[arg-type]
    listed = [v for v in listed if is_memory_key(mem.index.prefix, v.key)]  # never another saver's key
    doomed = [v for v in listed if not v.current]
    left: list[RemainingVersion] = []
    strays: list[_Version] = []
    current = [v for v in listed if v.current]
    if current:
        named = yield from mem.index.named_objects(path)
        young = time.time() - GRACE
        for v in current:
            if v.key in named:
                continue
            if v.modified >= young:
                strays.append(v)
            else:
                doomed.append(v)
    # A young one is reported only if it holds plaintext (an encrypted one is a put's
    # about to commit, or garbage for ``collect_garbage``): one wave of GETs.
    if strays:
        calls = tuple(about(mem.s3.get(v.key, v.version_id), f"namespace {show(path)}") for v in strays)
        answers = yield calls
        for v, call, answer in zip(strays, calls, answers):
            if isinstance(answer, BaseException):
                if classify(answer, call.operation) == OBJECT_MISSING:
                    continue  # deleted meanwhile (its writer's cleanup)
                raise_failure(call, answer)
            if _holds_plaintext(v.key, bytes(answer["Body"])):
                left.append(RemainingVersion(mem.s3.bucket, v.key, v.version_id, YOUNG_STRAY))
    count, locked = yield from _purge_all(mem, doomed)
    return count, left + locked


def _holds_plaintext(key: str, data: bytes) -> bool:
    """Whether an object of a namespace's folder (a value object or a sealed segment)
    holds a value or vectors not encrypted; one that cannot be read as either counts as
    plaintext (reported, never judged harmless)."""
    try:
        if f"/{SEGMENT_DIR}/" in key:
            wire = unpack(data, SEGMENT_FORMAT, "a segment")["rows"]
            cells = [(r.value, r.vectors) for r in (rows.row_from_wire(obj, "a segment") for obj in wire)]
        else:
            value = rows.value_from_wire(unpack(data, VALUE_FORMAT, "a value object")["value"], "a value object")
            cells = [(value, None)]
    except (S3SaverError, KeyError, TypeError, ValueError):
        return True
    return any(
        (isinstance(value, rows.ValueCell) and value.type_tag != SEALED_TAG)
        or (isinstance(vectors, rows.VectorsCell) and vectors.dtype != rows.SEALED_DTYPE)
        for value, vectors in cells
    )
