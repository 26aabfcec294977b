"""The store's semantics against LangGraph's ``InMemoryStore``, through the differential
harness (``store_reference``): random sequences of calls, and the cases of LangGraph's own
store tests (InMemoryStore's and PostgresStore's) written as call sequences, each run on
both stores with every answer compared.

The candidate here is the dict double of the pure core (``store_double.DictStore``):
what these tests hold is the core's decisions (checks, order, filters, scores, pages,
TTL). ``tests/test_store_s3.py`` runs the same harness and cases on ``S3Store`` on a
bucket (the manifest index mode; the DynamoDB mode joins as another candidate factory).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.store.base import (
    NOT_PROVIDED,
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    PutOp,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore
from store_double import DictStore
from store_reference import (
    FakeTime,
    HashEmbeddings,
    ReferenceStore,
    run_steps,
    run_steps_async,
    steps,
)

from s3_saver._format.memory import ttl

# -- random sequences ----------------------------------------------------------------------

EMBEDDER = HashEmbeddings(4)
INDEX = {"dims": 4, "embed": EMBEDDER, "fields": ["text", "meta.tag", "tags[*]"]}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps())
def test_the_core_agrees_with_inmemory(calls: list[Any]) -> None:
    run_steps(calls, ReferenceStore(), DictStore())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps())
def test_the_core_agrees_with_inmemory_with_an_index(calls: list[Any]) -> None:
    run_steps(calls, ReferenceStore(index=INDEX), DictStore(index=INDEX))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps())
def test_the_core_agrees_with_inmemory_async(calls: list[Any]) -> None:
    run_steps_async(calls, ReferenceStore(index=INDEX), DictStore(index=INDEX))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps(ttl=True), st.booleans())
def test_the_core_agrees_with_the_ttl_model(calls: list[Any], refresh_on_read: bool) -> None:
    time = FakeTime()
    config = {"default_ttl": 1, "refresh_on_read": refresh_on_read}
    reference = ReferenceStore(index=INDEX, ttl=config, time=time)
    candidate = DictStore(index=INDEX, ttl=config, clock=ttl.Clock(time), refresh_slack=0)
    run_steps(calls, reference, candidate, time=time)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps(ttl=True, max_size=60), st.booleans(), st.booleans())
def test_the_core_agrees_with_inmemory_at_length(calls: list[Any], with_index: bool, asynchronous: bool) -> None:
    time = FakeTime()
    index = INDEX if with_index else None
    config = {"default_ttl": 2, "refresh_on_read": True}
    reference = ReferenceStore(index=index, ttl=config, time=time)
    candidate = DictStore(index=index, ttl=config, clock=ttl.Clock(time), refresh_slack=0)
    (run_steps_async if asynchronous else run_steps)(calls, reference, candidate, time=time)


def test_each_normalization_is_needed_and_documented() -> None:
    """The reference's (a)-(g) against bare InMemoryStore, on one call each: each is a
    real difference (else it would hide nothing), and the reference gives the store's answer."""
    bare, ref, ours = InMemoryStore(index=INDEX), ReferenceStore(index=INDEX), DictStore(index=INDEX)
    for store in (bare, ref, ours):
        store.get(("ghost",), "k")  # (a)
        store.put(("n",), "k", {"text": "apple", "tags": ["pear"]})
        store.put(("n",), "k", {"text": "pear"}, index=["text"])  # (c): tags[*] no longer indexed
        store.put(("n",), "k2", {"n": "old"})
    assert ("ghost",) in bare.list_namespaces() and ("ghost",) not in ref.list_namespaces()
    assert ours.list_namespaces() == ref.list_namespaces() == [("n",)]
    assert set(bare._vectors[("n",)]["k"]) == {"text", "tags[*]"} and set(ref._vectors[("n",)]["k"]) == {"text"}
    with pytest.raises((TypeError, ValueError)):
        bare.search(("n",), filter={"n": {"$gt": 1}})  # (d)
    assert ref.search(("n",), filter={"n": {"$gt": 1}}) == ours.search(("n",), filter={"n": {"$gt": 1}}) == []
    with pytest.raises(ValueError):
        bare.put(("n",), "k3", {"text": "x", "tags": ["x"]})  # (e)
    ref.put(("n",), "k3", {"text": "x", "tags": ["x"]})
    ours.put(("n",), "k3", {"text": "x", "tags": ["x"]})
    assert [(i.key, i.score) for i in ref.search(("n",), query="x")] == [(i.key, i.score) for i in ours.search(("n",), query="x")]
    # (b): InMemoryStore resets created_at; the store keeps it.
    first = ours.get(("n",), "k")
    ours.put(("n",), "k", {"text": "again"})
    assert ours.get(("n",), "k").created_at == first.created_at < ours.get(("n",), "k").updated_at
    # (f): InMemoryStore has no TTL at all.
    with pytest.raises(NotImplementedError):
        bare.put(("n",), "t", {"a": 1}, ttl=1)
    # (g): InMemoryStore's batch stores under a label its put refuses.
    bare.batch([PutOp(("a.b",), "k", {"a": 1})])
    assert ("a.b",) in bare.list_namespaces()
    for store in (ref, ours):
        with pytest.raises(InvalidNamespaceError):
            store.batch([PutOp(("a.b",), "k", {"a": 1})])


