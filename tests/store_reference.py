"""The differential harness for memory stores: the same random sequence of BaseStore calls
(hypothesis) runs against LangGraph's ``InMemoryStore`` (the reference) and against any
other ``BaseStore`` (the candidate), and every answer must be equal: items (namespace,
key, value), their order, scores (exactly: float64 vectors), namespace pages, and which
calls raise (the candidate's exception an instance of the reference's type).

``ReferenceStore`` is InMemoryStore with the store's documented, deliberate differences
applied, all of them here and nowhere else:

(a) A get, search or delete does not create a namespace: InMemoryStore's defaultdict
    lists a namespace after a mere ``get`` (and keeps its place in the order). The
    reference forgets a namespace that no put gave an item (one emptied by deletes stays
    listed, as in InMemoryStore).
(b) ``created_at`` is kept by an overwrite (InMemoryStore resets it). The harness does not
    compare timestamps with InMemoryStore's; it checks the candidate's against the
    reference's record of which put created and which last updated each item
    (``ReferenceStore.generation``): one created_at per creating put, one updated_at per
    put, updated_at moving forward, created_at == updated_at for a fresh item.
(c) An overwrite replaces the item's vectors (InMemoryStore keeps vectors of paths the new
    value no longer indexes, and ``index=False`` keeps all the old ones).
(d) ``$gt``/``$gte``/``$lt``/``$lte`` on an item value ``float()`` refuses do not match
    (InMemoryStore raises TypeError/ValueError out of the search).
(e) A text that fills two places of one batch (two fields, two items) gives its vector to
    both (InMemoryStore raises "Number of embeddings ... does not match").
(f) TTL, which InMemoryStore lacks: with a time source, the reference drops items whose
    ttl passed before each batch, and a refreshing read moves the expiry of every item it
    returns (the candidate runs with ``refresh_slack=0`` for exact equality).
(g) Ops handed straight to ``batch`` have their labels checked (LangGraph's
    ``validate_op_namespace``, as PostgresStore does): one bad op fails the whole batch
    before anything of it runs. InMemoryStore checks labels only in its convenience
    methods, so ``batch`` would store under ``("a.b",)``.

What the generated calls avoid, because the store refuses it on purpose (each has a unit
test of its own): unknown filter operators and non-numeric operands, negative
limits/offsets/depths, keys over 1,000 bytes, labels with U+10FFFF or lone surrogates,
vectors of the wrong size.

The candidate is built by a factory, so the same harness drives any store: the dict
double of the core today (``store_double.DictStore``), ``S3Store`` in both index modes once
it exists.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import langgraph.store.memory as memory_module
from hypothesis import strategies as st
from langchain_core.embeddings import Embeddings
from langgraph.store.base import (
    NOT_PROVIDED,
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    validate_op_namespace,
)
from langgraph.store.memory import InMemoryStore

US_PER_MINUTE = 60_000_000


class HashEmbeddings(Embeddings):
    """A deterministic embedder without state (two instances agree): each character adds a
    small integer vector drawn from its SHA-256. Anagrams embed alike (ties for the stable
    sort); the empty text embeds to zeros (a zero norm)."""

    def __init__(self, dims: int = 4) -> None:
        self.dims = dims

    def _one(self, text: str) -> list[float]:
        vector = [0.0] * self.dims
        for char in text:
            digest = hashlib.sha256(char.encode("utf-8", "surrogatepass")).digest()
            for i in range(self.dims):
                vector[i] += (digest[i] % 5) - 2
        return vector

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._one(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._one(text)

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embed_documents(texts)

    async def aembed_query(self, text: str) -> list[float]:
        return self.embed_query(text)


@dataclass
class FakeTime:
    """The shared time source (UTC microseconds) of a TTL run."""

    us: int = 1_700_000_000_000_000

    def __call__(self) -> int:
        return self.us


_NUMERIC_OPS = ("$gt", "$gte", "$lt", "$lte")


def _tolerant(original: Callable[..., bool]) -> Callable[..., bool]:
    def apply(value: Any, operator: str, operand: Any) -> bool:
        if operator in _NUMERIC_OPS:
            try:
                float(value)
            except (TypeError, ValueError, OverflowError):
                return False  # (d)
        return original(value, operator, operand)

    return apply


class ReferenceStore(InMemoryStore):
    """InMemoryStore with (a)-(g) of the module docstring."""

    supports_ttl = True

    def __init__(self, *, index: IndexConfig | None = None, ttl: TTLConfig | None = None, time: Callable[[], int] | None = None) -> None:
        super().__init__(index=index)
        self.ttl_config = ttl
        self._extra = _Extra(time=time)

    def generations(self) -> dict[tuple[tuple[str, ...], str], tuple[int, int]]:
        """(creating put, last put) of each live item: numbers in put order (a copy)."""
        return dict(self._extra.generations)

    # -- hooks into InMemoryStore's batch ----------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = self._checked(ops)
        self._before()
        results = super().batch(ops)
        self._after(ops, results)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = self._checked(ops)
        self._before()
        results = await super().abatch(ops)
        self._after(ops, results)
        return results

    @staticmethod
    def _checked(ops: Iterable[Op]) -> list[Op]:
        ops = list(ops)
        for op in ops:
            validate_op_namespace(op)  # (g)
        return ops

    def _before(self) -> None:
        extra = self._extra
        # Every namespace left after the last batch is one a put gave an item.
        extra.known = set(self._data)
        if extra.time is None:
            return
        now = extra.time()
        for (ns, key), (expires, _) in list(extra.expiry.items()):
            if expires <= now:  # (f)
                self._data[ns].pop(key, None)
                self._vectors[ns].pop(key, None)
                del extra.expiry[(ns, key)]
                extra.generations.pop((ns, key), None)

    def _filter_items(self, op: SearchOp) -> list[tuple[Item, list[list[float]]]]:
        original = memory_module._apply_operator
        memory_module._apply_operator = _tolerant(original)  # (d)
        try:
            return super()._filter_items(op)
        finally:
            memory_module._apply_operator = original

    def _handle_list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        self._forget_unput()  # (a): a get earlier in this batch may have made one
        return super()._handle_list_namespaces(op)

    def _extract_texts(self, put_ops: dict[tuple[tuple[str, ...], str], PutOp]) -> Any:
        extra = self._extra
        self._forget_unput()  # (a): before the puts, so a namespace's place is its first put's
        extra.existed = {nk for nk in put_ops if nk[1] in self._data.get(nk[0], {})}
        for ns, key in put_ops:
            if ns in self._vectors:
                self._vectors[ns].pop(key, None)  # (c)
        return super()._extract_texts(put_ops)

    def _insertinmem_store(self, to_embed: dict[str, list[tuple[tuple[str, ...], str, str]]], embeddings: list[list[float]]) -> None:
        if len(embeddings) != len(to_embed):
            raise ValueError(f"{len(embeddings)} embeddings for {len(to_embed)} texts")
        for vector, places in zip(embeddings, to_embed.values(), strict=True):
            for ns, key, path in places:  # (e)
                self._vectors[ns][key][path] = vector

    def _forget_unput(self) -> None:
        for ns in [ns for ns, items in self._data.items() if not items and ns not in self._extra.known]:
            del self._data[ns]

    def _after(self, ops: list[Op], results: list[Result]) -> None:
        extra = self._extra
        put_ops: dict[tuple[tuple[str, ...], str], PutOp] = {}
        for op in ops:
            if isinstance(op, PutOp):
                put_ops[(op.namespace, op.key)] = op
        now = extra.time() if extra.time is not None else 0
        # (f) refreshes of what the reads returned (a put of the batch wins over them).
        for op, result in zip(ops, results, strict=True):
            if isinstance(op, GetOp) and result is not None and op.refresh_ttl:
                self._refresh(op.namespace, op.key, now, put_ops)
            elif isinstance(op, SearchOp) and op.refresh_ttl:
                for item in result:
                    self._refresh(item.namespace, item.key, now, put_ops)
        for (ns, key), op in put_ops.items():
            if op.value is None:
                extra.expiry.pop((ns, key), None)
                extra.generations.pop((ns, key), None)
                continue
            extra.counter += 1
            created = extra.generations[(ns, key)][0] if (ns, key) in extra.existed else extra.counter
            extra.generations[(ns, key)] = (created, extra.counter)
            if op.ttl is None or extra.time is None:
                extra.expiry.pop((ns, key), None)
            else:
                extra.expiry[(ns, key)] = (now + round(op.ttl * US_PER_MINUTE), op.ttl)
        self._forget_unput()
        extra.existed = set()

    def _refresh(self, ns: tuple[str, ...], key: str, now: int, put_ops: dict[Any, PutOp]) -> None:
        extra = self._extra
        if (ns, key) in put_ops or (ns, key) not in extra.expiry:
            return
        _, ttl = extra.expiry[(ns, key)]
        extra.expiry[(ns, key)] = (now + round(ttl * US_PER_MINUTE), ttl)


@dataclass
class _Extra:
    time: Callable[[], int] | None
    known: set[tuple[str, ...]] = field(default_factory=set)
    existed: set[tuple[tuple[str, ...], str]] = field(default_factory=set)
    expiry: dict[tuple[tuple[str, ...], str], tuple[int, float]] = field(default_factory=dict)
    generations: dict[tuple[tuple[str, ...], str], tuple[int, int]] = field(default_factory=dict)
    counter: int = 0


# -- generated calls -------------------------------------------------------------------------

COMMON = ["a", "b"]
LABELS = ["a", "b", "a b", "ab", "!", '"', "%2F", "é", "*", "x/y", ":", "日本", "langgraph"]
KEYS = ["k", "k2", "k3", "", "é", "a b", "!", "%"]
WORDS = ["apple", "pear", "red car", "care", "race", "日本語", ""]
FIELDS = ["text", "meta.tag", "tags[*]", "$", "nope"]


def namespaces(min_size: int = 1) -> st.SearchStrategy[tuple[str, ...]]:
    """Mostly from two labels (so calls meet each other's namespaces), up to depth 4 from
    labels that need escaping in keys and registry keys (``/``, ``%``, ``!``, ``"``, ``*``...)."""
    common = st.lists(st.sampled_from(COMMON), min_size=min_size, max_size=2).map(tuple)
    exotic = st.lists(st.sampled_from(LABELS), min_size=min_size, max_size=4).map(tuple)
    return st.integers(0, 5).flatmap(lambda i: exotic if i == 0 else common)


def keys() -> st.SearchStrategy[str]:
    return st.integers(0, 3).flatmap(lambda i: st.sampled_from(KEYS) if i == 0 else st.sampled_from(KEYS[:2]))


def _numbers() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.integers(-3, 3),
        st.sampled_from([0.5, -1.5, 2.0, 1e20]),
        st.sampled_from(["2", "x", True]),  # float()-able text, text that is not, a bool
    )


def values() -> st.SearchStrategy[dict[str, Any]]:
    scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["x", "y", "2"]))
    return st.fixed_dictionaries(
        {"n": _numbers()},
        optional={
            "s": scalar,
            "l": _small_lists(),
            "d": st.fixed_dictionaries({}, optional={"x": _numbers(), "y": scalar}),
            "text": st.sampled_from(WORDS),
            "meta": st.fixed_dictionaries({"tag": st.sampled_from(WORDS)}),
            "tags": st.lists(st.sampled_from(WORDS), max_size=3),
        },
    )


