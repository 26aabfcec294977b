"""Which texts an item is embedded by, and the vectors the embedder gives back, checked.

The texts are InMemoryStore's (``_extract_texts``), with LangGraph's own
``tokenize_path`` / ``get_text_at_path``:
- ``index=None`` takes the store's ``IndexConfig["fields"]`` (default ``["$"]``: the whole
  value as sorted JSON); a list takes those paths; ``False`` none. Without an index
  configured, ``index`` is ignored.
- A path giving one text stores its vector under the path; several texts (``"a[*].b"``)
  under ``"path.0"``, ``"path.1"``...
- Texts are deduplicated across the batch: each distinct text is embedded once, in one
  ``embed_documents`` call, and its vector goes to every place that holds it.
- An item's vectors are kept in the order InMemoryStore inserts them (texts in
  first-seen order, places in order): the order they are scored in.

Deliberate differences: InMemoryStore pairs one vector per distinct text with every
place, and so raises "Number of embeddings ... does not match" whenever two places of a
batch hold the same text (two fields of one item, or two items); the store gives each
place its text's vector. A vector that is not ``dims`` numbers, or not finite, or a
count that does not match, raises EmbeddingError before anything is stored
(InMemoryStore stores whatever it gets). An overwrite replaces the item's vectors
(``index=False`` leaves it none); InMemoryStore keeps the vectors of paths the new value
no longer indexes, ranking the item by text it no longer holds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langgraph.store.base import get_text_at_path, tokenize_path

from s3_saver._format.memory.names import show
from s3_saver.errors import ConfigurationError, EmbeddingError

Fields = list[tuple[str, Any]]
"""Paths with their tokens, as InMemoryStore keeps them (``"$"`` kept as is)."""


def tokenized_fields(index_config: Mapping[str, Any]) -> Fields:
    """The configured fields, tokenized once (InMemoryStore's ``__tokenized_fields``)."""
    return [(p, tokenize_path(p)) if p != "$" else (p, p) for p in (index_config.get("fields") or ["$"])]


def check_dims(index_config: Mapping[str, Any]) -> int:
    dims = index_config.get("dims")
    if isinstance(dims, bool) or not isinstance(dims, int) or dims <= 0:
        raise ConfigurationError(f"index: 'dims' must be a positive int, got {show(dims)}")
    return dims


def check_index_arg(index: Any, *, namespace: tuple[str, ...], key: str) -> None:
    """A put's ``index``: None, False, or a list of path strings."""
    if index is None or index is False:
        return
    if isinstance(index, (list, tuple)) and all(isinstance(p, str) for p in index):
        return
    raise ConfigurationError(
        f"put of key {show(key)} in namespace {show(namespace)}: index must be None, False or a list of field"
        f" paths, got {show(index)}"
    )


@dataclass
class TextPlan:
    """The distinct texts of a batch's puts and where each one's vector goes.

    ``texts[i]`` is embedded once; its vector goes to every ``(put, path)`` of ``places[i]``
    (``put`` numbers the batch's deduplicated puts)."""

    texts: list[str] = field(default_factory=list)
    places: list[list[tuple[int, str]]] = field(default_factory=list)


def plan_texts(puts: Sequence[tuple[Mapping[str, Any] | None, Any]], fields: Fields) -> TextPlan:
    """The texts of ``puts`` (``(value, index)`` in batch order; value None for a delete)
    under the store's ``fields``."""
    where: dict[str, list[tuple[int, str]]] = {}
    for number, (value, index) in enumerate(puts):
        if value is None or index is False:
            continue
        paths = fields if index is None else [(ix, tokenize_path(ix)) for ix in index]
        for path, tokens in paths:
            texts = get_text_at_path(value, tokens)
            if not texts:
                continue
            if len(texts) > 1:
                for i, text in enumerate(texts):
                    where.setdefault(text, []).append((number, f"{path}.{i}"))
            else:
                where.setdefault(texts[0], []).append((number, path))
    return TextPlan(list(where), list(where.values()))


def check_vector(
    vector: Any, dims: int, *, namespace: tuple[str, ...] | None = None, key: str | None = None, what: str = ""
) -> list[float]:
    """One vector: ``dims`` finite numbers, returned as given (a list); else EmbeddingError
    naming the item (``namespace``, ``key``) or ``what`` (a query)."""
    if not what:
        what = f"key {show(key)} in namespace {show(namespace)}"
    try:
        values = list(vector)
    except TypeError:
        raise EmbeddingError(
            f"{what}: the embedder returned {type(vector).__name__}, not a vector", namespace, key
        ) from None
    if len(values) != dims:
        raise EmbeddingError(
            f"{what}: the embedder returned a vector of {len(values)} numbers; the index has dims={dims}", namespace, key
        )
    for x in values:
        if isinstance(x, bool) or (not isinstance(x, (int, float)) and not hasattr(x, "__float__")):
            raise EmbeddingError(f"{what}: the vector holds {show(x)}, not a number", namespace, key)
        if not math.isfinite(float(x)):
            raise EmbeddingError(f"{what}: the vector holds {float(x)}, not a finite number", namespace, key)
    return values


def vectors_for_puts(
    plan: TextPlan,
    embeddings: Sequence[Any],
    dims: int,
    puts: Sequence[tuple[tuple[str, ...], str]],
) -> list[dict[str, list[float]]]:
    """Each put's vectors (path -> vector, in scoring order) from the embedder's answer to
    ``plan.texts`` (one vector per text). ``puts`` names each put's (namespace, key) for
    messages. EmbeddingError for a wrong count, length or value."""
    if len(embeddings) != len(plan.texts):
        raise EmbeddingError(
            f"the embedder returned {len(embeddings)} vectors for {len(plan.texts)} texts; nothing was stored"
        )
    result: list[dict[str, list[float]]] = [{} for _ in puts]
    for vector, places in zip(embeddings, plan.places, strict=True):
        namespace, key = puts[places[0][0]]
        checked = check_vector(vector, dims, namespace=namespace, key=key)
        for number, path in places:
            result[number][path] = checked
    return result
