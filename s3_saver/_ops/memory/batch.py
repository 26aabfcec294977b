"""The memory store's batch: one operation for ``S3Store.batch`` and ``abatch``.

``batch(mem, prepared, queries, vectors)`` answers a prepared batch (``prepare``) on
the index (``MemoryIndex``, either mode), with the embedder's answers computed by the
facade before it (the only step that differs between sync and async: the embedder is
the user's code, not an AWS call). As InMemoryStore:

1. the reads first, and they never see the batch's own puts: every GetOp's namespace,
   each searched prefix's own namespace and the registry ranges the batch needs in one
   round trip (a searched namespace known to have none below it needs no registry);
   then the namespaces under a searched prefix that the first wave did not read;
   values kept in objects of their own are read in one more wave;
2. then one commit of every change: the refreshes the reads found due (none in a
   replica region, read-only until ``promote()``), and the puts and deletes (deduplicated by ``prepare``: the last value of a key, at the place of
   its first op), grouped by namespace; values over the index's inline limit are
   written to their own objects once their namespaces are registered, before the rows,
   and the objects of replaced values deleted after;
3. results in op order.

Expired items are never returned (the store's clock, read once per batch for reads).

A batch of reads alone may run in a replica region (``S3Store`` routes it through the
saver's ``Route``, as the saver's reads): ``Memory.reads`` is then set, and a value object
that the replica's index names and that has not arrived is replication lag (``_resolve``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from typing import Any

import ormsgpack
from langgraph.store.base import (
    GetOp,
    Item,
    ListNamespacesOp,
    Result,
    SearchOp,
)

from s3_saver._format.key_codec import new_token
from s3_saver._format.memory import rows
from s3_saver._format.memory import ttl as ttl_core
from s3_saver._format.memory.documents import dumps_value, loads_value
from s3_saver._format.memory.names import show
from s3_saver._index.memory import Change, KeyFenced, Path
from s3_saver._ops.memory import listing, rank, sealing
from s3_saver._ops.memory.context import Memory
from s3_saver._ops.memory.prepare import Prepared
from s3_saver._transport.failures import OBJECT_MISSING, classify
from s3_saver._transport.protocol import Op, about, gather, raise_failure
from s3_saver._transport.s3 import DELETE_BATCH, put_immutable
from s3_saver.errors import EmbeddingError, StoreUnavailableError

log = logging.getLogger("s3_saver")
_RESOLVE_TRIES = 3


def batch(
    mem: Memory,
    prepared: Prepared,
    queries: dict[str, list[float]],
    vectors: list[dict[str, list[float]]] | None,
) -> Op[list[Result]]:
    return (yield from sealing.rekeying(mem, lambda m: _batch(m, prepared, queries, vectors)))


def _batch(
    mem: Memory,
    prepared: Prepared,
    queries: dict[str, list[float]],
    vectors: list[dict[str, list[float]]] | None,
) -> Op[list[Result]]:
    results: list[Result] = [None] * len(prepared.ops)
    # Packed (and checked against what the index holds) before the first request: an
    # item the index cannot hold stores nothing of its batch.
    packed: list[rows.VectorsCell | None] = [None] * len(prepared.puts)
    if vectors is not None:
        for number, put in enumerate(prepared.puts):
            if put.value is not None:
                packed[number] = rows.pack_vectors(vectors[number], mem.dims, mem.dtype)
                check_vectors(mem, put.namespace, put.key, packed[number])
    get_groups = prepared.get_groups()
    searches = [prepared.ops[i] for i in prepared.searches]
    prefixes = [op.namespace_prefix for op in searches if isinstance(op, SearchOp)]
    # The registry ranges the batch needs: each listing's fixed prefix, each searched
    # prefix's; an index that tells leaves apart (a namespace with none below it) reads
    # a searched prefix's range only once its first read shows it is not a leaf.
    listed = [listing.fixed_prefix(op) for op in (prepared.ops[i] for i in prepared.listings) if isinstance(op, ListNamespacesOp)]
    first = [*listed, *(p for p in prefixes if not p or not mem.index.knows_leaves)]
    whole = [p for p in prefixes if p]
    nodes: dict[Path, dict[str, rows.Row]] = {}
    registered: dict[Path, int] = {}
    leaves: frozenset[Path] = frozenset()
    # With encryption, the keys of the namespaces written (made for a new one) and of
    # those read go in the first wave, beside the reads (none sent when cached).
    writes = [ns for ns, numbers in prepared.groups.items() if any(prepared.puts[n].value is not None for n in numbers)]
    keying = gather(
        sealing.keyed(mem, writes, create=True), sealing.keyed(mem, [p for p in [*get_groups, *whole] if p not in writes])
    )
    if get_groups or prefixes or listed:
        # A searched prefix is often a namespace with no sub-namespaces: its rows are read
        # in the first wave (beside the registry, if it is read), so such a search is one
        # round trip.
        wanted = {ns: [_key(prepared.ops[i]) for i in positions] for ns, positions in get_groups.items()}
        (written, read), snapshot = yield from gather(keying, mem.index.read(whole, wanted, first))
        nodes, registered, leaves = dict(snapshot.nodes), dict(snapshot.registry), snapshot.leaves
    else:
        written, read = yield from keying
    mem = _joined(mem, written, read)
    more = [p for p in whole if p not in leaves and not any(p[: len(q)] == q for q in first)]
    if more:
        registered.update((yield from mem.index.read([], {}, more)).registry)
    order = sorted(registered, key=registered.__getitem__)
    # Each searched prefix's namespaces, in registration order (a leaf: itself alone).
    spaces = {p: [p] if p in leaves else [ns for ns in order if ns[: len(p)] == p] for p in prefixes}
    # Read whole unless they were (a get reads only its keys in DynamoDB mode).
    under = sorted({ns for found in spaces.values() for ns in found} - set(whole))
    if under:
        mem, found = yield from gather(sealing.keyed(mem, under), mem.index.read(under, {}))
        nodes.update(found.nodes)
    now = mem.clock.now()
    values = yield from _resolve(mem, nodes, lambda: _needed(prepared, nodes, spaces, now))
    returned: list[tuple[Path, rows.Row, bool]] = []

    for namespace, positions in get_groups.items():
        found = nodes[namespace]
        for position in positions:
            op = prepared.ops[position]
            assert isinstance(op, GetOp)
            row = found.get(op.key)
            if row is not None and row.live(now):
                results[position] = _item(mem, namespace, row, values)
                returned.append((namespace, row, ttl_core.read_refresh(op.refresh_ttl, mem.ttl_config)))

    for position in prepared.searches:
        op = prepared.ops[position]
        assert isinstance(op, SearchOp)
        query = queries.get(op.query) if op.query else None
        hits = rank.answer(op, _candidates(mem, nodes, values, spaces[op.namespace_prefix], now), query)
        results[position] = hits
        refresh = ttl_core.read_refresh(op.refresh_ttl, mem.ttl_config)
        returned += [(hit.namespace, nodes[hit.namespace][hit.key], refresh) for hit in hits]

    paths = sorted(registered)
    for position in prepared.listings:
        op = prepared.ops[position]
        assert isinstance(op, ListNamespacesOp)
        results[position] = listing.page_namespaces(paths, op)

    # The refreshes first (the batch's puts, applied after them, win over them). A replica
    # region takes no write: its reads leave the expiry as replicated (the primary's next
    # read refreshes it); they only go there while the primary is unavailable.
    groups: dict[Path, list[Change]] = {}
    refreshes = {} if mem.read_only else ttl_core.plan_refreshes(returned, prepared.written(), now, mem.slack)
    for namespace, moves in refreshes.items():
        groups[namespace] = [Change(m.key, refresh=m) for m in moves]
    for namespace, numbers in prepared.groups.items():
        changes = groups.setdefault(namespace, [])
        for number in numbers:
            put = prepared.puts[number]
            value, cell = put.value, packed[number]
            sealed_with = None
            if value is not None:
                value = sealing.seal_value(mem, namespace, put.key, value)
                cell = sealing.seal_vectors(mem, namespace, put.key, cell)
                sealed_with = sealing.key_id(mem, namespace)  # the commit refuses a destroyed one
            changes.append(Change(put.key, value, cell, put.ttl_minutes, sealed_with=sealed_with))
    released = yield from commit(mem, groups)
    yield from _delete_released(mem, released)
    return results


def commit(mem: Memory, groups: dict[Path, list[Change]]) -> Op[list[str]]:
    """``MemoryIndex.commit`` of ``groups``, the value objects written once their
    namespaces are registered; the value objects of the rows it replaced (to delete).

    Refused by the key fence (``KeyFenced``), it deletes the value objects it wrote for
    the refused namespaces before raising: nothing of those namespaces' puts landed, so
    no row names them (sealed under the destroyed key), and the batch run again
    (``sealing.rekeying``) writes its values to new objects under the new key. Left,
    they would be garbage until ``collect_garbage``."""
    try:
        return (yield from mem.index.commit(groups, partial(_move_large_values, mem, groups)))
    except KeyFenced as refused:
        # Invariant: an object deleted here is one this commit wrote (``written`` set by
        # ``_move_large_values`` this run) for a namespace whose puts did not land.
        staged = [
            mem.index.value_key(path, change.value.token)
            for path in refused.paths
            for change in groups.get(tuple(path), ())
            if isinstance(change.value, rows.ObjectRef) and change.written is not None
        ]
        yield from _delete_released(mem, staged)
        raise


def check_vectors(mem: Memory, namespace: Path, key: str, cell: rows.VectorsCell | None) -> None:
    """An item's vectors fit what the index holds beside its value (a DynamoDB item: 400 KB),
    else EmbeddingError naming where, before any request."""
    limit = mem.index.vector_limit
    if cell is None or limit is None:
        return
    size = len(ormsgpack.packb(rows.vectors_to_wire(cell)))
    if size > limit:
        raise EmbeddingError(
            f"{mem.index.describe(namespace)}: namespace {show(namespace)}, key {show(key)}: its {len(cell.paths)} vectors"
            f" of {cell.dims} {cell.dtype} take {size:,} bytes, and an item there holds at most {limit:,} bytes of"
            " vectors: index fewer paths (the put's index=[...] or the index's fields), use vector_dtype='float32',"
            " or keep memory in the bucket alone (no table); nothing was stored",
            namespace,
            key,
        )


def _move_large_values(mem: Memory, groups: dict[Path, list[Change]]) -> Op[None]:
    """Values over the index's inline limit go to objects of their own, written (one
    wave, ``IfNoneMatch``) before the rows that name them: objects first, index last
    (``MemoryIndex.commit`` runs this once their namespaces are registered).
    A commit that never lands leaves such an object unnamed: no read ever returns it, and
    ``collect_garbage`` (or ``erase_namespace``, unless a sweep unregistered its namespace
    first) removes it. Each change records when its object was sent: the commit names it
    only within the lease (``_index/memory_lease``)."""
    objects: dict[str, bytes] = {}
    sent = mem.clock.now()  # before the objects go out: the lease never runs from later than their write
    for path, changes in groups.items():
        for i, change in enumerate(changes):
            if isinstance(change.value, rows.ValueCell) and change.value.size > mem.index.inline_limit:
                token = new_token()
                objects[mem.index.value_key(path, token)] = dumps_value(change.value, path, change.key)
                # An import's stamps kept.
                changes[i] = replace(change, value=rows.ObjectRef(token, change.value.size), written=sent)
    if objects:
        yield from put_immutable(mem.s3, objects)


def _delete_released(mem: Memory, released: list[str]) -> Op[None]:
    """The value objects of the rows the commit replaced, after it landed. Best effort: the
    batch's changes are committed; an object left here is unnamed, for ``collect_garbage``."""
    for start in range(0, len(released), DELETE_BATCH):
        call = mem.s3.delete_many(released[start : start + DELETE_BATCH])
        (answer,) = yield (call,)
        if isinstance(answer, BaseException) or answer.get("Errors"):
            log.warning("%s: replaced values left behind (unnamed; collect_garbage removes them): %s", call.describe(), answer)