def _small_lists() -> st.SearchStrategy[list[int]]:
    return st.sampled_from([[], [1], [1, 2], [2, 1]])


def filters() -> st.SearchStrategy[dict[str, Any] | None]:
    scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["x", "y", "2"]))
    number = st.one_of(st.integers(-3, 3), st.sampled_from([0.5, 2.0, "1"]))
    operators = st.dictionaries(
        st.sampled_from(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte"]), number, min_size=1, max_size=2
    )
    condition = st.one_of(scalar, operators, _small_lists())
    nested = st.dictionaries(st.sampled_from(["x", "y"]), condition, min_size=1, max_size=2)
    return st.one_of(
        st.none(),
        st.none(),
        st.dictionaries(st.sampled_from(["n", "n", "s", "l", "d", "text", "missing"]), st.one_of(condition, nested), max_size=2),
    )


def match_paths() -> st.SearchStrategy[tuple[str, ...] | None]:
    path = st.lists(st.sampled_from(COMMON + ["*"]), min_size=1, max_size=2).map(tuple)
    odd = st.lists(st.sampled_from(LABELS + ["*"]), min_size=1, max_size=3).map(tuple)
    return st.integers(0, 4).flatmap(lambda i: (st.none(), path, path, odd, st.none())[i])


def _limits() -> st.SearchStrategy[int]:
    return st.integers(0, 9).flatmap(lambda i: st.just(0) if i == 0 else st.integers(1, 5))


def _offsets() -> st.SearchStrategy[int]:
    return st.integers(0, 2).flatmap(lambda i: st.integers(1, 3) if i == 0 else st.just(0))


def _index_arg() -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), st.just(False), st.lists(st.sampled_from(FIELDS), max_size=2))


