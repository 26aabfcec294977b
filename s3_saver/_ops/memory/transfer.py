"""Export and import of memory: the items of a namespace prefix out of a store and into
another (any bucket, prefix or index mode), written once for both drivers.

``export_items(mem, prefix)``: the registered namespaces under ``prefix`` (one registry
read), then their items, a chunk of namespaces per round trip, and the values kept in
objects of their own (one more wave per chunk). Items expired at the time of the read are
left out. Each namespace is read at one moment; the export as a whole is not a snapshot
of the store (writes landing meanwhile in namespaces not read yet are in it).

``import_items(mem, items, now)``: a chunk of items at a time (their namespaces read whole
first), written through the store's own commit path (``MemoryIndex.commit``): a namespace
is registered before its first item, values over the inline limit are written to their
own objects first, the index last. Each item is written with its exported times
(``Change.stamps``). An item the target holds already with the same times is left alone:
an import cut short and run again writes only what the first run did not, and an import
run twice changes nothing. An item the target holds in another version (other times) is
replaced by the exported one; items of the target that the file does not hold stay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from s3_saver._format.memory import rows
from s3_saver._format.memory.export import ExportedItem
from s3_saver._format.memory.names import show
from s3_saver._index.memory import Change, Path
from s3_saver._ops.memory import sealing
from s3_saver._ops.memory.batch import (
    _delete_released,
    _resolve,
    check_vectors,
    commit,
    item_vectors,
)
from s3_saver._ops.memory.context import Memory
from s3_saver._transport.protocol import Op, gather

_NAMESPACES_PER_READ = 32
_ITEMS_PER_COMMIT = 256


@dataclass(frozen=True)
class MemoryImportReport:
    """What ``import_memory`` did.

    Attributes:
        namespaces: The namespaces of the file's items.
        written: Items written (new in the target, or replacing another version).
        unchanged: Items the target held already, with the same times (an import run again).
        expired: Items of the file expired by the time of the import: not written.
        embedded: Items whose vectors the target store's embedder computed (the target has
            an index configured other than the one the file's vectors were made for).
    """

    namespaces: int
    written: int
    unchanged: int
    expired: int
    embedded: int = 0


def export_items(mem: Memory, prefix: Path) -> Op[list[ExportedItem]]:
    snapshot = yield from mem.index.read([], {}, [prefix])
    registered = snapshot.registry
    # Registration order (the store's order of namespaces); the registry's answer may
    # hold more than the prefix asked for.
    spaces = sorted((p for p in registered if p[: len(prefix)] == prefix), key=lambda p: (registered[p], p))
    items: list[ExportedItem] = []
    for start in range(0, len(spaces), _NAMESPACES_PER_READ):
        chunk = spaces[start : start + _NAMESPACES_PER_READ]
        mem, found = yield from gather(sealing.keyed(mem, chunk), mem.index.read(chunk, {}))
        nodes = dict(found.nodes)
        now = mem.clock.now()
        # Judged again on the namespaces ``_resolve`` reads again (a value object found gone).
        values = yield from _resolve(mem, nodes, lambda: _objects(nodes, chunk, now))
        for path in chunk:
            for row in sorted((r for r in nodes[path].values() if r.live(now)), key=lambda r: (r.seq, r.created_us, r.key)):
                cell = row.value if isinstance(row.value, rows.ValueCell) else values[(path, row.key)]
                where = f"{mem.index.describe(path)}, namespace {show(path)}, key {show(row.key)}"
                cell = sealing.open_value(mem, path, row.key, cell, mem.index.describe(path))
                vectors = item_vectors(mem, path, row)
                items.append(
                    ExportedItem(
                        path,
                        row.key,
                        row.created_us,
                        row.updated_us,
                        row.expires_us,
                        row.ttl_minutes,
                        rows.raw_cell(cell, where),
                        vectors,
                    )
                )
                if mem.crypt is not None:
                    items[-1] = sealing.seal_export(mem, items[-1])
    return items


def import_items(mem: Memory, items: Sequence[ExportedItem], now: int) -> Op[MemoryImportReport]:
    """``items`` as the facade prepared them: checked, vectors decided (see ``S3Store.import_memory``)."""
    written = unchanged = expired = 0
    # Before any request: an item the target cannot hold refuses the file whole.
    for item in items:
        check_vectors(mem, item.namespace, item.key, item.vectors)
    live = []
    for item in items:
        if item.expires_us is not None and item.expires_us <= now:
            expired += 1  # absent to every reader from now on: nothing to write
        else:
            live.append(item)
    for start in range(0, len(live), _ITEMS_PER_COMMIT):
        chunk = live[start : start + _ITEMS_PER_COMMIT]
        # A chunk refused at its commit (a key an erase destroyed since this process
        # cached it) is sealed again under the key read then, and committed whole.
        done, same = yield from sealing.rekeying(mem, lambda m, chunk=chunk: _import_chunk(m, chunk))
        written += done
        unchanged += same
    return MemoryImportReport(len({item.namespace for item in items}), written, unchanged, expired)


def _import_chunk(mem: Memory, chunk: list[ExportedItem]) -> Op[tuple[int, int]]:
    """One commit of ``chunk``: the items written, and those found there already."""
    written = unchanged = 0
    paths = list(dict.fromkeys(item.namespace for item in chunk))
    # The namespaces' keys (made for new ones) beside the read of what they hold.
    mem, found = yield from gather(sealing.keyed(mem, paths, create=True), mem.index.read(paths, {}))
    held = found.nodes
    groups: dict[Path, list[Change]] = {}
    for item in chunk:
        old = held.get(item.namespace, {}).get(item.key)
        stamps = (item.created_us, item.updated_us, item.expires_us)
        if old is not None and not old.tombstone and (old.created_us, old.updated_us, old.expires_us) == stamps:
            unchanged += 1  # this version is there (an import run again, or cut after its commit)
            continue
        value = sealing.seal_value(mem, item.namespace, item.key, rows.squeeze_cell(item.value))
        vectors = sealing.seal_vectors(mem, item.namespace, item.key, item.vectors)
        kid = sealing.key_id(mem, item.namespace)  # the commit refuses a destroyed one
        groups.setdefault(item.namespace, []).append(
            Change(item.key, value, vectors, item.ttl_minutes, stamps=stamps, sealed_with=kid)
        )
        written += 1
    if groups:
        released = yield from commit(mem, groups)  # a refusal deletes the objects it staged
        yield from _delete_released(mem, released)
    return written, unchanged


def _objects(nodes: dict[Path, dict[str, rows.Row]], chunk: list[Path], now: int) -> set[tuple[Path, str]]:
    """The live rows of ``chunk`` whose value lives in an object."""
    return {(p, k) for p in chunk for k, r in nodes[p].items() if r.live(now) and isinstance(r.value, rows.ObjectRef)}