def _needed(
    prepared: Prepared, nodes: dict[Path, dict[str, rows.Row]], spaces: dict[Path, list[Path]], now: int
) -> set[tuple[Path, str]]:
    """The live rows whose value lives in an object and that an answer needs: a get's
    row, and every row under a searched prefix (its filter reads the value)."""
    needed: set[tuple[Path, str]] = set()
    for position in prepared.gets:
        op = prepared.ops[position]
        assert isinstance(op, GetOp)
        row = nodes.get(op.namespace, {}).get(op.key)
        if row is not None and row.live(now) and isinstance(row.value, rows.ObjectRef):
            needed.add((op.namespace, op.key))
    for namespace in {ns for found in spaces.values() for ns in found}:
        needed |= {(namespace, k) for k, r in nodes[namespace].items() if r.live(now) and isinstance(r.value, rows.ObjectRef)}
    return needed


def _resolve(
    mem: Memory, nodes: dict[Path, dict[str, rows.Row]], needed: Callable[[], set[tuple[Path, str]]]
) -> Op[dict[tuple[Path, str], rows.ValueCell]]:
    """The values of the ``needed()`` rows (of ``nodes`` as they are now), from their
    objects (one wave). An object gone means a writer replaced the row after it was read:
    read those namespaces again (into ``nodes``), and retry. What the answers need is
    judged again on the rows read again (a key put meanwhile is needed too), and a value
    is kept only for the token its row names now (never an older version's value beside
    a newer row's times).

    Lag-safe reads (``mem.reads``): S3 replication copies each object on its own, so a
    replica's head or item can name a value object that has not arrived. One still named
    after the read again raises ``MissingObjectError`` (the route reports it as
    ``ReplicationLagError``): a namespace's rows are its only state, with no older one to
    stand in, and a value is never returned without its object."""
    found: dict[tuple[Path, str], tuple[str, rows.ValueCell]] = {}

    def token(path: Path, key: str) -> str:
        return nodes[path][key].value.token  # type: ignore[union-attr]

    for _ in range(_RESOLVE_TRIES):
        wanted = sorted(k for k in needed() if k not in found or found[k][0] != token(*k))
        if not wanted:
            return {k: cell for k, (_, cell) in found.items()}
        calls = tuple(
            about(mem.s3.get(mem.index.value_key(p, token(p, k))), f"namespace {show(p)}, key {show(k)}") for p, k in wanted
        )
        answers = yield calls
        gone: set[Path] = set()
        missing: list[tuple[Path, str, Any, BaseException]] = []
        for (path, key), call, answer in zip(wanted, calls, answers):
            if isinstance(answer, BaseException):
                if classify(answer, call.operation) != OBJECT_MISSING:
                    raise_failure(call, answer)
                gone.add(path)
                missing.append((path, key, call, answer))
                continue
            cell = loads_value(answer["Body"], path, key, f"s3://{mem.s3.bucket}/{call.params['Key']}")
            found[(path, key)] = (token(path, key), cell)
        if gone:
            again = yield from mem.index.read(sorted(gone), {})
            for path in gone:
                nodes[path] = again.nodes[path]
            if mem.reads is not None:
                for path, key, call, answer in missing:
                    value = row.value if (row := nodes[path].get(key)) is not None else None
                    if isinstance(value, rows.ObjectRef) and mem.index.value_key(path, value.token) == call.params["Key"]:
                        raise_failure(call, answer)  # MissingObjectError: still named, not arrived
    left = sorted(k for k in needed() if k not in found or found[k][0] != token(*k))
    if left:
        raise StoreUnavailableError(
            f"values of {', '.join(f'{show(p)} key {show(k)}' for p, k in left[:3])} kept being "
            f"replaced while being read (s3://{mem.s3.bucket}); try again"
        )
    return {k: cell for k, (_, cell) in found.items()}


