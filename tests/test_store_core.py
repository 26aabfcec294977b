"""The store's pure core (``s3_saver._format.memory`` and ``s3_saver._ops.memory``): every decision S3Store takes without a
request, against LangGraph's own InMemoryStore code where one exists. No servers: the
storage built on this core is tested on moto and SeaweedFS; this file pins the
semantics it must keep, and runs the differential harness (``store_reference``) on the
dict double of the core (``store_double``).
"""

from __future__ import annotations

import hashlib
import math
import random
import struct
import threading
import zlib
from typing import Any

import langgraph.store.memory as memory_module
import ormsgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.store.base import (
    NOT_PROVIDED,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
    _validate_namespace_labels,
    get_text_at_path,
)
from langgraph.store.memory import InMemoryStore
from store_double import DictStore
from store_reference import (
    FakeTime,
    HashEmbeddings,
    _tolerant,
)

from s3_saver._format import key_codec as _key_codec
from s3_saver._format.memory import names, rows, ttl
from s3_saver._ops.memory import embedding, filters, listing, rank
from s3_saver._ops.memory.prepare import prepare, query_vectors
from s3_saver.errors import (
    ConfigurationError,
    CorruptObjectError,
    EmbeddingError,
    InvalidFilterError,
    KeyTooLongError,
    NamespaceError,
    S3SaverError,
    SerializationError,
)

SERDE = JsonPlusSerializer()
# Labels from a few characters around the registry key's separator and escape ("!", '"', and
# the characters below them), so labels are often prefixes of each other; and any text.
label_text = st.one_of(
    st.text(alphabet=st.sampled_from(['a', 'b', '!', '"', '#', ' ', '\x01', 'é', '\uffff']), min_size=1, max_size=3),
    st.text(st.characters(codec="utf-8", exclude_characters="\U0010ffff"), min_size=1, max_size=6),
)
valid_labels = label_text.filter(lambda s: "." not in s and "\x00" not in s)
valid_namespaces = st.lists(valid_labels, max_size=4).map(tuple)


# -- 1. namespaces and keys ---------------------------------------------------------------


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.text(max_size=4), st.integers(), st.none()), max_size=4).map(tuple))
def test_labels_are_refused_exactly_where_langgraph_refuses_them(namespace: tuple[Any, ...]) -> None:
    try:
        _validate_namespace_labels(namespace)
        langgraph_refuses = False
    except InvalidNamespaceError:
        langgraph_refuses = True
    store_only = any(
        isinstance(label, str) and ("\U0010ffff" in label or any(0xD800 <= ord(c) <= 0xDFFF for c in label))
        for label in namespace
    )
    if langgraph_refuses or store_only:
        with pytest.raises(NamespaceError) as caught:
            names.check_labels(namespace)
        assert isinstance(caught.value, InvalidNamespaceError) and isinstance(caught.value, S3SaverError)
        assert caught.value.namespace in (namespace, ())
    else:
        assert names.check_labels(namespace) == namespace


def test_a_batch_checks_labels_but_leaves_the_langgraph_root_to_put() -> None:
    # What InMemoryStore accepts through batch but LangGraph's validate_op_namespace refuses.
    for op in (
        PutOp(("a.b",), "k", {"x": 1}),
        GetOp(("a", "\x00"), "k"),
        SearchOp(("",)),
        ListNamespacesOp((MatchCondition("prefix", ("a.b",)),)),
        PutOp(("a", "\udc80"), "k", {"x": 1}),
        PutOp(("a\U0010ffff",), "k", {"x": 1}),
    ):
        with pytest.raises(NamespaceError):
            prepare([PutOp(("ok",), "k", {"x": 1}), op], serde=SERDE)
    # The root "langgraph" is BaseStore.put's check; LangGraph's own tests put it through batch.
    assert prepare([PutOp(("langgraph", "foo"), "bar", {"x": 1})], serde=SERDE).puts[0].namespace == ("langgraph", "foo")
    with pytest.raises(InvalidNamespaceError):
        DictStore().put(("langgraph", "foo"), "bar", {"x": 1})


def test_an_item_needs_a_namespace_but_a_delete_in_the_root_is_a_no_op() -> None:
    with pytest.raises(NamespaceError, match="empty"):
        prepare([PutOp((), "k", {"x": 1})], serde=SERDE)
    assert prepare([PutOp((), "k", None)], serde=SERDE).puts == []
    assert prepare([GetOp((), "k")], serde=SERDE).gets == []  # nothing can be there: answered None, no read
    store = DictStore()
    store.delete((), "k")
    assert store.get((), "k") is None


def test_keys_up_to_1000_bytes_of_utf8() -> None:
    ns = ("memories", "alice")
    for key in ("", "k", "x" * 1000, "é" * 500, "日" * 333):
        assert names.check_key(ns, key) == key
    for key in ("x" * 1001, "é" * 501, "日" * 334):
        with pytest.raises(KeyTooLongError) as caught:
            names.check_key(ns, key)
        assert "'memories', 'alice'" in str(caught.value) and key[:20] in str(caught.value)
    with pytest.raises(ConfigurationError, match="key 5 in namespace \\('memories', 'alice'\\): keys are strings"):
        names.check_key(ns, 5)
    with pytest.raises(ConfigurationError, match="'memories', 'alice'.* not valid Unicode"):
        names.check_key(ns, "a\ud800")
    with pytest.raises(KeyTooLongError):
        prepare([GetOp(ns, "x" * 1001)], serde=SERDE)


