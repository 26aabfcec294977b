"""A deterministic embedder for the example: no model, no network, no API key.

Each word of a text adds one to a dimension chosen by a hash of the word (SHA-256: the same
in every process, unlike ``hash()``), so texts that share words point the same way and score
high under cosine similarity. ``langgraph.json`` names it as ``./embeddings.py:embed``; any
``Embeddings`` (``openai:text-embedding-3-small``...) takes its place there, with its ``dims``.
"""

from __future__ import annotations

import hashlib
import re

DIMS = 64


def embed(texts: list[str]) -> list[list[float]]:
    """One vector of ``DIMS`` numbers per text (LangGraph wraps this function as ``Embeddings``)."""
    return [_vector(text) for text in texts]


def _vector(text: str) -> list[float]:
    vector = [0.0] * DIMS
    for word in re.findall(r"\w+", text.lower()):
        vector[int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "big") % DIMS] += 1.0
    if not any(vector):
        vector[0] = 1.0  # a text without words: a direction all the same, never a zero vector
    return vector