def test_the_harness_fails_a_store_that_differs() -> None:
    """A harness that cannot fail proves nothing: stores with one wrong decision each."""

    class ResetsCreated(DictStore):
        def _run(self, prepared: Any, queries: Any, vectors: Any) -> Any:
            for put in prepared.puts:  # forget the old row: every put "creates"
                self._rows.get(put.namespace, {}).pop(put.key, None)
            return super()._run(prepared, queries, vectors)

    class ListsGets(DictStore):
        def batch(self, ops: Any) -> Any:
            ops = list(ops)
            for op in ops:
                if isinstance(op, GetOp):
                    self._registry.setdefault(op.namespace, len(self._registry))
            return super().batch(ops)

    put = ("put", ("a",), "k", {"n": 1}, None, NOT_PROVIDED)
    cases = [
        (ResetsCreated(), [put, ("put", ("a",), "k2", {"n": 1}, None, NOT_PROVIDED), put, ("search", ("a",), None, 5, 0, None, None)], None),
        (ListsGets(), [put, ("get", ("b",), "k", None), ("list", None, None, None, 5, 0)], None),
    ]
    for candidate, calls, time in cases:
        with pytest.raises(AssertionError):
            run_steps(calls, ReferenceStore(), candidate, time=time)
    time = FakeTime()
    config = {"default_ttl": 1}
    calls = [put, ("advance", 40_000_000), ("get", ("a",), "k", True), ("advance", 40_000_000), ("get", ("a",), "k", True)]
    run_steps(calls, ReferenceStore(ttl=config, time=time), DictStore(ttl=config, clock=ttl.Clock(time), refresh_slack=0), time=time)
    time = FakeTime()
    with pytest.raises(AssertionError):
        # A slack of 0.999999: a read refreshes only in the last millionth of the ttl.
        no_refresh = DictStore(ttl=config, clock=ttl.Clock(time), refresh_slack=0.999999)
        run_steps(calls, ReferenceStore(ttl=config, time=time), no_refresh, time=time)



# -- LangGraph's own store tests, as call sequences -------------------------------------------
# The namespaces, values, queries and filters of LangGraph's store tests (InMemoryStore's
# tests/test_store.py, PostgresStore's store and namespace-validation tests); instead of
# their hand-written expectations, every answer is compared with InMemoryStore's.


def _put(ns: tuple[str, ...], key: str, value: dict[str, Any], index: Any = None) -> tuple[Any, ...]:
    return ("put", ns, key, value, index, NOT_PROVIDED)


def _list(prefix: Any = None, suffix: Any = None, depth: int | None = None, limit: int = 100, offset: int = 0) -> tuple[Any, ...]:
    return ("list", prefix, suffix, depth, limit, offset)


def _search(prefix: tuple[str, ...], filter: Any = None, limit: int = 10, offset: int = 0, query: str | None = None) -> tuple[Any, ...]:
    return ("search", prefix, filter, limit, offset, query, None)


def _numbered(namespaces: list[tuple[str, ...]]) -> list[tuple[Any, ...]]:
    return [_put(ns, f"id_{i}", {"data": f"value_{i:02d}"}) for i, ns in enumerate(namespaces)]