def _key(op: Any) -> str:
    assert isinstance(op, GetOp)
    return op.key


def _joined(mem: Memory, *loaded: Memory) -> Memory:
    """``mem`` holding every key ``loaded`` holds (loads run side by side)."""
    for other in loaded:
        if other.sealer is not mem.sealer and other.sealer.enabled:
            base = mem.sealer if mem.sealer.enabled else other.sealer
            mem = replace(mem, sealer=base.with_keys(other.sealer.keys))
    return mem


def _item(mem: Memory, namespace: Path, row: rows.Row, values: dict[tuple[Path, str], rows.ValueCell]) -> Item:
    cell = row.value if isinstance(row.value, rows.ValueCell) else values[(namespace, row.key)]
    where = f"{mem.index.describe(namespace)}, namespace {show(namespace)}, key {show(row.key)}"
    cell = sealing.open_value(mem, namespace, row.key, cell, mem.index.describe(namespace))
    return rows.to_item(namespace, row, rows.unpack_value(mem.serde, cell, where))


def item_vectors(mem: Memory, namespace: Path, row: rows.Row) -> rows.VectorsCell | None:
    """A row's vectors, opened (None: none, or kept in an object)."""
    if not isinstance(row.vectors, rows.VectorsCell):
        return None
    return sealing.open_vectors(mem, namespace, row.key, row.vectors, mem.index.describe(namespace))


def _candidates(
    mem: Memory,
    nodes: dict[Path, dict[str, rows.Row]],
    values: dict[tuple[Path, str], rows.ValueCell],
    spaces: list[Path],
    now: int,
) -> Iterator[tuple[Item, list[list[float]]]]:
    """A search's candidates in InMemoryStore's order: namespaces by registration (their
    first put), items by ``seq`` (their first put), expired ones left out."""
    for namespace in spaces:
        for row in sorted((r for r in nodes[namespace].values() if r.live(now)), key=lambda r: r.seq):
            cell = item_vectors(mem, namespace, row)
            found = cell.vectors() if cell is not None else []
            yield _item(mem, namespace, row, values), found
