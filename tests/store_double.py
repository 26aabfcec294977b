"""A dict-backed BaseStore built from the store's pure core (``s3_saver._format.memory`` and ``s3_saver._ops.memory``): a test
double for the differential harness (``store_reference``), not product code.

It keeps what the storage keeps, in dicts: a registry (namespace -> registration
number, never removed: there is no sweep here), and per namespace its rows, encoded
with the row codec (values through the serializer, vectors packed), each with its
``seq``. Every decision is the core's: checks and batch shape (``prepare``), texts and
vectors (``embedding``), rows (``rows``), expiry and refresh (``ttl``), filters, order and
scores (``rank``), namespace pages (``listing``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    Op,
    Result,
    SearchOp,
    TTLConfig,
    ensure_embeddings,
)

from s3_saver._format.memory import rows
from s3_saver._ops.memory import embedding, listing, rank
from s3_saver._format.memory import ttl as ttl_core
from s3_saver._ops.memory.prepare import Prepared, prepare, query_vectors


class DictStore(BaseStore):
    supports_ttl = True

    def __init__(
        self,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        serde: Any = None,
        clock: ttl_core.Clock | None = None,
        refresh_slack: float = ttl_core.DEFAULT_REFRESH_SLACK,
        vector_dtype: str = "float64",
    ) -> None:
        self.ttl_config = ttl_core.check_ttl_config(ttl)
        self.serde = serde or JsonPlusSerializer()
        self.clock = clock or ttl_core.PROCESS_CLOCK
        self.slack = ttl_core.check_slack(refresh_slack)
        self.dtype = vector_dtype
        self.embeddings = None
        self.fields: embedding.Fields | None = None
        self.dims = 0
        # As InMemoryStore and PostgresStore: LangGraph's tests read index_config["dims"/"embed"].
        self.index_config = dict(index) if index else None
        if index:
            self.dims = embedding.check_dims(index)
            self.embeddings = ensure_embeddings(index.get("embed"))
            self.fields = embedding.tokenized_fields(index)
        self._registry: dict[tuple[str, ...], int] = {}
        self._rows: dict[tuple[str, ...], dict[str, bytes]] = {}
        self._next_seq: dict[tuple[str, ...], int] = {}

    # -- BaseStore -------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        prepared = self._prepare(ops)
        queries = {}
        if prepared.queries:
            answers = [self.embeddings.embed_query(q) for q in prepared.queries]
            queries = query_vectors(prepared.queries, answers, self.dims)
        vectors = None
        if prepared.texts.texts:
            vectors = self._vectors(prepared, self.embeddings.embed_documents(prepared.texts.texts))
        return self._run(prepared, queries, vectors)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        prepared = self._prepare(ops)
        queries = {}
        if prepared.queries:
            answers = [await self.embeddings.aembed_query(q) for q in prepared.queries]
            queries = query_vectors(prepared.queries, answers, self.dims)
        vectors = None
        if prepared.texts.texts:
            vectors = self._vectors(prepared, await self.embeddings.aembed_documents(prepared.texts.texts))
        return self._run(prepared, queries, vectors)

    # -- the double's storage ----------------------------------------------------------

    def _prepare(self, ops: Iterable[Op]) -> Prepared:
        return prepare(ops, serde=self.serde, fields=self.fields, ttl_config=self.ttl_config)

    def _vectors(self, prepared: Prepared, answers: list[Any]) -> list[dict[str, list[float]]]:
        return embedding.vectors_for_puts(
            prepared.texts, answers, self.dims, [(p.namespace, p.key) for p in prepared.puts]
        )

    def _row(self, namespace: tuple[str, ...], key: str) -> rows.Row | None:
        data = self._rows.get(namespace, {}).get(key)
        return None if data is None else rows.loads_row(data, f"double {namespace!r}")

    def _item(self, namespace: tuple[str, ...], row: rows.Row) -> Item:
        assert isinstance(row.value, rows.ValueCell)
        value = rows.unpack_value(self.serde, row.value, f"double {namespace!r}, key {row.key!r}")
        return rows.to_item(namespace, row, value)

    def _candidates(self, prefix: tuple[str, ...], now: int) -> Iterator[tuple[Item, list[list[float]]]]:
        # Namespaces in registration order, rows in seq order (first-put order), expired left out.
        for namespace in sorted(self._registry, key=self._registry.__getitem__):
            if namespace[: len(prefix)] != prefix:
                continue
            found = [self._row(namespace, key) for key in self._rows.get(namespace, {})]
            for row in sorted((r for r in found if r is not None and r.live(now)), key=lambda r: r.seq):
                vectors = row.vectors.vectors() if isinstance(row.vectors, rows.VectorsCell) else []
                yield self._item(namespace, row), vectors

    def _run(
        self,
        prepared: Prepared,
        queries: dict[str, list[float]],
        vectors: list[dict[str, list[float]]] | None,
    ) -> list[Result]:
        results: list[Result] = [None] * len(prepared.ops)
        returned: list[tuple[tuple[str, ...], rows.Row, bool]] = []
        now = self.clock.now()
        for namespace, positions in prepared.get_groups().items():
            for position in positions:
                op = prepared.ops[position]
                assert isinstance(op, GetOp)
                row = self._row(namespace, op.key)
                if row is not None and row.live(now):
                    results[position] = self._item(namespace, row)
                    returned.append((namespace, row, ttl_core.read_refresh(op.refresh_ttl, self.ttl_config)))
        for position in prepared.searches:
            op = prepared.ops[position]
            assert isinstance(op, SearchOp)
            query = queries.get(op.query) if op.query else None
            found = rank.answer(op, self._candidates(op.namespace_prefix, now), query)
            results[position] = found
            refresh = ttl_core.read_refresh(op.refresh_ttl, self.ttl_config)
            for item in found:
                row = self._row(item.namespace, item.key)
                assert row is not None
                returned.append((item.namespace, row, refresh))
        for position in prepared.listings:
            op = prepared.ops[position]
            assert isinstance(op, ListNamespacesOp)
            results[position] = listing.page_namespaces(sorted(self._registry), op)
        # Refreshes first (the batch's puts, applied after, win over them).
        moves = ttl_core.plan_refreshes(returned, prepared.written(), now, self.slack)
        for namespace, refreshes in moves.items():
            for move in refreshes:
                row = self._row(namespace, move.key)
                # The fence a storage write carries: the expiry is still the one read.
                assert row is not None and row.expires_us == move.seen_us
                self._rows[namespace][move.key] = rows.dumps_row(row.with_expiry(move.expires_us))
        for namespace, numbers in prepared.groups.items():
            for number in numbers:
                put = prepared.puts[number]
                now = self.clock.now()
                if put.value is None:
                    self._rows.get(namespace, {}).pop(put.key, None)
                    continue
                if namespace not in self._registry:
                    self._registry[namespace] = len(self._registry)
                old = self._row(namespace, put.key)
                kept = old if old is not None and old.live(now) else None
                seq = self._next_seq.get(namespace, 0)
                if kept is None:
                    self._next_seq[namespace] = seq + 1
                packed = rows.pack_vectors(vectors[number], self.dims, self.dtype) if vectors is not None else None
                row = rows.put_row(
                    put.key,
                    kept=kept,
                    now=now,
                    seq=seq,
                    value=put.value,
                    vectors=packed,
                    ttl_minutes=put.ttl_minutes,
                    expires_us=ttl_core.expires_at(now, put.ttl_minutes),
                )
                self._rows.setdefault(namespace, {})[put.key] = rows.dumps_row(row)
        return results