def _ttl_arg(ttl: bool) -> st.SearchStrategy[Any]:
    # Minutes that are whole multiples of 30 s: with advances of 10.001 s no expiry falls
    # within milliseconds of a read (the candidate's clock runs microseconds ahead).
    return st.sampled_from([NOT_PROVIDED, None, 0.5, 1, 2]) if ttl else st.just(NOT_PROVIDED)


def _query() -> st.SearchStrategy[str | None]:
    return st.one_of(st.none(), st.sampled_from(WORDS + ["care race"]))


def _raw_put(ttl: bool) -> st.SearchStrategy[PutOp]:
    return st.builds(
        PutOp,
        st.sampled_from([("a",), ("b",), ("a", "b")]),
        st.sampled_from(["k", "k2", "k3"]),
        st.one_of(st.none(), values(), values()),
        _index_arg(),
        ttl=st.sampled_from([None, 0.5, 1]) if ttl else st.none(),
    )


BAD_LABELS = [("a.b",), ("a", ""), ("ok", 3)]
"""Namespaces LangGraph's label check refuses, for ops handed straight to ``batch``."""


def _raw_op(ttl: bool) -> st.SearchStrategy[Op]:
    bad = st.sampled_from(BAD_LABELS)
    refused = st.one_of(
        st.builds(lambda ns, key: GetOp(ns, key), bad, keys()),
        st.builds(lambda ns: SearchOp(ns), bad),
        st.builds(lambda ns, key, value: PutOp(ns, key, value), bad, keys(), st.one_of(st.none(), values())),
        st.builds(lambda ns: ListNamespacesOp((MatchCondition("suffix", ns),)), bad),
    )
    # One op in twelve is refused: about a quarter of the generated batches fail whole.
    return st.integers(0, 11).flatmap(lambda i: refused if i == 0 else _good_op(ttl))


