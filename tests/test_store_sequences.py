"""S3Store from outside, as a production user meets it: one call after another, two
processes (two stores) on one prefix, a store beside a saver, a cut or a retried request
between two calls; each case in both index modes on moto, equal to InMemoryStore where
LangGraph defines the answer, or a named error with nothing stored."""

from __future__ import annotations

import random

import pytest
from conftest import TABLE
from langchain_core.embeddings import Embeddings
from test_store_s3 import _stored, bucket, make_store  # noqa: F401  (bucket: a fixture)

from s3_saver.errors import ConfigurationError, EmbeddingError


def test_a_ttl_past_what_a_timestamp_holds_is_refused_and_stores_nothing(bucket: tuple[str, str]) -> None:
    """A ttl whose expiry no index can hold (the bucket's documents keep 64-bit microsecond
    counts; DynamoDB numbers and Python's datetime stop earlier) is a ConfigurationError
    naming namespace and key, raised before anything is sent: the namespace is not even
    registered. The longest ttl accepted is stored and read back."""
    ns = ("users", "ann")
    with make_store(*bucket, ttl={"default_ttl": 5}) as store:
        for ttl in (1e12, 1e300):
            with pytest.raises(ConfigurationError, match=r"put of key 'k' in namespace \('users', 'ann'\): ttl must be"):
                store.put(ns, "k", {"v": 1}, ttl=ttl)
        assert _stored(bucket) == [] and store.list_namespaces() == []
        store.put(ns, "k", {"v": 1}, ttl=1e9)
        assert store.get(ns, "k").value == {"v": 1} and store.list_namespaces() == [ns]
    with pytest.raises(ConfigurationError, match=r"ttl\['default_ttl'\] must be"):
        make_store(*bucket, ttl={"default_ttl": 1e12})


class _WideEmbeddings(Embeddings):
    """Vectors of any size (a production embedder's 3,072 dims), drawn from the text."""

    def __init__(self, dims: int) -> None:
        self.dims = dims

    def _one(self, text: str) -> list[float]:
        draw = random.Random(text)
        return [draw.uniform(-1, 1) for _ in range(self.dims)]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._one(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._one(text)


def test_an_item_whose_vectors_outgrow_its_index_is_refused_before_any_request(bucket: tuple[str, str]) -> None:
    """An item indexed on a list (``notes[*]``: a vector per element) carries as many
    vectors as its list has elements. In the bucket alone they are stored and scored; a
    DynamoDB item holds 400 KB, so there an item whose vectors do not fit is an
    EmbeddingError naming the table, the namespace and the key, raised before anything
    is sent (it was DynamoDB's ValidationException, after the namespace was registered),
    for a put and for an import alike. Items that fit are stored in both modes."""
    index = {"dims": 3072, "embed": _WideEmbeddings(3072), "fields": ["notes[*]"]}
    many = {"notes": [f"note {i}" for i in range(20)]}  # 20 x 3,072 float64: 480 KiB
    few = {"notes": ["note 0", "note 1"]}
    ns = ("users", "ann")
    with make_store(*bucket, index=index) as store:
        if bucket[1] == "dynamodb":
            store.stats.reset()
            with pytest.raises(EmbeddingError) as raised:
                store.put(ns, "many", many)
            message = str(raised.value)
            assert TABLE in message and "namespace ('users', 'ann'), key 'many'" in message, message
            assert store.stats.total_requests == 0 and _stored(bucket) == [] and store.list_namespaces() == []
        else:
            store.put(ns, "many", many)
            assert [h.key for h in store.search(ns, query="note 3")] == ["many"]
        store.put(ns, "few", few)
        assert store.search(ns, query="note 1")[0].score == pytest.approx(1.0)
        if bucket[1] == "dynamodb":
            # An export of the bucket alone's item, imported here: refused whole, nothing written.
            with make_store(bucket[0], "manifest", prefix="wide/", index=index) as wide:
                wide.put(ns, "many", many)
                data = wide.export_memory()
            before = _stored(bucket)
            store.stats.reset()
            with pytest.raises(EmbeddingError, match="key 'many'"):
                store.import_memory(data)
            assert store.stats.total_requests == 0 and _stored(bucket) == before
