"""A batch, checked and shaped before any request: every op validated (so a bad op stores
nothing of its batch), values serialized, puts deduplicated, texts and queries to embed.

The shape is InMemoryStore's (``_prepare_ops``): every read of a batch sees the store as
it was before the batch (reads never see the batch's own puts); puts are deduplicated
by ``(namespace, key)``, the last op's value at the place of the first occurrence
(``put_ops[(ns, key)] = op``); the puts are applied after the reads.

Namespace order: a namespace's place among the others is where it first received an
item. Within a batch, the namespaces that receive one are registered in the order of
their first deduplicated put (a delete included: InMemoryStore's dict for the namespace
is created by the first op that touches it), ``Prepared.groups``'s order.

Per-namespace work, what a storage backend sends: the puts and deletes of one namespace
are one commit (``Prepared.groups``: manifest mode, one head swap), the gets of one
namespace one read (``Prepared.get_groups``); each search and listing is its own read; the
refreshes the reads call for are planned after them (``ttl.plan_refreshes``), one write
per namespace, and go before the puts (which win over them).

Checks (see ``names``, ``filters``, ``listing``, ``ttl``): labels of every op (ops handed
straight to ``batch`` included), an empty namespace where an item is put, keys, limits,
filters, ``limit``/``offset``, match conditions, ``index`` arguments, ttls, and values (a
mapping the serializer accepts). A delete in the namespace ``()`` holds nothing to
delete: it is checked and dropped, as InMemoryStore's is a no-op.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langgraph.store.base import GetOp, ListNamespacesOp, Op, PutOp, SearchOp, TTLConfig

from s3_saver._format.memory.names import (
    check_item_namespace,
    check_key,
    check_labels,
    registry_key,
    show,
)
from s3_saver._format.memory.rows import COMPRESS_MIN, ValueCell, pack_value
from s3_saver._format.memory.ttl import put_ttl
from s3_saver._ops.memory.embedding import (
    Fields,
    TextPlan,
    check_index_arg,
    check_vector,
    plan_texts,
)
from s3_saver._ops.memory.filters import check_filter
from s3_saver._ops.memory.listing import check_count, check_list_op
from s3_saver.errors import ConfigurationError, EmbeddingError


@dataclass(frozen=True, slots=True)
class PutPlan:
    """One deduplicated put (``value`` None: a delete)."""

    namespace: tuple[str, ...]
    key: str
    value: ValueCell | None
    ttl_minutes: float | None
    position: int
    """The batch position of the op whose value won (the last one of its key)."""


@dataclass
class Prepared:
    ops: list[Op]
    """The ops as checked: a SearchOp's filter a dict or None, a ListNamespacesOp's match
    paths tuples; results go at these positions."""
    gets: list[int] = field(default_factory=list)
    """Positions of GetOps to answer (a get in ``()`` is not among them: its answer is None)."""
    searches: list[int] = field(default_factory=list)
    listings: list[int] = field(default_factory=list)
    puts: list[PutPlan] = field(default_factory=list)
    groups: dict[tuple[str, ...], list[int]] = field(default_factory=dict)
    """Namespace -> its puts (indexes into ``puts``), namespaces in registration order."""
    texts: TextPlan = field(default_factory=TextPlan)
    """What to embed for the puts (empty without an index)."""
    queries: list[str] = field(default_factory=list)
    """The distinct non-empty queries of the searches, to embed (empty without an index)."""

    def get_groups(self) -> dict[tuple[str, ...], list[int]]:
        """Namespace -> positions of its GetOps, namespaces in op order: one read of a
        namespace answers all its gets (manifest mode: one head GET; DynamoDB mode: one
        BatchGetItem), whatever their number."""
        groups: dict[tuple[str, ...], list[int]] = {}
        for position in self.gets:
            op = self.ops[position]
            assert isinstance(op, GetOp)
            groups.setdefault(op.namespace, []).append(position)
        return groups

    def written(self) -> set[tuple[tuple[str, ...], str]]:
        """The (namespace, key) pairs this batch puts or deletes."""
        return {(p.namespace, p.key) for p in self.puts}

    def registering(self) -> list[tuple[str, ...]]:
        """Namespaces that receive an item in this batch, in registration order."""
        return [ns for ns, numbers in self.groups.items() if any(self.puts[i].value is not None for i in numbers)]


def prepare(
    ops: Iterable[Op],
    *,
    serde: Any,
    fields: Fields | None = None,
    ttl_config: TTLConfig | None = None,
    compress_min: int | None = COMPRESS_MIN,
) -> Prepared:
    """Check and shape a batch. ``fields``: the store's tokenized index fields, None
    without an index (then ``index`` arguments and queries are ignored, as InMemoryStore
    ignores them). Raises the first problem found, in op order, before anything is sent."""
    ops = list(ops)
    prepared = Prepared(ops=list(ops))
    chosen: dict[tuple[tuple[str, ...], str], tuple[int, PutOp]] = {}
    queries: dict[str, None] = {}
    for position, op in enumerate(ops):
        if isinstance(op, GetOp):
            namespace = check_labels(op.namespace)
            registry_key(namespace)
            check_key(namespace, op.key)
            if namespace:
                prepared.gets.append(position)
        elif isinstance(op, SearchOp):
            prepared.ops[position] = checked = _check_search(op)
            prepared.searches.append(position)
            if fields is not None and checked.query:
                queries[checked.query] = None
        elif isinstance(op, ListNamespacesOp):
            prepared.ops[position] = check_list_op(op)
            prepared.listings.append(position)
        elif isinstance(op, PutOp):
            namespace = check_labels(op.namespace)
            if op.value is None and not namespace:
                check_key(namespace, op.key)
                continue
            namespace = check_item_namespace(namespace)
            check_key(namespace, op.key)
            if op.value is not None and not isinstance(op.value, Mapping):
                raise ConfigurationError(
                    f"put of key {show(op.key)} in namespace {show(namespace)}: a value is a dict (or None to"
                    f" delete), got {type(op.value).__name__}"
                )
            check_index_arg(op.index, namespace=namespace, key=op.key)
            # A dict keeps the place of the first insertion: the first occurrence keeps its
            # place, the last op's value wins.
            chosen[(namespace, op.key)] = (position, op)
        else:
            raise ConfigurationError(f"batch: unknown operation type {type(op).__name__}: {show(op)}")
    puts: list[tuple[Mapping[str, Any] | None, Any]] = []
    for (namespace, key), (position, op) in chosen.items():
        value = None if op.value is None else dict(op.value)
        ttl = put_ttl(op.ttl, ttl_config, namespace=namespace, key=key)
        cell = None if value is None else pack_value(serde, value, namespace=namespace, key=key, compress_min=compress_min)
        prepared.groups.setdefault(namespace, []).append(len(prepared.puts))
        prepared.puts.append(PutPlan(namespace, key, cell, ttl if value is not None else None, position))
        puts.append((value, op.index))
    if fields is not None:
        prepared.texts = plan_texts(puts, fields)
        prepared.queries = list(queries)
    return prepared


def _check_search(op: SearchOp) -> SearchOp:
    prefix = check_labels(op.namespace_prefix, what="namespace prefix")
    registry_key(prefix)
    where = f"search of {show(prefix)}"
    if op.query is not None and not isinstance(op.query, str):
        raise ConfigurationError(f"{where}: query must be a string or None, got {type(op.query).__name__}")
    return SearchOp(
        namespace_prefix=prefix,
        filter=check_filter(op.filter, prefix),
        limit=check_count(op.limit, "limit", where),
        offset=check_count(op.offset, "offset", where),
        query=op.query,
        refresh_ttl=op.refresh_ttl,
    )


def query_vectors(queries: Sequence[str], answers: Sequence[Any], dims: int) -> dict[str, list[float]]:
    """Each query's vector from the embedder's answers (one per query, in order), checked."""
    if len(answers) != len(queries):
        raise EmbeddingError(f"the embedder returned {len(answers)} vectors for {len(queries)} queries")
    return {
        query: check_vector(vector, dims, what=f"query {show(query)}")
        for query, vector in zip(queries, answers, strict=True)
    }