def _good_op(ttl: bool) -> st.SearchStrategy[Op]:
    return st.one_of(
        st.builds(GetOp, namespaces(0), keys(), st.booleans()),
        st.builds(
            PutOp,
            st.one_of(namespaces(), namespaces().map(lambda ns: ("langgraph",) + ns[:2])),
            keys(),
            st.one_of(st.none(), values()),
            _index_arg(),
            ttl=st.sampled_from([None, 0.5, 1]) if ttl else st.none(),
        ),
        st.builds(
            SearchOp,
            namespaces(0),
            filters(),
            st.integers(0, 4),
            st.integers(0, 3),
            _query(),
            st.booleans(),
        ),
        st.builds(
            lambda prefix, suffix, depth, limit, offset: ListNamespacesOp(
                tuple(
                    [MatchCondition("prefix", prefix)] * (prefix is not None)
                    + [MatchCondition("suffix", suffix)] * (suffix is not None)
                ),
                depth,
                limit,
                offset,
            ),
            match_paths(),
            match_paths(),
            st.one_of(st.none(), st.integers(0, 3)),
            st.integers(0, 5),
            st.integers(0, 3),
        ),
    )


def steps(*, ttl: bool = False, max_size: int = 30) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    """A list of calls: ``("put", ns, key, value, index, ttl)``, ``("delete", ns, key)``,
    ``("get", ns, key, refresh)``, ``("search", prefix, filter, limit, offset, query, refresh)``,
    ``("list", prefix, suffix, max_depth, limit, offset)``, ``("batch", ops)``, and with
    ``ttl`` ``("advance", microseconds)``. Invalid namespaces reach the convenience
    methods (both stores must refuse them alike)."""
    bad_namespace = st.sampled_from([(), ("a.b",), ("a", ""), ("langgraph", "x"), ("ok", 3)])
    put = st.tuples(st.just("put"), namespaces(), keys(), values(), _index_arg(), _ttl_arg(ttl))
    weighted = [
        (4, put),
        (1, st.tuples(st.just("put"), bad_namespace, st.just("k"), st.just({"s": "x"}), st.none(), st.just(NOT_PROVIDED))),
        (1, st.tuples(st.just("delete"), namespaces(), keys())),
        (2, st.tuples(st.just("get"), namespaces(), keys(), st.sampled_from([None, True, False]))),
        (
            3,
            st.tuples(
                st.just("search"), namespaces(0), filters(), _limits(), _offsets(), _query(),
                st.sampled_from([None, True, False]),
            ),
        ),
        (
            2,
            st.tuples(
                st.just("list"), match_paths(), match_paths(), st.one_of(st.none(), st.integers(0, 3)),
                _limits(), _offsets(),
            ),
        ),
        (2, st.tuples(st.just("batch"), st.lists(_raw_op(ttl), min_size=1, max_size=6))),
        # Puts and deletes of few keys in one batch: deduplication and the order of new items.
        (1, st.tuples(st.just("batch"), st.lists(_raw_put(ttl), min_size=2, max_size=5))),
    ]
    if ttl:
        weighted.append((3, st.tuples(st.just("advance"), st.integers(1, 4).map(lambda n: n * 10_001_000))))
    call = st.sampled_from([s for weight, s in weighted for _ in range(weight)]).flatmap(lambda s: s)
    # A few puts first, so the calls after them meet items.
    return st.tuples(st.lists(put, min_size=1, max_size=8), st.lists(call, min_size=3, max_size=max_size)).map(
        lambda parts: parts[0] + parts[1]
    )