def test_registry_keys_up_to_1024_bytes() -> None:
    names.registry_key(("a" * 1024,))
    names.registry_key(("a" * 511, "b" * 512))  # 511 + 1 + 512
    with pytest.raises(KeyTooLongError, match="registry key is 1025 bytes"):
        names.registry_key(("a" * 512, "b" * 512))
    with pytest.raises(KeyTooLongError):
        names.registry_key(("!" * 342,))  # escaped: 3 bytes each
    with pytest.raises(KeyTooLongError):
        prepare([PutOp(("a" * 1025,), "k", {"x": 1})], serde=SERDE)
    with pytest.raises(KeyTooLongError):
        prepare([SearchOp(("a" * 1025,))], serde=SERDE)


@settings(deadline=None, max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(valid_namespaces, valid_namespaces)
def test_registry_keys_sort_as_python_sorts_the_tuples(a: tuple[str, ...], b: tuple[str, ...]) -> None:
    ka, kb = names.registry_key(a), names.registry_key(b)
    # DynamoDB compares the UTF-8 bytes.
    assert (ka.encode() < kb.encode()) == (a < b)
    assert (ka == kb) == (a == b)
    # The saver's sort_encode, the same encoding.
    assert ka == "!".join(_key_codec.sort_encode(label) for label in a)


@st.composite
def prefix_and_namespace(draw: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A prefix and a namespace related to it: under it, beside it (its last label extended,
    "ab" beside "a"), above it, or drawn apart."""
    prefix = draw(valid_namespaces)
    tail = draw(st.lists(valid_labels, max_size=2).map(tuple))
    kind = draw(st.sampled_from(["under", "beside", "above", "apart"]))
    if kind == "under":
        return prefix, prefix + tail
    if kind == "beside" and prefix:
        return prefix, prefix[:-1] + (prefix[-1] + draw(valid_labels),) + tail
    if kind == "above":
        return prefix, prefix[: draw(st.integers(0, len(prefix)))]
    return prefix, draw(valid_namespaces)


@settings(deadline=None, max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(prefix_and_namespace())
def test_registry_bounds_hold_exactly_the_namespaces_under_a_prefix(pair: tuple[tuple[str, ...], tuple[str, ...]]) -> None:
    prefix, ns = pair
    lo, hi = names.registry_bounds(prefix)
    key = names.registry_key(ns)
    assert (lo <= key < hi) == (ns[: len(prefix)] == prefix)


def test_node_ids_hash_the_canonical_tuple() -> None:
    ids = {names.node_id(ns) for ns in [("a", "b"), ("a:b",), ("a", "b", "c"), ("ab",), ("a",), ()]}
    assert len(ids) == 6
    assert names.node_id(("memories", "alice")) == hashlib.sha256(ormsgpack.packb(["memories", "alice"])).hexdigest()
    assert len(names.node_id(("x" * 10_000,))) == 64


# -- 2. filters ---------------------------------------------------------------------------

filter_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.5, 2.0, 1e300, "2", "x", ""])
)
filter_values = st.recursive(
    filter_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "$x"]), inner, max_size=3),
    ),
    max_leaves=8,
)
numeric_operands = st.one_of(st.integers(-3, 3), st.sampled_from([0.5, 2.0, "1", True]))


def _conditions() -> st.SearchStrategy[Any]:
    operators = st.dictionaries(
        st.sampled_from(sorted(filters.OPERATORS)),
        st.one_of(numeric_operands, filter_scalars),
        min_size=1,
        max_size=3,
    ).filter(
        lambda ops: all(
            _floatable(v) for op, v in ops.items() if op in ("$gt", "$gte", "$lt", "$lte")
        )
    )
    return st.recursive(
        st.one_of(filter_scalars, operators),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "b"]), inner, min_size=1, max_size=2)
        ),
        max_leaves=6,
    )


def _floatable(value: Any) -> bool:
    try:
        float(value)
        return True
    except (TypeError, ValueError, OverflowError):
        return False


@settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.sampled_from(["a", "b", "c", "$eq"]), filter_values, max_size=4),
    st.dictionaries(st.sampled_from(["a", "b", "c", "$eq", "missing"]), _conditions(), max_size=3),
)
def test_filters_match_as_inmemory_evaluates_them(value: dict[str, Any], filter: dict[str, Any]) -> None:
    checked = filters.check_filter(filter)
    original = memory_module._apply_operator
    memory_module._apply_operator = _tolerant(original)
    try:
        expected = all(memory_module._compare_values(value.get(k), v) for k, v in filter.items())
    finally:
        memory_module._apply_operator = original
    assert filters.matches(value, checked) == expected
    # Where InMemoryStore's float() raises, the store says "no match".
    try:
        raw = all(memory_module._compare_values(value.get(k), v) for k, v in filter.items())
        assert raw == expected
    except (TypeError, ValueError, OverflowError):
        pass


def test_a_non_numeric_value_does_not_match_where_inmemory_raises() -> None:
    store = InMemoryStore()
    store.put(("n",), "k", {"age": "old"})
    with pytest.raises(ValueError):
        store.search(("n",), filter={"age": {"$gt": 3}})
    with pytest.raises(TypeError):
        store.search(("n",), filter={"missing": {"$lt": 3}})
    ours = DictStore()
    ours.put(("n",), "k", {"age": "old"})
    ours.put(("n",), "k2", {"age": "5"})
    assert [i.key for i in ours.search(("n",), filter={"age": {"$gt": 3}})] == ["k2"]
    assert ours.search(("n",), filter={"missing": {"$lt": 3}}) == []


@pytest.mark.parametrize(
    "bad",
    [
        {"a": {"$in": [1, 2]}},
        {"a": {"$eq": 1, "b": 2}},  # InMemoryStore reads "b" as an operator
        {"a": {"b": {"$regex": "x"}}},
        {"a": [{"$foo": 1}]},
        {"a": {"$gt": "three"}},
        {"a": {"$lte": None}},
        {"a": {1: 2}},
        {1: 2},
        ["a"],
    ],
)
def test_a_filter_that_cannot_be_evaluated_is_refused_before_any_read(bad: Any) -> None:
    with pytest.raises(InvalidFilterError) as caught:
        prepare([PutOp(("n",), "k", {"a": 1}), SearchOp(("n", "x"), filter=bad)], serde=SERDE)
    assert isinstance(caught.value, ValueError)  # InMemoryStore's "Unsupported operator" is a ValueError
    assert "('n', 'x')" in str(caught.value) and caught.value.filter == bad
    store = DictStore()
    with pytest.raises(InvalidFilterError):
        store.search(("empty",), filter=bad)  # even with nothing to read (InMemoryStore: [])


def test_a_top_level_dollar_key_names_a_field_and_unknown_operators_raise_in_inmemory_too() -> None:
    assert filters.check_filter({"$eq": 1}) == {"$eq": 1}
    assert filters.matches({"$eq": 1}, {"$eq": 1}) and not filters.matches({"$eq": 2}, {"$eq": 1})
    store = InMemoryStore()
    store.put(("n",), "k", {"a": 1})
    with pytest.raises(ValueError, match="Unsupported operator"):
        store.search(("n",), filter={"a": {"$in": [1]}})


# -- 3. list_namespaces -----------------------------------------------------------------

list_labels = st.sampled_from(["a", "b", "c", "*"])
namespace_sets = st.sets(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4).map(tuple), max_size=12)
list_ops = st.builds(
    lambda prefix, suffix, depth, limit, offset: ListNamespacesOp(
        tuple([MatchCondition("prefix", prefix)] * bool(prefix) + [MatchCondition("suffix", suffix)] * bool(suffix)),
        depth,
        limit,
        offset,
    ),
    st.lists(list_labels, max_size=3).map(tuple),
    st.lists(list_labels, max_size=3).map(tuple),
    st.one_of(st.none(), st.integers(0, 4)),
    st.integers(0, 6),
    st.integers(0, 4),
)


@settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(namespace_sets, st.randoms(), list_ops)
def test_namespace_pages_equal_inmemory(namespaces: set[tuple[str, ...]], random: Any, op: ListNamespacesOp) -> None:
    reference = InMemoryStore()
    order = sorted(namespaces)
    random.shuffle(order)  # InMemoryStore sorts; the store reads its registry sorted
    for ns in order:
        reference._data[ns] = {}
    op = listing.check_list_op(op)
    consumed: list[tuple[str, ...]] = []

    def registry() -> Any:
        for ns in sorted(namespaces):
            consumed.append(ns)
            yield ns

    assert listing.page_namespaces(registry(), op) == reference._handle_list_namespaces(op)
    # Reading the registry range of the fixed prefix alone gives the same page.
    lo, hi = names.registry_bounds(listing.fixed_prefix(op))
    narrowed = [ns for ns in sorted(namespaces) if lo <= names.registry_key(ns) < hi]
    assert listing.page_namespaces(narrowed, op) == reference._handle_list_namespaces(op)


def test_a_page_reads_no_further_than_it_needs() -> None:
    read: list[tuple[str, ...]] = []

    def registry() -> Any:
        for i in range(1000):
            read.append(("ns", f"{i:04d}"))
            yield ("ns", f"{i:04d}")

    op = listing.check_list_op(ListNamespacesOp((), None, limit=5, offset=10))
    assert listing.page_namespaces(registry(), op) == [("ns", f"{i:04d}") for i in range(10, 15)]
    assert len(read) == 15


def test_match_paths_limits_and_types() -> None:
    op = listing.check_list_op(ListNamespacesOp((MatchCondition("suffix", "public"),)))  # PostgresStore's tests
    assert op.match_conditions[0].path == ("public",)
    for bad in (
        ListNamespacesOp((), limit=-1),
        ListNamespacesOp((), offset=-1),
        ListNamespacesOp((), max_depth=-1),
        ListNamespacesOp((), limit=True),
        ListNamespacesOp((MatchCondition("infix", ("a",)),)),
    ):
        with pytest.raises(ConfigurationError):
            listing.check_list_op(bad)
    with pytest.raises(NamespaceError):
        listing.check_list_op(ListNamespacesOp((MatchCondition("prefix", ("a.b",)),)))
    assert listing.fixed_prefix(
        ListNamespacesOp((MatchCondition("prefix", ("a", "*", "c")), MatchCondition("prefix", ("a", "b", "*"))))
    ) == ("a", "b")


# -- 4. search order, scores and paging ---------------------------------------------------

vector_values = st.floats(-4, 4, allow_nan=False, allow_infinity=False, width=64)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(vector_values, min_size=3, max_size=3),
    st.lists(st.one_of(st.lists(vector_values, min_size=3, max_size=3), st.just([0.0, 0.0, 0.0])), max_size=6),
)
def test_cosine_is_bit_equal_to_inmemory(x: list[float], ys: list[list[float]]) -> None:
    ours = rank.cosine_similarity(x, ys)
    theirs = memory_module._cosine_similarity(x, ys)
    assert [struct.pack("<d", s) for s in ours] == [struct.pack("<d", s) for s in theirs]
    assert rank.numpy_available() == memory_module._check_numpy()


search_items = st.lists(
    st.tuples(
        st.sampled_from([("a",), ("a", "b"), ("b",), ("a", "c")]),
        st.sampled_from(["k1", "k2", "k3", "k4"]),
        st.fixed_dictionaries({"n": st.integers(0, 3)}, optional={"t": st.sampled_from(["x", "y"])}),
        st.lists(st.lists(st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0]), min_size=3, max_size=3), max_size=3),
    ),
    max_size=14,
)


@settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    search_items,
    st.sampled_from([(), ("a",), ("a", "b"), ("b",)]),
    st.one_of(st.none(), st.just({"n": {"$gte": 1}}), st.just({"t": "x"})),
    st.integers(0, 5),
    st.integers(0, 3),
    st.one_of(st.none(), st.just(""), st.sampled_from(["ab", "ba", "zz", "a b"])),
)
def test_search_answers_equal_inmemory(items: list[Any], prefix: tuple[str, ...], filter: Any, limit: int, offset: int, query: str | None) -> None:
    embedder = HashEmbeddings(3)
    reference = InMemoryStore(index={"dims": 3, "embed": embedder})
    candidates: dict[tuple[str, ...], dict[str, tuple[Item, list[list[float]]]]] = {}
    for n, (ns, key, value, vectors) in enumerate(items):
        item = Item(value=value, key=key, namespace=ns, created_at=ttl.to_datetime(n), updated_at=ttl.to_datetime(n))
        reference._data[ns][key] = item
        reference._vectors[ns].pop(key, None)
        for i, vector in enumerate(vectors):
            reference._vectors[ns][key][f"p{i}"] = vector
        candidates.setdefault(ns, {})[key] = (item, vectors)
    op = SearchOp(prefix, filter, limit, offset, query)
    expected = reference.batch([op])[0]
    ordered = [c for ns, by_key in candidates.items() if ns[: len(prefix)] == prefix for c in by_key.values()]
    query_vector = embedder.embed_query(query) if query else None
    got = rank.answer(op, ordered, query_vector)
    assert [(i.namespace, i.key, i.value, i.score) for i in got] == [
        (i.namespace, i.key, i.value, i.score) for i in expected
    ]


def test_ties_keep_candidate_order_and_vectorless_items_fill_from_their_start() -> None:
    def item(key: str) -> Item:
        return Item(value={}, key=key, namespace=("n",), created_at=ttl.to_datetime(0), updated_at=ttl.to_datetime(0))

    candidates = [
        (item("none1"), []),
        (item("tie1"), [[1.0, 0.0]]),
        (item("best"), [[0.0, 1.0], [1.0, 1.0]]),  # max pooling: its best vector counts
        (item("tie2"), [[2.0, 0.0]]),
        (item("none2"), []),
    ]
    got = rank.answer(SearchOp(("n",), limit=10, query="q"), candidates, [1.0, 1.0])
    assert [(i.key, i.score is None) for i in got] == [
        ("best", False), ("tie1", False), ("tie2", False), ("none1", True), ("none2", True)
    ]
    assert got[1].score == got[2].score
    # offset skips scored items only; the fill starts at the first vectorless item.
    got = rank.answer(SearchOp(("n",), limit=2, offset=2, query="q"), candidates, [1.0, 1.0])
    assert [i.key for i in got] == ["tie2", "none1"]
    # No query vector (no index): plain order, no scores.
    got = rank.answer(SearchOp(("n",), limit=2, offset=1, query="q"), candidates, None)
    assert [(i.key, i.score) for i in got] == [("tie1", None), ("best", None)]


def test_an_unranked_search_reads_no_further_than_its_page() -> None:
    read = []

    def stream() -> Any:
        for i in range(100):
            read.append(i)
            yield (Item(value={"i": i}, key=str(i), namespace=("n",), created_at=ttl.to_datetime(0), updated_at=ttl.to_datetime(0)), [])

    got = rank.answer(SearchOp(("n",), filter={"i": {"$gte": 10}}, limit=3, offset=2), stream(), None)
    assert [i.key for i in got] == ["12", "13", "14"] and len(read) == 15


# -- 5. embedding texts and vectors -------------------------------------------------------

embed_values = st.fixed_dictionaries(
    {},
    optional={
        "text": st.sampled_from(["apple", "pear", ""]),
        "tags": st.lists(st.sampled_from(["apple", "x", "y"]), max_size=3),
        "meta": st.fixed_dictionaries({"tag": st.sampled_from(["apple", "z"]), "n": st.integers(0, 2)}),
        "n": st.integers(0, 2),
    },
)
index_args = st.one_of(
    st.none(), st.just(False), st.lists(st.sampled_from(["text", "tags[*]", "meta.tag", "$", "{text,meta.n}", "tags[-1]", "nope"]), max_size=3)
)


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.sampled_from(["k1", "k2", "k3"]), st.one_of(st.none(), embed_values), index_args), max_size=5),
    st.lists(st.sampled_from(["text", "tags[*]", "meta", "$", "meta.tag"]), max_size=3),
)
def test_texts_equal_inmemory(puts: list[Any], fields: list[str]) -> None:
    reference = InMemoryStore(index={"dims": 2, "embed": HashEmbeddings(2), "fields": fields})
    put_ops = {}
    for key, value, index in puts:
        put_ops[(("n",), key)] = PutOp(("n",), key, value, index)
    expected = reference._extract_texts(put_ops)
    prepared = prepare(
        [PutOp(("n",), key, value, index) for key, value, index in puts],
        serde=SERDE,
        fields=embedding.tokenized_fields({"fields": fields}),
    )
    got = {
        text: [(prepared.puts[n].namespace, prepared.puts[n].key, path) for n, path in places]
        for text, places in zip(prepared.texts.texts, prepared.texts.places, strict=True)
    }
    assert list(got.items()) == [(text, list(places)) for text, places in expected.items()]


def test_several_texts_of_a_path_are_named_path_dot_i_and_a_shared_text_fills_every_place() -> None:
    fields = embedding.tokenized_fields({"fields": ["tags[*]", "title"]})
    plan = embedding.plan_texts([({"tags": ["a", "b"], "title": "a"}, None), ({"title": "b"}, None)], fields)
    assert plan.texts == ["a", "b"]
    assert plan.places == [[(0, "tags[*].0"), (0, "title")], [(0, "tags[*].1"), (1, "title")]]
    vectors = embedding.vectors_for_puts(plan, [[1.0, 0.0], [0.0, 1.0]], 2, [(("n",), "k1"), (("n",), "k2")])
    assert vectors == [{"tags[*].0": [1.0, 0.0], "title": [1.0, 0.0], "tags[*].1": [0.0, 1.0]}, {"title": [0.0, 1.0]}]
    # InMemoryStore raises on a text that fills two places of one batch.
    store = InMemoryStore(index={"dims": 2, "embed": HashEmbeddings(2), "fields": ["tags[*]", "title"]})
    with pytest.raises(ValueError, match="does not match"):
        store.put(("n",), "k1", {"tags": ["a", "b"], "title": "a"})
    ours = DictStore(index={"dims": 2, "embed": HashEmbeddings(2), "fields": ["tags[*]", "title"]})
    ours.put(("n",), "k1", {"tags": ["a", "b"], "title": "a"})
    assert ours.search(("n",), query="a")[0].score == pytest.approx(1.0)
    # index=False and paths that give no text: no vectors; the whole value for "$".
    assert embedding.plan_texts([({"a": 1}, False), ({"a": 1}, ["nope"])], fields).texts == []
    whole = embedding.plan_texts([({"b": 1, "a": "x"}, None)], embedding.tokenized_fields({}))
    assert whole.texts == get_text_at_path({"a": "x", "b": 1}, "$") == ['{"a": "x", "b": 1}']


@pytest.mark.parametrize(
    "answer, message",
    [
        ([[1.0, 2.0]], "1 vectors for 2 texts"),
        ([[1.0], [1.0, 2.0]], "1 numbers; the index has dims=2"),
        ([[1.0, float("nan")], [1.0, 2.0]], "not a finite number"),
        ([[1.0, "x"], [1.0, 2.0]], "not a number"),
        ([None, [1.0, 2.0]], "not a vector"),
    ],
)
def test_vectors_that_cannot_be_stored_raise_before_anything_is_stored(answer: Any, message: str) -> None:
    plan = embedding.plan_texts([({"text": "a"}, None), ({"text": "b"}, None)], embedding.tokenized_fields({"fields": ["text"]}))
    with pytest.raises(EmbeddingError, match=message) as caught:
        embedding.vectors_for_puts(plan, answer, 2, [(("n",), "k1"), (("n",), "k2")])
    assert isinstance(caught.value, ConfigurationError)
    if caught.value.key is not None:
        assert caught.value.key == "k1" and caught.value.namespace == ("n",)
    with pytest.raises(EmbeddingError, match="dims=2"):
        query_vectors(["q"], [[1.0]], 2)

    class Wrong(HashEmbeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return answer

    store = DictStore(index={"dims": 2, "embed": Wrong(2), "fields": ["text"]})
    with pytest.raises(EmbeddingError):
        store.batch([PutOp(("n",), "k1", {"text": "a"}), PutOp(("n",), "k2", {"text": "b"})])
    assert store.search(("n",)) == [] and store.list_namespaces() == []


def test_an_index_needs_positive_int_dims() -> None:
    assert embedding.check_dims({"dims": 3}) == 3
    for bad in (0, -1, 2.0, "3", True, None):
        with pytest.raises(ConfigurationError, match="'dims' must be a positive int"):
            embedding.check_dims({"dims": bad})
    with pytest.raises(ConfigurationError):
        DictStore(index={"dims": 0, "embed": HashEmbeddings(2)})


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=4, max_size=4), min_size=1, max_size=3))
def test_float64_vectors_are_stored_bit_for_bit_in_8_bytes_a_dimension(vectors: list[list[float]]) -> None:
    by_path = {f"p{i}": v for i, v in enumerate(vectors)}
    cell = rows.pack_vectors(by_path, 4)
    assert cell is not None and len(cell.raw) == 8 * 4 * len(vectors)
    assert cell.by_path() == by_path
    back = rows.vectors_from_wire(ormsgpack.unpackb(ormsgpack.packb(rows.vectors_to_wire(cell))), "t")
    assert back == cell


def test_float32_vectors_take_4_bytes_a_dimension() -> None:
    cell = rows.pack_vectors({"text": [0.1, -2.5, 1e-3]}, 3, "float32")
    assert cell is not None and len(cell.raw) == 12
    assert cell.vectors()[0] == pytest.approx([0.1, -2.5, 1e-3], rel=1e-6)
    with pytest.raises(EmbeddingError, match="float32"):
        rows.pack_vectors({"text": [1e300, 0.0, 0.0]}, 3, "float32")
    assert rows.pack_vectors({}, 3) is None


# -- 6. rows -------------------------------------------------------------------------------

value_cells = st.builds(rows.ValueCell, st.text(max_size=8), st.binary(max_size=40), st.sampled_from([rows.RAW, rows.ZLIB]))
refs = st.builds(rows.ObjectRef, st.text(min_size=1, max_size=12), st.integers(0, 2**40))
vector_cells = st.integers(1, 3).flatmap(
    lambda dims: st.lists(st.text(max_size=5), min_size=1, max_size=3, unique=True).flatmap(
        lambda paths: st.builds(
            rows.VectorsCell,
            st.just("float64"),
            st.just(dims),
            st.just(tuple(paths)),
            st.binary(min_size=8 * dims * len(paths), max_size=8 * dims * len(paths)),
        )
    )
)
times = st.integers(0, 2**62)


@st.composite
def any_rows(draw: Any) -> rows.Row:
    key = draw(st.text(max_size=10))
    if draw(st.booleans()):
        return rows.tombstone_row(key, draw(times))
    created = draw(times)
    return rows.Row(
        key,
        draw(st.integers(0, 2**40)),
        created,
        draw(st.integers(created, 2**62)),
        draw(st.one_of(st.none(), times)),
        draw(st.one_of(st.none(), st.floats(0, 1e6, allow_nan=False))),
        0,
        draw(st.one_of(value_cells, refs)),
        draw(st.one_of(st.none(), vector_cells, refs)),
    )


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_rows())
def test_rows_round_trip(row: rows.Row) -> None:
    assert rows.loads_row(rows.dumps_row(row), "t") == row


def _damaged(wire: list[Any]) -> st.SearchStrategy[bytes]:
    junk = st.sampled_from([None, -1, "x", 2**64 - 1, [], b"", 1.5, True, {"a": 1}, ["@v", "", 1], ["float64", 0, [], b""]])
    return st.tuples(st.integers(0, 8), junk).map(lambda p: ormsgpack.packb(wire[: p[0]] + [p[1]] + wire[p[0] + 1 :]))


@settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=64), any_rows().map(rows.row_to_wire).flatmap(_damaged)))
def test_garbage_is_a_corrupt_object_error_or_a_row_and_nothing_else(data: bytes) -> None:
    try:
        row = rows.loads_row(data, "memory/n/abc/@head")
    except CorruptObjectError as exc:
        assert "memory/n/abc/@head" in str(exc)
        return
    assert rows.loads_row(rows.dumps_row(row), "t") == row


def test_rows_this_format_does_not_write_are_refused() -> None:
    good = rows.Row("k", 1, 10, 20, None, None, 0, rows.ValueCell("msgpack", b"\x80"), None)
    wire = rows.row_to_wire(good)
    for bad, why in [
        (wire[:8], "list of 9"),
        ([*wire[:6], 2, *wire[7:]], "unknown row flags"),
        ([*wire[:6], rows.TOMBSTONE, *wire[7:]], "tombstone row holds a value"),
        ([*wire[:7], None, None], "without a value"),
        ([*wire[:8], ["float64", 2, ["a"], b"\x00" * 8]], "not stored vectors"),
        ([*wire[:8], ["float16", 1, ["a"], b"\x00" * 2]], "not stored vectors"),
        ([*wire[:7], ["msgpack", "not bytes", 0], None], "not a stored value"),
        ([*wire[:7], ["msgpack", b"x", 7], None], "not a stored value"),
        ([*wire[:5], -1.0, *wire[6:]], "ttl"),
    ]:
        with pytest.raises(CorruptObjectError, match=why) as caught:
            rows.row_from_wire(bad, "memory/n/abc/@head")
        assert "memory/n/abc/@head" in str(caught.value)



def test_a_row_updated_before_its_creation_reads_as_updated_then() -> None:
    """Two processes' first puts of one key (DynamoDB mode): the one stamped later lands
    first and creates the item, the other overwrites it keeping its ``ca``: its stamp is
    before the creation. Every read of the key raised CorruptObjectError; it reads as
    updated when created, and a manifest overwrite is never stamped before it."""
    value = rows.ValueCell("msgpack", b"\x80")
    late = rows.row_from_wire(rows.row_to_wire(rows.Row("k", 1, 30, 20, None, None, 0, value, None)), "t")
    assert (late.created_us, late.updated_us) == (30, 30)
    kept = rows.Row("k", 1, 30, 30, None, None, 0, value, None)
    again = rows.put_row("k", kept=kept, now=20, seq=2, value=value, vectors=None, ttl_minutes=None, expires_us=None)
    assert (again.created_us, again.updated_us) == (30, 30)


def test_values_go_through_the_users_serializer_compressed_when_it_pays() -> None:
    small = {"text": "hi"}
    cell = rows.pack_value(SERDE, small, namespace=("n",), key="k")
    assert cell.codec == rows.RAW and (cell.type_tag, cell.data) == SERDE.dumps_typed(small)
    big = {"text": "the same memory again " * 100}
    cell = rows.pack_value(SERDE, big, namespace=("n",), key="k")
    assert cell.codec == rows.ZLIB and cell.size < len(SERDE.dumps_typed(big)[1]) / 5
    assert rows.unpack_value(SERDE, cell, "t") == big
    assert rows.pack_value(SERDE, big, compress_min=None).codec == rows.RAW
    noise = {"b": random.Random(0).randbytes(512)}  # does not compress by a tenth: kept as it came
    assert rows.pack_value(SERDE, noise).codec == rows.RAW

    class Tagged:
        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            return "json+custom", repr(sorted(obj.items())).encode()

        def loads_typed(self, data: tuple[str, bytes]) -> Any:
            assert data[0] == "json+custom"
            return dict(eval(data[1].decode()))

    cell = rows.pack_value(Tagged(), {"a": 1})
    assert cell.type_tag == "json+custom" and rows.unpack_value(Tagged(), cell, "t") == {"a": 1}


def test_a_value_the_serializer_refuses_stores_nothing_and_names_the_item() -> None:
    class Thing:
        pass

    with pytest.raises(SerializationError) as caught:
        prepare([PutOp(("memories", "bob"), "k1", {"x": Thing()})], serde=SERDE)
    assert "'memories', 'bob'" in str(caught.value) and "'k1'" in str(caught.value)
    store = DictStore()
    with pytest.raises(SerializationError):
        store.batch([PutOp(("n",), "ok", {"x": 1}), PutOp(("n",), "bad", {"x": Thing()})])
    assert store.list_namespaces() == [] and store.get(("n",), "ok") is None
    with pytest.raises(ConfigurationError, match="a value is a dict"):
        prepare([PutOp(("n",), "k", ["not", "a", "dict"])], serde=SERDE)  # type: ignore[arg-type]


def test_values_that_do_not_decode_are_named_errors() -> None:
    with pytest.raises(CorruptObjectError, match="does not decompress"):
        rows.unpack_value(SERDE, rows.ValueCell("msgpack", b"garbage", rows.ZLIB), "memory/n/x/@head, key 'k'")
    with pytest.raises(SerializationError, match="cannot read the value"):
        rows.unpack_value(SERDE, rows.ValueCell("msgpack", b"\xc1"), "t")
    with pytest.raises(CorruptObjectError, match="not a mapping"):
        rows.unpack_value(SERDE, rows.ValueCell(*SERDE.dumps_typed([1, 2])), "t")
    assert rows.unpack_value(SERDE, rows.ValueCell("msgpack", zlib.compress(SERDE.dumps_typed({"a": 1})[1]), rows.ZLIB), "t") == {"a": 1}


def test_an_overwrite_keeps_created_and_seq_a_dead_row_does_not() -> None:
    value = rows.ValueCell("msgpack", b"\x80")
    first = rows.put_row("k", kept=None, now=100, seq=7, value=value, vectors=None, ttl_minutes=None, expires_us=None)
    assert (first.seq, first.created_us, first.updated_us) == (7, 100, 100)
    again = rows.put_row("k", kept=first, now=200, seq=8, value=value, vectors=None, ttl_minutes=1.0, expires_us=260)
    assert (again.seq, again.created_us, again.updated_us, again.expires_us) == (7, 100, 200, 260)
    assert again.live(259) and not again.live(260)
    assert not rows.tombstone_row("k", 300).live(301)
    item = rows.to_item(("n",), again, {"a": 1})
    assert item.created_at == ttl.to_datetime(100) and item.updated_at.microsecond == 200 % 1_000_000


# -- 7. TTL -------------------------------------------------------------------------------


def test_ttl_config_and_per_call_arguments() -> None:
    config = ttl.check_ttl_config({"default_ttl": 5, "refresh_on_read": False, "sweep_interval_minutes": 1, "omit_expired": False})
    assert config is not None and config["default_ttl"] == 5.0
    assert ttl.put_ttl(NOT_PROVIDED, config) == 5.0
    assert ttl.put_ttl(None, config) is None  # an explicit None never expires (LangGraph Server passes None)
    assert ttl.put_ttl(0.5, config) == 0.5
    assert ttl.put_ttl(NOT_PROVIDED, None) is None
    assert ttl.read_refresh(None, config) is False and ttl.read_refresh(True, config) is True
    assert ttl.read_refresh(None, None) is True and ttl.read_refresh(None, {}) is True
    for bad in (-1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ConfigurationError, match="'k'"):
            ttl.put_ttl(bad, None, namespace=("n",), key="k")
    for bad in ({"default_tll": 5}, {"default_ttl": -1}, {"refresh_on_read": 1}, {"sweep_interval_minutes": 0}, [1]):
        with pytest.raises(ConfigurationError):
            ttl.check_ttl_config(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        ttl.check_slack(1.0)


def test_expiry_and_refresh_arithmetic() -> None:
    assert ttl.ttl_us(0.1) == 6_000_000 and ttl.ttl_us(1 / 60) == 1_000_000
    assert ttl.expires_at(1_000, 1) == 60_001_000 and ttl.expires_at(1_000, None) is None
    assert ttl.is_expired(5, 5) and not ttl.is_expired(5, 4) and not ttl.is_expired(None, 10**18)
    minute = ttl.US_PER_MINUTE
    # slack 0.1: not due in the first tenth of the ttl, due after it, never once expired.
    assert not ttl.refresh_due(minute, 1, int(0.09 * minute))
    assert ttl.refresh_due(minute, 1, int(0.11 * minute))
    assert not ttl.refresh_due(minute, 1, minute)
    assert not ttl.refresh_due(None, 1, 0) and not ttl.refresh_due(minute, None, 0)
    assert ttl.refresh_due(minute, 1, 1, slack=0)  # every read, once time moved
    assert ttl.epoch_seconds_up(1_000_001) == 2 and ttl.epoch_seconds_up(2_000_000) == 2


def test_a_batch_refreshes_each_due_item_once_and_never_one_it_writes() -> None:
    minute = ttl.US_PER_MINUTE
    value = rows.ValueCell("msgpack", b"\x80")

    def row(key: str, expires: int | None, minutes: float | None = 1) -> rows.Row:
        return rows.Row(key, 0, 0, 0, expires, minutes, 0, value, None)

    now = 10 * minute
    due, fresh = row("due", now + minute // 2), row("fresh", now + minute - 1)
    returned = [
        (("a",), row("quiet", now + 1), False),  # the read does not refresh
        (("a",), due, True),
        (("b",), due, True),  # another namespace's item of the same key
        (("a",), due, True),  # returned by a get and by a search: one write
        (("a",), fresh, True),  # not due: less than a tenth of its ttl went by
        (("a",), row("forever", None, None), True),
        (("a",), row("spent", now), True),  # expired at this instant
        (("a",), row("written", now + 1), True),
        (("a",), row("quiet", now + 1), True),  # a later read of it refreshes
    ]
    plan = ttl.plan_refreshes(returned, {(("a",), "written")}, now)
    assert plan == {
        ("a",): [ttl.Refresh("due", now + minute // 2, now + minute), ttl.Refresh("quiet", now + 1, now + minute)],
        ("b",): [ttl.Refresh("due", now + minute // 2, now + minute)],
    }
    assert ttl.plan_refreshes(returned, set(), now, slack=0)[("a",)][1] == ttl.Refresh("fresh", now + minute - 1, now + minute)


def test_with_the_default_slack_reads_write_an_item_at_most_once_a_tenth_of_its_ttl() -> None:
    time = FakeTime()
    store = DictStore(ttl={"default_ttl": 1}, clock=ttl.Clock(time))
    store.put(("n",), "k", {"a": 1})
    written = store._row(("n",), "k").expires_us
    seconds = 1_000_000
    time.us += 5 * seconds  # 55 s left of 60: not due (a tenth of the ttl has not gone by)
    assert store.get(("n",), "k") is not None and store.search(("n",))
    assert store._row(("n",), "k").expires_us == written
    time.us += 2 * seconds  # 53 s left: due; one refresh however many reads return it
    found = store.batch([GetOp(("n",), "k"), SearchOp(("n",)), GetOp(("n",), "k")])
    assert all(found)
    assert store._row(("n",), "k").expires_us - time.us in range(60 * seconds, 60 * seconds + 5)
    time.us += 61 * seconds
    assert store.get(("n",), "k") is None and store.search(("n",)) == []


def test_gets_are_grouped_by_namespace_and_writes_are_known() -> None:
    prepared = prepare(
        [GetOp(("a",), "k1"), GetOp(("b",), "k"), GetOp((), "k"), GetOp(("a",), "k2"), PutOp(("a",), "k1", None)],
        serde=SERDE,
    )
    assert prepared.get_groups() == {("a",): [0, 3], ("b",): [1]}
    assert prepared.written() == {(("a",), "k1")}


def test_the_clock_strictly_increases() -> None:
    readings = iter([100, 100, 50, 200, 200])
    clock = ttl.Clock(lambda: next(readings))
    assert [clock.now() for _ in range(5)] == [100, 101, 102, 200, 201]
    fixed = ttl.Clock(lambda: 7)
    seen: list[int] = []

    def take() -> None:
        seen.extend(fixed.now() for _ in range(500))

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == 2000
    assert abs(ttl.PROCESS_CLOCK.now() - ttl._wall_us()) < 60_000_000


# -- the batch ----------------------------------------------------------------------------


def test_a_batch_keeps_the_first_place_and_the_last_value_of_a_key() -> None:
    prepared = prepare(
        [
            PutOp(("b",), "x", None),
            PutOp(("a",), "k1", {"v": 1}),
            GetOp(("a",), "k1"),
            PutOp(("a",), "k2", {"v": 2}),
            PutOp(("a",), "k1", {"v": 3}),
            PutOp(("b",), "y", {"v": 4}),
            PutOp(("c",), "z", None),
        ],
        serde=SERDE,
    )
    assert [(p.namespace, p.key, p.position) for p in prepared.puts] == [
        (("b",), "x", 0), (("a",), "k1", 4), (("a",), "k2", 3), (("b",), "y", 5), (("c",), "z", 6)
    ]
    assert SERDE.loads_typed((prepared.puts[1].value.type_tag, prepared.puts[1].value.data)) == {"v": 3}
    # ("b",) first: its dict in InMemoryStore is made by the delete that comes first.
    assert list(prepared.groups) == [("b",), ("a",), ("c",)]
    assert prepared.registering() == [("b",), ("a",)]
    assert prepared.gets == [2]
    store = DictStore()
    store.batch(prepared.ops)
    assert store.list_namespaces() == [("a",), ("b",)]
    assert [i.namespace for i in store.search(())] == [("b",), ("a",), ("a",)]


def test_a_bad_op_anywhere_in_a_batch_stores_nothing() -> None:
    store = DictStore()
    for bad in (
        PutOp(("n",), "k", {"a": 1}, index=True),  # type: ignore[arg-type]
        PutOp(("n",), 3, {"a": 1}),  # type: ignore[arg-type]
        SearchOp(("n",), limit=-1),
        SearchOp(("n",), query=b"q"),  # type: ignore[arg-type]
        PutOp(("n",), "k", {"a": 1}, ttl=-5),
        ("not", "an", "op"),
    ):
        with pytest.raises(ConfigurationError):
            store.batch([PutOp(("n",), "first", {"a": 1}), bad])  # type: ignore[list-item]
    assert store.list_namespaces() == [] and store.get(("n",), "first") is None


def test_queries_are_embedded_once_and_only_with_an_index() -> None:
    ops = [SearchOp(("n",), query="q"), SearchOp((), query="q"), SearchOp(("n",), query=""), SearchOp(("n",), query="r")]
    assert prepare(ops, serde=SERDE, fields=embedding.tokenized_fields({})).queries == ["q", "r"]
    assert prepare(ops, serde=SERDE).queries == []
    assert prepare([PutOp(("n",), "k", {"a": "x"})], serde=SERDE).texts.texts == []


def test_stored_timestamps_are_exact_microseconds() -> None:
    time = FakeTime(1_700_000_000_123_456)
    store = DictStore(clock=ttl.Clock(time))
    store.put(("n",), "k", {"a": 1})
    item = store.get(("n",), "k")
    row = store._row(("n",), "k")
    assert row is not None and 0 <= row.created_us - 1_700_000_000_123_456 < 3  # the clock's ticks of one batch
    assert item is not None and item.created_at == ttl.to_datetime(row.created_us)
    assert item.created_at.tzinfo is not None and math.isclose(item.created_at.timestamp(), row.created_us / 1e6)


def test_the_stores_default_slack_is_the_cores() -> None:
    # Spelled out in S3Store's signature (the API page shows it); the two must not drift.
    import inspect

    from s3_saver import S3Store

    for make in (S3Store, S3Store.from_saver):
        assert inspect.signature(make).parameters["refresh_slack"].default == ttl.DEFAULT_REFRESH_SLACK
