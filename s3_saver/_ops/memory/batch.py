"""The memory store's batch: one operation for ``S3Store.batch`` and ``abatch``.

``batch(mem, prepared, queries, vectors)`` answers a prepared batch (``prepare``) on
the index (``MemoryIndex``, either mode), with the embedder's answers computed by the
facade before it (the only step that differs between sync and async: the embedder is
the user's code, not an AWS call). As InMemoryStore:

1. the reads first, and they never see the batch's own puts: every GetOp's namespace,
   each searched prefix's own namespace and the registry in one round trip; then the
   namespaces under a searched prefix that the first wave did not read (none for a
   namespace with no sub-namespaces);
2. then one commit of every change: the refreshes the reads found due, and the puts
   and deletes (deduplicated by ``prepare``: the last value of a key, at the place of
   its first op), grouped by namespace;
3. results in op order.

Expired items are never returned (the store's clock, read once per batch for reads).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from langgraph.store.base import (
    GetOp,
    Item,
    ListNamespacesOp,
    Result,
    SearchOp,
    TTLConfig,
)

from s3_saver._format.memory import rows
from s3_saver._format.memory import ttl as ttl_core
from s3_saver._format.memory.names import show
from s3_saver._index.memory import Change, MemoryIndex, Path
from s3_saver._ops.memory import listing, rank
from s3_saver._ops.memory.prepare import Prepared
from s3_saver._transport.protocol import Op


@dataclass(frozen=True)
class Memory:
    """What the batch needs besides the ops: the index, the serializer and the store's settings."""

    index: MemoryIndex
    serde: Any
    clock: ttl_core.Clock
    ttl_config: TTLConfig | None
    slack: float
    dims: int
    dtype: str


def batch(
    mem: Memory,
    prepared: Prepared,
    queries: dict[str, list[float]],
    vectors: list[dict[str, list[float]]] | None,
) -> Op[list[Result]]:
    results: list[Result] = [None] * len(prepared.ops)
    get_groups = prepared.get_groups()
    searches = [prepared.ops[i] for i in prepared.searches]
    prefixes = [op.namespace_prefix for op in searches if isinstance(op, SearchOp)]
    registry_needed = bool(prefixes or prepared.listings)
    nodes: dict[Path, dict[str, rows.Row]] = {}
    registered: dict[Path, int] = {}
    if get_groups or registry_needed:
        # A searched prefix is often a namespace with no sub-namespaces: its rows are read
        # in the first wave, beside the registry, so such a search is one round trip.
        wanted = {ns: [_key(prepared.ops[i]) for i in positions] for ns, positions in get_groups.items()}
        snapshot = yield from mem.index.read([p for p in prefixes if p], wanted, registry_needed)
        nodes = dict(snapshot.nodes)
        registered = snapshot.registry or {}
    # The namespaces under a searched prefix, read whole unless they were (a get reads
    # only its keys in DynamoDB mode).
    whole = {p for p in prefixes if p}
    under = [p for p in registered if p not in whole and any(p[: len(q)] == q for q in prefixes)]
    if under:
        nodes.update((yield from mem.index.read(under, {}, registry=False)).nodes)
    now = mem.clock.now()
    returned: list[tuple[Path, rows.Row, bool]] = []

    for namespace, positions in get_groups.items():
        found = nodes[namespace]
        for position in positions:
            op = prepared.ops[position]
            assert isinstance(op, GetOp)
            row = found.get(op.key)
            if row is not None and row.live(now):
                results[position] = _item(mem, namespace, row)
                returned.append((namespace, row, ttl_core.read_refresh(op.refresh_ttl, mem.ttl_config)))

    order = sorted(registered, key=registered.__getitem__)
    for position in prepared.searches:
        op = prepared.ops[position]
        assert isinstance(op, SearchOp)
        query = queries.get(op.query) if op.query else None
        hits = rank.answer(op, _candidates(mem, nodes, order, op.namespace_prefix, now), query)
        results[position] = hits
        refresh = ttl_core.read_refresh(op.refresh_ttl, mem.ttl_config)
        returned += [(hit.namespace, nodes[hit.namespace][hit.key], refresh) for hit in hits]

    paths = sorted(registered)
    for position in prepared.listings:
        op = prepared.ops[position]
        assert isinstance(op, ListNamespacesOp)
        results[position] = listing.page_namespaces(paths, op)

    # The refreshes first (the batch's puts, applied after them, win over them).
    groups: dict[Path, list[Change]] = {}
    for namespace, moves in ttl_core.plan_refreshes(returned, prepared.written(), now, mem.slack).items():
        groups[namespace] = [Change(m.key, refresh=m) for m in moves]
    for namespace, numbers in prepared.groups.items():
        changes = groups.setdefault(namespace, [])
        for number in numbers:
            put = prepared.puts[number]
            packed = None
            if put.value is not None and vectors is not None:
                packed = rows.pack_vectors(vectors[number], mem.dims, mem.dtype)
            changes.append(Change(put.key, put.value, packed, put.ttl_minutes))
    yield from mem.index.commit(groups)
    return results


def _key(op: Any) -> str:
    assert isinstance(op, GetOp)
    return op.key


def _item(mem: Memory, namespace: Path, row: rows.Row) -> Item:
    assert isinstance(row.value, rows.ValueCell)  # values in their own objects: not built yet
    where = f"{mem.index.describe(namespace)}, namespace {show(namespace)}, key {show(row.key)}"
    return rows.to_item(namespace, row, rows.unpack_value(mem.serde, row.value, where))


def _candidates(
    mem: Memory, nodes: dict[Path, dict[str, rows.Row]], order: list[Path], prefix: Path, now: int
) -> Iterator[tuple[Item, list[list[float]]]]:
    """A search's candidates in InMemoryStore's order: namespaces by registration (their
    first put), items by ``seq`` (their first put), expired ones left out."""
    for namespace in order:
        if namespace[: len(prefix)] != prefix:
            continue
        for row in sorted((r for r in nodes[namespace].values() if r.live(now)), key=lambda r: r.seq):
            found = row.vectors.vectors() if isinstance(row.vectors, rows.VectorsCell) else []
            yield _item(mem, namespace, row), found