# -- running and comparing -------------------------------------------------------------------


def _call(store: BaseStore, step: tuple[Any, ...]) -> Any:
    kind = step[0]
    if kind == "put":
        _, ns, key, value, index, ttl = step
        return store.put(ns, key, value, index=index, ttl=ttl)
    if kind == "delete":
        return store.delete(step[1], step[2])
    if kind == "get":
        return store.get(step[1], step[2], refresh_ttl=step[3])
    if kind == "search":
        _, prefix, filter, limit, offset, query, refresh = step
        return store.search(prefix, filter=filter, limit=limit, offset=offset, query=query, refresh_ttl=refresh)
    if kind == "list":
        _, prefix, suffix, depth, limit, offset = step
        return store.list_namespaces(prefix=prefix, suffix=suffix, max_depth=depth, limit=limit, offset=offset)
    if kind == "batch":
        return store.batch(step[1])
    raise AssertionError(step)


async def _acall(store: BaseStore, step: tuple[Any, ...]) -> Any:
    kind = step[0]
    if kind == "put":
        _, ns, key, value, index, ttl = step
        return await store.aput(ns, key, value, index=index, ttl=ttl)
    if kind == "delete":
        return await store.adelete(step[1], step[2])
    if kind == "get":
        return await store.aget(step[1], step[2], refresh_ttl=step[3])
    if kind == "search":
        _, prefix, filter, limit, offset, query, refresh = step
        return await store.asearch(prefix, filter=filter, limit=limit, offset=offset, query=query, refresh_ttl=refresh)
    if kind == "list":
        _, prefix, suffix, depth, limit, offset = step
        return await store.alist_namespaces(prefix=prefix, suffix=suffix, max_depth=depth, limit=limit, offset=offset)
    if kind == "batch":
        return await store.abatch(step[1])
    raise AssertionError(step)


