"""The memory store's encryption (``S3Store(encryption=...)``): each namespace's item
values and vectors sealed under that namespace's own data key.

Keys: one per namespace, named by the namespace id the store already uses for its
folders (hex SHA-256 of the namespace, ``names.node_id``), kept in the saver's key store
as ``<prefix>m/<id>`` (``_crypto.records.MEMORY``). A key per *full* namespace, not per
namespace node: ``erase_namespace(prefix)`` erases every namespace under ``prefix``, and
destroys the key of each; a key shared by a node and the namespaces below it could not be
destroyed for one of them without the others. The id names no one (it is a hash), so the
key store lists no namespace name.

What is sealed: a row's value (the serializer's pair, compressed first when that pays)
and its vectors (an embedding can be inverted back to text), in node heads, segments,
value objects (a large value is sealed before it moves to its object), DynamoDB items
and exports. What stays readable, as a thread's ids do: item keys (the docs advise opaque
ones), times, expiry, the vectors' field paths and sizes.

Binding: the associated data of a value is the namespace's folder (its key relative to
the prefix), the namespace id and the field ``value/<item key>`` (``vectors/<item key>``):
a row, a value object or a DynamoDB attribute copied to another item fails the tag; to
another namespace, it names another key. A row moves between a head and a segment
without being sealed again (the folder, not the object, is its place).

Loading: a batch loads the keys of the namespaces it reads beside its first index read
(``gather``: a cold process pays the key GET in the same wave, then KMS ``Decrypt``), and
of those it writes with ``create=True`` (a namespace's first key made there). In the
steady state every key is cached and nothing is sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import ormsgpack

from s3_saver._crypto.sealer import SEALED_TAG, StaleKey
from s3_saver._format.memory import rows
from s3_saver._format.memory.documents import node_folder
from s3_saver._format.memory.names import node_id, show
from s3_saver._index.memory import KeyFenced
from s3_saver._transport.protocol import Op, T, gather
from s3_saver.errors import (
    CorruptObjectError,
    EncryptedObjectError,
    ForeignCiphertextError,
    NamespaceErasedError,
    PlaintextObjectError,
    ReplicationLagError,
    S3SaverError,
    ThreadErasedError,
)

if TYPE_CHECKING:
    from s3_saver._ops.memory.context import Memory

Path = tuple[str, ...]
VALUE_FIELD = "value/"
# Writes sealed again after their key was found destroyed at their commit: each time
# another erase of the namespace came in between (as ``_ops/keyed.MAX_REKEYS``).
MAX_REKEYS = 3
VECTORS_FIELD = "vectors/"


def keyed(mem: Memory, paths: Iterable[Path], *, create: bool = False) -> Op[Memory]:
    """``mem`` holding the keys of the namespaces ``paths`` too (``create``: those
    without a live key get one: a writer's). Without encryption: ``mem``, at once."""
    if mem.crypt is None:
        return mem
    if not mem.sealer.enabled:
        mem = replace(mem, sealer=mem.crypt.sealer())
    held = mem.sealer.keys
    wanted: dict[str, Path] = {}
    for path in paths:
        node = node_id(path)
        if node not in held or (create and held[node].key is None):
            wanted.setdefault(node, path)
    if not wanted:
        return mem
    # The namespaces by name too: a key error names the namespace, not only its id (a hash).
    names = {node: show(path) for node, path in wanted.items()}
    try:
        keys = yield from mem.crypt.load(list(wanted), create=create, names=names)
    except NamespaceErasedError:
        if not create or not (yield from _settle_left(mem, wanted)):
            raise
        keys = yield from mem.crypt.load(list(wanted), create=create, names=names)
    return replace(mem, sealer=mem.sealer.with_keys(keys))


def _settle_left(mem: Memory, wanted: dict[str, Path]) -> Op[bool]:
    """A writer refused a new key: an erase of the namespace has destroyed its key and
    not yet settled the erasure. An erase settles it last, once the namespace is gone
    from the index (unregistered: its rows removed first). Found unregistered, the erase
    got that far, or was cut short after it (a prefix erase called again finds nothing
    registered below the prefix, so it would never settle it): the writer settles the
    erasure itself and a new life begins. Registered, the erase is under way: refused.
    Returns whether any erasure was settled (the load is tried once more)."""
    assert mem.crypt is not None
    registry = (yield from mem.index.read([], {}, list(wanted.values()))).registry
    gone = [node for node, path in wanted.items() if path not in registry]
    if not gone:
        return False
    yield from gather(*(mem.crypt.settle_left(node) for node in gone))
    return True


def key_id(mem: Memory, path: Path) -> str | None:
    """The id (hex) of the key ``seal_value`` seals the namespace's content with: what the
    index's commit checks against the ids an erase destroyed (None: no encryption)."""
    if mem.crypt is None:
        return None
    return mem.sealer.key_id(node_id(path))


def rekeying(mem: Memory, make: Any) -> Op[T]:
    """``make(mem)``, run again when:

    - it met a namespace's content sealed under another key than the one this process
      cached (``StaleKey``: another process erased the namespace and wrote it anew; the
      cached key was dropped, so the second run reads the key record), once per
      namespace. Opening happens before a batch commits anything, so the run again
      repeats no write;
    - its commit was refused (``KeyFenced``): a put sealed under a key that another
      process's erase destroyed after this one cached it. The key is dropped, so the run
      again reads the key record (a new life's key, made when none is live; refused while
      the erase is under way) and seals anew. The commit's other changes may have landed:
      run again, they are applied again as they were (a put's value, a delete), the
      batch's reads answered anew. At most ``MAX_REKEYS`` times per namespace (each one
      another erase of it between the key's read and the commit)."""
    if mem.crypt is None:
        return (yield from make(mem))
    renewed: set[str] = set()
    fenced: dict[str, int] = {}
    while True:
        try:
            return (yield from make(mem))
        except StaleKey as stale:
            if stale.thread_id in renewed:
                if stale.instead is not None:
                    raise stale.instead from None
                raise
            renewed.add(stale.thread_id)
        except KeyFenced as refused:
            for path in refused.paths:
                node = node_id(path)
                fenced[node] = fenced.get(node, 0) + 1
                if fenced[node] > MAX_REKEYS:
                    raise S3SaverError(
                        f"namespace {show(path)}: the write was sealed again {MAX_REKEYS} times, each time under a key an "
                        "erase destroyed before it committed (the namespace keeps being erased while it is written); "
                        "call again"
                    ) from refused
                mem.crypt.forget(node)
                if mem.sealer.enabled:
                    mem = replace(mem, sealer=mem.sealer.without(node))


def _folder(mem: Memory, node: str) -> str:
    assert mem.crypt is not None
    return node_folder(mem.crypt.prefix, node)


def seal_value(mem: Memory, path: Path, key: str, cell: rows.ValueCell) -> rows.ValueCell:
    """A value as a row holds it: sealed (the serializer's tag, the codec and the bytes,
    compressed first) under the namespace's key. Without encryption: as it is."""
    if mem.crypt is None:
        return cell
    node = node_id(path)
    inner = ormsgpack.packb([cell.type_tag, cell.codec, cell.data])
    return rows.ValueCell(SEALED_TAG, mem.sealer.seal_field(node, _folder(mem, node), VALUE_FIELD + key, inner), rows.RAW)


def open_value(mem: Memory, path: Path, key: str, cell: rows.ValueCell, where: str) -> rows.ValueCell:
    """What ``seal_value`` sealed; a plain cell as it is without encryption. With
    encryption a plain cell is refused; without it a sealed one (the errors name the
    namespace and the key)."""
    if cell.type_tag != SEALED_TAG and mem.crypt is None:
        return cell
    data = _opened(mem, path, key, VALUE_FIELD, cell.data if cell.type_tag == SEALED_TAG else None, where)
    try:
        tag, codec, raw = ormsgpack.unpackb(data)
        return rows.ValueCell(str(tag), bytes(raw), int(codec))
    except (ormsgpack.MsgpackDecodeError, TypeError, ValueError) as exc:
        raise CorruptObjectError(f"{where}: namespace {show(path)}, key {show(key)}: not a sealed value ({exc})") from exc


def seal_vectors(mem: Memory, path: Path, key: str, cell: rows.VectorsCell | None) -> rows.VectorsCell | None:
    if mem.crypt is None or cell is None:
        return cell
    node = node_id(path)
    inner = ormsgpack.packb([cell.dtype, cell.raw])
    sealed = mem.sealer.seal_field(node, _folder(mem, node), VECTORS_FIELD + key, inner)
    return rows.VectorsCell(rows.SEALED_DTYPE, cell.dims, cell.paths, sealed)


def open_vectors(mem: Memory, path: Path, key: str, cell: rows.VectorsCell, where: str) -> rows.VectorsCell:
    if cell.dtype != rows.SEALED_DTYPE and mem.crypt is None:
        return cell
    data = _opened(mem, path, key, VECTORS_FIELD, cell.raw if cell.dtype == rows.SEALED_DTYPE else None, where)
    try:
        dtype, raw = ormsgpack.unpackb(data)
        if dtype not in rows.DTYPES or len(raw) != len(cell.paths) * cell.dims * rows.DTYPES[dtype][1]:
            raise ValueError(f"dtype {dtype!r}, {len(raw)} bytes")
        return rows.VectorsCell(dtype, cell.dims, cell.paths, bytes(raw))
    except (ormsgpack.MsgpackDecodeError, TypeError, ValueError) as exc:
        raise CorruptObjectError(f"{where}: namespace {show(path)}, key {show(key)}: not sealed vectors ({exc})") from exc


def _opened(mem: Memory, path: Path, key: str, field: str, sealed: bytes | None, where: str) -> bytes:
    """The plaintext of ``sealed`` (None: the cell was stored plain), or the refusal,
    worded for memory."""
    folder = _folder(mem, node_id(path)) if mem.crypt is not None else ""
    return _opened_at(mem, path, key, folder, field, sealed, where)


def _opened_at(mem: Memory, path: Path, key: str, folder: str, field: str, sealed: bytes | None, where: str) -> bytes:
    node = node_id(path)
    subject = f"namespace {show(path)}, key {show(key)}"
    crypt = mem.crypt
    if crypt is None:
        raise EncryptedObjectError(
            f"{where}: {subject}: the item was written encrypted; this store has no encryption=: "
            "pass the KmsKey(...) or LocalKey(...) it was written with"
        )
    if sealed is None:
        raise PlaintextObjectError(
            f"{where}: {subject}: not encrypted, and this store encrypts (encryption={crypt.describe()}): the item "
            "was written without encryption (or put there by hand). It is refused, not read",
            bucket=crypt.bucket, key=where,
        )
    try:
        return mem.sealer.open_field(node, folder, field + key, sealed, where)
    except StaleKey as stale:
        if stale.instead is not None:
            # What the read answers if the key record, read again, still has no key.
            stale.instead = _worded(stale.instead, path, subject, where)
        raise
    except S3SaverError as exc:
        raise _worded(exc, path, subject, where) from None


def _worded(exc: S3SaverError, path: Path, subject: str, where: str) -> S3SaverError:
    """The sealer's refusal, said of a memory item."""
    if isinstance(exc, NamespaceErasedError):
        return exc
    if isinstance(exc, ThreadErasedError):
        return NamespaceErasedError(
            f"{where}: {subject}: the namespace was erased: the key its items were encrypted with was destroyed"
            + (f" at {exc.erased_at} (Unix seconds)" if exc.erased_at else "")
            + " (or the store is configured with another key store than the one it was written with), so no copy "
            "of them can be read",
            bucket=exc.bucket, key=where, erased_at=exc.erased_at, namespace=path,
        )
    if isinstance(exc, ForeignCiphertextError):
        return ForeignCiphertextError(
            f"{where}: {subject}: encrypted content that does not belong here: it was copied or moved from another "
            f"item or namespace, or changed ({exc})",
            bucket=exc.bucket, key=where,
        )
    if isinstance(exc, ReplicationLagError):
        return ReplicationLagError(f"{subject}: {exc}")
    return exc


# -- exports ---------------------------------------------------------------------------------
# An export lives outside the bucket: its items are bound to the store's prefix, their
# namespace and their key (no object), under the namespace's key, so an export of an
# erased namespace reads nowhere.
EXPORT_VALUE_FIELD = "export-value/"
EXPORT_VECTORS_FIELD = "export-vectors/"


def seal_export(mem: Memory, item: Any) -> Any:
    """An exported item (``ExportedItem``) with its value and vectors sealed."""
    assert mem.crypt is not None
    node, at = node_id(item.namespace), mem.crypt.prefix
    value = item.value
    inner = ormsgpack.packb([value.type_tag, value.data])
    sealed = rows.ValueCell(SEALED_TAG, mem.sealer.seal_field(node, at, EXPORT_VALUE_FIELD + item.key, inner), rows.RAW)
    vectors = item.vectors
    if vectors is not None:
        inner = ormsgpack.packb([vectors.dtype, vectors.raw])
        data = mem.sealer.seal_field(node, at, EXPORT_VECTORS_FIELD + item.key, inner)
        vectors = rows.VectorsCell(rows.SEALED_DTYPE, vectors.dims, vectors.paths, data)
    return replace(item, value=sealed, vectors=vectors)


def open_export(mem: Memory, items: list[Any], where: str) -> Op[list[Any]]:
    """The items of a sealed export, opened under the keys of the store that wrote it
    (``mem.crypt``: its key store, read with this store's keyring), loaded in one wave."""
    mem = yield from keyed(mem, [item.namespace for item in items])
    assert mem.crypt is not None
    out = []
    at = mem.crypt.prefix
    for item in items:
        if item.value.type_tag != SEALED_TAG:
            raise PlaintextObjectError(
                f"{where}: namespace {show(item.namespace)}, key {show(item.key)}: not encrypted in an export whose "
                "header says it is. Refused", bucket=mem.crypt.bucket, key=where,
            )
        data = _opened_at(mem, item.namespace, item.key, at, EXPORT_VALUE_FIELD, item.value.data, where)
        tag, raw = _pair(data, where)
        vectors = item.vectors
        if vectors is not None:
            data = _opened_at(mem, item.namespace, item.key, at, EXPORT_VECTORS_FIELD, vectors.raw, where)
            dtype, raw_vectors = _pair(data, where)
            if dtype not in rows.DTYPES or len(raw_vectors) != len(vectors.paths) * vectors.dims * rows.DTYPES[dtype][1]:
                raise CorruptObjectError(f"{where}: key {show(item.key)}: not sealed vectors")
            vectors = rows.VectorsCell(str(dtype), vectors.dims, vectors.paths, bytes(raw_vectors))
        out.append(replace(item, value=rows.ValueCell(str(tag), bytes(raw), rows.RAW), vectors=vectors))
    return out


def _pair(data: bytes, where: str) -> tuple[Any, Any]:
    try:
        first, second = ormsgpack.unpackb(data)
        return first, second
    except (ormsgpack.MsgpackDecodeError, TypeError, ValueError) as exc:
        raise CorruptObjectError(f"{where}: not a sealed pair ({exc})") from exc
