"""A search's answer from its candidates: filter, order, scores and paging, step for step
as ``InMemoryStore`` (``_filter_items``, ``_batch_search``, ``_cosine_similarity``).

The caller gives the candidates in the store's order: namespaces in the order they
were first put to (the registry's), items in the order they were first put (kept by
an overwrite, lost by a delete: a put after it is a new item), expired items left out.
That is InMemoryStore's dict order, so without a query the answer is
``matching[offset:offset + limit]``.

With a query (and an index): every vector of every matching item, in candidate order,
scored by cosine similarity with the query's vector (the same expression as
InMemoryStore: numpy's when numpy is importable, else the same pure-Python code, so
the same vectors give bit-equal scores); a stable sort by score, highest first; each
item kept once, at its best score (max pooling); ``offset`` items skipped, ``limit``
kept; then, when fewer than ``limit`` were kept, items without any vector are added
with ``score=None``, from the start of their list (InMemoryStore ignores ``offset``
there, and so does this).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from importlib import util
from typing import Any

from langgraph.store.base import Item, SearchItem, SearchOp

from s3_saver._ops.memory.filters import matches

Candidate = tuple[Item, Sequence[Sequence[float]]]
"""An item that passed the namespace prefix, and its vectors (empty when it has none)."""


@functools.lru_cache(maxsize=1)
def numpy_available() -> bool:
    """Whether numpy is importable: InMemoryStore's test (``util.find_spec``), so both pick
    the same branch of ``cosine_similarity`` in one process."""
    return bool(util.find_spec("numpy"))


def cosine_similarity(x: Sequence[float], ys: Sequence[Sequence[float]]) -> list[float]:
    """InMemoryStore's ``_cosine_similarity``, both branches as written there: the same
    inputs give the same bits. A zero-norm vector scores 0.0."""
    if not ys:
        return []
    if numpy_available():
        import numpy as np

        x_arr = np.array(x) if not isinstance(x, np.ndarray) else x
        y_arr = np.array(ys) if not isinstance(ys, np.ndarray) else ys
        x_norm = np.linalg.norm(x_arr)
        y_norm = np.linalg.norm(y_arr, axis=1)
        mask = y_norm != 0
        similarities = np.zeros_like(y_norm)
        similarities[mask] = np.dot(y_arr[mask], x_arr) / (y_norm[mask] * x_norm)
        return similarities.tolist()

    similarities = []
    for y in ys:
        dot_product = sum(a * b for a, b in zip(x, y, strict=False))
        norm1 = sum(a * a for a in x) ** 0.5
        norm2 = sum(a * a for a in y) ** 0.5
        similarity = dot_product / (norm1 * norm2) if norm1 > 0 and norm2 > 0 else 0.0
        similarities.append(similarity)
    return similarities


def select(op: SearchOp, candidates: Iterable[Candidate], *, ranked: bool) -> list[Candidate]:
    """The candidates that pass ``op.filter``, in order. Unranked (no query, or no index),
    only the first ``offset + limit`` are ever needed: the iteration stops there, so a
    caller may stream candidates and read no further."""
    stop = None if ranked else op.offset + op.limit
    kept: list[Candidate] = []
    if stop == 0:
        return kept
    for candidate in candidates:
        if matches(candidate[0].value, op.filter):
            kept.append(candidate)
            if len(kept) == stop:
                break
    return kept


def answer(op: SearchOp, candidates: Iterable[Candidate], query_vector: Sequence[float] | None) -> list[SearchItem]:
    """The search's result. ``query_vector``: the embedding of ``op.query`` when the store
    has an index and the op a (non-empty) query, else None (the query is then ignored,
    as InMemoryStore ignores it without an index). ``op`` was checked (``prepare``):
    its filter by ``check_filter``, ``limit``/``offset`` non-negative."""
    ranked = bool(op.query) and query_vector is not None
    kept = select(op, candidates, ranked=ranked)
    if not kept:
        return []
    if not ranked:
        return [_search_item(item, None) for item, _ in kept[op.offset : op.offset + op.limit]]
    assert query_vector is not None
    return [_search_item(item, score) for score, item in _ranked(op, kept, query_vector)]


def _ranked(op: SearchOp, kept: list[Candidate], query_vector: Sequence[float]) -> list[tuple[Any, Item]]:
    flat_items: list[Item] = []
    flat_vectors: list[Sequence[float]] = []
    scoreless: list[Item] = []
    for item, vectors in kept:
        for vector in vectors:
            flat_items.append(item)
            flat_vectors.append(vector)
        if not vectors:
            scoreless.append(item)
    scores = cosine_similarity(query_vector, flat_vectors)
    # sorted() is stable: equal scores keep candidate order.
    ordered = sorted(zip(scores, flat_items, strict=False), key=lambda pair: pair[0], reverse=True)
    seen: set[tuple[tuple[str, ...], str]] = set()
    result: list[tuple[Any, Item]] = []
    for score, item in ordered:
        key = (item.namespace, item.key)
        if key in seen:
            continue
        ix = len(seen)
        seen.add(key)
        if ix >= op.offset + op.limit:
            break
        if ix < op.offset:
            continue
        result.append((score, item))
    if scoreless and len(result) < op.limit:
        result.extend((None, item) for item in scoreless[: op.limit - len(result)])
    return result


def _search_item(item: Item, score: Any) -> SearchItem:
    return SearchItem(
        namespace=item.namespace,
        key=item.key,
        value=item.value,
        created_at=item.created_at,
        updated_at=item.updated_at,
        score=float(score) if score is not None else None,
    )