def normalized(result: Any) -> Any:
    """What is compared: items without timestamps (checked apart), scores exactly."""
    if isinstance(result, SearchItem):
        return ("item", result.namespace, result.key, result.value, result.score)
    if isinstance(result, Item):
        return ("item", result.namespace, result.key, result.value)
    if isinstance(result, list):
        return [normalized(r) for r in result]
    return result


def _items(result: Any) -> list[Item]:
    if isinstance(result, Item):
        return [result]
    if isinstance(result, list):
        return [i for r in result for i in _items(r)]
    return []


class TimestampChecker:
    """(b): the candidate's timestamps against the reference's record of puts."""

    def __init__(self) -> None:
        self.created: dict[int, Any] = {}
        self.updated: dict[int, Any] = {}
        self.last: dict[tuple[tuple[str, ...], str], tuple[int, Any]] = {}

    def observe(self, generations: dict[tuple[tuple[str, ...], str], tuple[int, int]], items: list[Item]) -> None:
        """``generations``: the reference's before the call (a batch's reads see the store
        as it was before the batch's puts)."""
        for item in items:
            created_gen, updated_gen = generations[(item.namespace, item.key)]
            assert self.created.setdefault(created_gen, item.created_at) == item.created_at, (item, "created_at moved")
            assert self.updated.setdefault(updated_gen, item.updated_at) == item.updated_at, (item, "updated_at moved")
            assert item.created_at <= item.updated_at, item
            if created_gen == updated_gen:
                assert item.created_at == item.updated_at, item
            previous = self.last.get((item.namespace, item.key))
            if previous is not None and previous[0] < updated_gen:
                assert previous[1] < item.updated_at, (item, "an overwrite did not move updated_at forward")
            self.last[(item.namespace, item.key)] = (updated_gen, item.updated_at)


def _outcome(run: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return run(), None
    except Exception as exc:  # noqa: BLE001 - compared below
        return None, exc


def _compare(step: tuple[Any, ...], ref: tuple[Any, BaseException | None], cand: tuple[Any, BaseException | None]) -> None:
    (ref_out, ref_exc), (cand_out, cand_exc) = ref, cand
    if ref_exc is not None or cand_exc is not None:
        assert ref_exc is not None and cand_exc is not None, (step, ref_exc, cand_exc)
        assert isinstance(cand_exc, type(ref_exc)), (step, ref_exc, cand_exc)
        return
    assert normalized(cand_out) == normalized(ref_out), (step, normalized(ref_out), normalized(cand_out))


def run_steps(
    calls: list[tuple[Any, ...]],
    reference: ReferenceStore,
    candidate: BaseStore,
    *,
    time: FakeTime | None = None,
) -> None:
    """Run ``calls`` on both stores (sync methods) and compare every answer."""
    checker = TimestampChecker()
    for step in calls:
        if step[0] == "advance":
            assert time is not None
            time.us += step[1]
            continue
        before = reference.generations()
        ref = _outcome(lambda step=step: _call(reference, step))
        cand = _outcome(lambda step=step: _call(candidate, step))
        _compare(step, ref, cand)
        checker.observe(before, _items(cand[0]))


def run_steps_async(
    calls: list[tuple[Any, ...]],
    reference: ReferenceStore,
    candidate: BaseStore,
    *,
    time: FakeTime | None = None,
) -> None:
    """The same with the async methods (``abatch``), in one event loop."""

    async def go() -> None:
        checker = TimestampChecker()
        for step in calls:
            if step[0] == "advance":
                assert time is not None
                time.us += step[1]
                continue
            before = reference.generations()
            outcomes = []
            for store in (reference, candidate):
                try:
                    outcomes.append((await _acall(store, step), None))
                except Exception as exc:  # noqa: BLE001 - compared below
                    outcomes.append((None, exc))
            _compare(step, outcomes[0], outcomes[1])
            checker.observe(before, _items(outcomes[1][0]))

    asyncio.run(go())