LISTING_BASIC = [
    _list(),  # the empty store
    *_numbered(
        [
            ("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "b", "f"), ("a", "c", "f"),
            ("b", "a", "f"), ("users", "123"), ("users", "456", "settings"), ("admin", "users", "789"),
        ]
    ),
    _list(),
    _list(("a", "b")),
    _list(suffix=("f",)),
    _list(("a",), ("f",)),
    _list(("a", "b"), depth=3),
    _list(("a", "b"), limit=2),
    _list(("a", "b"), offset=2),
    _list(("a", "*", "f")),
    _list(suffix=("*", "f")),
    _list(("nonexistent",)),
    _list(("users", "123")),
    _list(depth=2),
    _list(depth=1, limit=2, offset=1),
]

LISTING_WILDCARDS = [
    *_numbered(
        [
            ("users", "123"), ("users", "456"), ("users", "789", "settings"), ("admin", "users", "789"),
            ("guests", "123"), ("guests", "456", "preferences"),
        ]
    ),
    _list(("users", "*")),
    _list(suffix=("*", "preferences")),
    _list(("*", "users"), ("*", "settings")),
    _put(("admin", "users", "settings", "789"), "foo", {"data": "some_val"}),
    _list(("*", "users"), ("*", "settings")),
    _list(("*", "users", "*")),
    _list(("*",), depth=1),
]

LISTING_PAGES = [
    *[_put(("namespace", f"sub_{i:02d}"), f"id_{i:02d}", {"data": f"value_{i:02d}"}) for i in reversed(range(20))],
    _list(("namespace",), limit=5),
    _list(("namespace",), limit=5, offset=5),
    _list(("namespace",), limit=5, offset=15),
    _list(("namespace",), limit=5, offset=18),
    _list(("namespace",), limit=5, offset=25),
]

LISTING_DEPTH = [
    *_numbered([("a", "b", "c", "d"), ("a", "b", "c", "e"), ("a", "b", "f"), ("a", "g"), ("h", "i", "j", "k")]),
    _list(depth=2),
    _list(depth=3),
    _list(("a",), depth=2),
    _list(suffix=("*",), depth=0),
]

DOC = {"foo": "bar"}
ROOTS = [
    *[_put(ns, "foo", DOC) for ns in [(), ("the", "thing.about"), ("some", "fun", ""), ("langgraph", "foo")]],
    _put(("foo", "langgraph", "foo"), "bar", DOC),
    ("get", ("foo", "langgraph", "foo"), "bar", None),
    _search(("foo", "langgraph", "foo")),
    ("delete", ("foo", "langgraph", "foo"), "bar"),
    ("get", ("foo", "langgraph", "foo"), "bar", None),
    # Past put's check, through batch: LangGraph's own test stores under the "langgraph" root.
    ("batch", [PutOp(("langgraph", "foo"), "bar", DOC)]),
    ("get", ("langgraph", "foo"), "bar", None),
    _search(("langgraph", "foo")),
    ("delete", ("langgraph", "foo"), "bar"),
    ("get", ("langgraph", "foo"), "bar", None),
    # PostgresStore's: a bad namespace anywhere in a batch stores nothing of it.
    _put(("foo", "bar"), "key", {"original": True}),
    *[
        ("batch", [PutOp(("valid",), "key", {}), bad])
        for ns in [("foo.bar",), ("foo", ""), ("foo", 1)]
        for bad in [GetOp(ns, "key"), PutOp(ns, "key", {"changed": True}), PutOp(ns, "key", None), SearchOp(ns)]
    ],
    *[(method, ("foo.bar",), "key", None)[: 4 if method == "get" else 3] for method in ("get", "delete")],
    _search(("foo.bar",)),
    ("get", ("foo", "bar"), "key", None),
    ("get", ("valid",), "key", None),
    _list(),
]

# PostgresStore's: labels holding SQL LIKE metacharacters are plain text.
METACHARACTERS = [
    *[_put(ns, "key", {}) for ns in [("user_%",), ("user_%", "child"), ("userX%",), ("USER_%",)]],
    _search(()),
    _search(("user_%",)),
    _list(("user_%", "*")),
    _list(("user_%",)),
    _list(suffix=("child",)),
]

TEXT_DOCS = [
    ("doc1", {"text": "short text"}),
    ("doc2", {"text": "longer text document"}),
    ("doc3", {"text": "longest text document here"}),
    ("doc4", {"description": "text in description field"}),
    ("doc5", {"content": "text in content field"}),
    ("doc6", {"body": "text in body field"}),
]
VECTOR_INSERT = [*[_put(("test",), k, v) for k, v in TEXT_DOCS], _search(("test",), query="long text")]

VECTOR_UPDATE = [
    _put(("test",), "doc1", {"text": "zany zebra Xerxes"}),
    _put(("test",), "doc2", {"text": "something about dogs"}),
    _put(("test",), "doc3", {"text": "text about birds"}),
    _search(("test",), query="Zany Xerxes"),
    _put(("test",), "doc1", {"text": "new text about dogs"}),
    _search(("test",), query="Zany Xerxes"),
    _search(("test",), query="new text about dogs"),
    _put(("test",), "doc4", {"text": "new text about dogs"}, index=False),
    _search(("test",), query="new text about dogs", limit=3),
    _search(("test",), query="new text about dogs", limit=10),
]

COLORED = [
    ("doc1", {"text": "red apple", "color": "red", "score": 4.5}),
    ("doc2", {"text": "red car", "color": "red", "score": 3.0}),
    ("doc3", {"text": "green apple", "color": "green", "score": 4.0}),
    ("doc4", {"text": "blue car", "color": "blue", "score": 3.5}),
]
VECTOR_FILTERS = [
    *[_put(("test",), k, v) for k, v in COLORED],
    _search(("test",), {"color": "red"}, query="apple"),
    _search(("test",), {"color": "red"}, query="car"),
    _search(("test",), {"score": {"$gt": 3.2}}, query="bbbbluuu"),
    _search(("test",), {"score": {"$gte": 4.0}, "color": "green"}, query="apple"),
    _search(("test",), {"score": {"$ne": 3.0, "$lte": 4.0}}),
]


def _batched_docs() -> list[tuple[Any, ...]]:
    colors = ["red", "blue", "green", "yellow", "purple"]
    things = ["apple", "car", "house", "book", "phone"]
    scores = [3.0, 3.5, 4.0, 4.5, 5.0]
    docs = [
        (f"doc{i}", {"text": f"{colors[i % 5]} {things[i % 5]}", "color": colors[i % 5], "score": scores[i % 5], "index": i})
        for i in range(50)
    ]
    # LangGraph's concurrent aput/adelete/aput of every doc, as the one batch that
    # AsyncBatchedBaseStore makes of them.
    ops = [PutOp(("test",), k, v) for k, v in docs] + [PutOp(("test",), k, None) for k, _ in docs]
    ops += [PutOp(("test",), k, v) for k, v in docs]
    searches = [
        ("apple", {"color": "red"}), ("car", {"color": "blue"}), ("house", {"color": "green"}),
        ("phone", {"score": {"$gt": 4.99}}), ("book", {"score": {"$lte": 3.5}}),
        ("apple", {"score": {"$gte": 3.0}, "color": "red"}), ("car", {"score": {"$lt": 5.1}, "color": "blue"}),
        ("house", {"index": {"$gt": 25}}), ("phone", {"index": {"$lte": 10}}),
    ]
    return [
        ("batch", ops),
        ("batch", [SearchOp(("test",), f, query=q) for q, f in searches]),
        *[_search(("test",), f, query=q) for q, f in searches],
    ]


VECTOR_PAGES = [
    *[_put(("test",), f"doc{i}", {"text": f"test document number {i}"}) for i in range(5)],
    _search(("test",), limit=2, query="test"),
    _search(("test",), limit=2, offset=2, query="test"),
    _search(("test",), limit=10, query="test"),
]

VECTOR_EDGES = [
    _put(("test",), "doc1", {"text": "test document"}),
    *[_search(("test",), query=q) for q in ("", None, "test " * 100, "test!@#$%^&*()")],
]

# The store-generic tests of PostgresStore (and RedisStore, MemgraphStore...): one batch of
# every op kind, reads that do not see the batch's puts, non-ASCII text, trailing newlines.
BATCH_ORDER = [
    _put(("test", "foo"), "key1", {"data": "value1"}),
    _put(("test", "bar"), "key2", {"data": "value2"}),
    (
        "batch",
        [
            GetOp(("test", "foo"), "key1"),
            PutOp(("test", "bar"), "key2", {"data": "value2"}),
            SearchOp(("test",), {"data": "value1"}, 10, 0),
            ListNamespacesOp(None, None, 10, 0),
            GetOp(("test",), "key3"),
        ],
    ),
    (
        "batch",
        [
            PutOp(("test", "foo"), "key3", {"data": "value3"}),
            GetOp(("test", "foo"), "key3"),
            SearchOp(("test",)),
            PutOp(("test", "new"), "key", {"data": "new"}),
            ListNamespacesOp(None, None, 10, 0),
            PutOp(("test", "foo"), "key1", None),
            GetOp(("test", "foo"), "key1"),
        ],
    ),
    ("get", ("test", "foo"), "key3", None),
    ("get", ("test", "foo"), "key1", None),
    _search(("test",)),
    _list(),
]

TEXT = [
    _put(("user_123", "memories"), "1", {"text": "这是中文"}),
    _put(("user_123", "memories"), "2", {"text": "これは日本語です"}),
    _put(("user_123", "memories"), "3", {"text": "이건 한국어야"}),
    _put(("user_123", "memories"), "4", {"text": "Это русский"}),
    _put(("user_123", "memories"), "5", {"text": "यह हिंदी है"}),
    _put(("user_123", "memories", "日本"), "6", {"text": "emoji 🎉"}),
    _put(("trailing\n",), "key\n", {"text": "line\n"}),
    _search(("user_123",), {"text": "这是中文"}),
    _search(("user_123", "memories"), query="日本語"),
    _search(()),
    ("get", ("trailing\n",), "key\n", None),
    ("get", ("trailing",), "key", None),
    _list(suffix=("日本",)),
    _list(("trailing\n",)),
]

SCENARIOS = {
    "listing_basic": LISTING_BASIC,
    "listing_wildcards": LISTING_WILDCARDS,
    "listing_pages": LISTING_PAGES,
    "listing_depth": LISTING_DEPTH,
    "roots_and_bad_namespaces": ROOTS,
    "metacharacters": METACHARACTERS,
    "vector_insert": VECTOR_INSERT,
    "vector_update": VECTOR_UPDATE,
    "vector_filters": VECTOR_FILTERS,
    "vector_batched": _batched_docs(),
    "vector_pages": VECTOR_PAGES,
    "vector_edges": VECTOR_EDGES,
    "batch_order": BATCH_ORDER,
    "text": TEXT,
}
LANGGRAPH_INDEX = {"dims": 32, "embed": HashEmbeddings(32)}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_langgraphs_store_cases_agree_with_inmemory(name: str) -> None:
    for run in (run_steps, run_steps_async):
        run(SCENARIOS[name], ReferenceStore(index=LANGGRAPH_INDEX), DictStore(index=LANGGRAPH_INDEX))


def test_langgraphs_cases_reach_what_they_test() -> None:
    """The sequences are not vacuous: the answers they compare hold what LangGraph's tests
    assert of them."""
    store = InMemoryStore(index=LANGGRAPH_INDEX)
    for _, ns, key, value, index, _ in LISTING_BASIC[1:10]:
        store.put(ns, key, value, index=index)
    assert store.list_namespaces(prefix=("a", "b"), max_depth=3) == [("a", "b", "c"), ("a", "b", "d"), ("a", "b", "f")]
    assert store.list_namespaces(suffix=("*", "f")) == [("a", "b", "f"), ("a", "c", "f"), ("b", "a", "f")]
    ours = DictStore(index=LANGGRAPH_INDEX)
    with pytest.raises(InvalidNamespaceError):
        ours.put(("langgraph", "foo"), "bar", DOC)
    ours.batch(_batched_docs()[0][1])
    found = ours.batch(_batched_docs()[1][1])
    assert all(found) and all(i.value["color"] == "red" for i in found[0]) and len(ours.search(("test",), limit=100)) == 50
    assert all(i.value["index"] > 25 for i in found[7]) and found[7][0].score is not None
